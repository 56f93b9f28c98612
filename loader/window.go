package loader

import (
	"context"
	"fmt"
	"sync"

	"github.com/riffle-ml/riffle/sampler"
)

// window cuts the batches of an opportunistic job out of its records in the
// order their reads complete (DeepIO §III-C): the first Size records to
// arrive make the window's first batch, and so on. The job's buffer is
// shared by the batches and freed when the last of them is released.
type window struct {
	j       *job
	first   int   // index of the first batch in the epoch
	sizes   []int // records per batch
	mu      sync.Mutex
	arrived []int // batch slots of the job in completion order
	ready   []chan struct{}
	cut     int // batches whose records have all arrived
	next    int // the next batch the consumer takes
	held    int // batches handed out and not yet released
	batches []Batch
}

func newWindow(j *job, first, nb int, bs sampler.Batches) *window {
	w := &window{j: j, first: first, arrived: make([]int, 0, len(j.IDs))}
	for b := first; b < first+nb; b++ {
		_, n := bs.Span(b)
		w.sizes = append(w.sizes, n)
		w.ready = append(w.ready, make(chan struct{}))
	}
	return w
}

func (l *Loader) window() int { return max(1, l.opts.Opportunistic) }

// arrive records that the job's records [lo, hi) have been read.
func (w *window) arrive(lo, hi int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k := lo; k < hi; k++ {
		w.arrived = append(w.arrived, k)
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
	if j == nil || j.win.next == len(j.win.sizes) {
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
	case <-j.done: // every read finished: all arrived, or one failed
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.ctx.Done():
		l.pending = nil
		return nil, l.finish()
	}
	if s == len(w.sizes)-1 {
		// The last batch waits for the workers to be done with the job,
		// which may be reused once all of its batches are released.
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
	w.mu.Unlock()
	if len(slots) != w.sizes[s] {
		return nil, fmt.Errorf("loader: opportunistic batch %d has %d records, want %d", b.Index, len(slots), w.sizes[s])
	}
	l.batches.Add(1)
	l.records.Add(int64(len(slots)))
	// Resuming restarts at the window's first batch (see Options.Opportunistic).
	l.state = State{Epoch: j.Epoch, Batch: w.first}
	if w.next == len(w.sizes) {
		l.state = State{Epoch: j.Epoch, Batch: w.first + len(w.sizes)}
		if b.Last {
			l.state = State{Epoch: j.Epoch + 1}
		}
	}
	return b, nil
}
