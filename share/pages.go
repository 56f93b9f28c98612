package share

import (
	"math/bits"
	"math/rand/v2"
	"slices"
)

// Pages lets a group with no Cache, whose records wait in the page cache,
// choose which of its pages the page cache keeps: by next use, not by the
// kernel's recency. Under a uniform order the kernel's LRU keeps the
// wrong pages: it drops the records a job has not read yet this epoch,
// read long ago, to keep the ones every job has just taken, which no one
// needs again this epoch. The group knows better. A record's next use is
// near in proportion to the jobs that still need it, each at its rate
// over the records it has left (rate/remaining: the chance it is that
// job's next one), so when the page cache is full the group drops the
// pages whose records have the least of it, and a record given to
// several jobs and not yet taken by each is never the first to go.
//
// Modelled on the sharing benchmark's schedule (BenchmarkPages: four jobs
// at 1x, 1x, 2x, 4x started 3% of an epoch apart, the page cache 65% of
// the data), the kernel's order read 1.62 epochs and this one 1.10.
type Pages struct {
	// Count is the source's pages, numbered across its files; Span is the
	// pages record id lies in. Records follow each other in page order:
	// record id+1's pages start at or after record id's first page.
	Count int
	Span  func(id int) (first, n int)
	// Bytes is a page's size.
	Bytes int64
	// Drop asks the kernel to drop pages first... first+n-1. It is called
	// with no lock of the group held.
	Drop func(first, n int)
	// Room is the bytes the page cache may still take before the kernel
	// evicts, given held, the bytes of the pages the group keeps: while
	// it is negative the group drops its least needed pages.
	Room func(held int64) int64
}

// defaultFresh is a member's count for SetFresh until it is set.
const defaultFresh = 8192

// resident is the pages of a source's records that the page cache holds,
// as far as their keeper (a Group, a Steward) knows: those its jobs took
// or read, less those it dropped. Pages the kernel dropped on its own are
// still counted (a drop of them costs a system call and frees nothing).
// Its keeper's lock guards it.
type resident struct {
	p     Pages
	need  func(pg int) float64 // how soon page pg is needed: the keeper's
	rng   *rand.Rand
	looks int // held pages weighed to drop one
	// blind, if set, says others read the source whose next reads the
	// keeper cannot weigh: it drops nothing then.
	blind func() bool
	place []int32 // page -> its place in pages, or -1
	first []int32 // page -> the first record on it, while it is held
	// by and at are the group member that last took a record on each
	// page and its count of takes then (SetFresh); nil for a Steward,
	// whose jobs hold pages they have read.
	by    []uint8
	at    []uint32
	pages []int32
	added int // pages newly held since Room was asked
	every int // pages newly held between two looks
	// again counts the pages held again since: the kernel may have
	// dropped them, and a keeper that could not drop (a Steward while a
	// job's reads cannot be told) must look again.
	again     int
	asked     bool    // Room was asked once
	room      int64   // what Room said at the last look
	fits      bool    // at the last look, every page of the source fit in the room
	drops     []int32 // pages to drop once the lock is released
	dropCount int64
}

// checkEvery is how many pages a keeper newly holds between two looks at
// the memory left, and what it frees beyond the shortfall when it frees,
// at least: 1 MiB of 4 KiB pages; at most maxEvery, 16 MiB. Between, a
// 256th of the pages the room and the held pages make.
const checkEvery, maxEvery = 256, 4096

// againEvery is how many pages held again make a look at the memory
// left: 16 MiB read of pages the keeper counts as held.
const againEvery = 16 * checkEvery

// sampled is how many held pages the group looks at to drop one: Redis's
// approximated LRU looks at five; sixteen come within a few percent of
// the exact order (BenchmarkPages read 1.10 epochs at sixteen).
const sampled = 16

