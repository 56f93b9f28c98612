package loader_test

import (
	"context"
	"errors"
	"io"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
)

// Staged samplers read forward, in large runs, and shuffle in memory:
// every record once per epoch with its bytes, in the sampler's order, and
// storage sees a few large reads (OneAccess §3), not one read per record.
func TestStagedSamplersReadForward(t *testing.T) {
	const n, size = 4000, 256
	ds := fixedDataset(t, n, size, 0, false)
	for _, s := range []sampler.Sampler{
		&sampler.Reservoir{N: n, Size: 1000, Seed: 3},
		&sampler.Buffered{N: n, Buffer: 500, Seed: 3, Chunk: 400},
	} {
		t.Run(typeName(s), func(t *testing.T) {
			l, err := loader.New(context.Background(), ds, s, loader.Options{BatchSize: 64, Ordered: true, Epochs: 2, CoalesceGap: 4096})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			batches := drain(t, l, synth.CheckRecord)
			var got []int
			for _, b := range batches {
				got = append(got, b...)
			}
			want := append(sampler.Order(s, 0), sampler.Order(s, 1)...)
			if !slices.Equal(got, want) {
				t.Fatal("the loader's order differs from the sampler's")
			}
			st := l.Stats()
			if st.CacheHits < 2*n*9/10 {
				t.Fatalf("%d of %d records came from memory; the rest were read at random", st.CacheHits, 2*n)
			}
			if st.Staged < 2*n*size*9/10 || st.Reads > 2*n/10 {
				t.Fatalf("%d bytes staged and %d records read one by one, of %d records", st.Staged, st.Reads, 2*n)
			}
		})
	}
}

func typeName(s sampler.Sampler) string {
	switch s.(type) {
	case *sampler.Reservoir:
		return "reservoir"
	case *sampler.Buffered:
		return "buffered"
	}
	return "other"
}

