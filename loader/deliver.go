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

// advance moves the loader's place past batch j's index next-1.
func (l *Loader) advance(j *job, next int) {
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

// take receives the next planned job, or says why there is none.
func (l *Loader) take(ctx context.Context) (*job, error) {
	select {
	case j, ok := <-l.deliver:
		if !ok {
			return nil, l.finish()
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
