package share

import (
	"container/list"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// shuffles is a job's uniform order over n records, epoch after epoch,
// with its inverse: the model of a global shuffle.
type shuffles struct {
	n     int
	rng   *rand.Rand
	order [][]int // epoch -> position -> id
	pos   [][]int // epoch -> id -> position
}

func (s *shuffles) epoch(e int) []int {
	for len(s.order) <= e {
		o := s.rng.Perm(s.n)
		p := make([]int, s.n)
		for i, id := range o {
			p[id] = i
		}
		s.order, s.pos = append(s.order, o), append(s.pos, p)
	}
	return s.order[e]
}

// future is the job's Future at absolute position now.
func (s *shuffles) future(now int) Future {
	e, at := now/s.n, now%s.n
	s.epoch(e + 1)
	return Future{Now: int64(now), Ahead: func(id int) (int64, bool) {
		if q := s.pos[e][id]; q >= at {
			return int64(q - at), true
		}
		return int64(s.n - at + s.pos[e+1][id]), true
	}}
}

// pageModel is a page cache of room pages whose pages a Steward keeps:
// held pages are the cached ones, and a drop takes one away.
func pageModel(n, room int, seed uint64) (*Steward, Pages) {
	p := Pages{Count: n, Bytes: 4096, Span: func(id int) (int, int) { return id, 1 }}
	p.Room = func(held int64) int64 { return int64(room)*p.Bytes - held }
	p.Drop = func(int, int) {}
	return NewSteward(p, n, seed), p
}

// TestStewardKeepsWhatIsReadSoonest runs one job's uniform epochs of
// records a page each over a page cache of a share c of them, kept by a
// Steward, and the same reads through an LRU of the same size: the
// Steward answers about c of the reads after the first epoch, the LRU
// c + (1-c)ln(1-c), as the model of job/direct.go says.
func TestStewardKeepsWhatIsReadSoonest(t *testing.T) {
	const n, epochs = 16384, 4
	for _, c := range []float64{0.3, 0.5, 0.7} {
		room := int(c * n)
		s, _ := pageModel(n, room, 1)
		sh := &shuffles{n: n, rng: rand.New(rand.NewPCG(7, uint64(c*100)))}
		now := 0
		r := s.Join(func() Future { return sh.future(now) })
		lru, where := list.New(), map[int]*list.Element{}
		var hits, lruHits, reads int
		for e := range epochs {
			for _, id := range sh.epoch(e) {
				if e > 0 {
					reads++
					if s.res.place[id] >= 0 {
						hits++
					}
					if _, ok := where[id]; ok {
						lruHits++
					}
				}
				now++ // the job's place is past the record it read
				r.Read([]int{id})
				if el, ok := where[id]; ok {
					lru.MoveToFront(el)
				} else {
					where[id] = lru.PushFront(id)
					if lru.Len() > room {
						delete(where, lru.Remove(lru.Back()).(int))
					}
				}
			}
		}
		got, gotLRU := float64(hits)/float64(reads), float64(lruHits)/float64(reads)
		model := c + (1-c)*math.Log1p(-c)
		t.Logf("cache %.0f%% of the data: the Steward answers %.3f of the reads, the LRU %.3f (model %.3f)", 100*c, got, gotLRU, model)
		if got < c-0.04 {
			t.Errorf("cache %.2f: the Steward answered %.3f of the reads, want about %.2f", c, got, c)
		}
		if math.Abs(gotLRU-model) > 0.03 {
			t.Errorf("cache %.2f: the LRU answered %.3f, its model says %.3f", c, gotLRU, model)
		}
		if kept, _, _ := s.Stats(); kept > int64(room+checkEvery) {
			t.Errorf("cache %.2f: %d pages kept, more than the room's %d and a look's %d", c, kept, room, checkEvery)
		}
	}
}

// TestStewardDropsNothingItCannotTell: while a job whose reads cannot be
// told (a share group's, an order with no inverse) reads the source, the
// Steward drops nothing and the kernel's order decides; once it has
// left, the Steward drops again.
func TestStewardDropsNothingItCannotTell(t *testing.T) {
	const n = 4096
	s, _ := pageModel(n, n/4, 2)
	sh := &shuffles{n: n, rng: rand.New(rand.NewPCG(3, 4))}
	now := 0
	known := s.Join(func() Future { return sh.future(now) })
	blind := s.Join(nil)
	for _, id := range sh.epoch(0) {
		now++
		known.Read([]int{id})
	}
	if _, dropped, _ := s.Stats(); dropped != 0 {
		t.Fatalf("%d pages dropped while a job's reads could not be told", dropped)
	}
	blind.Leave()
	for _, id := range sh.epoch(1) {
		now++
		known.Read([]int{id})
	}
	kept, dropped, _ := s.Stats()
	if dropped == 0 || kept > n/4+checkEvery {
		t.Fatalf("after the blind job left: %d kept, %d dropped; want at most %d kept", kept, dropped, n/4)
	}
}

// TestStewardKeepsPagesOfRecordsReadSoon: of many short records a page,
// a page is needed as soon as its soonest record, and the pages kept are
// those read soonest.
func TestStewardKeepsPagesOfRecordsReadSoon(t *testing.T) {
	const perPage, pages = 8, 4096
	n := perPage * pages
	p := Pages{Count: pages, Bytes: 4096, Span: func(id int) (int, int) { return id / perPage, 1 }}
	p.Room = func(held int64) int64 { return int64(pages/2)*p.Bytes - held }
	p.Drop = func(int, int) {}
	s := NewSteward(p, n, 5)
	// Page pg is next read after about pg*perPage positions, but one
	// record of each page in the later half is read at once.
	r := s.Join(func() Future {
		return Future{Ahead: func(id int) (int64, bool) {
			if id/perPage >= pages/2 && id%perPage == 3 {
				return 0, true
			}
			return int64(id), true
		}}
	})
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	r.Read(ids)
	kept, dropped, _ := s.Stats()
	if dropped == 0 {
		t.Fatal("nothing dropped with the pages twice the room")
	}
	// The pages of the first quarter are read within a quarter epoch, the
	// second quarter's after that, the later half's at once: the second
	// quarter's go first.
	far := 0
	for _, pg := range s.res.pages {
		if pg >= pages/4 && pg < pages/2 {
			far++
		}
	}
	if far > int(kept)/20 {
		t.Fatalf("%d of the %d pages kept are of those read last; want under 5%%", far, kept)
	}
}

// TestStewardJobsOfTwoOrders: two jobs reading the file each in its own
// uniform order (a sweep that does not share), one read each in turn, or
// the second two epochs behind, over a page cache of half the pages: each
// order is asked about every page weighed, and each job finds over half
// of its reads cached (the pages of both orders' soonest reads), where
// taking the last reader's word alone left one job 0.33-0.42. Two
// readings of one order (same Part) at other places are two orders.
func TestStewardJobsOfTwoOrders(t *testing.T) {
	const n, epochs = 8192, 5
	for _, c := range []struct {
		name       string
		lag        int // epochs the second job starts after the first
		sameOrders bool
	}{{"together", 0, false}, {"two epochs apart", 2, false}, {"one order read twice, two epochs apart", 2, true}} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := pageModel(n, n/2, 9)
			type job struct {
				sh        *shuffles
				now       int
				hits, all int
			}
			var jobs [2]*job
			for k := range jobs {
				seed := uint64(k + 1)
				if c.sameOrders {
					seed = 1
				}
				j := &job{sh: &shuffles{n: n, rng: rand.New(rand.NewPCG(seed, 2))}}
				jobs[k] = j
			}
			var readers [2]*Reader
			for k, j := range jobs {
				order := uint64(k)
				if c.sameOrders {
					order = 0
				}
				readers[k] = s.Join(func() Future {
					f := j.sh.future(j.now)
					f.Order, f.Part = order, 0
					return f
				})
			}
			read := func(k int) {
				j := jobs[k]
				id := j.sh.epoch(j.now / n)[j.now%n]
				if j.now >= n { // after its first epoch
					j.all++
					if s.res.place[id] >= 0 {
						j.hits++
					}
				}
				j.now++
				readers[k].Read([]int{id})
			}
			for i := range epochs * n {
				read(0)
				if i >= c.lag*n {
					read(1)
				}
			}
			for k, j := range jobs {
				got := float64(j.hits) / float64(j.all)
				t.Logf("job %d: %.3f of its reads after its first epoch cached", k, got)
				if got < 0.5 {
					t.Errorf("job %d found %.3f of its reads cached with room for half the pages; want over 0.5", k, got)
				}
			}
		})
	}
}

