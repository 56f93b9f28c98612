package job

import (
	"context"
	"log/slog"
	"math"
	"os"
	"slices"
	"sort"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// Reads past the page cache, when little comes of passing through it.
//
// Through the page cache a cold 4 KiB read costs the kernel ~40% more CPU
// than an O_DIRECT one (page insertion, memcg charge: BENCHMARKS.md, the
// depth section); on a device that CPU limits (a fast NVMe, the RAM
// device there) that is the rate lost, and what a shuffle reads pushes
// out what the cache held for others. What the cache gives back is hits,
// and in a shuffle of files many times its size they are few. So a job whose
// spec leaves direct unset reads with O_DIRECT when a shuffle (global, or
// the order auto picks) of local files would find under 1/8 of its page
// reads in the page cache (pageCacheHits), unless it is stewarded (its
// source's steward can keep the pages its global shuffle reads soonest,
// which answer a share c of them) and c is at least stewardFrom. Pages
// other orders read too
// (a share group's jobs, a sweep's on one dataset, a rank's part) hit
// more often, as random reads do: the rule counts them so, and a sweep
// keeps the cache its jobs find each other in.
//
// The cache is taken to keep keep bytes of the files (a share c of
// them): half the memory the process may use (its cgroup's limit if
// lower), the rule sampler auto prices orders by, the other half being the
// jobs' and the daemon's own. Orders that read file order (sequential,
// buffered) gain the kernel's readahead, and a block order named by the
// user reads its blocks its own way: they read through the cache. So do a
// directory's many small files, object stores, datasets of rows and
// mixtures. A subset (or a filter, or dedup) is decided once the files
// are open and its size known, and the files are then opened anew past
// the cache if it misses.

// directBelow is the share of a shuffle's page reads the page cache must
// answer for a job to read through it. Below it, a device the reads keep
// busy (a disk) serves at most 1/8 more reads past the cache, where one
// the CPU limits gains the ~40% of CPU per read the cache costs (the
// break-even of CPU alone is near 30% hits).
const directBelow = 1.0 / 8

// pageCacheHits is the share of a shuffle's page reads an LRU page cache
// keeping a share c of the files answers, for records of mean bytes (0:
// unknown) that never straddle more pages than they fill (aligned) or
// that start anywhere.
//
// A page read again within an epoch (another record on it: records
// smaller than a page, or the page two unaligned records straddle) is a
// hit as often as the cache holds a page drawn at random, c. A page's
// first read of an epoch was last read an epoch ago, at uniform places u
// and v of the two permutations; between them the other pages read are
// those after u in one epoch or before v in the next, a share
// 1-(1-u)(1-v), and LRU keeps the page if that is under c: probability
// c + (1-c)ln(1-c) (≈ c²/2 for small c). The share of page reads that are
// a page's first: min(1, m/page) for aligned records of m bytes; for
// records starting anywhere, which span 1 + (m-1)/page pages on average,
// m/(page+m-1); taken as 0 (many records a page: the most hits) when the
// mean is not known before the files are opened, so that only files many
// times the cache go past it. TestPageCacheHits holds this to a simulated
// LRU.
func pageCacheHits(c float64, mean int64, aligned bool) float64 {
	c = min(1, max(0, c))
	page := float64(storage.DirectAlign)
	first := 0.0
	switch m := float64(mean); {
	case mean > 0 && aligned:
		first = min(1, m/page)
	case mean > 0:
		first = m / (page + m - 1)
	}
	again := c + (1-c)*math.Log1p(-c)
	if c >= 1 {
		again = 1
	}
	return (1-first)*c + first*again
}

// readingNow says whether a job open in env reads the files of paths in
// an order of its own: not another part (a DataLoader worker's batches, a
// rank's) of plan's, which reads each page once an epoch with it.
func (env *Env) readingNow(paths []string, plan Plan) bool {
	key := pathsKey(paths)
	env.jobsMu.Lock()
	defer env.jobsMu.Unlock()
	for j := range env.jobs {
		if j.src.key.paths == key && !partsOfOne(j.plan, plan) {
			return true
		}
	}
	return false
}

// partsOfOne says a and b are two parts of one order: the same seed and
// sampler, cut into the same number of workers' and ranks' parts, at other
// places.
func partsOfOne(a, b Plan) bool {
	return a.Sampler.Seed == b.Sampler.Seed && a.Sampler.Kind == b.Sampler.Kind &&
		a.Loader.BatchStride == b.Loader.BatchStride && a.Sampler.World == b.Sampler.World &&
		(a.Loader.BatchOffset != b.Loader.BatchOffset || a.Sampler.Rank != b.Sampler.Rank)
}

// pageCacheBytes is what the page cache may keep of a job's files.
func (env *Env) pageCacheBytes() int64 {
	if env.opts.PageCacheBytes > 0 {
		return env.opts.PageCacheBytes
	}
	return AvailableMemory() / 2
}

// readsDirect says whether a job of plan over paths reads them with
// O_DIRECT: its spec leaves it to the job, its order reads records at
// random, paths are local files, and the page cache, keeping keep bytes
// of them, would answer under directBelow of the reads. others says
// other jobs read the same files now. A job of part of the files (a
// subset, a filter, dedup) is decided once they are open (directFrom).
func readsDirect(plan Plan, paths []string, keep int64, others bool) bool {
	if plan.Subset != nil || plan.Filter != nil || plan.Dedup {
		return false
	}
	total, ok := directFiles(plan, paths)
	return ok && missesCache(plan, total, keep, others)
}

// directFiles says whether a job of plan may read paths past the page
// cache, and how many bytes they hold.
func directFiles(plan Plan, paths []string) (int64, bool) {
	if !plan.DirectUnset || plan.Refresh || plan.Mixture != nil {
		// A mixture's part of each source is known only once its sources
		// are open; a growing dataset's files change: through the cache.
		return 0, false
	}
	if k := plan.Sampler.Kind; !sampler.Uniform(k) && k != "auto" {
		return 0, false
	}
	var total int64
	for _, p := range paths {
		if storage.IsS3(p) {
			return 0, false
		}
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			return 0, false // a directory's files, or an open that will say what is wrong
		}
		total += st.Size()
	}
	return total, total > 0
}

