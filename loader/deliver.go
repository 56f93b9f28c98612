package loader

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// Next returns the next batch, io.EOF after the last epoch, or the first
// error, which names the file and offset of a failed read. The batch is
// valid until its Release.
func (l *Loader) Next(ctx context.Context) (*Batch, error) {
	if l.err != nil {
		return nil, l.err
	}
	l.start.Do(func() {
		if l.opts.Lazy {
			close(l.started)
		}
	})
	if l.cut() {
		return l.nextOpportunistic(ctx)
	}
	j := l.pending
	if j == nil {
		var err error
		if j, err = l.take(ctx); err != nil {
			return nil, err
		}
	}
	if j.shed {
		// Its memory went back while it waited (memory.go): read it again.
		if err := l.reload(ctx, j); err != nil {
			l.pending = j
			return nil, err
		}
	}
	select {
	case <-j.done:
		l.pending = nil
	case <-ctx.Done():
		l.pending = j
		return nil, ctx.Err()
	case <-l.ctx.Done():
		// Reads may still be landing in j's buffer; Close waits for them.
		l.pending = nil
		return nil, l.finish()
	}
	if err := j.err; err != nil {
		// j goes back for reuse (prepare clears its err): read it first.
		l.release(j)
		if errors.Is(err, context.Canceled) && l.ctx.Err() != nil {
			// Its reads were cut because loading stopped (another batch's
			// preparation or read failed first): say why loading stopped, not
			// that this batch's reads were cancelled.
			return nil, l.finish()
		}
		l.err = err
		l.cancel()
		return nil, l.err
	}
	l.batches.Add(1)
	l.records.Add(int64(len(j.IDs)))
	l.advance(j, j.Index+1)
	return &j.Batch, nil
}

// advance moves the loader's place past batch j's index next-1: to the
// next batch this loader delivers (with a stride, the next of its own).
func (l *Loader) advance(j *load, next int) {
	if step := l.window(); l.opts.BatchStride > 1 && next%step == 0 {
		next += (l.opts.BatchStride - 1) * step
	}
	l.stMu.Lock()
	defer l.stMu.Unlock()
	l.state = State{Epoch: j.Epoch, Batch: next}
	l.mark = j.mark
	if next >= l.Batches().Count() {
		l.state, l.mark = State{Epoch: j.Epoch + 1}, nil
	}
	l.places[l.nplaces%len(l.places)] = place{state: l.state, mark: l.mark}
	l.nplaces++
}

// place is a delivered batch's State and its sampler's mark, kept for a
// while so a client pipelining ahead of its user can still ask for the
// state at the batch the user is at (StateAt).
type place struct {
	state State
	mark  any
}

// placesKept is how many delivered batches' places are kept.
const placesKept = 64

// Count is how many batches of each epoch this loader delivers: all of
// them, or its share with a stride.
func (l *Loader) Count() int {
	bs := l.Batches()
	step := l.window()
	windows := (bs.Count() + step - 1) / step
	mine := 0
	for w := l.opts.BatchOffset; w < windows; w += l.opts.BatchStride {
		mine += min(step, bs.Count()-w*step)
	}
	return mine
}

// Left is how many batches this loader delivers of an epoch from batch
// index from on: Count when from is 0. A client counts its requests by it
// instead of working out the stride, windows and shares again.
func (l *Loader) Left(from int) int {
	bs := l.Batches()
	step := l.window()
	left := 0
	for i := max(0, from); i < bs.Count(); i++ {
		if (i/step-l.opts.BatchOffset)%max(1, l.opts.BatchStride) == 0 {
			left++
		}
	}
	return left
}

