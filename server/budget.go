package server

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// The daemon's memory, added up (issue 28 §1). A daemon's memory is its
// record cache and the rest of its Go heap (indexes, orders, share
// groups), which the Go runtime counts, and its jobs' arenas: shared
// memory, outside the heap, charged to the daemon's memory cgroup page by
// page as the loader first writes them, and never given back while the
// arena lives. Nothing once added these up: each default job's arena could
// grow to 2 x 64 MiB, the Go heap was allowed 4/5 of the limit beside
// them, and a daemon in a 512 MiB cgroup was OOM-killed within a second of
// 64 jobs.
//
// So the limit (the memory cgroup's, or the machine's) is split once, at
// start:
//
//	slack   a sixteenth: the kernel's share of the cgroup (page tables,
//	        socket buffers), stacks, the binary;
//	cache   the record cache (a quarter, unless --cache-bytes);
//	heap    an eighth beyond the cache for the rest of the Go heap;
//	jobs    the rest: every job's arena is reserved from it, whole, before
//	        the arena is made.
//
// A job's arena is all the memory its batches may ever take, read ahead
// or held by a client (the loader's memory bound is half of it), so a
// client that holds batches fills its own job's arena and stops being
// fed, and never pushes the daemon past its budget. The Go runtime's
// memory limit follows the reservations (Server.HeapLimit): the heap may
// use what the arenas leave, and the collector works harder, not the OOM
// killer, when arenas take it back.
//
// An open that does not fit waits in a queue, first come first served, for
// as long as its client's connection lives and at most MemoryWait; then it
// is refused with ErrMemory, which says what the job needs and what holds
// the budget. A job larger than the whole budget is refused at once.

// split is how a daemon divides its memory.
type split struct {
	total, slack, cache, heap, jobs int64
}

// splitMemory divides total, with a cache of cache bytes (0: a quarter).
func splitMemory(total, cache int64) split {
	sp := split{total: total, slack: total / 16, cache: cache, heap: total / 8}
	if sp.cache <= 0 {
		sp.cache = total / 4
	}
	sp.jobs = total - sp.slack - sp.cache - sp.heap
	// A cache asked for larger than the limit leaves: the jobs keep an
	// eighth, and the heap's collector makes room.
	sp.jobs = max(sp.jobs, total/8)
	return sp
}

// heapLimit is the Go runtime's memory limit while held bytes of arenas
// are reserved: what the arenas and the slack leave.
func (sp split) heapLimit(held int64) int64 {
	return max(sp.total-sp.slack-held, sp.cache+sp.heap)
}

// budget is the daemon's memory for its jobs' arenas: reservations
// against sp.jobs, and the opens waiting for room. It is safe for
// concurrent use.
type budget struct {
	sp   split
	wait time.Duration
	// changed, if set, is told the bytes held after each change, with
	// the budget's lock held (so calls come in order).
	changed func(held int64)

	mu      sync.Mutex
	held    int64
	holders int
	queue   []*waiter // first come, first served
	refused int64
}

type waiter struct {
	need  int64
	since time.Time
	ready chan struct{} // closed once granted
}

// reserve takes need bytes of the budget, waiting for room while ctx
// lives, at most b.wait. It returns the function that gives them back.
func (b *budget) reserve(ctx context.Context, need int64) (func(), error) {
	b.mu.Lock()
	if need > b.sp.jobs {
		b.refused++
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: this job needs %s of shared memory for its batches, more than the %s the daemon has for all jobs' "+
			"(what its memory limit of %s leaves beside the record cache's %s and the Go heap): lower memory_bytes or batch_size",
			job.ErrMemory, humanize.IBytes(uint64(need)), humanize.IBytes(uint64(b.sp.jobs)), humanize.IBytes(uint64(b.sp.total)),
			humanize.IBytes(uint64(b.sp.cache)))
	}
	w := &waiter{need: need, since: time.Now(), ready: make(chan struct{})}
	b.queue = append(b.queue, w)
	b.admit()
	b.mu.Unlock()
	release := func() { b.release(need) }
	select {
	case <-w.ready:
		return release, nil
	default:
	}
	slog.Info("an open waits for memory", "needs", need, "held", b.heldNow(), "budget", b.sp.jobs, "at most", b.wait)
	t := time.NewTimer(b.wait)
	defer t.Stop()
	var why string
	select {
	case <-w.ready:
		return release, nil
	case <-ctx.Done():
		why = "the client went"
	case <-t.C:
		why = fmt.Sprintf("waited %s", b.wait)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // granted as the wait ended
		if ctx.Err() == nil {
			return release, nil
		}
		b.give(need)
	default:
		for i, q := range b.queue {
			if q == w {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				break
			}
		}
		b.admit() // those behind it may fit
	}
	b.refused++
	return nil, fmt.Errorf("%w: this job needs %s of shared memory for its batches, and %s of the daemon's %s for all jobs' is held by %d jobs "+
		"(%s); lower memory_bytes or batch_size, or wait for jobs to end", job.ErrMemory, humanize.IBytes(uint64(need)),
		humanize.IBytes(uint64(b.held)), humanize.IBytes(uint64(b.sp.jobs)), b.holders, why)
}

// admit grants the waiters at the head of the queue that fit, in order;
// the lock is held.
func (b *budget) admit() {
	granted := false
	for len(b.queue) > 0 && b.held+b.queue[0].need <= b.sp.jobs {
		w := b.queue[0]
		b.queue = b.queue[1:]
		b.held += w.need
		b.holders++
		close(w.ready)
		granted = true
	}
	if granted && b.changed != nil {
		b.changed(b.held)
	}
}

func (b *budget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.give(n)
}

// give returns n bytes a holder had; the lock is held.
func (b *budget) give(n int64) {
	b.held -= n
	b.holders--
	if b.changed != nil {
		b.changed(b.held)
	}
	b.admit()
}

func (b *budget) heldNow() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// status is the budget as `riffle status` shows it.
func (b *budget) status() *wire.MemoryStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := &wire.MemoryStatus{Limit: b.sp.total, Cache: b.sp.cache, Heap: b.sp.heap, Jobs: b.sp.jobs,
		Held: b.held, Holders: b.holders, Refused: b.refused}
	now := time.Now()
	for _, w := range b.queue {
		st.Waiting = append(st.Waiting, wire.MemoryWait{Bytes: w.need, Seconds: now.Sub(w.since).Seconds()})
	}
	return st
}
