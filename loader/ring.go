package loader

import (
	"log/slog"
	"runtime"
	"sync"

	"github.com/riffle-ml/riffle/storage"
)

// The ring engine serves reads of local files through io_uring: one
// goroutine keeps Depth reads in flight with one system call per round
// instead of Depth goroutines blocked in pread. Blocking preads reach the
// device's queue depth only as fast as Go's runtime hands their scheduler
// slots to other threads, which on a 2-core machine caps cold random reads
// at a third of what the device does; batched submission is what fio does.
//
// Reads whose bytes are already in the page cache never go to the ring: a
// few workers, one per CPU, first try each read with RWF_NOWAIT, which
// copies cached pages at memory speed on every core and fails at once on a
// miss. Only the misses (and every O_DIRECT read) are forwarded to the ring.
// Warm data is thus read by all cores and cold data at the device's depth.

// newAsync returns an io_uring queue when every object is a local file and
// the kernel allows it, or nil to read with goroutines.
func (l *Loader) newAsync() *storage.Async {
	if l.opts.NoRing {
		return nil
	}
	if _, ok := l.ds.Object(0).(*storage.File); !ok {
		return nil
	}
	a, err := storage.NewAsync(l.opts.Depth)
	if err != nil {
		slog.Info("io_uring unavailable, reading with goroutines", "err", err)
		return nil
	}
	return a
}

// pending is one read of a job: the job and the index of the read.
type pending struct {
	j *job
	r int
}

// startRing starts the cache-first workers and the ring goroutine.
func (l *Loader) startRing(a *storage.Async) {
	misses := make(chan pending, a.Cap())
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		l.g.Go(func() error {
			defer wg.Done()
			l.tryCache(misses)
			return nil
		})
	}
	l.g.Go(func() error {
		wg.Wait()
		close(misses)
		return nil
	})
	l.g.Go(func() error { return l.ring(a, misses) })
}

// tryCache serves tasks' reads from the page cache and forwards the rest.
func (l *Loader) tryCache(misses chan<- pending) {
	for {
		t, ok := l.nextTask()
		if !ok {
			return
		}
		j := t.j
		for i := t.lo; i < t.hi; i++ {
			r := j.reads[i]
			if j.failed.Load() || l.ctx.Err() != nil {
				l.readsLeft(j, 1)
				continue
			}
			if l.ds.Object(r.obj).(*storage.File).TryReadAt(j.Data[r.dst:r.dst+r.n], r.off) {
				l.readDone(j, r, nil)
				l.readsLeft(j, 1)
				continue
			}
			select {
			case misses <- pending{j, i}:
			case <-l.ctx.Done():
				l.readsLeft(j, t.hi-i)
				return
			}
		}
		// Reading ahead from the cache never blocks, so without a yield the
		// workers would hold every P until the read-ahead is done, and the
		// goroutine that hands a batch to the consumer (a daemon's client
		// handler) would wait behind them.
		runtime.Gosched()
	}
}

// ring keeps the misses in flight through io_uring until the workers are
// done and every read has finished.
func (l *Loader) ring(a *storage.Async, misses <-chan pending) error {
	defer a.Close()
	slots := make([]pending, a.Cap())
	free := make([]int, 0, a.Cap())
	for i := range slots {
		free = append(free, i)
	}
	closed := false
	add := func(p pending) {
		r := p.j.reads[p.r]
		if p.j.failed.Load() || l.ctx.Err() != nil {
			l.readsLeft(p.j, 1)
			return
		}
		s := free[len(free)-1]
		free = free[:len(free)-1]
		slots[s] = p
		a.Add(l.ds.Object(r.obj).(*storage.File), p.j.Data[r.dst:r.dst+r.n], r.off, uint64(s))
	}
	for {
		// Take what has arrived, blocking only when nothing is in flight.
		// The workers close misses when they stop, cancelled or done, and
		// add counts down what arrives after a cancel.
	fill:
		for len(free) > 0 && !closed {
			var p pending
			var ok bool
			if a.InFlight() == 0 {
				p, ok = <-misses
			} else {
				select {
				case p, ok = <-misses:
				default:
					break fill
				}
			}
			if !ok {
				closed = true
				break
			}
			add(p)
		}
		if a.InFlight() == 0 {
			if closed {
				return nil
			}
			continue
		}
		// Reads in flight always finish before the ring goes: the kernel
		// writes into their buffers.
		if err := a.Wait(func(tag uint64, err error) {
			p := slots[tag]
			slots[tag] = pending{}
			free = append(free, int(tag))
			l.readDone(p.j, p.j.reads[p.r], err)
			l.readsLeft(p.j, 1)
		}); err != nil {
			return err
		}
	}
}