// TestStewardHoldsNothingWhileTheFileFits: while every page of the file
// fits in the room the Steward holds and weighs none (a warm job pays
// nothing a record); once the room shrinks below the file it holds the
// pages read from then on and drops the least needed.
func TestStewardHoldsNothingWhileTheFileFits(t *testing.T) {
	const n = 4096
	room := n + 100
	p := Pages{Count: n, Bytes: 4096, Span: func(id int) (int, int) { return id, 1 }, Drop: func(int, int) {}}
	p.Room = func(held int64) int64 { return int64(room)*p.Bytes - held }
	s := NewSteward(p, n, 3)
	s.fitLook = 0 // every read sees to the room
	sh := &shuffles{n: n, rng: rand.New(rand.NewPCG(1, 1))}
	now := 0
	r := s.Join(func() Future { return sh.future(now) })
	read := func(e int) {
		for _, id := range sh.epoch(e) {
			now++
			r.Read([]int{id})
		}
	}
	read(0)
	if kept, dropped, _ := s.Stats(); kept > 1 || dropped != 0 {
		t.Fatalf("with the file in the room the steward holds %d pages and dropped %d; want none", kept, dropped)
	}
	room = n / 4
	read(1)
	kept, dropped, _ := s.Stats()
	if dropped == 0 || kept > int64(room+checkEvery) {
		t.Fatalf("with room for a quarter of the file: %d pages held, %d dropped", kept, dropped)
	}
}

