package loader_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// A block order's window spreads each block's records over as many
// batches; the loader loads the window's batches as one, so each block is
// one read (not a read per record, or per batch that takes some of it),
// and cuts the batches in the order's own order: every batch is the
// order's, as an ungathered loader (a stride, which turns gathering off)
// delivers it, and a loader resumed at any batch, inside a window too,
// delivers the rest of the same batches.
func TestGatheredBlockWindows(t *testing.T) {
	const n, size = 6000, 128 // 4096-byte blocks of 32 records; windows of 8 blocks, 256 records
	ds := fixedDataset(t, n, size, 0, false)
	bounds := sampler.BlockBounds(n, func(id int) (int, int64, int) { return 0, int64(id) * size, size }, 4096, 4096, 0)
	smp, err := sampler.NewBlock(bounds, 5, 8)
	if err != nil {
		t.Fatal(err)
	}
	for _, batch := range []int{32, 30} { // windows of whole batches, and batches that straddle two windows
		gathered(t, ds, smp, loader.Options{BatchSize: batch, Epochs: 2})
	}
}

func gathered(t *testing.T, ds dataset.Dataset, smp *sampler.Block, opts loader.Options) {
	const n, size = 6000, 128
	batch := opts.BatchSize
	l, err := loader.New(context.Background(), ds, smp, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	all := drain(t, l, synth.CheckRecord)
	st := l.Stats()
	// The order's batches, as the sampler gives them.
	var want [][]int
	for e := range 2 {
		order := sampler.Order(smp, e)
		for p := 0; p < n; p += batch {
			want = append(want, order[p:min(n, p+batch)])
		}
	}
	if len(all) != len(want) {
		t.Fatalf("%d batches, want %d", len(all), len(want))
	}
	for i := range want {
		if !slices.Equal(all[i], want[i]) {
			t.Fatalf("batch %d is not the order's: %v, want %v", i, all[i][:4], want[i][:4])
		}
	}
	// One read a block an epoch, and a few for the records of the next
	// window that a window's last batch takes; no byte read twice but
	// those.
	blocks := int64(smp.Blocks())
	t.Logf("batch %d: %d reads of %d bytes for 2 epochs of %d blocks (%d bytes)", batch, st.Reads, st.Bytes, blocks, n*size)
	if st.Reads > 2*(blocks+blocks/8*int64(batch)) || st.Bytes > int64(2*(n*size+n/256*batch*size)) {
		t.Fatalf("%d reads of %d bytes for 2 epochs of %d blocks (%d bytes): not read by the block", st.Reads, st.Bytes, blocks, n*size)
	}
	// Ungathered (strided: one loader of two takes every other batch),
	// a block is read once for each batch that takes part of it.
	o := opts
	o.BatchStride, o.Epochs = 2, 1
	s, err := loader.New(context.Background(), ds, smp, o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	drain(t, s, synth.CheckRecord)
	per := s.Stats()
	if per.Reads < 2*blocks {
		t.Fatalf("an ungathered half epoch made %d reads of %d blocks: the comparison shows nothing", per.Reads, blocks)
	}
	for _, stop := range []int{1, 7, 8, 9, 57, len(want)/2 - 1, len(want) / 2, len(want) - 1} {
		r := opts
		per := len(want) / 2
		r.Epoch, r.Batch, r.Epochs = stop/per, stop%per, 2-stop/per
		l, err := loader.New(context.Background(), ds, smp, r)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		rest := drain(t, l, synth.CheckRecord)
		if len(rest) != len(want)-stop {
			t.Fatalf("resumed at batch %d: %d batches, want %d", stop, len(rest), len(want)-stop)
		}
		for i := range rest {
			if !slices.Equal(rest[i], want[stop+i]) {
				t.Fatalf("resumed at batch %d: batch %d differs", stop, stop+i)
			}
		}
	}
}

// A gathered window weighs its records' bookkeeping as well as their
// bytes (of small records it is most of what the window holds), so the
// buffers in flight stay within the memory less it: a loader that weighed
// only bytes held 305 MB live in 128 MiB of memory.
func TestGatheredWindowsWeighTheirBookkeeping(t *testing.T) {
	const n, size, batch = 6000, 128, 32 // 4096-byte blocks of 32 records; windows of 8 blocks, 256 records
	ds := fixedDataset(t, n, size, 0, false)
	bounds := sampler.BlockBounds(n, func(id int) (int, int64, int) { return 0, int64(id) * size, size }, 4096, 4096, 0)
	smp, err := sampler.NewBlock(bounds, 5, 8)
	if err != nil {
		t.Fatal(err)
	}
	const window = 256
	memory := int64(3*(window+batch)) * (size + loader.RecordMeta)
	if !loader.GatherFits(window, batch, size, memory) || loader.GatherFits(window, batch, size, memory-1) {
		t.Fatalf("GatherFits does not ask for three windows and batches with their bookkeeping in %d bytes", memory)
	}
	alloc := &countingAlloc{}
	l, err := loader.New(context.Background(), ds, smp, loader.Options{BatchSize: batch, MemoryBytes: memory, Alloc: alloc, Prefetch: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for {
		b, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Microsecond) // let the loader run ahead as far as it may
		b.Release()
	}
	// What the buffers may hold: the memory less each window's bookkeeping.
	bound := int(memory * size / (size + loader.RecordMeta))
	t.Logf("peak %d bytes of buffers in %d bytes of memory (bound %d)", alloc.peak, memory, bound)
	if alloc.peak > bound {
		t.Fatalf("%d bytes of buffers alive at once in %d bytes of memory: the windows' bookkeeping is not weighed (bound %d)", alloc.peak, memory, bound)
	}
}
