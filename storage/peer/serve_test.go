package peer_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/server"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/peer"
)

// A peer's block request whose numbers overflow (an offset near 2^63, a
// block index whose byte offset wraps to 0, negative and huge lengths),
// sent in the peer protocol to a real daemon's TCP port, gets an error;
// the daemon keeps serving, on the same connection, the right bytes.
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
	version := r.Version()
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

	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	pc, err := peer.Dial(dctx, d.TCPAddr(), "tok")
	if err != nil {
		t.Fatalf("a peer's hello: %v", err)
	}
	defer pc.Close()
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
	for _, a := range absurd {
		_, err := pc.Get(dctx, peer.Request{Object: object, Version: version, Block: a.block, Offset: a.off, Length: a.leng})
		var ae *peer.AnswerError
		if !errors.As(err, &ae) {
			t.Fatalf("%s: %v, want an answered error", a.name, err)
		}
		if strings.Contains(ae.Message, "internal error") {
			t.Fatalf("%s: the request panicked: %s", a.name, ae.Message)
		}
		t.Logf("%s: %s", a.name, ae.Message)
	}
	// The node still serves, on the same connection, the right bytes.
	for _, want := range []struct{ block, off, leng int64 }{{0, 0, mib}, {2, 5, 1000}, {3, 0, 777}, {3, 776, 1}} {
		b, err := pc.Get(dctx, peer.Request{Object: object, Version: version, Block: want.block, Offset: want.off, Length: want.leng})
		lo := want.block*mib + want.off
		if err != nil || !bytes.Equal(b, data[lo:lo+want.leng]) {
			t.Fatalf("block %d+%d: %v, %d bytes, want bytes %d-%d", want.block, want.off, err, len(b), lo, lo+want.leng)
		}
	}
	// Another version is refused as changed, not served.
	if _, err := pc.Get(dctx, peer.Request{Object: object, Version: version + "x", Block: 0, Length: 1}); !peer.IsChanged(err) {
		t.Fatalf("another version: %v", err)
	}
	// And a new connection is served too.
	pc2, err := peer.Dial(dctx, d.TCPAddr(), "tok")
	if err != nil {
		t.Fatalf("after the absurd requests: %v", err)
	}
	pc2.Close()
}