// TestStewardPasses runs one job's uniform epochs over a page cache of
// a share c of its pages twice on the same orders: each record read into
// the cache (as TestStewardKeepsWhatIsReadSoonest), and in the first
// epoch each read past it where the job's bypass does not keep its page
// (MIN with bypass, planned at the start). Both answer about as many
// reads (MIN's c); the bypass's first epoch reads through the cache only
// what the next reads from it, and drops little of it.
func TestStewardPasses(t *testing.T) {
	const n, epochs = 16384, 4
	for _, c := range []float64{0.3, 0.65} {
		room := int(c * n)
		type run struct{ hits, drops, drops0, passes, through, through0, hits1 int64 }
		var runs [2]run
		reads := int64(0)
		for k := range runs {
			s, _ := pageModel(n, room, 1)
			sh := &shuffles{n: n, rng: rand.New(rand.NewPCG(7, uint64(c*100)))}
			now := 0
			r := s.Join(func() Future { return sh.future(now) })
			if k == 1 {
				sh.epoch(epochs + 1)
				r.Bypass(Order{N: n, Fill: func(e, pos int, ids []int) int { return copy(ids, sh.epoch(e)[pos:]) },
					Next: func(e int) func(int) (int64, bool) {
						return func(id int) (int64, bool) { return int64((e+1)*n + sh.pos[e+1][id]), true }
					}})
			}
			run := &runs[k]
			for e := range epochs {
				var keep []uint64
				if k == 1 && e == 0 {
					keep = waitKeeps(t, r, e)
				}
				if k == 1 && e > 0 && r.Keeps(e) != nil {
					t.Fatalf("a bypass of epoch %d, past the first", e)
				}
				for _, id := range sh.epoch(e) {
					hit := s.res.place[id] >= 0
					if hit && e > 0 {
						run.hits++
					}
					if k == 0 && e > 0 {
						reads++
					}
					now++
					past := []bool{false}
					r.Passes([]int{id}, keep, past)
					passed := past[0]
					if passed && hit {
						t.Fatalf("record %d passed though its page is held", id)
					}
					if !passed && !hit {
						run.through++
						if e == 0 {
							run.through0++
						}
					}
					if hit && e == 1 {
						run.hits1++
					}
					if e == 1 && run.drops0 == 0 {
						_, run.drops0, _ = s.Stats()
					}
					r.Read([]int{id})
					if s.pass[id] != 0 {
						t.Fatalf("record %d's page still marked after its read was told", id)
					}
					if passed && s.res.place[id] >= 0 {
						t.Fatalf("record %d read past the cache is held", id)
					}
				}
			}
			if kept, _, _ := s.Stats(); kept > int64(room+checkEvery) {
				t.Errorf("cache %.2f: %d pages kept, more than the room's %d and a look's %d", c, kept, room, checkEvery)
			}
			_, run.drops, run.passes = s.Stats()
			r.Leave()
		}
		for k, name := range []string{"into the cache", "bypassed"} {
			t.Logf("cache %.0f%% of the data, %s: %.3f of the reads answered, %d dropped, %d passed, %d of %d misses read through the cache (first epoch %d, then %d answered)",
				100*c, name, float64(runs[k].hits)/float64(reads), runs[k].drops, runs[k].passes, runs[k].through, int64(epochs)*n-runs[k].hits, runs[k].through0, runs[k].hits1)
		}
		into, bp := runs[0], runs[1]
		if bp.hits < into.hits-reads/50 {
			t.Errorf("cache %.2f: the bypass answered %d reads, reading into the cache %d", c, bp.hits, into.hits)
		}
		if bp.passes == 0 || bp.through0 > bp.hits1+bp.hits1/10 {
			t.Errorf("cache %.2f: the bypass's first epoch passed %d records and read %d through the cache, of which the next answered %d",
				c, bp.passes, bp.through0, bp.hits1)
		}
		// The room runs out by a page now and then, and a look frees a
		// look's pages beyond it (resident.lookNow).
		if bp.drops0 > 2*int64(checkEvery) {
			t.Errorf("cache %.2f: %d pages dropped in the bypass's first epoch", c, bp.drops0)
		}
	}
}

