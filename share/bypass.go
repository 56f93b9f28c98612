package share

import (
	"runtime/debug"
	"sync"
)

// A bypass is MIN with bypass for a job alone whose order is known epochs
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
// Steward without a bypass reads every page into the cache and drops, at
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
// A bypass covers the job's first epoch, the one whose every read is a
// miss: there, on a device at memory speed, reading through the cache
// costs the CPU about twice an O_DIRECT read, and a bypass made the epoch
// 1.04-1.31x faster (BENCHMARKS.md, "MIN with bypass"). After it the
// steward keeps pages as before (sampled MIN), whose later epochs
// measured faster on the disk than a bypass of each epoch:
// 165k against 129k samples/s, 2% of it the bypass's tables (20 MB for
// 2^19 records) taking that much of the cgroup's page cache, the rest
// not found.
//
// An interval starting in epoch e ends in epoch e+1, so an epoch's
// decisions are final once the next epoch is planned too. The planner
// runs in a goroutine of its own, from the job's start, and frees its
// tables once the first epoch's decisions are final; until then (the
// first tenths of a second of a job) every read goes through the cache.
type bypass struct {
	n        int
	order    Order
	capacity func() int64 // the pages the cache may hold, at each epoch planned

	from  int // the epoch planned
	mu    sync.Mutex
	done  bool
	final []uint64 // the records whose epoch-from reads it keeps, by id, once final

	// The greedy's state, its goroutine's own (open is the goroutine's
	// until an epoch is final): each record's held
	// interval's end (its next read's position, plus one; 0 if none) and
	// start, the intervals by end, and the bits of the epochs planned
	// whose decisions are not final.
	end, start []int64
	far        dueHeap
	held       int64
	open       map[int][]uint64
}

// BypassBytes bounds what a bypass holds a record: its interval's start and
// end (16), the heap's entries (16 each, up to two a record and a few
// thousand: compact) and its two epochs' bits.
const BypassBytes = 16 + 2*16 + 1

// An Order is a job's order as a bypass reads it: N positions an epoch,
// Fill the ids at positions of an epoch (sampler.Sampler's), and Next,
// for an epoch, the position (epoch*N + position) of each record's read
// in the epoch after it.
type Order struct {
	N    int
	Fill func(e, pos int, ids []int) int
	Next func(e int) func(id int) (int64, bool)
}

// newBypass starts planning epoch from of o, the cache holding capacity()
// pages.
func newBypass(o Order, from int, capacity func() int64) *bypass {
	p := &bypass{n: o.N, order: o, capacity: capacity, from: from, open: map[int][]uint64{},
		end: make([]int64, o.N), start: make([]int64, o.N)}
	go p.run()
	return p
}

// keeps returns the records whose epoch-e reads the cache keeps, by id,
// once decided, or nil: e is not the epoch planned, or its bypass is not
// made yet.
func (p *bypass) keeps(e int) []uint64 {
	if e != p.from {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.final
}

// stop ends the planner.
func (p *bypass) stop() {
	p.mu.Lock()
	p.done = true
	p.mu.Unlock()
}

// run plans epochs from and from+1, whose end makes from's decisions
// final, and frees the greedy's tables.
func (p *bypass) run() {
	for e := p.from; e <= p.from+1; e++ {
		p.mu.Lock()
		done := p.done
		p.mu.Unlock()
		if done || !p.epoch(e) {
			return
		}
	}
	p.mu.Lock()
	p.final = p.open[p.from]
	p.mu.Unlock()
	p.end, p.start, p.far, p.open = nil, nil, nil, nil
	// Its tables (20 MB for 2^19 records) go back to the system now, not
	// as the runtime's scavenger gets to them: until then they take the
	// room of as many pages of the page cache, in a cgroup that holds
	// both (2% of the file's reads an epoch, in the benchmark's 2 GiB in
	// 1.5 GiB).
	debug.FreeOSMemory()
}

// epoch runs the greedy over epoch e's reads; false if the order cannot
// say a read's next.
func (p *bypass) epoch(e int) bool {
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

func (p *bypass) live(id int32, due int64) bool { return p.end[id] == due }

// bitsOf is the bits of epoch e's reads, while not final.
func (p *bypass) bitsOf(e int) []uint64 { return p.open[e] }
