package share

import (
	"sync"
)

// A plan is MIN with bypass for a job alone whose order is known epochs
// ahead (a global shuffle: its inverse says every record's next read),
// decided before the reads: which reads' pages the page cache keeps
// until their next reads, and which go past it.
//
// Keeping a read's page until the record's next read is an interval of
// positions, and the cache holds at most capacity of them at once. The
// most intervals (the most reads answered) are kept by taking them in
// the order they start and, whenever one too many are held, giving up
// the one that ends last (the greedy for the largest k-colourable set of
// intervals, Carlisle and Lloyd; as many hits as Belady's MIN). A
// Steward without a plan reads every page into the cache and drops, at
// each look, the held pages read last: each epoch under a uniform
// shuffle, with the cache holding 65% of the file, two thirds of the
// pages read into it were dropped unread, and all of the first epoch's
// reads went through it (TestStewardPasses). Planned a whole epoch
// ahead, a read's interval is given up before it starts: the read goes
// past the cache (O_DIRECT), and only pages later read from the cache
// enter it (the first epoch: 65% of its reads, the share the next reads
// from the cache). What is dropped is only pages read from the cache
// whose next reads are not kept.
//
// An interval starting in epoch e ends in epoch e+1, so an epoch's
// decisions are final once the next epoch is planned too. The planner
// runs in a goroutine of its own, an epoch ahead of the job; until an
// epoch's decisions are final (the first tenths of a second of a job),
// every read goes through the cache.
type plan struct {
	n        int
	order    Order
	capacity func() int64 // the pages the cache may hold, at each epoch planned

	mu    sync.Mutex
	cond  *sync.Cond
	want  int // the latest epoch whose decisions were asked for
	done  bool
	final map[int][]uint64 // epoch -> the records whose reads it keeps, by id

	// The greedy's state, its goroutine's own (open is the goroutine's
	// until an epoch is final): each record's held
	// interval's end (its next read's position, plus one; 0 if none) and
	// start, the intervals by end, and the bits of the epochs planned
	// whose decisions are not final.
	end, start []int64
	far        dueHeap
	held       int64
	next       int // the next epoch to plan
	open       map[int][]uint64
}

// An Order is a job's order as a plan reads it: N positions an epoch,
// Fill the ids at positions of an epoch (sampler.Sampler's), and Next,
// for an epoch, the position (epoch*N + position) of each record's read
// in the epoch after it.
type Order struct {
	N    int
	Fill func(e, pos int, ids []int) int
	Next func(e int) func(id int) (int64, bool)
}

// newPlan starts planning o from epoch from, the cache holding capacity()
// pages.
func newPlan(o Order, from int, capacity func() int64) *plan {
	p := &plan{n: o.N, order: o, capacity: capacity, want: from, final: map[int][]uint64{}, open: map[int][]uint64{},
		end: make([]int64, o.N), start: make([]int64, o.N), next: from}
	p.cond = sync.NewCond(&p.mu)
	go p.run()
	return p
}

// keeps returns the records whose epoch-e reads the cache keeps, by id,
// once decided, or nil; it asks for epoch e to be planned.
func (p *plan) keeps(e int) []uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e > p.want {
		p.want = e
		p.cond.Signal()
	}
	return p.final[e]
}

// stop ends the planner.
func (p *plan) stop() {
	p.mu.Lock()
	p.done = true
	p.cond.Signal()
	p.mu.Unlock()
}

func (p *plan) run() {
	for {
		p.mu.Lock()
		for !p.done && p.next > p.want+1 {
			p.cond.Wait()
		}
		if p.done {
			p.mu.Unlock()
			return
		}
		e := p.next
		p.mu.Unlock()
		if !p.epoch(e) {
			return
		}
		p.mu.Lock()
		// Epoch e-1's intervals have all ended: its decisions are final.
		if b, ok := p.open[e-1]; ok {
			p.final[e-1] = b
			delete(p.open, e-1)
		}
		for k := range p.final {
			if k < p.want-1 {
				delete(p.final, k)
			}
		}
		p.next = e + 1
		p.mu.Unlock()
	}
}

// epoch runs the greedy over epoch e's reads; false if the order cannot
// say a read's next.
func (p *plan) epoch(e int) bool {
	c := p.capacity()
	next := p.order.Next(e)
	bits := make([]uint64, (p.n+63)/64)
	p.open[e] = bits
	ids := make([]int, min(p.n, 1<<14))
	for pos := 0; pos < p.n; {
		k := p.order.Fill(e, pos, ids)
		if k <= 0 {
			return false
		}
		for i, id := range ids[:k] {
			t := int64(e*p.n + pos + i)
			if id < 0 || id >= p.n {
				return false
			}
			if p.end[id] != 0 {
				p.held-- // its interval ends at this read
			}
			due, ok := next(id)
			if !ok {
				return false
			}
			p.end[id], p.start[id] = due+1, t
			p.far.push(due+1, id)
			p.held++
			bits[id/64] |= 1 << (id % 64)
			for p.held > c {
				v := p.far.top(p.live)
				if v < 0 {
					break
				}
				// Given up: its read goes past the cache.
				s := p.start[v]
				if b := p.bitsOf(int(s) / p.n); b != nil {
					b[v/64] &^= 1 << (v % 64)
				}
				p.end[v] = 0
				p.held--
			}
		}
		p.far.compact(int(p.held), p.live)
		pos += k
	}
	return true
}

func (p *plan) live(id int32, due int64) bool { return p.end[id] == due }

// bitsOf is the bits of epoch e's reads, while not final.
func (p *plan) bitsOf(e int) []uint64 { return p.open[e] }
