package share

import (
	"math/rand/v2"
	"sync"
	"time"
)

// Steward chooses which pages of a source's files the page cache keeps
// for jobs that read the source each in an order of its own (no group):
// those the jobs read again soonest, Belady's MIN over the orders'
// inverses, in the room the memory leaves; the others it drops. It is
// Pages without a group. A wrong choice costs a read, never a byte.
//
// A job alone on data larger than the page cache is where the kernel's
// order does worst. Under a uniform shuffle a page's next read is as
// likely anywhere in the next epoch, and the LRU keeps the pages read
// last, those read this epoch, which are not read again until the next;
// a page read early in an epoch is dropped before its read in the next,
// unless fewer than a share c of the pages were read between the two. It
// answers a share c + (1-c)ln(1-c) of the reads (5%, 15% and 34% at a
// cache of 30%, 50% and 70% of the data); keeping the pages whose next
// read is soonest answers c (TestStewardKeepsWhatIsReadSoonest).
type Steward struct {
	mu      sync.Mutex
	res     *resident
	records int
	readers map[*Reader]bool
	// due is, for a held page only one record lies on, the position of
	// the readers' order at which it is read next, plus one, as the job
	// that last read it said then; 0 for a page of several records, whose
	// records are asked when it is weighed. While every reader reads
	// parts of one order (a job alone, its DataLoader workers, its ranks)
	// a page's next read changes only when one of them reads it, so what
	// was said holds until the page is read again, and weighing a page
	// costs no question to an order. Readers of several orders (a sweep
	// that does not share) are each asked.
	due []int64
	// futures are the readers' places and futures this Read, taken at
	// the first weighing; known says whether every reader's order can
	// say, one whether they are parts of one order.
	futures []Future
	now     int64 // the least of the readers' places
	taken   bool
	known   bool
	one     bool
	// looked is when the room was last seen to while the file fit in it,
	// at most fitLook apart.
	looked  time.Time
	fitLook time.Duration
	// For a job alone on the source, told its reads (alone), its bypass
	// (Reader.Bypass) says which records' pages the cache keeps until their
	// next reads, MIN with bypass: pass marks the pages of records it
	// reads now, read past the cache (passed, not held) or from it and
	// not kept (leave, dropped once read); passes counts the first.
	pass   []uint8
	passes int64
}

// fitLook is how often a Steward sees to the room while the whole file
// fits in it: reading at 3 GB/s, 150 MB go by between two looks, and the
// cgroup's room is at least a 32nd of it beyond a look's.
const fitLook = 50 * time.Millisecond

// A Future is a job's place in its order (epoch*N + position) and how
// many positions pass from it before the job reads each record again;
// Ahead's false says its order cannot say, and a nil Ahead that none of
// its reads can be told. Order names the order: the futures of parts of
// one order (its workers', its ranks') name the same, and each its own
// Part; two jobs of one Part are two readings of the order, at places of
// their own.
//
// A job alone on the file is told by Mine and MineNow, its own reads: a
// rank's part of an order reads a part of each epoch, and a rank alone
// on its node keeps the pages it reads soonest, not those its order's
// other ranks, elsewhere, read soonest. Nil Mine: Ahead and Now say.
type Future struct {
	Now         int64
	Ahead       func(id int) (int64, bool)
	Order, Part uint64
	MineNow     int64
	Mine        func(id int) (int64, bool)
}

// own is f told by the job's own reads, for a job alone on the file.
func (f Future) own() Future {
	if f.Mine != nil {
		f.Now, f.Ahead = f.MineNow, f.Mine
	}
	return f
}

// Reader is a job's place in a Steward.
type Reader struct {
	s *Steward
	// order and bypass, for a job alone on a source of a page or more a
	// record, are its order and its first epoch's MIN with bypass (Bypass);
	// the Steward's lock guards them.
	order  *Order
	bypass *bypass
	// future gives the job's future from its place now; nil: the job's
	// reads cannot be told (a share group's, an order with no inverse),
	// and while it reads the Steward drops nothing.
	future func() Future
}

// told is the job's future now, by its own reads if it is the file's only
// reader; a zero Future (no Ahead) if its reads cannot be told. The
// Steward's lock is held.
func (r *Reader) told() Future {
	if r.future == nil {
		return Future{}
	}
	f := r.future()
	if len(r.s.readers) == 1 {
		f = f.own()
	}
	return f
}