// waitKeeps waits for the bypass of epoch e.
func waitKeeps(t *testing.T, r *Reader, e int) []uint64 {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if k := r.Keeps(e); k != nil {
			return k
		}
		if time.Now().After(deadline) {
			t.Fatalf("no bypass of epoch %d after 30 s", e)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkBypassEpoch is what a bypass costs an epoch of a global shuffle
// of 2^19 records (2 GiB of 4 KiB), the cache holding 65% of them.
func BenchmarkBypassEpoch(b *testing.B) {
	const n = 1 << 19
	sh := &shuffles{n: n, rng: rand.New(rand.NewPCG(1, 2))}
	sh.epoch(b.N + 2)
	o := Order{N: n, Fill: func(e, pos int, ids []int) int { return copy(ids, sh.epoch(e)[pos:]) },
		Next: func(e int) func(int) (int64, bool) {
			return func(id int) (int64, bool) { return int64((e+1)*n + sh.pos[e+1][id]), true }
		}}
	p := &bypass{n: n, order: o, capacity: func() int64 { return n * 65 / 100 }, open: map[int][]uint64{},
		end: make([]int64, n), start: make([]int64, n)}
	b.ResetTimer()
	for e := range b.N {
		p.epoch(e)
		delete(p.open, e-1)
	}
}
