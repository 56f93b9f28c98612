package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
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
//	heap    an eighth beyond the cache for the rest of the Go heap, half
//	        of it (decode) the most the image decodes take at once
//	        (transform.Memory: Go's decoders allocate in the Go heap,
//	        libjpeg beside it, so the Go runtime's limit leaves it out);
//	jobs    the rest: every job's arena is reserved from it before the
//	        arena is made.
//
// A job's arena is all the memory its batches may ever take, read ahead
// or held by a client (the loader's memory bound is half of it), so a
// client that holds batches fills its own job's arena and stops being
// fed, and never pushes the daemon past its budget. The Go runtime's
// memory limit follows the reservations (Server.HeapLimit): the heap may
// use what the arenas leave, and the collector works harder, not the OOM
// killer, when arenas take it back.
//
// Memory bends before it refuses (issue 46). A job whose memory bends
// (job/memory.go: memory_bytes left to the daemon, loads of one batch)
// asks for its full arena and the least it runs in, two batches in
// flight. The budget shares itself among the jobs it holds and the opens
// at the head of its queue whose least fits beside the others' least,
// each job's share its want or the same level as the others' (water
// filling, at least its least): an open is granted what room there is up
// to its share at once; if the room is less than its least, the jobs
// above their share are told to shrink to it (the loader's bound falls
// and it gives back the batches it read ahead, loader/memory.go; the
// arena's limit falls with it, and its pages above the limit go back
// once the batches there are released); a job below its share grows as
// room frees. Before, 64 default jobs in a 512 MiB cgroup ran 8 at a
// time, and a process that opened 16 jobs to read them in turn waited
// for ever at its ninth.
//
// An open whose least does not fit beside the others' least waits in a
// queue, first come first served, for as long as its client's connection
// lives and at most MemoryWait; then it is refused with ErrMemory, which
// says what the job needs and what holds the budget. A job whose least is
// larger than the whole budget is refused at once.

// split is how a daemon divides its memory.
type split struct {
	total, slack, cache, heap, decode, jobs int64
}

// splitMemory divides total, with a cache of cache bytes (0: a quarter).
func splitMemory(total, cache int64) split {
	sp := split{total: total, slack: total / 16, cache: cache, heap: total / 8, decode: total / 16}
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
// are reserved: what the arenas, the slack and the decodes' part leave.
func (sp split) heapLimit(held int64) int64 {
	return max(sp.total-sp.slack-sp.decode-held, sp.cache+sp.heap-sp.decode)
}

// budget is the daemon's memory for its jobs' arenas: holds against
// sp.jobs, and the opens waiting for room. It is safe for concurrent use.
type budget struct {
	sp   split
	wait time.Duration
	// changed, if set, is told the bytes held after each change, with
	// the budget's lock held (so calls come in order).
	changed func(held int64)

	mu    sync.Mutex
	held  int64 // the holds' has, summed
	holds []*hold
	queue []*hold // waiting, first come, first served
	// refused counts the opens refused; shrunk the times a job was told
	// to give memory back, grown to take more.
	refused, shrunk, grown int64
}

// hold is one job's part of the budget: between floor and want bytes.
type hold struct {
	want, floor int64
	since       time.Time
	ready       chan struct{} // closed once granted
	// size is what the job was told it may use; has what is charged:
	// size, or more while a shrink waits for batches above it to go.
	size, has int64
	share     int64 // its share at the last balance
	// resize tells the job a new size, its arena's limit and its
	// loader's bound. It reports whether the arena holds nothing above
	// it now; if not, the arena calls fit once it does (never from
	// within resize, never with the budget's lock held). nil until the
	// job has opened (attach): a hold is not resized before.
	resize func(size int64, fit func()) bool
	gone   bool
}

// reserve takes between floor and want bytes of the budget (as much of
// want as the job's share allows), waiting for room while ctx lives, at
// most b.wait.
func (b *budget) reserve(ctx context.Context, want, floor int64) (*hold, error) {
	floor = min(max(1, floor), want)
	b.mu.Lock()
	if floor > b.sp.jobs {
		b.refused++
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: this job needs %s of shared memory for its batches, more than the %s the daemon has for all jobs' "+
			"(what its memory limit of %s leaves beside the record cache's %s and the Go heap): lower memory_bytes or batch_size",
			job.ErrMemory, need(floor, want), humanize.IBytes(uint64(b.sp.jobs)), humanize.IBytes(uint64(b.sp.total)),
			humanize.IBytes(uint64(b.sp.cache)))
	}
	h := &hold{want: want, floor: floor, since: time.Now(), ready: make(chan struct{})}
	b.queue = append(b.queue, h)
	b.balance()
	b.mu.Unlock()
	select {
	case <-h.ready:
		return h, nil
	default:
	}
	slog.Info("an open waits for memory", "needs", floor, "held", b.heldNow(), "budget", b.sp.jobs, "at most", b.wait)
	t := time.NewTimer(b.wait)
	defer t.Stop()
	var why string
	select {
	case <-h.ready:
		return h, nil
	case <-ctx.Done():
		why = "the client went"
	case <-t.C:
		why = fmt.Sprintf("waited %s", b.wait)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-h.ready: // granted as the wait ended
		if ctx.Err() == nil {
			return h, nil
		}
		b.drop(h)
	default:
		b.queue = slices.DeleteFunc(b.queue, func(q *hold) bool { return q == h })
		b.balance() // those behind it may fit
	}
	b.refused++
	var least int64
	for _, o := range b.holds {
		least += o.floor
	}
	return nil, fmt.Errorf("%w: this job needs %s of shared memory for its batches, and %s of the daemon's %s for all jobs' is held by %d jobs "+
		"(%s of it the least they run in: two batches each where memory_bytes was left to the daemon, all of it where one was named; %s); "+
		"lower memory_bytes or batch_size, or wait for jobs to end", job.ErrMemory, need(floor, want), humanize.IBytes(uint64(b.held)),
		humanize.IBytes(uint64(b.sp.jobs)), len(b.holds), humanize.IBytes(uint64(least)), why)
}

