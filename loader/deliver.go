package loader

import (
	"context"
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
	if l.window() > 1 {
		return l.nextOpportunistic(ctx)
	}
	j := l.pending
	if j == nil {
		var err error
		if j, err = l.take(ctx); err != nil {
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
	if j.err != nil {
		l.err = j.err
		l.release(j)
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
func (l *Loader) advance(j *job, next int) {
	if step := l.window(); l.opts.BatchStride > 1 && next%step == 0 {
		next += (l.opts.BatchStride - 1) * step
	}
	l.state = State{Epoch: j.Epoch, Batch: next}
	if j.mark != nil {
		st, err := l.stateful.Save(j.mark)
		if err == nil {
			l.state.Sampler = st
		}
	}
	if next >= l.Batches().Count() {
		l.state = State{Epoch: j.Epoch + 1}
	}
}

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

// take receives the next planned job, or says why there is none.
func (l *Loader) take(ctx context.Context) (*job, error) {
	select {
	case j, ok := <-l.deliver:
		if !ok {
			return nil, l.finish()
		}
		if l.flight != nil {
			l.flight.taken(j.Epoch)
		}
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

func (l *Loader) release(j *job) {
	if j.win != nil && !j.win.releaseOne() {
		return // other batches of the window are still held
	}
	if j.Data != nil {
		l.opts.Alloc.Free(j.Data)
		j.Data = nil
		l.mem.Release(j.weight)
	}
	j.Batch.j = nil
	select {
	case l.freeJobs <- j:
	default:
	}
}

// State is the place of the next batch Next will return.
func (l *Loader) State() State { return l.state }
