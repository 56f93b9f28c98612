package job

import (
	"math/rand/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
)

// A job alone on a local file's raw records, read through the page cache,
// leaves the kernel to choose which pages stay, and under a uniform
// shuffle its LRU keeps the wrong ones: the pages read last, which the
// job reads again only next epoch, at any place in it. Of data a share c
// of which the cache keeps, it answers c + (1-c)ln(1-c) of the reads (15%
// at c = 0.5), where keeping the pages read again soonest answers c. The
// job's order has an inverse (the global shuffle's is as cheap as the
// order), so the next read of every page is known: the source's steward
// (share.Steward) keeps the pages its jobs read soonest, Belady's MIN, in
// the room the memory leaves (env.pageRoom), and drops the rest. Jobs that
// share keep their pages by their group's need (Env.pages); while such a
// job, a mixture of the source or an order with no inverse reads the
// source, the steward drops nothing, for it cannot tell their next reads.
// A job alone also has its first epoch planned (share's bypass, MIN with
// bypass): a read whose page the bypass does not keep goes past the page
// cache (storage.Request.PastCache), so that only pages read from it
// later enter it.

// steward makes the job's places with the page stewards of the sources it
// reads: its own, told its next reads, or blind ones.
func (j *Job) steward() {
	if j.src.parts != nil {
		for _, p := range j.src.parts {
			if st := j.env.steward(p); st != nil {
				j.blind = append(j.blind, st.Join(nil))
			}
		}
		return
	}
	if st := j.toldSteward(); st != nil {
		r := st.Join(j.future)
		if j.bypasses() {
			smp := j.smp
			r.Bypass(share.Order{N: smp.Len(), Fill: smp.Fill, Next: func(e int) func(id int) (int64, bool) {
				return sampler.NextUses(smp, (e+1)*smp.Len())
			}})
		}
		j.pages.Store(r)
	} else if st := j.env.steward(j.src); st != nil {
		j.blind = append(j.blind, st.Join(nil))
	}
}

// toldSteward is the steward of the job's source if the job tells it
// its next reads: one order with an inverse, not shared; nil otherwise.
func (j *Job) toldSteward() *share.Steward {
	if j.src.parts != nil {
		return nil
	}
	st := j.env.steward(j.src)
	smp, _ := j.positions()
	if _, ok := smp.(sampler.Positioner); st == nil || !ok || j.ord.OwnPart {
		return nil
	}
	return st
}

// bypasses says the job's first epoch may be planned (share's bypass) if it
// tells its steward its reads: a whole order (a rank's part is told by
// its own reads, which a bypass of the order would not know), whose bypass's
// tables take at most a thirty-second of the memory, as the steward's
// (Env.pages).
func (j *Job) bypasses() bool {
	_, part := j.smp.(*sampler.RankPart)
	return !part && int64(j.smp.Len())*share.BypassBytes <= AvailableMemory()/32
}

// leaveSteward takes the job's places with page stewards away.
func (j *Job) leaveSteward() {
	if r := j.pages.Load(); r != nil {
		r.Leave()
	}
	for _, r := range j.blind {
		r.Leave()
	}
}

// pastCache is the loader's PastCache for a job that will tell its
// source's steward its reads (toldSteward) and may be planned, or nil:
// a record of the job's first epoch passes where its bypass (Reader.Bypass)
// does not keep its page. The loader asks from its first read, before
// the job has joined the steward (after the loader is made): until then,
// while the bypass is not made, and after the first epoch, nothing passes.
func (j *Job) pastCache() func(e int, ids []int, past []bool) {
	if !j.bypasses() || j.toldSteward() == nil {
		return nil
	}
	return func(e int, ids []int, past []bool) {
		if pages := j.pages.Load(); pages != nil {
			pages.Passes(ids, pages.Keeps(e), past)
		}
	}
}

// positions is the order the job's positions are of, and how many of its
// positions one of the job's stands for: a rank's part is every world-th
// position of its base's order.
func (j *Job) positions() (sampler.Sampler, int) {
	if rp, ok := j.smp.(*sampler.RankPart); ok {
		return rp.Base, rp.World
	}
	return j.smp, 1
}

// future tells the job's steward how many positions of its order pass,
// from its place now, before it reads each record again.
func (j *Job) future() share.Future {
	smp, world := j.positions()
	st, _ := j.l.Place()
	now := st.Epoch*smp.Len() + st.Batch*max(1, j.plan.Loader.BatchSize)*world
	// Parts of one order (DataLoader workers, ranks: partsOfOne) name it
	// alike, by its seed, its epochs' length and how it is cut, and each
	// its own part.
	lo, cfg := j.plan.Loader, j.plan.Sampler
	f := share.Future{Now: int64(now), Ahead: sampler.Ahead(smp, now),
		Order: sampler.Mix(cfg.Seed, uint64(smp.Len())<<16^uint64(max(1, cfg.World))<<8^uint64(max(1, lo.BatchStride))),
		Part:  uint64(lo.BatchOffset)<<32 | uint64(cfg.Rank)}
	if world > 1 {
		// Alone on its node, a rank keeps the pages it reads soonest.
		mine := st.Epoch*j.smp.Len() + st.Batch*max(1, lo.BatchSize)
		f.MineNow, f.Mine = int64(mine), sampler.Ahead(j.smp, mine)
	}
	return f
}

// steward is src's page steward, made once, or nil: src is not raw
// records of local files read through the page cache (a mixture, a
// dataset of rows, files read with O_DIRECT or from a store), its pages
// hold more than two records each (pagesOfFew), it is a file a record
// (fileARecord), or its pages cannot be counted (Env.pages).
func (env *Env) steward(src *source) *share.Steward {
	src.stewardOnce.Do(func() {
		ds := src.ds
		if _, rows := ds.(dataset.Rows); rows || src.parts != nil || ds.Len() == 0 || storage.AlignmentOf(ds.Object(0)) > 1 || fileARecord(ds) {
			return
		}
		src.pagesOnce.Do(func() { src.pages = env.pages(ds) })
		if src.pages != nil && pagesOfFew(src.pages.Count, ds.Len()) {
			src.steward = share.NewSteward(*src.pages, ds.Len(), rand.Uint64())
		}
	})
	return src.steward
}

// pagesOfFew says n records lie at most about two to a page of pages, where
// a steward pays its way. A page of k records is read k times an epoch, and all but
// the first of those reads find it about as often as the kernel's LRU
// keeps it, c (pageCacheHits): the steward can better only the first, and
// it weighs a page by asking its order for each of its records' next
// reads, k of them a page looked at. At 64-byte records (64 a page) that
// asking was half the job's CPU and the job read at 0.45-0.5x the LRU's
// rate.
func pagesOfFew(pages, n int) bool {
	return 2*pages >= n
}

// fileARecord says ds is a directory of files, a record each, which it opens
// as they are read: a steward's drop of a page read long ago opens its file
// again, and at 1 and 4 KB files past a 256 MiB cgroup the steward cost a
// job a third of its rate (33k against 48k samples/s) and saved 11% of its
// device reads.
func fileARecord(ds dataset.Dataset) bool {
	objs, ok := ds.(dataset.Counted)
	return ok && objs.Objects() == ds.Len()
}
