package share

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// lru is a model of the kernel's page cache: pages kept by recency, the
// least recent dropped when it is full.
type lru struct {
	cap        int
	in         []bool
	prev, next []int32
	head, tail int32
	n          int
}

func newLRU(pages, capacity int) *lru {
	return &lru{cap: capacity, in: make([]bool, pages), prev: make([]int32, pages), next: make([]int32, pages), head: -1, tail: -1}
}

func (c *lru) unlink(p int32) {
	if c.prev[p] >= 0 {
		c.next[c.prev[p]] = c.next[p]
	} else {
		c.head = c.next[p]
	}
	if c.next[p] >= 0 {
		c.prev[c.next[p]] = c.prev[p]
	} else {
		c.tail = c.prev[p]
	}
}

func (c *lru) drop(p int32) {
	if c.in[p] {
		c.unlink(p)
		c.in[p] = false
		c.n--
	}
}

// read reads page p and says whether the device served it.
func (c *lru) read(p int32) bool {
	hit := c.in[p]
	if hit {
		c.unlink(p)
	} else {
		for c.n >= c.cap {
			c.drop(c.tail)
		}
		c.in[p] = true
		c.n++
	}
	c.prev[p], c.next[p] = -1, c.head
	if c.head >= 0 {
		c.prev[c.head] = p
	}
	c.head = p
	if c.tail < 0 {
		c.tail = p
	}
	return !hit
}

// model runs the sharing benchmark's schedule: jobs taking one epoch each
// of records of sizes (laid end to end, pages of 4096 bytes) at rates
// (records per tick) from start ticks, under a page cache of capFrac of
// the data and a hold of holdFrac. With steer, the group chooses which
// pages the cache keeps (Options.Pages; SetFresh(fresh)), asking the model's
// free room as a daemon asks its cgroup's. Each job reads a record lag
// takes after it took it, as a loader reads the batches it planned. It
// returns the pages the device read, and each job's epoch.
func model(sizes []int, rates []float64, starts []int, capFrac, holdFrac float64, steer bool, lag, fresh int) (int, [][]int) {
	n := len(sizes)
	offs := make([]int64, n+1)
	for i, s := range sizes {
		offs[i+1] = offs[i] + int64(s)
	}
	const page = 4096
	pages := int((offs[n] + page - 1) / page)
	span := func(id int) (int, int) {
		if sizes[id] == 0 {
			return int(offs[id] / page), 0
		}
		f, l := offs[id]/page, (offs[id+1]-1)/page
		return int(f), int(l - f + 1)
	}
	kernel := newLRU(pages, int(capFrac*float64(pages)))
	opts := Options{Records: n, Seed: 1, Hold: int64(holdFrac * float64(offs[n])), Size: func(id int) int { return sizes[id] }}
	if steer {
		opts.Pages = &Pages{Count: pages, Span: span, Bytes: page,
			Drop: func(first, k int) {
				for p := first; p < first+k; p++ {
					kernel.drop(int32(p))
				}
			},
			Room: func(int64) int64 { return int64(kernel.cap-kernel.n-2*checkEvery) * page }}
	}
	read := 0
	done := make([]int, len(rates)) // each job's records read
	readTo := func(k int, got []int, upTo int) {
		for ; done[k] < upTo; done[k]++ {
			f, c := span(got[done[k]])
			for p := f; p < f+c; p++ {
				if kernel.read(int32(p)) {
					read++
				}
			}
		}
	}
	epochs := schedule(NewGroup(opts), n, rates, starts, fresh, func(k int, got []int) {
		if readTo(k, got, len(got)-lag); len(got) == n {
			readTo(k, got, n)
		}
	}, nil)
	return read, epochs
}

// speeds is the sharing benchmark's schedule (bench/share.py): jobs at
// 1x, 1x, 2x, 4x started 3% of an epoch apart.
func speeds(n int) ([]float64, []int) {
	st := n * 3 / 100
	return []float64{1, 1, 2, 4}, []int{0, st, 2 * st, 3 * st}
}

func fixedSizes(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = 4096
	}
	return s
}

// lineSizes are JSONL lines' sizes, 100 B to 8 KiB: several lines share
// a page, and most lines lie on two.
func lineSizes(n int) []int {
	r := rand.New(rand.NewPCG(7, 7))
	s := make([]int, n)
	for i := range s {
		s[i] = 100 + r.IntN(8092)
	}
	return s
}

// recordKind is a model's records: their sizes, laid end to end.
type recordKind struct {
	name  string
	sizes []int
}

// recordKinds are n records of a page each, and n lines.
func recordKinds(n int) []recordKind {
	return []recordKind{{"fixed", fixedSizes(n)}, {"lines", lineSizes(n)}}
}

// The group's choice of pages reads fewer of them than the kernel's LRU on
// the sharing benchmark's schedule, for records of a page each and for
// lines sharing their pages, and every job still takes each record once.
func TestPagesKeptByNeedReadLess(t *testing.T) {
	const n = 20000
	rates, starts := speeds(n)
	for _, c := range recordKinds(n) {
		t.Run(c.name, func(t *testing.T) {
			kernel, _ := model(c.sizes, rates, starts, 0.65, 0.1875, false, 0, 1)
			steered, epochs := model(c.sizes, rates, starts, 0.65, 0.1875, true, 0, 1)
			for k, e := range epochs {
				if s := slices.Sorted(slices.Values(e)); len(s) != n || s[0] != 0 || s[n-1] != n-1 || len(slices.Compact(s)) != n {
					t.Fatalf("job %d took %d records, not each of %d once", k, len(e), n)
				}
			}
			t.Logf("pages read: %d by the kernel's order, %d by need", kernel, steered)
			if steered*5 > kernel*4 {
				t.Fatalf("pages kept by need read %d pages, the kernel's LRU %d: not a fifth fewer", steered, kernel)
			}
		})
	}
}

