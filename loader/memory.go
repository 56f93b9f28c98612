package loader

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// bound is the loader's memory bound: the bytes of loads alive (read
// ahead, or held by the consumer) and the most there may be, which moves
// (SetMemory) while loads live, as a daemon's budget bends each job's
// memory to the jobs it holds (server's budget.go). A semaphore's weight
// is fixed once made; this one's is not. The planner acquires, and Next
// for a load it takes back (shed, below); any goroutine releases.
type bound struct {
	mu    sync.Mutex
	cond  *sync.Cond
	used  int64
	limit int64
	// shed counts the loads whose memory was given back before Next took
	// them: the planner waits until Next has loaded them again.
	shed int
	// gen counts changes a reload waits for (releases, loads shed, loads
	// done that could be).
	gen uint64
}

func newBound(limit int64) *bound {
	b := &bound{limit: limit}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// fits says a load of n bytes may start: it fits under the limit beside
// the loads alive, or none is alive (a load larger than the bound is
// still loaded, alone).
func (b *bound) fits(n int64) bool { return b.used+n <= b.limit || b.used == 0 }

// Acquire (the planner's) waits until n bytes fit and no load shed waits
// to be read again, or ctx is done.
func (b *bound) Acquire(ctx context.Context, n int64) error {
	return b.waitUntil(ctx, func() bool { return b.fits(n) && b.shed == 0 }, func() { b.used += n })
}

// TryAcquire takes n bytes if they fit now.
func (b *bound) TryAcquire(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.fits(n) {
		return false
	}
	b.used += n
	return true
}

func (b *bound) Release(n int64) {
	b.mu.Lock()
	b.used -= n
	b.gen++
	b.mu.Unlock()
	b.cond.Broadcast()
}

// poke says a load that could be shed is done.
func (b *bound) poke() {
	b.mu.Lock()
	b.gen++
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *bound) generation() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gen
}

// waitPast waits for a change after generation gen, or ctx's end.
func (b *bound) waitPast(ctx context.Context, gen uint64) error {
	return b.waitUntil(ctx, func() bool { return b.gen != gen }, func() {})
}

// waitUntil waits, under b.mu, until ok holds, then runs then (still under
// b.mu); or returns ctx's error. A cond has no way to wait on a context, so
// ctx's end broadcasts to wake the wait.
func (b *bound) waitUntil(ctx context.Context, ok func() bool, then func()) error {
	stop := context.AfterFunc(ctx, func() {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	})
	defer stop()
	b.mu.Lock()
	defer b.mu.Unlock()
	for !ok() {
		if err := ctx.Err(); err != nil {
			return err
		}
		b.cond.Wait()
	}
	then()
	return nil
}

// setLimit moves the limit; it reports whether the loads alive are over
// it now.
func (b *bound) setLimit(n int64) bool {
	b.mu.Lock()
	b.limit = n
	over := b.used > n
	b.mu.Unlock()
	b.cond.Broadcast()
	return over
}

// over says whether the loads alive are over the limit, or a load of n
// more would be.
func (b *bound) over(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used+n > b.limit && b.used > 0
}

// shedding says loads shed wait to be read again.
func (b *bound) shedding() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.shed > 0
}

// shedOne gives back a load's n bytes before Next took it.
func (b *bound) shedOne(n int64) {
	b.mu.Lock()
	b.used -= n
	b.shed++
	b.gen++
	b.mu.Unlock()
	b.cond.Broadcast()
}

// unshed counts a shed load read again.
func (b *bound) unshed() {
	b.mu.Lock()
	b.shed--
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *bound) Limit() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.limit
}

// SetMemory moves the loader's memory bound to n bytes, at most
// MemoryBytes and at least 1: loads start only while those alive leave
// room under it. Lowered, the loads read ahead that Next has not taken
// give their memory back (shed), those the consumer holds stay until
// released; raised, loads waiting for room start at once. Safe from any
// goroutine.
func (l *Loader) SetMemory(n int64) {
	if over := l.mem.setLimit(min(max(1, n), l.opts.MemoryBytes)); over || l.mem.shedding() {
		l.kickShed()
	}
}

// Memory is the loader's memory bound now (MemoryStart, or the last
// SetMemory).
func (l *Loader) Memory() int64 { return l.mem.Limit() }

// Shedding read-ahead. A daemon that bends a job's memory down (server's
// budget.go) needs the memory back, and a job's memory is mostly batches
// read ahead of its consumer, which a consumer that is busy elsewhere (a
// process opening more jobs before it reads on: jobs read in turn) may not
// take for a long time. So a loader over its bound gives back the memory
// of the loads it read ahead and Next has not taken, newest first, and
// reads each again when Next comes to it; the planner starts no new load
// until they are loaded again, so nothing is read past them meanwhile.
//
// Only a load that can be read again as it was is shed: records read
// whole into the batch (no transform, no rows, no window cut into several
// batches, no staged order), none of them from or for the cache, its
// reads done and none failed.

