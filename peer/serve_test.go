package peer_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/server"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// A peer's block request whose numbers overflow (an offset near 2^63, a
// block index whose byte offset wraps to 0, negative and huge lengths),
// sent to a real daemon over loopback TCP, gets an error; the daemon
// keeps serving, on the same connection, the right bytes.
func TestAbsurdBlockRequests(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	data := make([]byte, 3<<20+777) // blocks of 1 MiB: three whole, one short
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	if err := srv.Put(ctx, "bkt", "obj.bin", data); err != nil {
		t.Fatal(err)
	}
	const object = "s3://bkt/obj.bin"
	s3, err := storage.NewS3(storage.S3Options{Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s3.Open(ctx, object)
	if err != nil {
		t.Fatal(err)
	}
	version := r.(storage.Versioned).Version()
	r.Close()

	sockDir := filepath.Join(t.TempDir(), "sock")
	if err := os.Mkdir(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &server.Server{Socket: filepath.Join(sockDir, "d.sock"), TCP: "127.0.0.1:0", Token: "tok",
		Peers: []string{"self", "127.0.0.1:1"}, Node: 0, S3: storage.S3Options{Endpoint: srv.Endpoint},
		IndexDir: t.TempDir(), Outputs: t.TempDir()}
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("the daemon did not start: %v", err)
	}
	defer func() {
		cancel()
		<-done
	}()

	c, err := net.Dial("tcp", d.TCPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	br, bw := bufio.NewReader(c), bufio.NewWriter(c)
	ask := func(m *wire.Msg) (*wire.Msg, []byte) {
		t.Helper()
		if err := wire.Write(bw, m); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		a, err := wire.Read(br)
		if err != nil {
			t.Fatalf("%+v: the daemon's answer: %v", m, err)
		}
		var b []byte
		if a.Payload > 0 {
			b = make([]byte, a.Payload)
			if _, err := io.ReadFull(br, b); err != nil {
				t.Fatal(err)
			}
		}
		return a, b
	}
	if a, _ := ask(&wire.Msg{Op: wire.OpHello, Version: wire.Version, Token: "tok"}); a.Op != wire.OpHello {
		t.Fatalf("hello: %+v", a)
	}
	const mib = 1 << 20
	absurd := []struct {
		name             string
		block, off, leng int64
	}{
		{"offset near 2^63", 0, math.MaxInt64 - 10, 100},
		{"offset near 2^63, rest of block", 0, math.MaxInt64 - 10, 0},
		{"offset+length wraps", 1, 10, math.MaxInt64 - 5},
		{"block 2^62 wraps to block 0", 1 << 62, 0, 0},
		{"block 2^62 wraps, a range", 1 << 62, 100, 100},
		{"block 2^43 wraps to 0", 1 << 43, 0, 16},
		{"block MaxInt64", math.MaxInt64, 0, 1},
		{"negative block", -1, 0, 1},
		{"negative offset", 0, -1, 2},
		{"negative length", 0, 0, -1},
		{"MinInt64 length", 0, 5, math.MinInt64},
		{"one past the last block", 4, 0, 1},
		{"past the short block's end", 3, 700, 100},
		{"offset at the block's end", 0, mib, 0},
	}
	for i, a := range absurd {
		m, b := ask(&wire.Msg{Op: wire.OpBlock, Tag: uint64(100 + i), Object: object, ObjectVersion: version,
			Block: a.block, Offset: a.off, Length: a.leng})
		if m.Op != wire.OpError || m.Tag != uint64(100+i) || len(b) != 0 {
			t.Fatalf("%s: answered %+v with %d bytes, want an error", a.name, m, len(b))
		}
		if strings.Contains(m.Message, "internal error") {
			t.Fatalf("%s: the request panicked: %s", a.name, m.Message)
		}
		t.Logf("%s: %s", a.name, m.Message)
	}
	// The node still serves, on the same connection, the right bytes.
	for i, want := range []struct{ block, off, leng int64 }{{0, 0, 0}, {2, 5, 1000}, {3, 0, 0}, {3, 776, 1}} {
		m, b := ask(&wire.Msg{Op: wire.OpBlock, Tag: uint64(i + 1), Object: object, ObjectVersion: version,
			Block: want.block, Offset: want.off, Length: want.leng})
		lo := want.block*mib + want.off
		hi := min((want.block+1)*mib, int64(len(data)))
		if want.leng != 0 {
			hi = lo + want.leng
		}
		if m.Op != wire.OpBlock || m.Tag != uint64(i+1) || !bytes.Equal(b, data[lo:hi]) {
			t.Fatalf("block %d+%d: answered %+v with %d bytes, want bytes %d-%d", want.block, want.off, m, len(b), lo, hi)
		}
	}
	// And a new connection is served too.
	c2, err := net.Dial("tcp", d.TCPAddr())
	if err != nil {
		t.Fatalf("after the absurd requests: %v", err)
	}
	c2.Close()
}
