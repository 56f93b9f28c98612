package loader

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
)

// window cuts the batches of an opportunistic job out of its records in the
// order they arrive (DeepIO §III-C): the first Size records to arrive make
// the window's first batch, and so on. The load's buffer is shared by the
// batches and freed when the last of them is released.
//
// A gathered window (ordered) is a block order's instead: its batches are
// loaded as one so that each block of the order's window, whose records
// the window spreads over as many batches, is one read (lirs.txt §4.1:
// small records read by the block, no byte read twice), and they are cut
// in the order's own order, each once all its records are in.
type window struct {
	j       *load
	first   int   // index of the first batch in the epoch
	sizes   []int // records per batch
	ordered bool
	in      []int // ordered: each batch's records arrived
	batchOf []int // ordered: each slot's batch
	mu      sync.Mutex
	arrived []int // delivery slots of the load in arrival order
	ready   []chan struct{}
	cut     int // batches whose records have all arrived
	next    int // the next batch the consumer takes
	held    int // batches handed out and not yet released
	batches []Batch
	// Rows: a row arrives when the last of its cells does (need counts
	// each slot's cells still to read); cells finds a read cell in the
	// load's staging buffer by its place.
	need  []int
	cells map[dataset.Loc]int
	stage rowStage // where a batch cut from the window is transformed
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

// cut says whether loads hold several batches cut from them: an
// opportunistic order's windows, or a block order's gathered ones.
func (l *Loader) cut() bool { return l.window() > 1 || l.gathered != nil }

// gatherMemory is how many gathered loads the loader's memory must hold:
// one delivered while the next is read, and room for a buffer of the last
// one still on its way back to the allocator.
const gatherMemory = 3

// gatheredOf is s, a block order whose windows the loader loads whole
// (one load a window, each block of it one read), or nil: a loader that
// delivers every batch (no stride, no opportunistic order) of records,
// whose memory holds a window's records as often as GatherFits asks.
func gatheredOf(ds dataset.Dataset, s sampler.Sampler, opts Options) *sampler.Block {
	b, ok := s.(*sampler.Block)
	if !ok || b.Window < 2 || opts.Opportunistic > 1 || opts.BatchStride > 1 || b.Blocks() <= b.Window || opts.Samples != nil {
		return nil // a token corpus's blocks are best_fit's windows of samples, no byte range to read whole
	}
	if _, rows := ds.(dataset.Rows); rows {
		return nil
	}
	records := int64(b.Len()) * int64(b.Window) / int64(b.Blocks())
	mean := max(1, ds.Info().Bytes/int64(max(1, ds.Len())))
	if !GatherFits(records, opts.BatchSize, mean, opts.MemoryBytes) {
		return nil
	}
	return b
}

// GatherFits says whether a gathered window of records of mean bytes,
// with a batch beside it, fits in memory gatherMemory times over, each
// record with its bookkeeping (RecordMeta): sampler auto asks it of the
// windows it weighs.
func GatherFits(records int64, batch int, mean, memory int64) bool {
	return (records+int64(batch))*(mean+RecordMeta)*gatherMemory <= memory
}

// gatherSpan is the batches [b, end) of epoch e's gathered load that
// starts at batch b: those starting inside the window holding b's first
// position. A batch that straddles two windows is the first one's.
func (l *Loader) gatherSpan(e, b int, bs sampler.Batches) int {
	pos, _ := bs.Span(b)
	_, hi := l.gathered.WindowOf(e, pos)
	end := max(b+1, (hi+bs.Size-1)/bs.Size)
	return min(end, bs.Count())
}

// gatherStart is the first batch of epoch e's gathered load that holds
// batch b.
func (l *Loader) gatherStart(e, b int, bs sampler.Batches) int {
	pos, _ := bs.Span(b)
	lo, _ := l.gathered.WindowOf(e, pos)
	return min(b, (lo+bs.Size-1)/bs.Size)
}

// arriveRows makes w a window of rows: a row arrives once every cell it
// reads has, and one that reads none (its pages unpacked already) has.
func (w *window) arriveRows() {
	w.need = make([]int, len(w.j.IDs))
	for _, en := range w.j.ents {
		if en.n > 0 {
			w.need[en.slot]++
		}
	}
	for slot, n := range w.need {
		if n == 0 {
			w.arrived = append(w.arrived, slot)
		}
	}
	w.cutReady()
}

// gathered makes w an ordered window: batches cut in order, from batch
// next on (a resumed loader's first batch inside it).
func (w *window) gathered(next int) {
	w.ordered, w.next = true, next
	w.in = make([]int, len(w.sizes))
	w.batchOf = make([]int, 0, len(w.j.IDs))
	for b, n := range w.sizes {
		for range n {
			w.batchOf = append(w.batchOf, b)
		}
	}
	for b := range next {
		close(w.ready[b]) // not delivered: the state was past them
	}
	w.cut = next
}

// arrive records that the records (or cells) of ents have been read.
func (w *window) arrive(ents []entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ordered {
		for _, en := range ents {
			w.in[w.batchOf[en.slot]]++
		}
		for w.cut < len(w.sizes) && w.in[w.cut] == w.sizes[w.cut] {
			close(w.ready[w.cut])
			w.cut++
		}
		return
	}
	for _, en := range ents {
		if w.need == nil {
			w.arrived = append(w.arrived, en.slot)
		} else if en.n > 0 {
			if w.need[en.slot]--; w.need[en.slot] == 0 {
				w.arrived = append(w.arrived, en.slot)
			}
		}
	}
	w.cutReady()
}

// cutReady marks ready the batches whose records have all arrived.
func (w *window) cutReady() {
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
	if s == len(w.sizes)-1 || l.rows != nil {
		// The last batch waits for every read of the load, which may be
		// reused once all of its batches are released. So does every
		// batch of rows: the window's row batch gives up what it holds
		// (a page it claimed to unpack) only then, and a batch cut
		// from it lays its rows out again.
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
	*b = Batch{Epoch: j.Epoch, Index: w.first + s, Pos: j.Pos + start, Last: j.Last && s == len(w.sizes)-1, Data: j.Data, j: j}
	if w.ordered {
		// The batch is the load's slots in order: views of its arrays,
		// which stay the load's until its last batch is released.
		end := start + w.sizes[s]
		b.IDs, b.Off, b.Len = j.IDs[start:end:end], j.Off[start:end:end], j.Len[start:end:end]
		if j.Labels != nil {
			b.Labels = j.Labels[start:end:end]
		}
	} else {
		b.IDs, b.Off, b.Len = make([]int, len(slots)), make([]int, len(slots)), make([]int, len(slots))
		if j.Labels != nil {
			b.Labels = make([]int, len(slots))
		}
		for i, k := range slots {
			b.IDs[i], b.Off[i], b.Len[i] = j.IDs[k], j.Off[k], j.Len[k]
			if b.Labels != nil {
				b.Labels[i] = j.Labels[k]
			}
		}
	}
	if l.rows != nil {
		if err := l.cutRows(ctx, w, b); err != nil {
			w.mu.Unlock()
			l.err = err
			l.cancel()
			return nil, err
		}
	}
	w.next++
	w.held++
	if w.next == len(w.sizes) {
		l.pending = nil // every batch is out: the load is recycled once they are released
	}
	var delivered []int
	if w.next < len(w.sizes) && !w.ordered {
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

// cutRows puts batch b of rows, cut from window w, together in a buffer
// of its own: its rows planned again as one batch, their cells taken from
// where the window's reads put them (a cell the window did not read, as
// a page the window's row batch found unpacked and that is gone since, is read
// here). Called with w.mu held, once every read of the window is done.
func (l *Loader) cutRows(ctx context.Context, w *window, b *Batch) error {
	j := w.j
	if w.cells == nil {
		w.cells = make(map[dataset.Loc]int, len(j.ents))
		for _, en := range j.ents {
			if en.n > 0 {
				w.cells[dataset.Loc{Object: en.obj, Off: en.off, Len: en.n}] = j.cellOff[j.cellAt[en.slot]+en.cell]
			}
		}
	}
	rb, err := l.rows.BatchOf(b.IDs)
	if err != nil {
		return err
	}
	n := l.ncells
	cells := make([][]byte, len(b.IDs)*n)
	var locs []dataset.Loc
	for slot := range b.IDs {
		locs = rb.Cells(slot, locs[:0])
		for k, loc := range locs {
			if loc.Len == 0 {
				continue
			}
			if off, ok := w.cells[loc]; ok {
				cells[slot*n+k] = j.raw[off : off+loc.Len]
				continue
			}
			p := make([]byte, loc.Len)
			if err := l.ds.Object(loc.Object).ReadAt(ctx, p, loc.Off); err != nil {
				rb.Release()
				return err
			}
			cells[slot*n+k] = p
		}
	}
	size := l.rowsSize(rb, len(b.IDs))
	out, err := l.opts.Alloc.Alloc(ctx, size, l.align)
	if err != nil {
		rb.Release()
		return fmt.Errorf("loader: allocating %d bytes for batch %d of epoch %d: %w", size, b.Index, b.Epoch, err)
	}
	cols, err := l.putRows(ctx, rb, b.IDs, b.Epoch, func(slot, k int) []byte { return cells[slot*n+k] }, out, &w.stage)
	if err != nil {
		l.opts.Alloc.Free(out)
		return err
	}
	b.Data, b.own = out, true
	b.Off, b.Len = make([]int, len(b.IDs)), make([]int, len(b.IDs))
	b.Columns = cols
	return nil
}