// NewSteward returns a Steward over the pages p of a source of records
// records, its sampling drawn from seed.
func NewSteward(p Pages, records int, seed uint64) *Steward {
	s := &Steward{records: records, readers: map[*Reader]bool{}, due: make([]int64, p.Count), fitLook: fitLook, pass: make([]uint8, p.Count)}
	s.res = newResident(p, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), s.pageNeed, stewardSampled, false)
	// While a job whose reads cannot be told reads the source, the
	// Steward drops nothing, as a group beside a Steward's jobs.
	s.res.blind = func() bool { return s.reading(false) }
	return s
}

// reading says a job reads the source whose next reads the Steward is
// told (told) or cannot be told (!told). The Steward's lock is held.
func (s *Steward) reading(told bool) bool {
	for r := range s.readers {
		if (r.future != nil) == told {
			return true
		}
	}
	return false
}

// Join adds a job whose reads future tells, or nil if they cannot be
// told.
func (s *Steward) Join(future func() Future) *Reader {
	r := &Reader{s: s, future: future}
	s.mu.Lock()
	s.readers[r] = true
	s.mu.Unlock()
	return r
}

// Leave takes the job away. Its records marked to read past the page
// cache and not yet told of are forgotten: it will not tell of them.
func (r *Reader) Leave() {
	s := r.s
	s.mu.Lock()
	delete(s.readers, r)
	if r.bypass != nil {
		r.bypass.stop()
	}
	if s.passes > 0 {
		clear(s.pass)
	}
	s.mu.Unlock()
}

// Read says the job has read records ids: their pages are in the page
// cache. Held pages past the room are dropped before it returns.
func (r *Reader) Read(ids []int) {
	s := r.s
	s.mu.Lock()
	if s.res.fits {
		// Every page of the file fits in the room: none will be dropped,
		// and a job reading from the page cache (warm) pays nothing a
		// record; the room is seen to now and then, and once the file
		// no longer fits, pages are held from the next read on (those
		// read before are the kernel's to keep or drop).
		now := time.Now()
		if now.Sub(s.looked) < s.fitLook {
			s.mu.Unlock()
			return
		}
		s.looked = now
		if s.res.lookNow(); s.res.fits {
			s.mu.Unlock()
			return
		}
	}
	s.taken = false
	f := r.told()
	span := s.res.p.Span
	// Every page of the batch is held, with its next read, before the
	// room is seen to: a drop weighs them as they are now. A record read
	// past the page cache left none of its pages there.
	for _, id := range ids {
		if id < 0 || id >= s.records || s.unpass(id) {
			continue
		}
		s.res.hold(id, func(pg int) {
			s.due[pg] = 0
			if f.Ahead == nil || !onlyOn(span, s.records, id, pg) {
				return // a page of several records: weighed when sampled
			}
			if d, ok := f.Ahead(id); ok {
				s.due[pg] = f.Now + d + 1
			}
		})
	}
	s.res.look()
	drops := s.res.dropped()
	s.futures = s.futures[:0]
	s.mu.Unlock()
	if len(drops) > 0 {
		s.res.p.dropRuns(drops)
	}
}

// alone says one job reads the source, whose reads the Steward is told.
// Its lock is held.
func (s *Steward) alone() bool {
	if len(s.readers) != 1 {
		return false
	}
	for r := range s.readers {
		return r.future != nil
	}
	return false
}

// Bypass lets the job's first epoch be planned (bypass.go), o its order: which
// records' pages the page cache keeps until their next reads. The bypass
// is made at the job's first Keeps that finds it alone and the file past
// the room, of that epoch. Only for a source of records a page or more
// each.
func (r *Reader) Bypass(o Order) {
	s := r.s
	if s.res.p.Count < s.records || o.N != s.records {
		return
	}
	s.mu.Lock()
	r.order = &o
	s.mu.Unlock()
}

// Keeps returns the records whose epoch-e reads the page cache keeps, by
// id (a bit each), once the job's bypass has decided, or nil: the job is
// not alone, the file fits, or e is not the epoch planned.
func (r *Reader) Keeps(e int) []uint64 {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.order == nil || !s.alone() || (s.res.asked && s.res.fits) {
		return nil // nothing passes
	}
	if r.bypass == nil {
		r.bypass = newBypass(*r.order, e, func() int64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			if !s.res.asked {
				s.res.lookNow()
			}
			// The pages it may hold, as the last look saw them; in
			// records, which span Count/records pages or more each.
			pages := int64(len(s.res.pages)) + s.res.room/s.res.p.Bytes
			return pages * int64(s.records) / int64(s.res.p.Count)
		})
	}
	return r.bypass.keeps(e)
}

