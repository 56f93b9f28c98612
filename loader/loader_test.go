package loader_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/alignbuf"
	"github.com/riffle-ml/riffle/internal/mincore"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// drain loads every batch and returns the ids in delivery order, checking
// each record's bytes against the id it claims.
func drain(t *testing.T, l *loader.Loader, check func(b []byte, id int) error) [][]int {
	t.Helper()
	var out [][]int
	for {
		b, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range b.IDs {
			if err := check(b.Record(i), id); err != nil {
				t.Fatalf("epoch %d batch %d record %d: %v", b.Epoch, b.Index, i, err)
			}
		}
		out = append(out, slices.Clone(b.IDs))
		b.Release()
	}
}

func fixedDataset(t *testing.T, n, size, header int, direct bool) dataset.Dataset {
	t.Helper()
	p := filepath.Join(t.TempDir(), "d.bin")
	if err := synth.WriteFixed(p, n, size, header); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size, HeaderBytes: int64(header), Direct: direct}, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	return ds
}

func TestBatchesHoldTheFilesBytes(t *testing.T) {
	for _, c := range []struct {
		name   string
		size   int
		header int
		direct bool
		opts   loader.Options
	}{
		{"fetch order", 100, 0, false, loader.Options{BatchSize: 37}},
		{"ordered", 100, 0, false, loader.Options{BatchSize: 37, Ordered: true}},
		{"depth 1", 64, 0, false, loader.Options{BatchSize: 16, Depth: 1}},
		{"unaligned header direct", 1000, 123, true, loader.Options{BatchSize: 50}},
		{"page records direct", 4096, 0, true, loader.Options{BatchSize: 64, Ordered: true}},
		{"coalesce gap", 48, 7, false, loader.Options{BatchSize: 300, CoalesceGap: 4096}},
		{"tiny memory bound", 512, 0, false, loader.Options{BatchSize: 64, MemoryBytes: 1000, Prefetch: 1}},
		{"drop last", 100, 0, false, loader.Options{BatchSize: 64, DropLast: true}},
		{"three epochs", 100, 0, false, loader.Options{BatchSize: 100, Epochs: 3}},
		// The same with goroutines calling pread instead of io_uring.
		{"threads fetch order", 100, 0, false, loader.Options{BatchSize: 37, NoRing: true}},
		{"threads ordered", 100, 0, false, loader.Options{BatchSize: 37, Ordered: true, NoRing: true}},
		{"threads direct", 1000, 123, true, loader.Options{BatchSize: 50, NoRing: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			const n = 1000
			ds := fixedDataset(t, n, c.size, c.header, c.direct)
			s := sampler.Global{N: n, Seed: 5}
			l, err := loader.New(context.Background(), ds, s, c.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			batches := drain(t, l, synth.CheckRecord)
			epochs := max(1, c.opts.Epochs)
			perEpoch := l.Batches().Count()
			if len(batches) != epochs*perEpoch {
				t.Fatalf("%d batches, want %d", len(batches), epochs*perEpoch)
			}
			for e := range epochs {
				var ids []int
				for b, got := range batches[e*perEpoch : (e+1)*perEpoch] {
					// Membership is exactly the sampler's slice.
					pos, k := l.Batches().Span(b)
					want := sampler.Order(s, e)[pos : pos+k]
					if c.opts.Ordered {
						if !slices.Equal(got, want) {
							t.Fatalf("epoch %d batch %d: ordered batch %v, sampler says %v", e, b, got, want)
						}
					}
					slices.Sort(want)
					g := slices.Sorted(slices.Values(got))
					if !slices.Equal(g, want) {
						t.Fatalf("epoch %d batch %d holds other records than the sampler's slice", e, b)
					}
					ids = append(ids, got...)
				}
				if c.opts.DropLast {
					if len(ids) != n/c.opts.BatchSize*c.opts.BatchSize {
						t.Fatalf("drop_last epoch of %d records", len(ids))
					}
					continue
				}
				slices.Sort(ids)
				for i, id := range ids {
					if id != i {
						t.Fatalf("epoch %d: record %d missing or repeated", e, i)
					}
				}
			}
		})
	}
}

// stride is the order i*Step mod N: no two ids of a short run touch.
type stride struct{ N, Step int }

func (s stride) Len() int { return s.N }
func (s stride) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.N-pos))
	for i := range n {
		dst[i] = (pos + i) * s.Step % s.N
	}
	return n
}