// sheddable says whether the loader's loads can be shed at all.
func (l *Loader) sheddable() bool {
	return l.tf == nil && !l.assembled() && !l.cut() && l.staged == nil
}

// canShed says whether load j, admitted, can be shed once its reads are done.
func (l *Loader) canShed(j *load) bool {
	if !l.sheddable() || len(j.units) == 0 {
		return false
	}
	for k := range j.ents {
		if j.ents[k].item != nil {
			return false
		}
	}
	return true
}

// kickShed asks the shedder to look at the loads read ahead: to shed
// them if over the bound, else to read those shed again.
func (l *Loader) kickShed() {
	select {
	case l.shedKick <- struct{}{}:
	default:
	}
}

// shedder sheds, when kicked, until the planner ends (Next's reload sheds
// for itself after) or the loader closes.
func (l *Loader) shedder() error {
	for {
		select {
		case <-l.ctx.Done():
			return nil
		case <-l.scheduleEnd:
			return nil
		case <-l.shedKick:
			if l.mem.over(0) {
				l.shed(0)
			} else {
				l.unshed()
			}
		}
	}
}

// shed gives back the memory of loads read ahead and not taken, newest
// first, while those alive are over the bound (with room for need more).
func (l *Loader) shed(need int64) {
	l.aheadMu.Lock()
	defer l.aheadMu.Unlock()
	for i := len(l.ahead) - 1; i >= 0 && l.mem.over(need); i-- {
		j := l.ahead[i]
		if j.shed || !j.sheddable || j.failed.Load() {
			continue
		}
		select {
		case <-j.done:
		default:
			continue // its reads are landing: shed when they are done (finishLoad)
		}
		l.opts.Alloc.Free(j.Data)
		j.Data, j.shed = nil, true
		l.mem.shedOne(j.weight)
	}
}

// aheadOf notes load j planned, for shed, until Next takes it.
func (l *Loader) aheadOf(j *load) {
	l.aheadMu.Lock()
	l.ahead = append(l.ahead, j)
	l.aheadMu.Unlock()
}

// takenFromAhead notes load j taken by Next (the oldest ahead): shed
// leaves it alone from now on.
func (l *Loader) takenFromAhead(j *load) {
	l.aheadMu.Lock()
	defer l.aheadMu.Unlock()
	if len(l.ahead) > 0 && l.ahead[0] == j {
		l.ahead[0] = nil
		l.ahead = l.ahead[1:]
	} else if i := slices.Index(l.ahead, j); i >= 0 {
		l.ahead = slices.Delete(l.ahead, i, i+1)
	}
}

// reload reads a shed load again, now that Next has come to it: its
// memory (loads read ahead after it are shed for it if need be), then
// reread.
func (l *Loader) reload(ctx context.Context, j *load) error {
	for {
		gen := l.mem.generation()
		if l.mem.TryAcquire(j.weight) {
			break
		}
		// Loads read ahead after it give way, as their reads land.
		l.shed(j.weight)
		if l.mem.TryAcquire(j.weight) {
			break
		}
		if err := l.mem.waitPast(ctx, gen); err != nil {
			return err
		}
	}
	j.shed = false
	l.reread(j)
	return nil
}

// unshed reads loads shed and not taken again, oldest first, while they
// fit under the bound: a bound raised again reads ahead again.
func (l *Loader) unshed() {
	var again []*load
	l.aheadMu.Lock()
	for _, j := range l.ahead {
		if !j.shed {
			continue
		}
		if !l.mem.TryAcquire(j.weight) {
			break
		}
		j.shed = false
		j.done = make(chan struct{}) // Next, taking it now, waits for the reads below
		again = append(again, j)
	}
	l.aheadMu.Unlock()
	for _, j := range again {
		l.reread(j)
	}
}

// reread reads shed load j again, its memory acquired: a buffer, and its
// reads as they were laid out.
func (l *Loader) reread(j *load) {
	l.mem.unshed()
	j.err, j.errOnce = nil, sync.Once{}
	if j.done == nil || isClosed(j.done) {
		j.done = make(chan struct{})
	}
	j.failed.Store(false)
	j.again = true
	data, err := l.opts.Alloc.Alloc(l.ctx, j.size(), l.bufAlign)
	if err != nil {
		l.mem.Release(j.weight)
		j.fail(fmt.Errorf("loader: allocating %d bytes for batch %d of epoch %d again: %w", j.size(), j.Index, j.Epoch, err))
		close(j.done)
		return
	}
	j.Data = data
	// One unit more than it has, counted done once dispatch returns: the
	// load completes (and Next may take it, release it, and the planner
	// reuse it) only after dispatch is done with it.
	j.left.Store(int64(len(j.units)) + 1)
	l.dispatch(j)
	if j.left.Add(-1) == 0 {
		l.finishLoad(j)
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
