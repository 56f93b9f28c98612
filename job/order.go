package job

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
)

// defaultPageWindow is the block window of a dataset's own blocks.
const defaultPageWindow = 16

// order makes the job's sampler, in this one place: a member of its
// source's group when it asks to share a global shuffle (Joader's
// dependent sampling), else its own sampler (by default block-aware over a
// dataset's own blocks, Parquet's pages), over its subset if it has one.
func (j *Job) order(ctx context.Context, subset *roaring.Bitmap, key func(int) cache.Key) (sampler.Sampler, error) {
	ds := j.src.ds
	plan := j.plan
	smpCfg := plan.Sampler
	if smpCfg.Kind == "auto" {
		var err error
		if smpCfg, j.auto, err = j.autoOrder(ctx, smpCfg, ds); err != nil {
			return nil, err
		}
	}
	smpCfg = ownBlocks(smpCfg, ds)
	if plan.Mixture != nil {
		return j.mixture(smpCfg, subset)
	}
	if plan.Share && (smpCfg.Kind == "" || smpCfg.Kind == "global") {
		// Ranks and DataLoader workers are dealt parts of the subset (or
		// of the rest of an epoch resumed on another topology): a shared
		// order is no function of position to cut.
		if len(plan.Delivered) > 0 {
			var err error
			if subset, err = j.rest(ctx, subset, ds.Len()); err != nil {
				return nil, err
			}
		}
		mine := j.part(smpCfg, subset, ds.Len())
		if j.delivered != nil && mine.IsEmpty() {
			// Of this part, every record was delivered: the rest holds none.
			return sampler.Sequential{}, nil
		}
		if mine != nil && mine.IsEmpty() {
			return nil, fmt.Errorf("%w: this rank's part of the subset holds no record", dataset.ErrEmpty)
		}
		m, err := j.join(j.src, key, mine, plan.Loader.Epoch)
		if err == nil {
			return m, nil
		}
		slog.Info("job not shared", "reason", err)
		if j.delivered != nil {
			// Alone, the rest is its own uniform order over this part's
			// records not delivered: still each once.
			own := smpCfg
			own.Rank, own.World = 0, 1
			smp, err := ownOrder(own, ds, mine)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errSpec, err)
			}
			return smp, nil
		}
	}
	if len(plan.Delivered) > 0 {
		// An opportunistic order's rest, from every part's place: of the
		// epoch's order over one rank, split over this run's.
		one := smpCfg
		one.Rank, one.World, one.RankDropLast = 0, 1, false
		base, err := ownOrder(one, ds, subset)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errSpec, err)
		}
		rest, err := j.positionalRest(ctx, base)
		if err != nil {
			return nil, err
		}
		smp, _, err := smpCfg.Split(rest, "rest")
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errSpec, err)
		}
		return smp, nil
	}
	smp, err := ownOrder(smpCfg, ds, subset)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	return smp, nil
}

// ownOrder is cfg's order over ds's records, or over its subset (of ds's
// ids) if not nil: the order of the subset's positions, naming its ids,
// with ds's own blocks cut to the subset's.
func ownOrder(cfg sampler.Config, ds dataset.Dataset, subset *roaring.Bitmap) (sampler.Sampler, error) {
	if subset == nil {
		smp, _, err := cfg.Build(ds.Len(), dataset.Locator(ds))
		return smp, err
	}
	ids := subset.ToArray()
	if len(cfg.Bounds) > 0 {
		cfg.Bounds = subsetBounds(cfg.Bounds, ids)
	}
	base, _, err := cfg.Build(len(ids), func(i int) (int, int64, int) {
		l := ds.Locate(int(ids[i]))
		return l.Object, l.Off, l.Len
	})
	if err != nil {
		return nil, err
	}
	return &subsetSampler{base: base, ids: ids}, nil
}

// part is this rank's and DataLoader worker's part of subset (every
// record of n, if nil) when the job is shared, dealt as part deals it.
func (j *Job) part(cfg sampler.Config, subset *roaring.Bitmap, n int) *roaring.Bitmap {
	stride := max(1, j.plan.Loader.BatchStride)
	return part(subset, n, cfg.Rank, max(1, cfg.World), j.plan.Loader.BatchOffset, stride, cfg.RankDropLast)
}

