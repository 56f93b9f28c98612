package loader

import (
	"cmp"
	"context"
	"sync"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// Adaptive read-ahead bounds.
const (
	minAhead = 4
	maxAhead = 1024
)

// flight tracks the batches being read, for the adaptive read-ahead: the
// planner may start another batch while fewer than minBatches are being
// read or fewer than twice the engine's depth of reads are in flight (the
// depth adapts to the device, so the reads offered follow it), and while the batches
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
	depth      func() int // the reads in flight the device is given now
	pending    int        // planned, not yet taken by the consumer
	perBatch   int        // reads of the last batch planned
	consumer   int        // the epoch of the last batch taken
}

// maxPending is how many batches may wait planned: enough for 2*maxReads
// reads, at least minBatches*2.
func (f *flight) maxPending(maxReads int) int {
	return min(maxAhead, max(2*f.minBatches, (2*maxReads+f.perBatch-1)/max(1, f.perBatch)))
}

func newFlight(ctx context.Context, minBatches int, depth func() int, epoch int) *flight {
	f := &flight{ctx: ctx, minBatches: minBatches, depth: depth, consumer: epoch}
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
	for {
		maxReads := 2 * f.depth()
		if !(f.batches >= f.minBatches && f.reads >= maxReads) && f.pending < f.maxPending(maxReads) && epoch <= f.consumer+1 {
			break
		}
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

// Depth is the reads in flight the loader's device is given now: the
// option's, when it pins one, or the depth the engine chose for it. Safe
// at any time, from any goroutine.
func (l *Loader) Depth() int {
	return cmp.Or(l.opts.Depth, l.engine.Stats().Depth, storage.DefaultHints.Depth)
}

// maxDepth bounds the depth the loader's own engine may choose: reads in
// flight times the mean read size stay within the memory the loader may
// hold, and within MaxDepth.
func maxDepth(ds dataset.Dataset, opts Options, align int) int {
	size := int64(storage.DefaultHints.BlockSize)
	if n := int64(ds.Len()); n > 0 && ds.Info().Bytes > 0 {
		size = max(1, ds.Info().Bytes/n)
	}
	a := int64(max(1, align))
	size = (size + a - 1) / a * a
	return int(max(1, min(MaxDepth, opts.MemoryBytes/size)))
}
