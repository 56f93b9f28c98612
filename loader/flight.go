package loader

import (
	"context"
	"sync"
)

// Adaptive read-ahead bounds.
const (
	minAhead = 4
	maxAhead = 1024
)

// flight tracks the batches being read, for the adaptive read-ahead: the
// planner may start another batch while fewer than minBatches are being
// read or fewer than maxReads reads are in flight.
type flight struct {
	ctx        context.Context
	mu         sync.Mutex
	cond       *sync.Cond
	batches    int
	reads      int
	minBatches int
	maxReads   int
}

func newFlight(ctx context.Context, minBatches, maxReads int) *flight {
	f := &flight{ctx: ctx, minBatches: minBatches, maxReads: maxReads}
	f.cond = sync.NewCond(&f.mu)
	context.AfterFunc(ctx, f.wake)
	return f
}

func (f *flight) admit(reads int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.batches >= f.minBatches && f.reads >= f.maxReads {
		if f.ctx.Err() != nil {
			return false
		}
		f.cond.Wait()
	}
	f.batches++
	f.reads += reads
	return f.ctx.Err() == nil
}

func (f *flight) done(reads int) {
	f.mu.Lock()
	f.batches--
	f.reads -= reads
	f.mu.Unlock()
	f.cond.Broadcast()
}

func (f *flight) wake() {
	f.mu.Lock()
	f.mu.Unlock()
	f.cond.Broadcast()
}
