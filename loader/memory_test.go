package loader

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/sampler"
)

// counting is the heap allocator with the bytes it has out counted: the
// memory a daemon's arena would have charged.
type counting struct {
	mu  sync.Mutex
	out int64
}

func (c *counting) Alloc(ctx context.Context, n, align int) ([]byte, error) {
	c.mu.Lock()
	c.out += int64(n)
	c.mu.Unlock()
	return make([]byte, n), nil
}

func (c *counting) Free(b []byte) {
	c.mu.Lock()
	c.out -= int64(len(b))
	c.mu.Unlock()
}

func (c *counting) bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// A loader whose bound is lowered while its consumer takes nothing (busy
// elsewhere: opening other jobs) gives back the memory of the batches it
// read ahead, keeping only what its consumer holds; read again when Next
// comes to them, they hold the right records, each once; raised again,
// it reads ahead again.
func TestSetMemorySheds(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.bin")
	const n, size, batch = 4096, 1024, 64
	if err := synth.WriteFixed(p, n, size, 0); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	alloc := &counting{}
	const one = batch * size
	l, err := New(context.Background(), ds, sampler.Global{N: n, Seed: 3}, Options{BatchSize: batch, MemoryBytes: 32 * one, Prefetch: 16, Alloc: alloc})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := make([]int, n)
	take := func() *Batch {
		b, err := l.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range b.IDs {
			if err := synth.CheckRecord(b.Record(i), id); err != nil {
				t.Fatal(err)
			}
			seen[id]++
		}
		return b
	}
	held := take()
	waitUntil(t, "16 batches read ahead", func() bool { return alloc.bytes() >= 16*one })
	l.SetMemory(2 * one)
	waitUntil(t, "the read-ahead shed", func() bool { return alloc.bytes() <= 2*one })
	if l.Memory() != 2*one {
		t.Fatalf("bound %d, want %d", l.Memory(), 2*one)
	}
	for range 10 {
		b := take()
		held.Release()
		held = b
		if alloc.bytes() > 2*one {
			t.Fatalf("%d bytes out under a bound of %d", alloc.bytes(), 2*one)
		}
	}
	l.SetMemory(32 * one)
	waitUntil(t, "read-ahead again", func() bool { return alloc.bytes() >= 8*one })
	for {
		b, err := l.Next(context.Background())
		if err != nil {
			break
		}
		for i, id := range b.IDs {
			if err := synth.CheckRecord(b.Record(i), id); err != nil {
				t.Fatal(err)
			}
			seen[id]++
		}
		held.Release()
		held = b
	}
	held.Release()
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("record %d delivered %d times", id, k)
		}
	}
}
