package order

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/quality"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// The cheapest order that reaches a requested randomness (sampler "auto").
// Data the page cache can keep (at most half the memory) is read in the
// global shuffle: every order reads it from memory after its first epoch.
// DeepIO's randomization level (deepio.txt §III-C; quality.RL) prices an
// order's randomness and LIRS (lirs.txt §5) the epochs a partial shuffle
// costs; what an order costs the device is its reads. A model of those
// (a device's rate by read size, and a block order's reads as whole
// blocks) was tried first and was wrong by 2.5x: a block order's window
// spreads each block over as many batches, so a batch reads a share of
// each block, not a block, and how much the device gains from such nearby
// reads no read-size curve says. So each candidate order is measured as
// it reads: the job's own loader over the dataset's files opened with
// O_DIRECT (the page cache does not answer), for a moment each, once per
// process. The order picked is the fastest of the global shuffle and the
// block orders whose RL reaches min_randomness and whose window fits in
// the job's memory (memory_bytes); see minMix for why RL alone is not
// enough, and why no buffered order.

// probeTime is how long each candidate order is read.
const probeTime = 150 * time.Millisecond

// minMix is the fewest blocks a block order's window may hold (unless
// the dataset has fewer): a batch's records come from its window's blocks,
// and over data sorted by label, time or source a batch of a few regions
// is a biased sample however random the order's RL says it is. On the
// label-sorted training check (200,000 examples, 40 MB), a block order of
// 8 MiB blocks in windows of 2 has RL 0.938 and reached 0.58 accuracy in
// 20 epochs, a buffered order of 65,536 records RL 0.900 and 0.52; 1 MiB
// blocks in windows of 16, RL 0.909, reached 0.883, the global shuffle's
// 0.885. RL counts orders, not the regions a batch mixes: auto asks both.
const minMix = 16

// Auto is the order sampler auto chose (wire.AutoOrder): a sampler kind
// and its block size and window, its randomization level, and the
// records per second it and a sequential read were measured at.
type Auto = wire.AutoOrder

// candidates are the orders auto weighs for n records of total bytes:
// the global shuffle, and for each block size the smallest window of at
// least minMix blocks whose RL reaches minRL and whose window fits in
// memory three times over: the loader reads a block order's windows
// whole, each block one read, the next while the last is delivered
// (loader.GatherFits).
//
// blocksOf is how many blocks the dataset's records make for a block size
// (its BlockBounds): a block ends at the first page-edge record end past
// the size, which lines of text seldom reach, so theirs grow to the span,
// four times the size, and a window's bytes are its blocks' own.
func candidates(n int, total int64, minRL float64, memory int64, blocksOf func(size int) int) []Auto {
	mean := max(1, total/int64(max(n, 1)))
	out := []Auto{{Sampler: "global", RL: 1}}
	for b := 8 << 10; b <= 16<<20 && int64(b) <= total; b *= 2 {
		if int64(b) < 2*mean {
			continue // a block holds at least two records, or it is the global order
		}
		blocks := max(1, blocksOf(b))
		for w := min(minMix, blocks); w <= loader.MaxWindow && loader.GatherFits(int64(n)*int64(w)/int64(blocks), loader.DefaultBatchSize, mean, memory); w *= 2 {
			if rl := quality.BlockRL(n, blocks, w); rl >= minRL {
				out = append(out, Auto{Sampler: "block", BlockSize: b, Window: w, RL: rl})
				break
			}
			if w >= blocks {
				break
			}
		}
	}
	return out
}

// choose is the candidate of the highest rate (measure says each's
// records per second), the higher RL on a tie within 1%.
func choose(cands []Auto, measure func(Auto) (float64, error)) (Auto, error) {
	var best Auto
	for i, a := range cands {
		r, err := measure(a)
		if err != nil {
			return Auto{}, err
		}
		a.Rate = r
		if i == 0 || a.Rate > best.Rate*1.01 || (a.Rate >= best.Rate*0.99 && a.RL > best.RL) {
			best = a
		}
	}
	return best, nil
}

// ChooseOrder is sampler auto's choice for ds: of the candidates, the
// order ds's files are read fastest in, cold, as measured now (each
// dataset and setting once per process).
//
// Files of at most cached bytes (a job passes half the memory it may use)
// count as kept by the page cache.
func ChooseOrder(ctx context.Context, ds dataset.Dataset, minRL float64, memory int64, batch int, cached int64) (Auto, error) {
	inf := ds.Info()
	if _, ok := ds.(dataset.Blocker); ok {
		return Auto{}, specErr("sampler auto: a %s dataset's own blocks (its pages) make its order; name the window", inf.Format)
	}
	key := chosenKey(ds, minRL, memory, batch, cached)
	if a, ok := chosen.Load(key); ok {
		return a.(Auto), nil
	}
	dd, err := directOf(ctx, ds)
	if err != nil {
		return Auto{}, err
	}
	defer dd.close()
	measure := func(a Auto) (float64, error) { return probeOrder(ctx, dd, a, batch, memory) }
	cands := candidates(ds.Len(), inf.Bytes, minRL, memory, func(size int) int { return blocksOf(ds, size) })
	if inf.Bytes <= cached {
		// Files the page cache keeps: from the second epoch every order
		// reads memory, and the first reads the files whole in any order
		// (a 388 MiB file of LIBSVM lines, cold: the global shuffle at
		// 0.93x a sequential read). The most random order costs nothing.
		cands = cands[:1]
	}
	best, err := choose(cands, measure)
	if err != nil {
		return Auto{}, err
	}
	if best.Sequential, err = measure(Auto{Sampler: "sequential"}); err != nil {
		return Auto{}, err
	}
	chosen.Store(key, best)
	return best, nil
}

