package storage_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/internal/faultproxy"
	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/storage"
)

func s3Store(t *testing.T, endpoint string, opts storage.S3Options) *storage.S3 {
	t.Helper()
	opts.Endpoint = endpoint
	s, err := storage.NewS3(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A real S3 server: ranged reads equal the object, names list, glob, walk
// and stat as a file system's would, small objects read and write whole.
func TestS3Store(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	data := synth.RandomBytes(3<<20+123, 1)
	for _, k := range []string{"d/a.bin", "d/sub/b.bin", "d/sub/c.txt", "d/.hidden", "other.bin"} {
		if err := srv.Put(ctx, "bkt", k, data); err != nil {
			t.Fatal(err)
		}
	}
	s := s3Store(t, srv.Endpoint, storage.S3Options{})
	r, err := s.Open(ctx, "s3://bkt/d/a.bin")
	if err != nil {
		t.Fatal(err)
	}
	if r.Size() != int64(len(data)) {
		t.Fatalf("size %d, want %d", r.Size(), len(data))
	}
	for _, c := range []struct{ off, n int }{{0, 1}, {0, 4096}, {1 << 20, 777}, {len(data) - 10, 10}} {
		p := make([]byte, c.n)
		if err := r.ReadAt(ctx, p, int64(c.off)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, data[c.off:c.off+c.n]) {
			t.Fatalf("range %d+%d differs", c.off, c.n)
		}
	}
	err = r.ReadAt(ctx, make([]byte, 20), int64(len(data)-10))
	if !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "s3://bkt/d/a.bin") {
		t.Fatalf("a read past the end: %v", err)
	}
	got, err := s.Glob(ctx, "s3://bkt/d/sub/*.bin")
	if err != nil || len(got) != 1 || got[0] != "s3://bkt/d/sub/b.bin" {
		t.Fatalf("glob: %v %v", got, err)
	}
	if st, err := s.Stat(ctx, "s3://bkt/d/sub"); err != nil || !st.Dir {
		t.Fatalf("a prefix stats as a directory: %+v %v", st, err)
	}
	if _, err := s.Stat(ctx, "s3://bkt/nope"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a missing object: %v", err)
	}
	var walked []string
	err = s.Walk(ctx, "s3://bkt/d", func(name string, info storage.ObjectInfo) error {
		walked = append(walked, strings.TrimPrefix(name, "s3://bkt/d/"))
		return nil
	})
	if err != nil || strings.Join(walked, ",") != "a.bin,sub,sub/b.bin,sub/c.txt" {
		t.Fatalf("walk: %v %v", walked, err)
	}
	if err := s.WriteFile(ctx, "s3://bkt/d/a.bin.ridx", []byte("index")); err != nil {
		t.Fatal(err)
	}
	if b, err := s.ReadFile(ctx, "s3://bkt/d/a.bin.ridx", 100); err != nil || string(b) != "index" {
		t.Fatalf("read back %q %v", b, err)
	}
	if _, err := s.ReadFile(ctx, "s3://bkt/d/a.bin", 100); !errors.Is(err, storage.ErrTooLarge) {
		t.Fatalf("a large object read whole: %v", err)
	}
	// Replaced under a reader: an error, not a mix of versions.
	if err := srv.Put(ctx, "bkt", "d/a.bin", data[:len(data)-1]); err != nil {
		t.Fatal(err)
	}
	if err := r.ReadAt(ctx, make([]byte, 100), 0); !errors.Is(err, storage.ErrChanged) {
		t.Fatalf("a replaced object was read: %v", err)
	}
}

// Through a proxy that answers 503 and resets connections, reads are
// retried until they succeed; when every request fails, the error names
// the bucket, the key and the range.
func TestS3Retries(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	data := synth.RandomBytes(1<<20, 2)
	if err := srv.Put(ctx, "bkt", "x.bin", data); err != nil {
		t.Fatal(err)
	}
	px, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	s := s3Store(t, px.URL, storage.S3Options{Retries: 8})
	r, err := s.Open(ctx, "s3://bkt/x.bin")
	if err != nil {
		t.Fatal(err)
	}
	px.Set(0, 0.3, 0.1)
	for i := range 100 {
		off := (i * 9973) % (len(data) - 4096)
		p := make([]byte, 4096)
		if err := r.ReadAt(ctx, p, int64(off)); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !bytes.Equal(p, data[off:off+4096]) {
			t.Fatalf("read %d differs", i)
		}
	}
	if px.Faults.Load() == 0 {
		t.Fatal("no fault was injected")
	}
	px.Set(0, 1, 0)
	err = r.ReadAt(ctx, make([]byte, 10), 100)
	if err == nil || !strings.Contains(err.Error(), "bucket bkt key x.bin range 100-109") {
		t.Fatalf("every request failing: %v", err)
	}
	// A request slower than the deadline is tried again, then fails.
	px.Set(300*time.Millisecond, 0, 0)
	slow := s3Store(t, px.URL, storage.S3Options{Retries: 1, Timeout: 100 * time.Millisecond})
	if _, err := slow.Open(ctx, "s3://bkt/x.bin"); err == nil {
		t.Fatal("a request past its deadline succeeded")
	}
}