// stewardSampled is a Steward's: for a job reading every record each
// epoch, every page already read this epoch is as good to drop as
// another, and four find one as well as sixteen (TestStewardKeepsWhat
// IsReadSoonest: 0.29-0.70 against 0.31-0.71 of the reads answered at c
// = 0.3-0.7); a rank alone reads a part of each epoch, and its pages not
// read next epoch are the ones to drop: in a model of a rank of two with
// room for a quarter of the file, 4, 8 and 16 looks answered 0.33, 0.40
// and 0.44 of its reads. Each look is a cache miss in tables of the
// file's pages (16 asking the orders cost a job alone 5% of its CPU on
// the RAM device).
const stewardSampled = 8

func newResident(p Pages, rng *rand.Rand, need func(pg int) float64, looks int, fresh bool) *resident {
	r := &resident{p: p, need: need, rng: rng, looks: looks, every: checkEvery, place: make([]int32, p.Count), first: make([]int32, p.Count)}
	if fresh {
		r.by, r.at = make([]uint8, p.Count), make([]uint32, p.Count)
	}
	for i := range r.place {
		r.place[i] = -1
	}
	return r
}

// hold notes that record id's pages are in the page cache from now on,
// calling mark for each (the group's SetFresh, the steward's next reads);
// look then sees to the room.
func (r *resident) hold(id int, mark func(pg int)) {
	first, n := r.p.Span(id)
	for pg := first; pg < first+n; pg++ {
		if pg < 0 || pg >= len(r.place) {
			continue
		}
		if mark != nil {
			mark(pg)
		}
		if r.place[pg] >= 0 {
			r.again++
			continue
		}
		r.place[pg] = int32(len(r.pages))
		r.pages = append(r.pages, int32(pg))
		r.first[pg] = int32(firstOn(r.p.Span, pg, id))
		r.added++
	}
}

// look, every r.every pages newly held, every againEvery held again, and
// at the first, asks the room left and drops the least needed pages if
// there is none.
func (r *resident) look() {
	if r.added >= r.every || r.again >= againEvery || !r.asked {
		r.lookNow()
	}
}

// lookNow asks the room left, notes whether all the source's pages fit in
// it, and drops the least needed pages if there is no room.
func (r *resident) lookNow() {
	r.added, r.again, r.asked = 0, 0, true
	held := int64(len(r.pages)) * r.p.Bytes
	room := r.p.Room(held)
	r.room = room
	r.fits = room >= 0 && int64(r.p.Count)*r.p.Bytes <= held+room
	// A look reads the cgroup's files (a few hundred µs): in a page cache
	// of many MiB, looks a 256th of it apart, and as much freed beyond the
	// shortfall, cost a job alone under 1% of its CPU where a look every
	// MiB cost 5%, and keep 0.4% fewer pages.
	r.every = int(min(maxEvery, max(checkEvery, (held+room)/r.p.Bytes/256)))
	if room < 0 {
		r.evict(int((-room+r.p.Bytes-1)/r.p.Bytes) + r.every)
	}
}

// touch notes that m took record id, to read it: its pages are in the
// page cache from now on. The group's lock is held.
func (g *Group) touch(m *Member, id int) {
	by, at := uint8(bits.TrailingZeros64(m.bit)), uint32(m.takes)
	g.res.hold(id, func(pg int) { g.res.by[pg], g.res.at[pg] = by, at })
	g.res.look()
}

// firstOn returns the first record on page pg, which record id lies on:
// id, or a record before it ending on pg (a short record shares its page
// with its neighbours).
func firstOn(span func(int) (int, int), pg, id int) int {
	for k := 0; id > 0 && k < 4096; k++ {
		f, n := span(id - 1)
		if n == 0 && f == pg {
			id-- // an empty record ends nothing; one before it may
			continue
		}
		if f+n-1 < pg {
			break
		}
		id--
	}
	return id
}

// evict drops n of the held pages, each the least needed of a sample. A
// sample of pages all kept (held for a slow job, not yet read, or of a
// job whose next reads are unknown) ends it: those stay, and the
// kernel's order decides past them.
func (r *resident) evict(n int) {
	if r.blind != nil && r.blind() {
		return
	}
	for ; n > 0 && len(r.pages) > 0; n-- {
		victim, least := int32(-1), 0.0
		for range r.looks {
			pg := r.pages[r.rng.IntN(len(r.pages))]
			if v := r.need(int(pg)); victim < 0 || v < least {
				victim, least = pg, v
			}
		}
		if least >= kept {
			return
		}
		r.release(int(victim))
	}
}