// join makes the job a member of src's share group over its part mine,
// from epoch. Whoever holds the bytes states their size: a shared
// record's item is the record's own length (its locator's), or the
// output size of the transform it keeps; never a mean, which cuts the
// longer records of a variable-size dataset.
//
// A local file's raw records, read through the page cache, are held
// there: the first job's read leaves the record's pages in it for the
// others, and the group counts those pages against a quarter of the
// memory the daemon may use (half of what the page cache is taken to
// keep, pageCacheBytes), so the jobs behind the leader sit out before
// their records would be pushed out: a page read once waits in the
// kernel's inactive list, a part of the cache, and with half the memory
// held the slow jobs' records were pushed out before they took them
// (1.72x one epoch below, against 1.59x). A copy in the record cache
// would hold the same bytes twice and take the memory the page cache
// serves everything else from: a JSONL line's neighbour on its pages, a
// record read again an epoch later. Four staggered jobs over 4 GiB in
// 3 GiB read 1.59x one epoch this way against 1.72x with copies in a
// 2 GiB record cache (fixed records), 2.14x against 2.78x with a 512 MiB
// one (JSONL; BENCHMARKS.md). And the group chooses which of the file's
// pages the page cache keeps (env.pages, share.Pages): those needed
// soonest, in the room the cgroup leaves, dropping the rest, where the
// kernel's LRU keeps the pages every job has just read: 1.10x, 1.47x and
// 1.45x (a file tree) one epoch, all below 1.5x. Records read past the
// page cache (O_DIRECT, an object store) and a transform's outputs are
// kept in the record cache, which is then the only place they are.
func (j *Job) join(src *source, key func(int) cache.Key, mine *roaring.Bitmap, epoch int) (*share.Member, error) {
	ds := src.ds
	size := func(id int) int { return ds.Locate(id).Len }
	if j.cached() != "" {
		out := j.tf.Size()
		size = func(int) int { return out }
	}
	opts := share.Options{Cache: j.env.cache, Key: key}
	_, rows := ds.(dataset.Rows)
	switch {
	case rows && j.cached() == "":
		// A row is no one byte range to keep: jobs on rows share the
		// dataset's decoded blocks (Parquet pages, compressed Arrow record
		// batches: one claim/fill/wait cache per dataset), which the rows
		// they take at the same time lie in. The group reserves no record
		// items, which no loader of rows fills; a transform's outputs, one
		// of its size a row, it does, as for records (loader/rowtf.go).
		opts.Cache = nil
	case j.cached() == "" && pageCached(src):
		opts.Cache, opts.Hold = nil, j.env.pageCacheBytes()/2
		size = func(id int) int { l := ds.Locate(id); return pagesOf(l.Off, l.Len) }
		src.pagesOnce.Do(func() { src.pages = j.env.pages(ds) })
		opts.Pages = src.pages
		// Jobs on the file that do not share have their pages kept by
		// its steward, and neither keeper weighs the other's jobs: while
		// both read, neither drops.
		opts.Others = func() bool { st := j.env.steward(src); return st != nil && st.Telling() }
	}
	opts.Size = size
	m, err := j.env.groups.join(j, src, opts, mine, epoch)
	if err == nil && opts.Pages != nil {
		m.SetFresh(2 * j.readAhead())
	}
	return m, err
}

// readAhead bounds the records the job's loader takes from its order
// before it reads them (loader/flight.go): its prefetch's batches, or by
// default at most twice minAhead batches, or four times the depth's reads
// and a batch (the depth the engine chooses seldom passes 256); batches
// of an opportunistic window are taken together.
func (j *Job) readAhead() int {
	lo := j.plan.Loader
	bs := max(1, lo.BatchSize) * max(1, lo.Opportunistic)
	if lo.Prefetch > 0 {
		return (lo.Prefetch + 1) * bs
	}
	depth := lo.Depth
	if depth == 0 {
		depth = 256
	}
	return max(8*bs, 4*depth+bs)
}