// take receives the next planned load, or says why there is none.
func (l *Loader) take(ctx context.Context) (*load, error) {
	select {
	case j, ok := <-l.deliver:
		if !ok {
			return nil, l.finish()
		}
		if l.flight != nil {
			l.flight.taken(j.Epoch)
		}
		l.takenFromAhead(j)
		return j, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// finish returns why loading ended: io.EOF after the last epoch.
func (l *Loader) finish() error {
	l.waitOnce.Do(func() {
		err := l.g.Wait()
		switch {
		case err != nil:
			l.err = err
		case l.complete.Load():
			l.err = io.EOF
		default:
			l.err = fmt.Errorf("loader stopped: %w", context.Canceled)
		}
	})
	return l.err
}

func (l *Loader) release(j *load) {
	if j.win != nil && !j.win.releaseOne() {
		return // other batches of the window are still held
	}
	if j.Data != nil {
		l.opts.Alloc.Free(j.Data)
		j.Data = nil
		l.mem.Release(j.weight)
	}
	// A window's batches view the buffer given back: a load kept for reuse
	// must not keep it (Free may let it go) through them.
	j.win = nil
	j.Batch.j = nil
	if l.gathered != nil {
		// A window's bookkeeping, no longer counted once its memory is
		// given back: few loads are gathered (one a window), so reusing
		// theirs saves little, and keeping it holds what no weight counts.
		return
	}
	select {
	case l.freeLoads <- j:
	default:
	}
}

// State is the place of the next batch Next will return, with a stream
// sampler's state there (which may cost O(records) to encode: see Place).
func (l *Loader) State() State {
	l.stMu.Lock()
	st, mark := l.state, l.mark
	l.stMu.Unlock()
	if mark != nil {
		if b, err := l.save(mark, st.Batch); err == nil {
			st.Sampler = b
		}
	}
	return st
}

// save is the sampler's state at mark, the place before batch. An
// opportunistic window is loaded again whole on a resume, less the records
// delivered (Skip), so a stream that can keeps the order of the records
// it gave from the window's start on: the window gets them back.
func (l *Loader) save(mark any, batch int) ([]byte, error) {
	type saverFrom interface {
		SaveFrom(mark any, from int) ([]byte, error)
	}
	if step := l.window(); step > 1 && batch%step != 0 {
		// Inside a window (batch > 0, so the window holding the batch
		// before is of the place's epoch): its records are the tail. On a
		// window's boundary, or at an epoch's start (after the last batch
		// of the epoch before, whose mark it has), every record taken was
		// delivered.
		if sf, ok := l.stateful.(saverFrom); ok {
			bs := l.Batches()
			from := bs.Len
			if w := batch / step * step; w < bs.Count() {
				from, _ = bs.Span(w)
			}
			return sf.SaveFrom(mark, from)
		}
	}
	return l.stateful.Save(mark)
}

// Place is State without the sampler's state: cheap, for every batch.
// Stream reports whether the sampler has a state to save (StateAt).
func (l *Loader) Place() (st State, stream bool) {
	l.stMu.Lock()
	defer l.stMu.Unlock()
	return l.state, l.stateful != nil
}

// setSkip records the delivered records of the current opportunistic
// window in the loader's place.
func (l *Loader) setSkip(skip []int) {
	l.stMu.Lock()
	defer l.stMu.Unlock()
	l.state.Skip = skip
	l.places[(l.nplaces-1)%len(l.places)].state.Skip = skip
}

// StateAt is the State at the place after one of the last batches
// delivered (within the last 64), sampler state included.
func (l *Loader) StateAt(epoch, batch int) (State, error) {
	l.stMu.Lock()
	places, n := l.places, l.nplaces
	l.stMu.Unlock()
	for k := range min(n, len(places)) {
		p := places[(n-1-k)%len(places)]
		if p.state.Epoch == epoch && p.state.Batch == batch {
			st := p.state
			if p.mark != nil {
				b, err := l.save(p.mark, p.state.Batch)
				if err != nil {
					return State{}, err
				}
				st.Sampler = b
			}
			return st, nil
		}
	}
	if epoch == l.opts.Epoch && batch == l.opts.Batch {
		return State{Epoch: epoch, Batch: batch, Sampler: l.opts.SamplerState, Skip: l.opts.Skip}, nil
	}
	return State{}, fmt.Errorf("loader: no state kept for epoch %d batch %d (the last %d delivered are)", epoch, batch, len(l.places))
}
