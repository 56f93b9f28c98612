// Package s3test starts a real S3-compatible server for tests and
// benchmarks: versitygw with its POSIX back end over a temporary
// directory, on a loopback port (scripts/install-deps.sh installs it).
package s3test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Server is a running versitygw.
type Server struct {
	Endpoint       string // http://127.0.0.1:port
	Access, Secret string
	Dir            string // its POSIX back end: a bucket is a directory
	cmd            *exec.Cmd
}

// Binary finds versitygw: on PATH, or where go install puts it.
func Binary() (string, error) {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	gopath := os.Getenv("GOPATH")
	if gopath == "" {
		home, _ := os.UserHomeDir()
		gopath = filepath.Join(home, "go")
	}
	p := filepath.Join(gopath, "bin", "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("versitygw not found (scripts/install-deps.sh installs it with go install)")
}

// Start starts versitygw over a temporary directory until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartIn(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartIn starts versitygw with its back end in dir.
func StartIn(dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &Server{Endpoint: "http://" + addr, Access: "riffletest", Secret: "riffletestsecret", Dir: dir}
	s.cmd = exec.Command(bin, "--access", s.Access, "--secret", s.Secret, "--port", addr, "posix", dir)
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return s, nil
		}
	}
	s.Stop()
	return nil, fmt.Errorf("versitygw did not listen on %s", addr)
}

// Stop kills the server.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

// Env is the environment a client of the server needs.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + s.Access, "AWS_SECRET_ACCESS_KEY=" + s.Secret, "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=" + s.Endpoint}
}

// SetEnv sets that environment for the rest of the test.
func (s *Server) SetEnv(t testing.TB) {
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// Client is a minio client of the server, for putting test objects.
func (s *Server) Client() (*minio.Client, error) {
	return minio.New(strings.TrimPrefix(s.Endpoint, "http://"), &minio.Options{
		Creds: credentials.NewStaticV4(s.Access, s.Secret, ""), Region: "us-east-1", BucketLookup: minio.BucketLookupPath})
}

// Put makes a bucket if needed and puts an object.
func (s *Server) Put(ctx context.Context, bucket, key string, b []byte) error {
	c, err := s.Client()
	if err != nil {
		return err
	}
	if ok, _ := c.BucketExists(ctx, bucket); !ok {
		if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
			return err
		}
	}
	_, err = c.PutObject(ctx, bucket, key, strings.NewReader(string(b)), int64(len(b)), minio.PutObjectOptions{})
	return err
}