// pages numbers the pages of ds's files for a share group, or the source's
// steward, to choose which of them the page cache keeps (share.Pages), or
// is nil, and the kernel's order is kept: a file's cached pages cannot be
// dropped, or the tables, a group's 13 bytes a page and 4 more a page held and a
// steward's 17 and 4, would take more than a thirty-second of the memory
// (a dataset about 3.5 times the memory; past 1.7 times a job alone reads
// it with O_DIRECT: stewardFrom). It reads the files' sizes, not the
// records: opening 10^9 of them costs what it did before it.
func (env *Env) pages(ds dataset.Dataset) *share.Pages {
	const page = storage.DirectAlign
	objs, ok := ds.(dataset.Counted)
	if !ok || ds.Len() == 0 {
		return nil
	}
	n := objs.Objects()
	base := make([]int64, n+1) // each file's first page
	sizes := make([]int64, n)
	for i := range n {
		o := ds.Object(i)
		if _, ok := o.(storage.Dropper); !ok {
			return nil
		}
		sizes[i] = o.Size()
		base[i+1] = base[i] + (sizes[i]+page-1)/page
	}
	if base[n] >= math.MaxInt32 || base[n]*(17+20) > AvailableMemory()/32 {
		return nil
	}
	// Records are not checked here, one Locate each, which cost 8.7 s at
	// the open of 10^9 records: every format lists a file's records in
	// the order they lie in it, and a record out of that order would only
	// have its pages weighed wrong (every byte is still read from its
	// file). A record past its file, which its read reports, has no pages.
	span := func(id int) (int, int) {
		l := ds.Locate(id)
		if l.Object < 0 || l.Object >= n || l.Off < 0 || l.Off+int64(max(0, l.Len)) > sizes[l.Object] {
			return 0, 0
		}
		f, k := pageSpan(l.Off, l.Len)
		return int(base[l.Object] + f), int(k)
	}
	return &share.Pages{Count: int(base[n]), Span: span, Bytes: page, Room: env.pageRoom,
		Drop: func(first, k int) {
			// A run of pages may cross from one file into the next.
			for k > 0 {
				i := sort.Search(n, func(i int) bool { return base[i+1] > int64(first) })
				m := min(int64(k), base[i+1]-int64(first))
				// A failed drop leaves the pages cached: the kernel's
				// order decides for them, and every byte is still read
				// from its file.
				_ = ds.Object(i).(storage.Dropper).Drop((int64(first)-base[i])*page, m*page)
				first, k = first+int(m), k-int(m)
			}
		}}
}

// pageRoom is what the page cache may still take, given the bytes of
// pages a share group keeps: a set PageCacheBytes less those (a bound on
// each group, not on all of them), or the memory left before the kernel
// reclaims (memoryRoom).
func (env *Env) pageRoom(held int64) int64 {
	if env.opts.PageCacheBytes > 0 {
		return env.opts.PageCacheBytes - held
	}
	return memoryRoom(held)
}

// ownBlocks fits cfg to ds: its record size and device block, and, for a
// dataset with blocks of its own (Parquet pages), a block order over them
// unless a job asks for another order. By default the rows of 16 blocks
// are spread over 16 batches, so a batch mixes 16 pages while each page
// is still read and decoded once.
func ownBlocks(cfg sampler.Config, ds dataset.Dataset) sampler.Config {
	cfg.RecordSize = ds.Info().RecordSize
	cfg.Align = storage.HintsOf(ds.Object(0)).BlockSize
	if b, ok := ds.(dataset.Blocker); ok && cfg.BlockSize == 0 && (cfg.Kind == "" || cfg.Kind == "block") {
		cfg.Kind, cfg.Bounds = "block", b.Blocks()
		if cfg.Window == 0 {
			cfg.Window = defaultPageWindow
			if bs, ok := ds.(dataset.BlockSizer); ok && bs.BlockBytes() > 0 {
				// The window's blocks stay decoded while its batches take
				// their rows: at most half the decoded budget, or each is
				// decoded again for every batch that misses it (a Feather
				// file's 64K-row batches, 6 MiB each decompressed: window
				// 16 read 351 MB/s where window 4 read 20).
				cfg.Window = int(min(int64(defaultPageWindow), max(1, dataset.UnpackedBudget/2/bs.BlockBytes())))
			}
		}
	}
	return cfg
}

