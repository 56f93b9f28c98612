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
// read or fewer than maxReads reads are in flight, and while the batches
// planned and not yet taken by the consumer are few enough that their
// reads would keep the device busy about twice over. Without that last
// bound a loader of a small dataset, or of many epochs, would read epochs
// ahead of its consumer as far as its memory goes, and waste them all if
// the consumer stops.
type flight struct {
	ctx        context.Context
	mu         sync.Mutex
	cond       *sync.Cond
	batches    int
	reads      int
	minBatches int
	maxReads   int
	pending    int // planned, not yet taken by the consumer
	perBatch   int // reads of the last batch planned
	consumer   int // the epoch of the last batch taken
}

// maxPending is how many batches may wait planned: enough for 2*maxReads
// reads, at least minBatches*2.
func (f *flight) maxPending() int {
	return min(maxAhead, max(2*f.minBatches, (2*f.maxReads+f.perBatch-1)/max(1, f.perBatch)))
}

func newFlight(ctx context.Context, minBatches, maxReads, epoch int) *flight {
	f := &flight{ctx: ctx, minBatches: minBatches, maxReads: maxReads, consumer: epoch}
	f.cond = sync.NewCond(&f.mu)
	context.AfterFunc(ctx, f.wake)
	return f
}

// admit waits until a batch of epoch with reads reads may be planned. A
// batch more than one epoch ahead of the consumer waits too: read-ahead
// crosses into the next epoch, so it starts without a stall, but never
// further, however small the epochs.
func (f *flight) admit(reads, epoch int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.perBatch = max(1, reads)
	for (f.batches >= f.minBatches && f.reads >= f.maxReads) || f.pending >= f.maxPending() || epoch > f.consumer+1 {
		if f.ctx.Err() != nil {
			return false
		}
		f.cond.Wait()
	}
	f.batches++
	f.reads += reads
	f.pending++
	return f.ctx.Err() == nil
}

// taken counts a planned batch of epoch handed to the consumer.
func (f *flight) taken(epoch int) {
	f.mu.Lock()
	f.pending--
	f.consumer = max(f.consumer, epoch)
	f.mu.Unlock()
	f.cond.Broadcast()
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