// need says what a job needs: its floor, and its want if more.
func need(floor, want int64) string {
	if floor == want {
		return humanize.IBytes(uint64(want))
	}
	return fmt.Sprintf("at least %s (two batches in flight; %s for all it reads ahead)", humanize.IBytes(uint64(floor)), humanize.IBytes(uint64(want)))
}

// attach starts resizing h, whose job has opened, through resize.
func (b *budget) attach(h *hold, resize func(size int64, fit func()) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h.gone {
		return
	}
	h.resize = resize
	b.balance()
}

// release gives back h, whose job has closed and whose arena is gone.
func (b *budget) release(h *hold) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drop(h)
}

// drop removes h from the holds; the lock is held.
func (b *budget) drop(h *hold) {
	if h.gone {
		return
	}
	h.gone = true
	b.holds = slices.DeleteFunc(b.holds, func(o *hold) bool { return o == h })
	b.charge(-h.has)
	b.balance()
}

// charge adds n bytes to those held; the lock is held.
func (b *budget) charge(n int64) {
	b.held += n
	if n != 0 && b.changed != nil {
		b.changed(b.held)
	}
}

// balance shares the budget among the holds and the waiters at the head
// of the queue whose floors fit beside the others' (fill), grants those
// waiters what room there is up to their share, in order; if one is left
// without its floor, tells the holds above their share to shrink to it
// (room comes as their arenas empty above it, fitted), else grows the
// holds below their share into the room; the lock is held. Holds shrink
// only for an open that needs the room: a job keeps what it has until
// then, and its read-ahead is not shed for nothing.
func (b *budget) balance() {
	in := slices.Clone(b.holds)
	var least int64
	for _, h := range in {
		least += h.floor
	}
	admit := 0
	for _, w := range b.queue {
		if least+w.floor > b.sp.jobs {
			break
		}
		least += w.floor
		admit++
	}
	in = append(in, b.queue[:admit]...)
	fill(in, b.sp.jobs)
	grant := func() {
		for ; admit > 0; admit-- {
			w := b.queue[0]
			g := min(w.share, b.sp.jobs-b.held)
			if g < w.floor {
				return
			}
			b.queue = b.queue[1:]
			b.holds = append(b.holds, w)
			w.size, w.has = g, g
			b.charge(g)
			close(w.ready)
		}
	}
	if grant(); admit > 0 {
		// An open waits for room its share holds: the holds above theirs
		// give it back, some at once (grant again), the rest as their
		// arenas empty (fitted balances again).
		for _, h := range b.holds {
			if h.resize != nil && h.size > h.share {
				b.setSize(h, h.share)
				b.shrunk++
			}
		}
		if grant(); admit > 0 {
			return
		}
	}
	for _, h := range b.holds {
		if room := b.sp.jobs - b.held; h.resize != nil && h.size < h.share && room > 0 {
			// It may be shrinking still (has above size): it grows into
			// what it has first.
			b.setSize(h, min(h.share, max(h.has, h.size)+room))
			b.grown++
		}
	}
}

// fill sets each hold's share of total: its want, or the level the others
// share (never below its floor) when the wants do not fit; the floors fit.
func fill(hs []*hold, total int64) {
	at := func(level int64) (sum int64) {
		for _, h := range hs {
			sum += min(h.want, max(h.floor, level))
		}
		return sum
	}
	var level int64
	for _, h := range hs {
		level = max(level, h.want)
	}
	if at(level) > total {
		lo, hi := int64(0), level
		for lo < hi { // the highest level that fits
			m := lo + (hi-lo+1)/2
			if at(m) <= total {
				lo = m
			} else {
				hi = m - 1
			}
		}
		level = lo
	}
	for _, h := range hs {
		h.share = min(h.want, max(h.floor, level))
	}
}

// setSize tells h its size is n; the lock is held. A hold grows at once;
// a shrink is charged until its arena holds nothing above n.
func (b *budget) setSize(h *hold, n int64) {
	h.size = n
	if n > h.has {
		b.charge(n - h.has)
		h.has = n
	}
	if h.resize(n, func() { b.fitted(h, n) }) && h.has > n {
		b.charge(-(h.has - n))
		h.has = n
	}
}

// fitted says h's arena holds nothing above n bytes now (its pages above
// are given back): what it had above goes back to the budget.
func (b *budget) fitted(h *hold, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h.gone || n != h.size || h.has <= n {
		return // stale: it was told another size since
	}
	b.charge(-(h.has - n))
	h.has = n
	b.balance()
}

func (b *budget) heldNow() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// sizeOf is h's size now, what `riffle status` shows of its job.
func (b *budget) sizeOf(h *hold) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return h.size
}

// status is the budget as `riffle status` shows it.
func (b *budget) status() *wire.MemoryStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := &wire.MemoryStatus{Limit: b.sp.total, Cache: b.sp.cache, Heap: b.sp.heap, Decode: b.sp.decode, Jobs: b.sp.jobs,
		Held: b.held, Holders: len(b.holds), Refused: b.refused, Shrunk: b.shrunk, Grown: b.grown}
	for _, h := range b.holds {
		if h.size < h.want {
			st.Bent++
		}
	}
	now := time.Now()
	for _, w := range b.queue {
		st.Waiting = append(st.Waiting, wire.MemoryWait{Bytes: w.floor, Seconds: now.Sub(w.since).Seconds()})
	}
	return st
}