// mixture is a mixture's order: each source in its own order (of the
// job's kind, seeded apart, over its part of the subset), mixed by the
// weights, then split from the start and over ranks as one order is.
func (j *Job) mixture(cfg sampler.Config, subset *roaring.Bitmap) (sampler.Sampler, error) {
	c := j.src.ds.(concatenated)
	parts, offs := c.Parts(), c.Offsets()
	// Each source's part of the subset, in its own ids (nil: all).
	locals := make([]*roaring.Bitmap, len(parts))
	for k, ds := range parts {
		if subset == nil {
			continue
		}
		mine := roaring.New()
		mine.AddRange(uint64(offs[k]), uint64(offs[k]+ds.Len()))
		mine.And(subset)
		if mine.IsEmpty() {
			return nil, fmt.Errorf("%w: the subset holds no record of mixture source %d (%s)", dataset.ErrEmpty, k, ds.Info().Paths[0])
		}
		locals[k] = roaring.New()
		it := mine.Iterator()
		for it.HasNext() {
			locals[k].Add(it.Next() - uint32(offs[k]))
		}
	}
	srcs := make([]sampler.Sampler, len(parts))
	if j.plan.Share && (cfg.Kind == "" || cfg.Kind == "global") && j.plan.Loader.Opportunistic <= 1 {
		// Each source's order is a member of its source's share group, as
		// a job on the source alone would be: mixtures and jobs over
		// overlapping sources read what they have in common once.
		if err := j.shareSources(cfg, locals, srcs); err != nil {
			return nil, err
		}
		cfg.Rank, cfg.World = 0, 1 // members cover this rank's and worker's part
	} else {
		if j.plan.Share {
			// As a job alone: only a global shuffle is shared (and a
			// mixture's not with opportunistic batches, whose windows
			// would cross its sources' epochs).
			slog.Info("mixture not shared", "sampler", cfg.Kind, "opportunistic", j.plan.Loader.Opportunistic)
		}
		for k, ds := range parts {
			own := ownBlocks(cfg, ds) // a Parquet source: a block order over its pages
			own.Seed = sampler.Mix(cfg.Seed, uint64(k)+1)
			own.Rank, own.World, own.Start = 0, 1, 0
			var err error
			if srcs[k], err = ownOrder(own, ds, locals[k]); err != nil {
				return nil, fmt.Errorf("%w: mixture source %d: %w", errSpec, k, err)
			}
		}
	}
	m, err := sampler.NewMixture(srcs, offs, j.plan.Mixture.Segments, j.plan.Mixture.Cycle)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	j.subset = m.Len() // an epoch's samples: the schedule's, not every record
	s, _, err := cfg.Split(m, "mixture")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	return s, nil
}

// shareSources puts in srcs, for each source, a member of the source's
// share group over this rank's and worker's part of the source's records
// (locals[k], nil for all) dealt as a shared job's (part).
// A member starts at the source's own epoch the mixture's schedule has
// reached at the job's start.
func (j *Job) shareSources(cfg sampler.Config, locals []*roaring.Bitmap, srcs []sampler.Sampler) error {
	plan := j.plan
	mine := make([]*roaring.Bitmap, len(srcs))
	sizes := make([]sampler.Sampler, len(srcs))
	for k, p := range j.src.parts {
		n := p.ds.Len()
		mine[k] = j.part(cfg, locals[k], n)
		if mine[k] != nil {
			n = int(mine[k].GetCardinality())
		}
		if n == 0 {
			return fmt.Errorf("%w: this rank's part of mixture source %d holds no record", dataset.ErrEmpty, k)
		}
		sizes[k] = sampler.Sequential{N: n}
	}
	at, err := sampler.NewMixture(sizes, j.src.ds.(concatenated).Offsets(), plan.Mixture.Segments, plan.Mixture.Cycle)
	if err != nil {
		return fmt.Errorf("%w: %w", errSpec, err)
	}
	draws, err := at.Draws(plan.Loader.Epoch, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", errSpec, err)
	}
	for k, p := range j.src.parts {
		epoch := plan.Loader.Epoch
		if plan.Mixture.Cycle {
			epoch = draws[k] / sizes[k].Len()
		}
		m, err := j.join(p, cacheKey(p, j.cached()), mine[k], epoch)
		if err != nil {
			return fmt.Errorf("mixture source %d not shared: %w", k, err)
		}
		srcs[k] = m
	}
	return nil
}

// subsetBounds are a dataset's own blocks (bounds: each block's first id,
// and the records at the end) over the positions of its subset ids
// (sorted): a block of the subset is its ids in one of the dataset's, so
// a page is still read once for all of its rows the subset keeps.
func subsetBounds(bounds []int, ids []uint32) []int {
	out := []int{0}
	b := 0
	for i, id := range ids {
		for b+1 < len(bounds) && int(id) >= bounds[b+1] {
			b++
			if i > out[len(out)-1] {
				out = append(out, i)
			}
		}
	}
	if len(ids) > out[len(out)-1] {
		out = append(out, len(ids))
	}
	return out
}

// pageCached says src's records are read through the page cache: local
// files opened without O_DIRECT.
func pageCached(src *source) bool {
	if src.key.direct || len(src.paths) == 0 {
		return false
	}
	for _, p := range src.paths {
		if storage.IsS3(p) {
			return false
		}
	}
	return true
}

// pagesOf is the bytes of the pages a record of n bytes at off lies in.
func pagesOf(off int64, n int) int {
	_, k := pageSpan(off, n)
	return int(k) * storage.DirectAlign
}

// pageSpan is the pages a record of n bytes at off lies in: the first,
// and how many (none for an empty record).
func pageSpan(off int64, n int) (first, count int64) {
	const page = storage.DirectAlign
	first = off / page
	if n <= 0 {
		return first, 0
	}
	return first, (off+int64(n)-1)/page - first + 1
}