// Records read one per read are laid out in delivery order, packed: the
// batch is one array, viewed without a copy, in its shuffled order.
func TestContiguousFixedBatch(t *testing.T) {
	ds := fixedDataset(t, 100, 24, 0, false)
	l, err := loader.New(context.Background(), ds, stride{100, 7}, loader.Options{BatchSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release()
	if !b.Contiguous() || len(b.Data) != 240 {
		t.Fatalf("fixed-size batch is not one packed array: offs %v, %d bytes", b.Off, len(b.Data))
	}
	if slices.IsSorted(b.IDs) {
		t.Fatalf("batch %v is in file order, not shuffled", b.IDs)
	}
}

// A sequential sampler over adjacent records coalesces a batch into one read.
func TestCoalescing(t *testing.T) {
	ds := fixedDataset(t, 1024, 64, 0, false)
	l, err := loader.New(context.Background(), ds, sampler.Sequential{N: 1024}, loader.Options{BatchSize: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	drain(t, l, synth.CheckRecord)
	if st := l.Stats(); st.Reads != 4 || st.Bytes != 1024*64 {
		t.Fatalf("%d reads of %d bytes for 4 sequential batches, want 4 reads of 65536", st.Reads, st.Bytes)
	}
}

// With O_DIRECT every read is whole pages and no page is read twice within
// a batch, even when records straddle page edges.
// With O_DIRECT, a block shuffle of small records reads every page of the
// file exactly once per epoch, in whole aligned pages, however its blocks
// fall into batches. Without O_DIRECT (or with the page rounding gone) the
// reads would be record-sized and unaligned, which the counts catch.
func TestDirectReadsEachPageOnce(t *testing.T) {
	const size, n = 512, 8000 // 1000 pages of 8 records
	var ds dataset.Dataset
	// tmpfs refuses O_DIRECT and the file silently falls back to the page
	// cache: use a directory whose filesystem takes it.
	for _, dir := range []string{t.TempDir(), "."} {
		d, err := os.MkdirTemp(dir, ".direct-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		p := filepath.Join(d, "d.bin")
		if err := synth.WriteFixed(p, n, size, 0); err != nil {
			t.Fatal(err)
		}
		o, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size, Direct: true}, p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { o.Close() })
		if f, ok := o.Object(0).(*storage.File); ok && f.Direct() {
			ds = o
			break
		}
	}
	if ds == nil {
		t.Skip("no filesystem here takes O_DIRECT (tmpfs?): nothing to test")
	}
	bounds := sampler.BlockBounds(n, func(id int) (int, int64, int) { return 0, int64(id) * size, size }, 4096, 4096, 0)
	smp, err := sampler.NewBlock(bounds, 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Batches of whole pages: a batch that ends inside a page leaves the
	// page's other records to the next batch, which reads the page again.
	l, err := loader.New(context.Background(), ds, smp, loader.Options{BatchSize: 96, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	drain(t, l, synth.CheckRecord)
	st := l.Stats()
	if st.Bytes != size*n {
		t.Fatalf("read %d bytes for a %d-byte file: pages read more than once", st.Bytes, size*n)
	}
	if st.Reads > n*size/4096 {
		t.Fatalf("%d reads for %d pages: not whole pages", st.Reads, n*size/4096)
	}
}

func TestVariableLength(t *testing.T) {
	dir := t.TempDir()
	tf := filepath.Join(dir, "a.tfrecord")
	synth.WriteTFRecord(tf, 500)
	jl := filepath.Join(dir, "a.jsonl")
	synth.WriteLines(jl, "jsonl", 500, false)
	tree := filepath.Join(dir, "tree")
	synth.WriteTree(tree, []string{"a", "b"}, 250)
	for _, c := range []struct {
		path  string
		check func([]byte, int) error
	}{
		{tf, synth.CheckRecord},
		{jl, func(b []byte, id int) error {
			if string(b) != synth.Line("jsonl", id) {
				return fmt.Errorf("line %q", b)
			}
			return nil
		}},
		{tree, synth.CheckRecord},
	} {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			ds, err := dataset.Open(context.Background(), dataset.Options{}, c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			l, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len(), Seed: 2}, loader.Options{BatchSize: 64})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(c.path) == "tree" {
				for i, id := range b.IDs {
					if b.Labels[i] != id/250 {
						t.Fatalf("record %d labelled %d", id, b.Labels[i])
					}
				}
			}
			b.Release()
			n := len(drain(t, l, c.check))
			if n != 7 {
				t.Fatalf("%d more batches, want 7", n)
			}
		})
	}
}

// A loader started from a saved State delivers exactly the batches the
// first one would have delivered next.
func TestResume(t *testing.T) {
	ds := fixedDataset(t, 500, 32, 0, false)
	s := sampler.Global{N: 500, Seed: 11}
	opts := loader.Options{BatchSize: 30, Epochs: 3, Ordered: true}
	l, err := loader.New(context.Background(), ds, s, opts)
	if err != nil {
		t.Fatal(err)
	}
	all := drain(t, l, synth.CheckRecord)
	l.Close()
	for _, stop := range []int{0, 5, 16, 17, 40} {
		l, err := loader.New(context.Background(), ds, s, opts)
		if err != nil {
			t.Fatal(err)
		}
		for range stop {
			b, err := l.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
		}
		st := l.State()
		l.Close()
		o := opts
		o.Epoch, o.Batch, o.Epochs = st.Epoch, st.Batch, opts.Epochs-st.Epoch
		r, err := loader.New(context.Background(), ds, s, o)
		if err != nil {
			t.Fatal(err)
		}
		rest := drain(t, r, synth.CheckRecord)
		r.Close()
		if len(rest) != len(all)-stop {
			t.Fatalf("resumed after %d batches (state %+v): %d batches, want %d", stop, st, len(rest), len(all)-stop)
		}
		for i := range rest {
			if !slices.Equal(rest[i], all[stop+i]) {
				t.Fatalf("resumed after %d batches: batch %d differs", stop, i)
			}
		}
	}
}

// faulty wraps a dataset's first object with fault injection.
type faulty struct {
	dataset.Dataset
	f *storage.Faulty
}

func (d faulty) Object(i int) storage.Reader { return d.f }

func TestReadErrorNamesFileAndOffset(t *testing.T) {
	ds := fixedDataset(t, 1000, 100, 0, false)
	bad := int64(617 * 100)
	f := &storage.Faulty{Reader: ds.Object(0), Inject: func(off int64, n int) error {
		if off <= bad && bad < off+int64(n) {
			return syscall.EIO
		}
		return nil
	}}
	l, err := loader.New(context.Background(), faulty{ds, f}, sampler.Global{N: 1000, Seed: 1}, loader.Options{BatchSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for {
		b, err := l.Next(context.Background())
		if err == nil {
			if slices.Contains(b.IDs, 617) {
				t.Fatal("a batch holding the failed record was delivered")
			}
			b.Release()
			continue
		}
		var se *storage.Error
		if !errors.Is(err, syscall.EIO) || !errors.As(err, &se) || se.Object != ds.Info().Paths[0] || se.Offset != bad {
			t.Fatalf("error %v: want EIO naming %s at %d", err, ds.Info().Paths[0], bad)
		}
		if _, again := l.Next(context.Background()); again == nil {
			t.Fatal("loader went on after an error")
		}
		return
	}
}

func TestFileShrinksUnderLoader(t *testing.T) {
	for _, noRing := range []bool{false, true} {
		t.Run(fmt.Sprint("noring=", noRing), func(t *testing.T) { fileShrinks(t, noRing) })
	}
}

func fileShrinks(t *testing.T, noRing bool) {
	ds := fixedDataset(t, 1000, 100, 0, false)
	path := ds.Info().Paths[0]
	l, err := loader.New(context.Background(), ds, sampler.Global{N: 1000, Seed: 1}, loader.Options{BatchSize: 100, Prefetch: 1, Depth: 1, NoRing: noRing})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	if err := os.Truncate(path, 100*10); err != nil {
		t.Fatal(err)
	}
	for {
		b, err := l.Next(context.Background())
		if err == nil {
			b.Release()
			continue
		}
		// Past the new end the file is shorter; below it, not as it
		// was opened (storage/changed.go).
		var se *storage.Error
		if !errors.As(err, &se) || se.Object != path ||
			!(errors.Is(err, storage.ErrShrunk) && se.Offset+int64(se.Len) > 1000 || errors.Is(err, storage.ErrChanged) && se.Offset < 1000) {
			t.Fatalf("error %v: want ErrShrunk naming %s past offset 1000, or ErrChanged below it", err, path)
		}
		return
	}
}

func TestTFRecordCRCOnRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.tfrecord")
	synth.WriteTFRecord(p, 100)
	b, _ := os.ReadFile(p)
	b[len(b)-10] ^= 1 // inside the last record's data
	os.WriteFile(p, b, 0o644)
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	l, err := loader.New(context.Background(), ds, sampler.Sequential{N: 100}, loader.Options{BatchSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Next(context.Background())
	var fe *dataset.FormatError
	if !errors.Is(err, dataset.ErrCRC) || !errors.As(err, &fe) || fe.Path != p {
		t.Fatalf("error %v: want a CRC error naming %s", err, p)
	}
}

// Cancelling the context stops a loader stuck on slow reads promptly.
func TestCancel(t *testing.T) {
	ds := fixedDataset(t, 1000, 100, 0, false)
	// Each read says it started, then holds until the loader is cancelled.
	reading := make(chan struct{})
	var once sync.Once
	ctx, cancel := context.WithCancel(context.Background())
	f := &storage.Faulty{Reader: ds.Object(0), Inject: func(int64, int) error {
		once.Do(func() { close(reading) })
		<-ctx.Done()
		return ctx.Err()
	}}
	l, err := loader.New(ctx, faulty{ds, f}, sampler.Global{N: 1000}, loader.Options{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() {
		_, err := l.Next(context.Background())
		done <- err
	}()
	<-reading // a read is under way, held by its delay: cancel it
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Next returned a batch after cancel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Next did not return after cancel")
	}
	l.Close()
}

func TestNextHonoursItsContext(t *testing.T) {
	ds := fixedDataset(t, 100, 100, 0, false)
	f := &storage.Faulty{Reader: ds.Object(0), Delay: 200 * time.Millisecond}
	l, err := loader.New(context.Background(), faulty{ds, f}, sampler.Sequential{N: 100}, loader.Options{BatchSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := l.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with an expired context: %v", err)
	}
	// The batch it gave up on is still delivered next time.
	b, err := l.Next(context.Background())
	if err != nil || b.Index != 0 {
		t.Fatalf("after a timeout: batch %v, %v", b, err)
	}
	b.Release()
}

// A batch kept by the consumer is not overwritten by later batches.
func TestHeldBatchUnchanged(t *testing.T) {
	ds := fixedDataset(t, 2000, 64, 0, false)
	l, err := loader.New(context.Background(), ds, sampler.Global{N: 2000, Seed: 3}, loader.Options{BatchSize: 100, Prefetch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	held, err := l.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snapshot := slices.Clone(held.Data)
	drain(t, l, synth.CheckRecord)
	if !slices.Equal(snapshot, held.Data) {
		t.Fatal("a held batch changed")
	}
	for i, id := range held.IDs {
		if err := synth.CheckRecord(held.Record(i), id); err != nil {
			t.Fatal(err)
		}
	}
	held.Release()
}

func TestSteadyStateAllocations(t *testing.T) {
	ds := fixedDataset(t, 4096, 64, 0, false)
	l, err := loader.New(context.Background(), ds, sampler.Global{N: 4096}, loader.Options{BatchSize: 256, Epochs: -1, Depth: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for range 50 { // warm the pools
		b, _ := l.Next(context.Background())
		b.Release()
	}
	allocs := testing.AllocsPerRun(200, func() {
		b, err := l.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	})
	// The planner allocates one channel per batch; nothing per record.
	if allocs > 8 {
		t.Fatalf("%.1f allocations per batch of 256 records", allocs)
	}
}

// Opportunistic ordering: every record once per epoch, each batch full
// size and made of records of its window, bytes right.
func TestOpportunistic(t *testing.T) {
	for _, noRing := range []bool{false, true} {
		ds := fixedDataset(t, 1000, 64, 0, false)
		s := sampler.Global{N: 1000, Seed: 4}
		const w, size = 3, 64
		l, err := loader.New(context.Background(), ds, s, loader.Options{BatchSize: size, Opportunistic: w, Epochs: 2, NoRing: noRing})
		if err != nil {
			t.Fatal(err)
		}
		var held []*loader.Batch
		per := l.Batches().Count()
		n := 0
		ids := map[int]int{}
		for {
			b, err := l.Next(context.Background())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			pos, k := l.Batches().Span(b.Index)
			if len(b.IDs) != k {
				t.Fatalf("batch %d: %d records, want %d", b.Index, len(b.IDs), k)
			}
			// Its records come from its window of the sampler's order.
			wlo := b.Index / w * w
			lo, _ := l.Batches().Span(wlo)
			hiPos, hiN := l.Batches().Span(min(wlo+w, per) - 1)
			window := sampler.Order(s, b.Epoch)[lo : hiPos+hiN]
			for i, id := range b.IDs {
				if !slices.Contains(window, id) {
					t.Fatalf("batch %d holds %d from outside its window (pos %d)", b.Index, id, pos)
				}
				if err := synth.CheckRecord(b.Record(i), id); err != nil {
					t.Fatal(err)
				}
				ids[b.Epoch*10000+id]++
			}
			n++
			held = append(held, b)
			if len(held) > 4 { // release out of order, a little late
				held[1].Release()
				held = append(held[:1], held[2:]...)
			}
		}
		for _, b := range held {
			b.Release()
		}
		l.Close()
		if n != 2*per || len(ids) != 2000 {
			t.Fatalf("%d batches, %d distinct (epoch, id); want %d and 2000", n, len(ids), 2*per)
		}
		for k, c := range ids {
			if c != 1 {
				t.Fatalf("epoch %d record %d came %d times", k/10000, k%10000, c)
			}
		}
	}
}

// countingAlloc tracks the bytes of live batch buffers.
type countingAlloc struct {
	loader.Pool
	mu         sync.Mutex
	live, peak int
}

func (a *countingAlloc) Alloc(ctx context.Context, n, align int) ([]byte, error) {
	a.mu.Lock()
	a.live += n
	a.peak = max(a.peak, a.live)
	a.mu.Unlock()
	return a.Pool.Alloc(ctx, n, align)
}

func (a *countingAlloc) Free(b []byte) {
	a.mu.Lock()
	a.live -= len(b)
	a.mu.Unlock()
	a.Pool.Free(b)
}

// The loader reads ahead only while the buffers of batches in flight and
// held by the consumer fit in MemoryBytes.
func TestMemoryBound(t *testing.T) {
	ds := fixedDataset(t, 4000, 100, 0, false)
	alloc := &countingAlloc{}
	const batch = 100 * 100
	l, err := loader.New(context.Background(), ds, sampler.Global{N: 4000}, loader.Options{BatchSize: 100, MemoryBytes: 3 * batch, Alloc: alloc})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var held []*loader.Batch
	for {
		b, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, b)
		if len(held) == 2 { // the consumer keeps two batches at a time
			held[0].Release()
			held = held[1:]
		}
		time.Sleep(time.Millisecond) // let the loader run ahead as far as it may
	}
	for _, b := range held {
		b.Release()
	}
	if alloc.peak > 3*batch {
		t.Fatalf("%d bytes of batches alive at once, the bound is %d", alloc.peak, 3*batch)
	}
	if alloc.peak < 3*batch {
		t.Fatalf("the loader never read ahead to its bound (peak %d bytes)", alloc.peak)
	}
}

// A batch whose records are all empty has nothing to read: it completes
// all the same (a text file of blank lines).
func TestBatchWithNothingToRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "blank.txt")
	if err := os.WriteFile(p, []byte(strings.Repeat("\n", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{Format: "text"}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	l, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len(), Seed: 1}, loader.Options{BatchSize: 16, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	for {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n += len(b.IDs)
		b.Release()
	}
	if n != 100 {
		t.Fatalf("%d records of 100", n)
	}
}

// Lines read in order are one read a batch: a line's newline is a gap of
// a byte between neighbouring records, which a read spans (neighbourGap).
// Without it each line was a read of its own (2M preadv2 for 2M lines),
// the sequential order 3-4x slower than the device. A global shuffle of
// the same lines still reads each alone, and every record is its bytes.
func TestLinesInOrderAreOneReadABatch(t *testing.T) {
	const n, batch = 4096, 256
	for _, kind := range []string{"jsonl", "libsvm", "csv"} {
		ds, p := linesDataset(t, kind, "d."+kind, n)
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		bytesOf := func(b []byte, id int) error {
			loc := ds.Locate(id)
			if want := raw[loc.Off : loc.Off+int64(loc.Len)]; string(b) != string(want) {
				return fmt.Errorf("record %d is %q, want %q", id, b, want)
			}
			return nil
		}
		for _, smp := range []sampler.Sampler{sampler.Sequential{N: ds.Len()}, sampler.Global{N: ds.Len(), Seed: 3}} {
			l, err := loader.New(context.Background(), ds, smp, loader.Options{BatchSize: batch, Epochs: 1})
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for _, ids := range drain(t, l, bytesOf) {
				seen += len(ids)
			}
			st := l.Stats()
			l.Close()
			if seen != ds.Len() {
				t.Fatalf("%s %T: %d records in the epoch, want %d", kind, smp, seen, ds.Len())
			}
			batches := int64((ds.Len() + batch - 1) / batch)
			if _, global := smp.(sampler.Global); global && st.Reads < int64(ds.Len())/2 {
				t.Fatalf("%s: a global shuffle made %d reads of %d lines: records read together that are not neighbours", kind, st.Reads, ds.Len())
			} else if !global && st.Reads > batches+1 {
				t.Fatalf("%s: the sequential order made %d reads for %d batches of lines", kind, st.Reads, batches)
			}
		}
	}
}

// A loader asked to read some records past the page cache (PastCache)
// reads each once an epoch with its bytes, leaves the pages of those it
// read past the cache each epoch out of the cache and the others' in it, and asks only of records read alone whose reads O_DIRECT takes
// (here 4 KiB records, aligned; not the 2 KiB ones, which share pages).
func TestPastCache(t *testing.T) {
	for _, size := range []int{4096, 2048} {
		const n = 512
		ds := fixedDataset(t, n, size, 0, false)
		f, ok := ds.Object(0).(*storage.File)
		if !ok || !storage.CanPastCache(f, alignbuf.Make(storage.DirectAlign, storage.DirectAlign), 0) {
			t.Skip("the file system under the test's files refuses O_DIRECT (tmpfs?): nothing reads past the cache")
		}
		// Written pages are dirty until written back; clean ones drop.
		if err := syscall.Fdatasync(f.Fd()); err != nil {
			t.Fatal(err)
		}
		if err := f.Drop(0, 0); err != nil {
			t.Fatal(err)
		}
		var asked atomic.Int64
		var mu sync.Mutex
		passed := map[int]int{} // each record's reads past the cache
		past := func(e int, ids []int, past []bool) {
			asked.Add(int64(len(ids)))
			mu.Lock()
			defer mu.Unlock()
			for i, id := range ids {
				past[i] = id%2 == 0
				if past[i] {
					passed[id]++
				}
			}
		}
		l, err := loader.New(context.Background(), ds, sampler.Global{N: n, Seed: 4}, loader.Options{BatchSize: 32, Epochs: 2, PastCache: past})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[[2]int]int{}
		for _, b := range drain(t, l, synth.CheckRecord) {
			for _, id := range b {
				seen[[2]int{0, id}]++
			}
		}
		l.Close()
		for id := range n {
			if seen[[2]int{0, id}] != 2 {
				t.Fatalf("%d-byte records: record %d delivered %d times in two epochs", size, id, seen[[2]int{0, id}])
			}
		}
		cached, err := mincore.Fd(f.Fd(), f.Size())
		if err != nil {
			t.Fatal(err)
		}
		if size == 2048 {
			if asked.Load() != 0 {
				t.Fatalf("2048-byte records: asked %d times of records that share their pages", asked.Load())
			}
			continue
		}
		// A record read with its neighbour (one read of both pages) is
		// not asked, and reads through the cache.
		if asked.Load() == 0 || len(passed) == 0 {
			t.Fatalf("4096-byte records: asked %d times, %d records passed", asked.Load(), len(passed))
		}
		for id := range n {
			if every := passed[id] == 2; cached[id] == every {
				t.Fatalf("record %d (read past the cache in %d of 2 epochs): its page cached %v", id, passed[id], cached[id])
			}
		}
	}
}