// missesCache says a shuffle of plan's records over bytes of its files
// would find under directBelow of its page reads in a page cache keeping
// keep bytes.
func missesCache(plan Plan, bytes, keep int64, others bool) bool {
	// Only a fixed-size file's record is known before it is opened. Where
	// the pages are read by more than one permutation (a rank on a node
	// of its own reads a random part of each epoch; jobs that share, or
	// others on these files, read them too) a page's last read is nearer
	// than the job's own last epoch: the cache answers them about as it
	// would random reads, c, as if the mean were not known. So a sweep's
	// jobs on one dataset keep the page cache they find each other in.
	o := plan.Dataset
	mean := int64(o.RecordSize)
	if plan.Sampler.World > 1 || plan.Share || others {
		mean = 0
	}
	aligned := mean > 0 && o.HeaderBytes%storage.DirectAlign == 0 && (mean%storage.DirectAlign == 0 || storage.DirectAlign%mean == 0)
	c := float64(keep) / float64(bytes)
	if stewarded(plan) && c >= stewardFrom {
		return false
	}
	return pageCacheHits(c, mean, aligned) < directBelow
}

// stewardFrom is the share of the files the page cache keeps from which
// a job whose pages its source's steward keeps (stewarded) reads through
// the cache, though the kernel's LRU would answer under directBelow of
// its reads: the steward keeps the pages read again soonest, which answer
// c of them (job/steward.go), and from about 30% hits they pay for the
// cache's cost per read in CPU as well as in reads (directBelow).
const stewardFrom = 0.3

// stewarded says a job of plan reads its files in an order of its own
// whose next reads its source's steward can tell (job/steward.go): a
// global shuffle of every record, not shared, from an epoch's start. A
// subset's order, the rest of an epoch and a shared order have no
// inverse the steward can ask.
func stewarded(plan Plan) bool {
	return !plan.Share && sampler.Uniform(plan.Sampler.Kind) && plan.Subset == nil && plan.Filter == nil && !plan.Dedup &&
		plan.Sampler.Start == 0 && len(plan.Delivered) == 0
}

// directFrom is readsDirect for a job of part of its files' records (a
// subset, a filter, dedup), whose size is known only once the files are
// open and the order has chosen them: the least records of src a shuffle
// of which misses the page cache (missesCache, which grows with the
// records: a threshold), or 0 if no part is read past it. The order says
// whether its part reaches it (order.Order.Direct), and the job then
// reopens the files past the page cache (reopenDirect).
func (env *Env) directFrom(plan Plan, src *source) int {
	if _, rows := src.ds.(dataset.Rows); rows {
		return 0 // a dataset of rows reads its pages through readers of its own
	}
	if _, ok := directFiles(plan, src.paths); !ok {
		return 0
	}
	inf := src.ds.Info()
	mean := int64(inf.RecordSize)
	if mean == 0 {
		mean = inf.Bytes / int64(max(1, src.ds.Len()))
	}
	if mean <= 0 {
		return 0
	}
	keep, others, n := env.pageCacheBytes(), env.readingNow(src.paths, plan), src.ds.Len()
	k := sort.Search(n, func(k int) bool { return missesCache(plan, int64(k+1)*mean, keep, others) })
	if k == n {
		return 0
	}
	return k + 1
}

// reopenDirect is src's files opened anew past the page cache, for a part
// of their records the order reads so (directFrom); src given back to the
// registry. If they cannot be, or were rewritten since, it is src itself:
// the part names the records src holds.
func (env *Env) reopenDirect(ctx context.Context, plan Plan, src *source) *source {
	// The files src was opened with, not plan.Paths expanded again: a
	// glob may match others by now, and the part names src's records.
	paths := src.paths
	opts := plan.Dataset
	opts.Direct = true
	d, err := env.sets.get(ctx, paths, opts)
	if err != nil {
		// Buffered reads of these files worked a moment ago: keep them.
		slog.Warn("a subset's files not reopened past the page cache", "paths", len(paths), "err", err)
		return src
	}
	if !slices.Equal(d.ds.Info().Versions, src.ds.Info().Versions) {
		// Rewritten since: the subset names the records src holds.
		env.sets.put(d)
		return src
	}
	env.sets.put(src)
	return d
}
