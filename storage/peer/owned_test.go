package peer

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/storage"
)

// gatedStore is a memStore whose reads wait for open to close, counting
// them: the object store while an owner fetches a block. Each object it
// opens can be paused inside a read of the cluster's (paused, below).
type gatedStore struct {
	memStore
	open   chan struct{}
	reads  atomic.Int64
	flight atomic.Int64
}

// gatedObject is one opened object. Armed, its Size calls after the
// first block until resume closes: the cluster asks an object's size as
// a read begins and again while it takes the block for its owner's
// memory, so an armed object's read stops inside the owner's path.
var _ storage.Reader = (*gatedObject)(nil)

type gatedObject struct {
	memObject
	g      *gatedStore
	armed  bool
	sizes  atomic.Int64
	paused chan struct{}
	resume chan struct{}
}

func (g *gatedStore) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := g.memStore.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &gatedObject{memObject: *r.(*memObject), g: g, paused: make(chan struct{}), resume: make(chan struct{})}, nil
}

func (o *gatedObject) Size() int64 {
	if o.armed && o.sizes.Add(1) == 2 {
		close(o.paused)
		<-o.resume
	}
	return o.memObject.Size()
}

func (o *gatedObject) ReadAt(ctx context.Context, p []byte, off int64) error {
	o.g.reads.Add(1)
	o.g.flight.Add(1)
	defer o.g.flight.Add(-1)
	select {
	case <-o.g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return o.memObject.ReadAt(ctx, p, off)
}

// A reader of a block this node owns that comes while another reader is
// taking the block (between finding it missing and its fetch) waits for
// that one fetch: the object store is read once per block however many
// readers want it at once, as at an epoch's start or after a restart with
// empty memory. A reader that found the block missing and then found it
// reserved by another fetched the whole block again for itself alone (in
// the namespace tests, several whole blocks an epoch on every node).
func TestOwnedBlockFetchedOnce(t *testing.T) {
	const block = 4096
	data := make([]byte, 4*block)
	for i := range data {
		data[i] = byte(i*7 + i>>9)
	}
	g := &gatedStore{memStore: memStore{name: "s3://bkt/owned.bin", data: data}, open: make(chan struct{})}
	c, err := New(g, Options{Peers: []string{"a:1"}, Self: 0, Token: "t", Budget: 1 << 30, Block: block})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	// Two readers of block 1, each through an object of its own (as a
	// job's read and a peer's request are): b is paused inside the
	// owner's path while a comes.
	ra, err := c.Open(ctx, g.name)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := c.Open(ctx, g.name)
	if err != nil {
		t.Fatal(err)
	}
	gb := rb.(*object).Reader.(*gatedObject)
	gb.armed = true
	var wg sync.WaitGroup
	got := [2][]byte{make([]byte, 100), make([]byte, 100)}
	var errs [2]error
	wg.Go(func() { errs[1] = rb.ReadAt(ctx, got[1], block+200) })
	<-gb.paused
	hits := c.mem.Stats().Hits
	wg.Go(func() { errs[0] = ra.ReadAt(ctx, got[0], block+100) })
	// a is at the store, or waiting for b's fetch (a hit on the block
	// being loaded); then b goes on.
	for deadline := time.Now().Add(time.Minute); g.flight.Load() == 0 && c.mem.Stats().Hits == hits; {
		if time.Now().After(deadline) {
			t.Fatal("the second reader neither read the store nor waited for the first")
		}
		time.Sleep(time.Millisecond)
	}
	close(gb.resume)
	// Both reads reach the store or wait on each other before it answers.
	for deadline := time.Now().Add(time.Minute); g.flight.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no reader reached the store")
		}
		time.Sleep(time.Millisecond)
	}
	close(g.open)
	wg.Wait()
	for k, off := range []int{block + 100, block + 200} {
		if errs[k] != nil {
			t.Fatal(errs[k])
		}
		if !bytes.Equal(got[k], data[off:off+100]) {
			t.Fatalf("reader %d: wrong bytes", k)
		}
	}
	if n := g.reads.Load(); n != 1 {
		t.Fatalf("the block was read from the store %d times by two readers at once, want once", n)
	}
}
