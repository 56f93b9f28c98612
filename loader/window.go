package loader

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/riffle-ml/riffle/sampler"
)

// window cuts the batches of an opportunistic job out of its records in the
// order they arrive (DeepIO §III-C): the first Size records to arrive make
// the window's first batch, and so on. The load's buffer is shared by the
// batches and freed when the last of them is released.
type window struct {
	j       *load
	first   int   // index of the first batch in the epoch
	sizes   []int // records per batch
	mu      sync.Mutex
	arrived []int // delivery slots of the load in arrival order
	ready   []chan struct{}
	cut     int // batches whose records have all arrived
	next    int // the next batch the consumer takes
	held    int // batches handed out and not yet released
	batches []Batch
}

func newWindow(j *load, first, nb int, bs sampler.Batches) *window {
	w := &window{j: j, first: first, arrived: make([]int, 0, len(j.IDs))}
	for b := first; b < first+nb; b++ {
		_, n := bs.Span(b)
		w.sizes = append(w.sizes, n)
		w.ready = append(w.ready, make(chan struct{}))
	}
	return w
}

func (l *Loader) window() int { return max(1, l.opts.Opportunistic) }

// arrive records that the records of ents have been read.
func (w *window) arrive(ents []entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, en := range ents {
		w.arrived = append(w.arrived, en.slot)
	}
	for w.cut < len(w.sizes) {
		end := 0
		for _, n := range w.sizes[:w.cut+1] {
			end += n
		}
		if len(w.arrived) < end {
			break
		}
		close(w.ready[w.cut])
		w.cut++
	}
}

// releaseOne counts one batch of the window released and reports whether
// it was the last.
func (w *window) releaseOne() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held--
	return w.held == 0 && w.next == len(w.sizes)
}

// nextOpportunistic returns the next batch cut from the current window.
func (l *Loader) nextOpportunistic(ctx context.Context) (*Batch, error) {
	j := l.pending
	if j == nil {
		var err error
		if j, err = l.take(ctx); err != nil {
			return nil, err
		}
		l.pending = j
	}
	w := j.win
	s := w.next
	select {
	case <-w.ready[s]:
	case <-j.done: // every unit finished: all arrived, or one failed
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		l.pending = nil
		return nil, l.finish()
	}
	if s == len(w.sizes)-1 {
		// The last batch waits for every read of the load, which may be
		// reused once all of its batches are released.
		select {
		case <-j.done:
		case <-l.ctx.Done():
			l.pending = nil
			return nil, l.finish()
		}
	}
	if j.failed.Load() {
		<-j.done
		l.err = j.err
		l.cancel()
		return nil, l.err
	}
	w.mu.Lock()
	start := 0
	for _, n := range w.sizes[:s] {
		start += n
	}
	slots := w.arrived[start : start+w.sizes[s]]
	if len(w.batches) == 0 {
		w.batches = make([]Batch, len(w.sizes))
	}
	b := &w.batches[s]
	*b = Batch{Epoch: j.Epoch, Index: w.first + s, Pos: j.Pos + start, Last: j.Last && s == len(w.sizes)-1,
		IDs: make([]int, len(slots)), Off: make([]int, len(slots)), Len: make([]int, len(slots)), Data: j.Data, j: j}
	if j.Labels != nil {
		b.Labels = make([]int, len(slots))
	}
	for i, k := range slots {
		b.IDs[i], b.Off[i], b.Len[i] = j.IDs[k], j.Off[k], j.Len[k]
		if b.Labels != nil {
			b.Labels[i] = j.Labels[k]
		}
	}
	w.next++
	w.held++
	if w.next == len(w.sizes) {
		l.pending = nil // every batch is out: the load is recycled once they are released
	}
	var delivered []int
	if w.next < len(w.sizes) {
		// The records of this window delivered so far: what a resumed
		// loader leaves out of the window (State.Skip).
		delivered = make([]int, 0, start+len(slots))
		for _, k := range w.arrived[:start+len(slots)] {
			delivered = append(delivered, j.IDs[k])
		}
		slices.Sort(delivered)
	}
	w.mu.Unlock()
	if len(slots) != w.sizes[s] {
		return nil, fmt.Errorf("loader: opportunistic batch %d has %d records, want %d", b.Index, len(slots), w.sizes[s])
	}
	l.batches.Add(1)
	l.records.Add(int64(len(slots)))
	l.advance(j, b.Index+1)
	if delivered != nil {
		l.setSkip(append(delivered, l.opts.skipped(j)...))
	}
	return b, nil
}

// skipped returns the records of a resumed window delivered before the
// checkpoint, for a job that is that window.
func (o Options) skipped(j *load) []int {
	if j.Epoch == o.Epoch && j.Index == o.Batch && len(o.Skip) > 0 {
		return o.Skip
	}
	return nil
}