// blocksOf is how many blocks ds's records make for a block size: those
// BlockBounds cuts (the block order's own), or ceil(bytes/size) if none
// can be built.
func blocksOf(ds dataset.Dataset, size int) int {
	cfg := sampler.Config{Kind: "block", BlockSize: size, RecordSize: ds.Info().RecordSize}
	if s, _, err := cfg.Build(ds.Len(), dataset.Locator(ds)); err == nil {
		if b, ok := s.(*sampler.Block); ok {
			return b.Blocks()
		}
	}
	return int((ds.Info().Bytes + int64(size) - 1) / int64(size))
}

// chosen keeps ChooseOrder's choices, by chosenKey.
var chosen sync.Map

func chosenKey(ds dataset.Dataset, minRL float64, memory int64, batch int, cached int64) string {
	inf := ds.Info()
	return fmt.Sprint(inf.Paths, inf.Versions, ds.Len(), minRL, memory, batch, cached)
}

// probeOrder reads ds in order a for probeTime, within memory, and
// returns the records per second: the loader reads as a job would, from a
// place inside an epoch no job reads first (the device's own cache holds
// nothing of it).
func probeOrder(ctx context.Context, ds dataset.Dataset, a Auto, batch int, memory int64) (float64, error) {
	cfg := sampler.Config{Kind: a.Sampler, Seed: 0x70726f6265, BlockSize: a.BlockSize, Window: a.Window,
		RecordSize: ds.Info().RecordSize}
	s, _, err := cfg.Build(ds.Len(), dataset.Locator(ds))
	if err != nil {
		return 0, err
	}
	// Within the job's memory, as the job will read: a window is read
	// whole only if two fit.
	l, err := loader.New(ctx, ds, s, loader.Options{BatchSize: batch, Epoch: 1 << 20, Epochs: 1, MemoryBytes: memory})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	// The rate from the first batch on: a block order's window is loaded
	// whole before its first batch (loader.gatheredOf), a wait an epoch
	// pays once a window and the rate after it counts in; the global
	// order's first batch waits for its reads too.
	var t0 time.Time
	records := 0
	for t0.IsZero() || time.Since(t0) < probeTime {
		b, err := l.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("sampler auto: measuring the %s order: %w", a.Sampler, err)
		}
		if t0.IsZero() {
			t0 = time.Now()
		} else {
			records += len(b.IDs)
		}
		b.Release()
	}
	return float64(records) / max(time.Since(t0).Seconds(), 1e-9), nil
}

// direct is a dataset whose objects are read with O_DIRECT: the same
// records, with the page cache out of the way.
type direct struct {
	dataset.Dataset
	store *storage.Local
	mu    sync.Mutex
	objs  map[int]storage.Reader
	err   error
}

func directOf(ctx context.Context, ds dataset.Dataset) (*direct, error) {
	inf := ds.Info()
	var roots []string
	for _, p := range inf.Paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, specErr("sampler auto measures a local device, and %s is not a local file (%v): name the order", p, err)
		}
		if roots = append(roots, filepath.Dir(p)); st.IsDir() {
			roots = append(roots, p)
		}
	}
	slices.Sort(roots)
	roots = slices.Compact(roots)
	st, err := storage.NewLocal(true, roots)
	if err != nil {
		return nil, err
	}
	return &direct{Dataset: ds, store: st, objs: map[int]storage.Reader{}}, nil
}

// Object opens object i with O_DIRECT on first use; one that cannot be
// falls back to the dataset's own reader.
func (d *direct) Object(i int) storage.Reader {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.objs[i]; ok {
		return r
	}
	r, err := d.store.Open(context.Background(), d.Dataset.Object(i).Name())
	if err != nil {
		r = d.Dataset.Object(i)
	}
	d.objs[i] = r
	return r
}

func (d *direct) close() {
	for _, r := range d.objs {
		if c, ok := r.(io.Closer); ok && r != nil {
			c.Close()
		}
	}
	d.store.Close()
}

// Close leaves the dataset open: it is the job's.
func (d *direct) Close() error { return nil }

// autoOrder resolves sampler auto for a job: cfg with the order chosen
// within the job's memory, or the one chosen before (auto_order), and the
// choice.
func autoOrder(ctx context.Context, cfg sampler.Config, ds dataset.Dataset, p Plan, env Env) (sampler.Config, *Auto, error) {
	cached := env.PageCacheBytes
	var a Auto
	if o := p.AutoOrder; o != nil {
		// Read again as chosen, not measured again: its level is the
		// order's; its rate as measured if this process measured it.
		a = *o
		a.RL, a.Rate, a.Sequential = 1, 0, 0
		if a.Sampler == "block" {
			a.RL = quality.BlockRL(ds.Len(), max(1, blocksOf(ds, a.BlockSize)), a.Window)
		}
		if c, ok := chosen.Load(chosenKey(ds, p.MinRandomness, env.Memory, p.BatchSize, cached)); ok {
			if c := c.(Auto); c.Sampler == a.Sampler && c.BlockSize == a.BlockSize && c.Window == a.Window {
				a = c
			}
		}
	} else {
		var err error
		if a, err = ChooseOrder(ctx, ds, p.MinRandomness, env.Memory, p.BatchSize, cached); err != nil {
			return cfg, nil, err
		}
	}
	cfg.Kind, cfg.BlockSize, cfg.Window = a.Sampler, a.BlockSize, a.Window
	return cfg, &a, nil
}