// A job reads the records it took some takes later, as a loader reads
// the batches it planned: the group keeps their pages until then (Fresh),
// or it drops pages about to be read and reads them twice.
func TestPagesKeptUntilRead(t *testing.T) {
	const n, lag = 20000, 512
	rates, starts := speeds(n)
	kernel, _ := model(fixedSizes(n), rates, starts, 0.65, 0.1875, false, lag, 1)
	early, _ := model(fixedSizes(n), rates, starts, 0.65, 0.1875, true, lag, 1)
	kept, epochs := model(fixedSizes(n), rates, starts, 0.65, 0.1875, true, lag, 2*lag)
	for k, e := range epochs {
		if len(e) != n {
			t.Fatalf("job %d took %d records, want %d", k, len(e), n)
		}
	}
	t.Logf("pages read, records read %d takes after: %d by the kernel's order, %d by need dropping them before, %d keeping them", lag, kernel, early, kept)
	if kept*10 > early*9 || kept*5 > kernel*4 {
		t.Fatalf("pages kept until read: %d pages read, against %d dropped before and %d by the kernel", kept, early, kernel)
	}
}

// The group drops the pages no job needs before those a job still needs,
// and holds no more than the room it is given and what it takes between
// two looks at it.
func TestPagesDropTheUnneededFirst(t *testing.T) {
	const n, budget = 4096, 1024
	var g *Group
	var b *Member
	var most int
	unneeded, all := 0, 0
	g = NewGroup(Options{Records: n, Seed: 3, Hold: 1 << 20, Size: func(int) int { return 4096 },
		Pages: &Pages{Count: n, Bytes: 4096,
			Span: func(id int) (int, int) { return id, 1 },
			Drop: func(first, k int) {
				if b.takes == 0 {
					return
				}
				for pg := first; pg < first+k; pg++ {
					all++
					if g.cl.sig(pg)&b.bit == 0 && g.waiting[int32(pg)] == 0 {
						unneeded++
					}
				}
			},
			Room: func(h int64) int64 { most = max(most, int(h/4096)); return (budget - h/4096) * 4096 }}})
	a, _ := g.Join(nil, 0)
	b, _ = g.Join(nil, 0)
	a.Last, b.Last = 0, 0
	a.SetFresh(1)
	b.SetFresh(1)
	// a takes its whole epoch, sharing with b what b has room for; then
	// b takes half of its epoch. The records b has taken are needed by no
	// one, those it has not by b.
	for p := range n {
		a.Fill(0, p, []int{0})
	}
	for p := range n / 2 {
		b.Fill(0, p, []int{0})
	}
	if most > budget+checkEvery+1 {
		t.Fatalf("the group held %d pages with room for %d", most, budget)
	}
	// A drop at random would find an unneeded page about as often as the
	// kept pages hold them, under half the time here.
	if all == 0 || unneeded*4 < all*3 {
		t.Fatalf("of the %d pages dropped while b read, %d were no job's: the unneeded were not dropped first", all, unneeded)
	}
	t.Logf("%d of %d pages dropped while b read were no job's", unneeded, all)
}

// BenchmarkPages is the sharing benchmark's schedule, modelled, against
// the page cache (a fraction of the data): pages read per page of one
// epoch, by the kernel's order and by need.
func BenchmarkPages(b *testing.B) {
	const n = 100000
	rates, starts := speeds(n)
	for _, sz := range recordKinds(n) {
		for _, capFrac := range []float64{0.5, 0.65} {
			for _, steer := range []bool{false, true} {
				b.Run(fmt.Sprintf("%s/cache=%.0f%%/by-need=%v", sz.name, 100*capFrac, steer), func(b *testing.B) {
					var read int
					for b.Loop() {
						read, _ = model(sz.sizes, rates, starts, capFrac, 0.1875, steer, 0, 1)
					}
					var total int64
					for _, s := range sz.sizes {
						total += int64(s)
					}
					b.ReportMetric(float64(read)*4096/float64(total), "reads/epoch")
				})
			}
		}
	}
}

// While jobs outside the group whose next reads it cannot weigh read the
// source (Options.Others: a steward's), the group drops none of its
// pages; once they have gone, it drops again.
func TestPagesDropNothingBesideOthers(t *testing.T) {
	const n, budget = 4096, 1024
	others := true
	g := NewGroup(Options{Records: n, Seed: 5, Hold: 1 << 20, Size: func(int) int { return 4096 },
		Others: func() bool { return others },
		Pages: &Pages{Count: n, Bytes: 4096, Span: func(id int) (int, int) { return id, 1 }, Drop: func(int, int) {},
			Room: func(h int64) int64 { return (budget - h/4096) * 4096 }}})
	m, _ := g.Join(nil, 0)
	m.SetFresh(1)
	for p := range n {
		m.Fill(0, p, []int{0})
	}
	if st := g.Stats(); st.PagesDropped != 0 {
		t.Fatalf("%d pages dropped while others read the source", st.PagesDropped)
	}
	others = false
	for p := range n {
		m.Fill(1, p, []int{0})
	}
	if st := g.Stats(); st.PagesDropped == 0 || st.PagesKept > budget+checkEvery {
		t.Fatalf("after the others left: %d pages kept, %d dropped, with room for %d", st.PagesKept, st.PagesDropped, budget)
	}
}