// A loader resumed from any State delivers exactly the batches the
// uninterrupted one would have, for every sampler kind, the stream
// samplers' saved state included.
func TestResumeEverySampler(t *testing.T) {
	const n = 700
	ds := fixedDataset(t, n, 32, 0, false)
	locate := func(id int) (int, int64, int) { return 0, int64(id * 32), 32 }
	rapid.Check(t, func(t *rapid.T) {
		kind := rapid.SampledFrom(sampler.Kinds).Draw(t, "kind")
		cfg := sampler.Config{Kind: kind, Seed: rapid.Uint64().Draw(t, "seed"), BlockSize: 512, Window: rapid.IntRange(1, 3).Draw(t, "window"),
			Buffer: rapid.IntRange(1, 900).Draw(t, "buffer"), Reservoir: rapid.IntRange(1, 900).Draw(t, "reservoir")}
		build := func() sampler.Sampler {
			s, _, err := cfg.Build(n, locate)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		opts := loader.Options{BatchSize: rapid.IntRange(1, 100).Draw(t, "batch"), Epochs: 2, Seed: 5}
		all := drainT(t, mustLoader(t, ds, build(), opts))
		stop := rapid.IntRange(0, len(all)).Draw(t, "stop")
		l := mustLoader(t, ds, build(), opts)
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
		o.Epoch, o.Batch, o.SamplerState, o.Epochs = st.Epoch, st.Batch, st.Sampler, opts.Epochs-st.Epoch
		if o.Epochs == 0 {
			return
		}
		rest := drainT(t, mustLoader(t, ds, build(), o))
		if len(rest) != len(all)-stop {
			t.Fatalf("%s: resumed after %d batches: %d batches, want %d", kind, stop, len(rest), len(all)-stop)
		}
		for i := range rest {
			if !slices.Equal(rest[i], all[stop+i]) {
				t.Fatalf("%s: resumed after %d batches: batch %d differs", kind, stop, i)
			}
		}
	})
}

// An opportunistic window resumes exactly from a state saved inside it,
// for an order that is a function of position and for a shared (stream)
// one: the sampler took the window whole, so a stream's state lies at the
// window's end, and the window is loaded again less what was delivered
// (a stream's state used to be refused as past the next batch, and keeps
// the order of the window's records, or a window after the first lost or
// repeated records).
func TestResumeOpportunistic(t *testing.T) {
	const n = 1000
	ds := fixedDataset(t, n, 64, 0, false)
	orders := map[string]func(seed uint64) sampler.Sampler{
		"global": func(uint64) sampler.Sampler { return sampler.Global{N: n, Seed: 8} },
		"shared": func(seed uint64) sampler.Sampler {
			m, _ := share.NewGroup(share.Options{Records: n, Seed: seed}).Join(nil, 0)
			return m
		},
	}
	for name, order := range orders {
		for _, stop := range []int{1, 2, 3, 4, 5, 6, 7, 15} {
			opts := loader.Options{BatchSize: 64, Opportunistic: 3}
			l := mustLoader(t, ds, order(3), opts)
			seen := map[int]int{}
			for range stop {
				b, err := l.Next(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				for _, id := range b.IDs {
					seen[id]++
				}
				b.Release()
			}
			st := l.State()
			l.Close()
			opts.Epoch, opts.Batch, opts.Skip, opts.SamplerState = st.Epoch, st.Batch, st.Skip, st.Sampler
			for _, b := range drainT(t, mustLoader(t, ds, order(4), opts)) {
				for _, id := range b {
					seen[id]++
				}
			}
			for id := range n {
				if seen[id] != 1 {
					t.Fatalf("%s, stopped after %d batches: record %d came %d times", name, stop, id, seen[id])
				}
			}
		}
	}
}

// Inside a batch, each record's place is uniform: a chi-square test of
// (record, slot) counts over many epochs of a block order, whose sampler
// order puts a block's records side by side.
func TestBatchOrderUniform(t *testing.T) {
	const n, bsz, epochs = 64, 8, 600
	ds := fixedDataset(t, n, 512, 0, false)
	bounds := sampler.BlockBounds(n, func(id int) (int, int64, int) { return 0, int64(id * 512), 512 }, 4096, 4096, 0)
	blk, err := sampler.NewBlock(bounds, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]float64, n*bsz)
	l := mustLoader(t, ds, blk, loader.Options{BatchSize: bsz, Epochs: epochs, Seed: 9})
	for _, b := range drainT(t, l) {
		for slot, id := range b {
			counts[id*bsz+slot]++
		}
	}
	exp := float64(epochs) / bsz
	chi := 0.0
	for _, c := range counts {
		chi += (c - exp) * (c - exp) / exp
	}
	df := float64(n * (bsz - 1))
	if z := (math.Cbrt(chi/df) - (1 - 2/(9*df))) / math.Sqrt(2/(9*df)); z > 5 {
		t.Fatalf("chi-square %.0f over %v degrees of freedom: places inside batches are not uniform", chi, df)
	}
}

// tb is what the helpers need of *testing.T and *rapid.T.
type tb interface {
	Fatal(...any)
	Fatalf(string, ...any)
}

func mustLoader(t tb, ds dataset.Dataset, s sampler.Sampler, o loader.Options) *loader.Loader {
	l, err := loader.New(context.Background(), ds, s, o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// drainT loads every batch, checks each record's bytes, closes the loader
// and returns the ids of each batch in delivery order.
func drainT(t tb, l *loader.Loader) [][]int {
	defer l.Close()
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
			if err := synth.CheckRecord(b.Record(i), id); err != nil {
				t.Fatalf("epoch %d batch %d record %d: %v", b.Epoch, b.Index, i, err)
			}
		}
		out = append(out, slices.Clone(b.IDs))
		b.Release()
	}
}

// Loaders with a batch stride (DataLoader workers) split an epoch without
// padding it: interleaved round-robin, as DataLoader takes from its
// workers, they deliver exactly the batches one loader would, for any
// number of workers, and each resumes from its own State.
func TestBatchStride(t *testing.T) {
	const n = 1001
	ds := fixedDataset(t, n, 32, 0, false)
	s := sampler.Global{N: n, Seed: 3}
	base := loader.Options{BatchSize: 64, Epochs: 2, Seed: 1}
	want := drainT(t, mustLoader(t, ds, s, base))
	for workers := 1; workers <= 4; workers++ {
		var per [][][]int
		for w := range workers {
			o := base
			o.BatchStride, o.BatchOffset = workers, w
			l := mustLoader(t, ds, s, o)
			if w == 0 && l.Count() != (16+workers-1)/workers {
				t.Fatalf("%d workers: worker 0 delivers %d batches an epoch", workers, l.Count())
			}
			per = append(per, drainT(t, l))
		}
		var got [][]int
		for e := range 2 {
			for b := range 16 {
				w := b % workers
				k := e*((16-w+workers-1)/workers) + b/workers
				got = append(got, per[w][k])
			}
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("%d workers: batch %d differs from one loader's", workers, i)
			}
		}
	}
	// A worker with no batch in an epoch (more workers than batches) has
	// none in any: its loader ends, over every epoch to come too.
	none := base
	none.BatchSize, none.Epochs, none.BatchStride, none.BatchOffset = 2*n, -1, 2, 1
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang, not a time asserted
	defer cancel()
	nl := mustLoader(t, ds, s, none)
	b, err := nl.Next(ctx)
	nl.Close()
	if !errors.Is(err, io.EOF) {
		t.Fatalf("a part with no batch of its own: batch %v, error %v, want io.EOF", b, err)
	}
	// A worker resumes from its own State.
	o := base
	o.BatchStride, o.BatchOffset = 3, 1
	l := mustLoader(t, ds, s, o)
	all := drainT(t, l)
	l = mustLoader(t, ds, s, o)
	for range 4 {
		b, _ := l.Next(context.Background())
		b.Release()
	}
	st := l.State()
	l.Close()
	r := o
	r.Epoch, r.Batch, r.Epochs = st.Epoch, st.Batch, o.Epochs-st.Epoch
	rest := drainT(t, mustLoader(t, ds, s, r))
	if len(rest) != len(all)-4 || !slices.Equal(rest[0], all[4]) {
		t.Fatalf("a strided loader resumed at %+v: %d batches, want %d", st, len(rest), len(all)-4)
	}
}