// release drops held page pg: it is no longer held, and the kernel is
// asked to drop it once the lock is released (dropped).
func (r *resident) release(pg int) {
	k := r.place[pg]
	if k < 0 {
		return
	}
	last := r.pages[len(r.pages)-1]
	r.pages[k] = last
	r.place[last] = k
	r.pages = r.pages[:len(r.pages)-1]
	r.place[pg] = -1
	r.drops = append(r.drops, int32(pg))
	r.dropCount++
}

// records calls fn for the records on held page pg, from its first, until
// fn returns false.
func (r *resident) records(pg, total int, fn func(id int) bool) {
	for id := int(r.first[pg]); id < total; id++ {
		f, n := r.p.Span(id)
		if f > pg {
			return
		}
		if n > 0 && f+n-1 >= pg && !fn(id) {
			return
		}
	}
}

// pageNeed is how soon the records on page pg are needed: the sum of
// their needs, or more than any such sum while the job that last took one
// may not have read it yet.
func (g *Group) pageNeed(pg int) float64 {
	r := g.res
	if m := g.mem[r.by[pg]]; m != nil && uint32(m.takes)-r.at[pg] < uint32(m.fresh()) {
		return kept
	}
	v := 0.0
	r.records(pg, g.opts.Records, func(id int) bool {
		v += g.need(id)
		return true
	})
	return v
}

// kept is the need of a page that must stay: more than any sum of needs.
const kept = 1e9

// need is how soon record id is needed: for each job that still needs it
// in the epoch it is being given, that job's share of the group's takes
// over the records it has left; and kept if it was given to several jobs
// and one of them has still to take it.
func (g *Group) need(id int) float64 {
	if g.waiting[int32(id)] > 0 {
		return kept
	}
	v := 0.0
	for sig := g.cl.sig(id); sig != 0; sig &= sig - 1 {
		if m := g.mem[bits.TrailingZeros64(sig)]; m != nil && m.remaining > 0 {
			v += m.rate / float64(m.remaining)
		}
	}
	return v
}

// rates counts a take by m, and every rateEvery takes sets each member's
// rate, its share of the group's takes, halfway to its share since the
// last time: a job's need follows its pace, measured in takes, not time.
func (g *Group) rates(m *Member) {
	m.takes++
	if g.takes++; g.takes%rateEvery != 0 {
		return
	}
	for _, o := range g.mem {
		if o != nil {
			o.rate = (o.rate + float64(o.takes-o.lastTakes)/rateEvery) / 2
			o.lastTakes = o.takes
		}
	}
}

const rateEvery = 1024

// SetFresh says, with Options.Pages, how many records the job takes
// before it has surely read one it took: its loader plans batches ahead
// of their reads, and a page dropped between the two is read again, into
// a page cache the group no longer counts. A page the job took within
// its last n takes stays. Default 8192.
func (m *Member) SetFresh(n int) {
	m.g.mu.Lock()
	m.ahead = n
	m.g.mu.Unlock()
}

func (m *Member) fresh() int {
	if m.ahead > 0 {
		return m.ahead
	}
	return defaultFresh
}

// dropped returns the pages dropped since the last call, sorted, for the
// caller to drop once the lock is released (dropRuns).
func (r *resident) dropped() []int32 {
	d := r.drops
	r.drops = nil
	slices.Sort(d)
	return d
}

// dropRuns asks the kernel to drop sorted pages, a run of pages at a
// time. No lock is held: a drop is a system call.
func (p *Pages) dropRuns(drops []int32) {
	for i := 0; i < len(drops); {
		k := 1
		for i+k < len(drops) && drops[i+k] == drops[i]+int32(k) {
			k++
		}
		p.Drop(int(drops[i]), k)
		i += k
	}
}