// Passes says which of records ids, read by a job alone now, are to be
// read past the page cache (storage.Request.PastCache), setting past[i]
// for ids[i]: those whose pages its bypass (keep, from Keeps; nil while
// the bypass of the epoch is not made) does not keep until their next
// reads. A held page is read from the cache, and if the bypass does not
// keep it, dropped once Read is told of it. Only for a job alone whose
// reads the Steward is told, and records alone on their pages. The
// caller reads a record past the cache if it says so, and tells Read of
// it as of any other.
func (r *Reader) Passes(ids []int, keep []uint64, past []bool) {
	s := r.s
	if keep == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.alone() || r.future == nil || s.res.fits {
		return
	}
	for i, id := range ids {
		past[i] = s.passes1(id, keep)
	}
}

// passes1 is Passes of one record. The Steward's lock is held.
func (s *Steward) passes1(id int, keep []uint64) bool {
	if id < 0 || id >= s.records || id/64 >= len(keep) {
		return false
	}
	first, n := s.res.p.Span(id)
	if n == 0 || first < 0 || first+n > len(s.pass) || s.pass[first] != 0 {
		return false
	}
	for pg := first; pg < first+n; pg++ {
		if !onlyOn(s.res.p.Span, s.records, id, pg) {
			return false
		}
	}
	kept := keep[id/64]&(1<<(id%64)) != 0
	mark := passed
	if s.res.place[first] >= 0 {
		if kept {
			return false
		}
		mark = leave
	} else if kept {
		return false
	}
	for pg := first; pg < first+n; pg++ {
		s.pass[pg] = mark
	}
	if mark == leave {
		return false
	}
	s.passes++
	return true
}

// What Read does with the pages of a record Passes marked.
const (
	passed uint8 = 1 + iota // read past the cache: not held
	leave                   // read from the cache, not kept: dropped
)

// unpass says record id was read past the page cache (Passes), or drops
// its pages if it was read from the cache not to be kept, and clears its
// pages' marks. The Steward's lock is held.
func (s *Steward) unpass(id int) bool {
	first, n := s.res.p.Span(id)
	if n == 0 || first < 0 || first+n > len(s.pass) || s.pass[first] == 0 {
		return false
	}
	mark := s.pass[first]
	for pg := first; pg < first+n; pg++ {
		s.pass[pg] = 0
		if mark == leave {
			s.res.release(pg)
		}
	}
	return true
}

// onlyOn says record id, of records, is the only one on page pg: the
// record before it ends before pg and the one after starts past it.
func onlyOn(span func(int) (int, int), records, id, pg int) bool {
	if id > 0 {
		if f, n := span(id - 1); f+n-1 >= pg {
			return false
		}
	}
	if id+1 < records {
		if f, _ := span(id + 1); f <= pg {
			return false
		}
	}
	return true
}

// Telling says a job whose next reads the Steward is told reads the
// source now: a share group over it, which cannot weigh them, drops
// none of its pages then (Options.Others).
func (s *Steward) Telling() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reading(true)
}

// Stats are the pages the Steward keeps, those it has dropped and the
// records read past the page cache.
func (s *Steward) Stats() (kept, dropped, passed int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.res.pages)), s.res.dropCount, s.passes
}

// recordsLooked bounds the records of one page whose next reads are
// asked: a page of many short records (text lines) is needed soon if any
// one of them is, and its first sixteen say so about as well as all.
const recordsLooked = 16

// pageNeed is how soon page pg is read again: 1/(1 + positions until the
// next read of a record on it), summed over the orders asked (a page of
// several records, or readers of several orders); kept while a job's
// reads cannot be told. A page's due read that passed unread (its job
// left) needs nothing.
func (s *Steward) pageNeed(pg int) float64 {
	if !s.taken {
		s.taken, s.known, s.one, s.now = true, true, true, -1
		for r := range s.readers {
			f := r.told()
			if f.Ahead == nil {
				s.known = false
				break
			}
			for _, o := range s.futures {
				if f.Order != o.Order || f.Part == o.Part {
					s.one = false
				}
			}
			s.futures = append(s.futures, f)
			if s.now < 0 || f.Now < s.now {
				s.now = f.Now
			}
		}
	}
	if !s.known || len(s.futures) == 0 {
		return kept
	}
	if due := s.due[pg]; due > 0 && s.one {
		if d := due - 1 - s.now; d >= 0 {
			return 1 / float64(1+d)
		}
		return 0
	}
	v := 0.0
	for _, f := range s.futures {
		soonest, looked, ok := int64(-1), 0, true
		s.res.records(pg, s.records, func(id int) bool {
			d, known := f.Ahead(id)
			if !known {
				ok = false
				return false
			}
			if soonest < 0 || d < soonest {
				soonest = d
			}
			looked++
			return looked < recordsLooked
		})
		if !ok {
			return kept
		}
		if soonest >= 0 {
			v += 1 / float64(1+soonest)
		}
	}
	return v
}
