package job

import (
	"math"
	"sort"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
)

// shareOptions are the options of src's share group for the job (the
// group is made of the first member's): what the group keeps of a record,
// and where. Whoever holds the bytes states their size: a shared
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
// page cache (O_DIRECT, an object store; pages false: src's files
// reopened past it) and a transform's outputs are kept in the record
// cache, which is then the only place they are.
func (j *Job) shareOptions(src *source, key func(int) cache.Key, pages bool) share.Options {
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
		// dataset's unpacked blocks (Parquet pages, compressed Arrow record
		// batches: one claim/fill/wait cache per dataset), which the rows
		// they take at the same time lie in. The group reserves no record
		// items, which no loader of rows fills; a transform's outputs, one
		// of its size a row, it does, as for records (loader/rowtf.go).
		opts.Cache = nil
	case j.cached() == "" && pages && pageCached(src):
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
	return opts
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
