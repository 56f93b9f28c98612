package loader

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// Batch is one batch of records. Record i is ID[i], its bytes are
// Data[Off[i] : Off[i]+Len[i]].
//
// A Batch and its Data are valid until Release; after that the buffer is
// reused for a later batch. Release it as soon as it is consumed: the
// loader reads ahead only while MemoryBytes allows.
type Batch struct {
	Epoch int  // the epoch it belongs to
	Index int  // its index in the epoch
	Pos   int  // the epoch position of its first record in the sampler's order
	Last  bool // the last batch of its epoch

	IDs    []int
	Labels []int // nil when the dataset has no labels
	Off    []int
	Len    []int
	Data   []byte

	j *job
}

// Record returns record i's bytes, valid until Release.
func (b *Batch) Record(i int) []byte { return b.Data[b.Off[i] : b.Off[i]+b.Len[i]] }

// Contiguous reports whether the records are packed back to back from the
// start of Data, as fixed-size records read without O_DIRECT are, so the
// batch can be viewed as one (n, size) array without a copy.
func (b *Batch) Contiguous() bool {
	at := 0
	for i := range b.Off {
		if b.Off[i] != at {
			return false
		}
		at += b.Len[i]
	}
	return true
}

// Release gives the batch's buffer back. The Batch must not be used after.
func (b *Batch) Release() {
	if j := b.j; j != nil {
		b.j = nil
		j.l.release(j)
	}
}

// State is a loader's place: the next batch it will deliver. Saved with a
// checkpoint, it resumes the same sequence of batches exactly (Options.Epoch
// and Options.Batch).
type State struct {
	Epoch int `json:"epoch"`
	Batch int `json:"batch"`
}

// Stats counts a loader's work so far.
type Stats struct {
	Batches, Records, Reads int64
	Bytes                   int64 // bytes read from storage, alignment and gaps included
}

// Loader loads batches of a dataset in a sampler's order.
type Loader struct {
	ds     dataset.Dataset
	smp    sampler.Sampler
	opts   Options
	align  int
	head   int
	tail   int
	framed dataset.Framed
	labels bool

	ctx     context.Context
	cancel  context.CancelFunc
	g       *errgroup.Group
	tasks   chan task
	deliver chan *job
	mem     *semaphore.Weighted
	flight  *flight // adaptive read-ahead; nil with a fixed Prefetch

	freeJobs sync.Pool
	pending  *job // delivered but not yet complete when the consumer gave up waiting
	state    State
	complete atomic.Bool // the planner handed out every batch
	err      error
	waitOnce sync.Once

	batches, records, reads, bytes atomic.Int64
}

// read is one storage read that serves one or more records.
type read struct {
	obj    int
	off    int64
	n      int
	dst    int
	lo, hi int // the batch's records [lo, hi) lie in it
}

// task is a share of one batch's reads for one worker.
type task struct {
	j      *job
	lo, hi int
}

type job struct {
	Batch
	l       *Loader
	ents    []entry
	reads   []read
	left    atomic.Int64
	done    chan struct{}
	errOnce sync.Once
	err     error
	failed  atomic.Bool
	win     *window // opportunistic ordering: the batches cut from this job
	weight  int64
}

type entry struct {
	obj int
	off int64
	n   int
	id  int
}

// New starts loading ds in the order of s. Close it when done.
func New(ctx context.Context, ds dataset.Dataset, s sampler.Sampler, opts Options) (*Loader, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if s.Len() == 0 {
		return nil, fmt.Errorf("loader: sampler has no positions: %w", dataset.ErrEmpty)
	}
	l := &Loader{ds: ds, smp: s, opts: opts, align: storage.AlignmentOf(ds.Object(0))}
	if f, ok := ds.(dataset.Framed); ok {
		if l.head, l.tail = f.Frame(); l.head+l.tail > 0 {
			l.framed = f
		}
	}
	l.labels = ds.Label(0) >= 0
	l.state = State{Epoch: opts.Epoch, Batch: opts.Batch}
	l.ctx, l.cancel = context.WithCancel(ctx)
	l.g, l.ctx = errgroup.WithContext(l.ctx)
	ahead := opts.Prefetch
	if ahead == 0 {
		ahead = maxAhead
		l.flight = &flight{minBatches: minAhead, maxReads: 2 * opts.Depth}
		l.flight.cond = sync.NewCond(&l.flight.mu)
		context.AfterFunc(l.ctx, l.flight.wake)
	}
	l.tasks = make(chan task, opts.Depth*(min(ahead, 8)+2))
	l.deliver = make(chan *job, ahead)
	l.mem = semaphore.NewWeighted(opts.MemoryBytes)
	l.g.Go(l.plan)
	if async := l.newAsync(); async != nil {
		l.startRing(async)
	} else {
		for range opts.Depth {
			l.g.Go(l.work)
		}
	}
	return l, nil
}

// Batches says how an epoch of this loader is cut into batches.
func (l *Loader) Batches() sampler.Batches {
	return sampler.Batches{Len: l.smp.Len(), Size: l.opts.BatchSize, DropLast: l.opts.DropLast}
}

// plan turns batches into reads, in order, and hands them to the workers.
func (l *Loader) plan() error {
	defer close(l.deliver)
	defer close(l.tasks)
	bs := l.Batches()
	if bs.Count() == 0 {
		return fmt.Errorf("loader: %d records make no batch of %d with drop_last: %w", bs.Len, bs.Size, dataset.ErrEmpty)
	}
	for e := l.opts.Epoch; l.opts.Epochs < 0 || e < l.opts.Epoch+l.opts.Epochs; e++ {
		first := 0
		if e == l.opts.Epoch {
			first = l.opts.Batch
		}
		step := l.window()
		if step > 1 {
			first = first / step * step // a window is loaded whole
		}
		for b := first; b < bs.Count(); b += step {
			j, err := l.prepare(e, b, min(step, bs.Count()-b), bs)
			if err != nil {
				return err
			}
			if err := l.mem.Acquire(l.ctx, j.weight); err != nil {
				return nil
			}
			if l.flight != nil && !l.flight.admit(l.ctx, len(j.reads)) {
				l.mem.Release(j.weight)
				return nil
			}
			if j.Data, err = l.opts.Alloc.Alloc(j.size(), l.align); err != nil {
				l.mem.Release(j.weight)
				return fmt.Errorf("loader: allocating %d bytes for batch %d of epoch %d: %w", j.size(), b, e, err)
			}
			j.Batch.j = j
			// Spread the reads over the workers; small shares keep the
			// device queue full, large ones cost fewer hand-offs.
			share := max(1, (len(j.reads)+l.opts.Depth-1)/l.opts.Depth)
			for lo := 0; lo < len(j.reads); lo += share {
				select {
				case l.tasks <- task{j, lo, min(lo+share, len(j.reads))}:
				case <-l.ctx.Done():
					return nil
				}
			}
			select {
			case l.deliver <- j:
			case <-l.ctx.Done():
				return nil
			}
		}
	}
	l.complete.Store(true)
	return nil
}

func (j *job) size() int {
	if len(j.reads) == 0 {
		return 0
	}
	r := j.reads[len(j.reads)-1]
	return r.dst + r.n
}

// prepare lays out batch b of epoch e: which records, which reads, where
// each record lands.
func (l *Loader) prepare(e, b, nb int, bs sampler.Batches) (*job, error) {
	j, _ := l.freeJobs.Get().(*job)
	if j == nil {
		j = &job{l: l}
	}
	j.err, j.errOnce, j.done, j.win = nil, sync.Once{}, make(chan struct{}), nil
	j.failed.Store(false)
	pos, _ := bs.Span(b)
	lastPos, lastN := bs.Span(b + nb - 1)
	n := lastPos + lastN - pos
	j.Batch = Batch{Epoch: e, Index: b, Pos: pos, Last: b+nb == bs.Count(),
		IDs: grow(j.IDs, n), Off: grow(j.Off, n), Len: grow(j.Len, n)}
	if got := l.smp.Fill(e, pos, j.IDs); got != n {
		return nil, fmt.Errorf("loader: sampler gave %d ids at position %d of epoch %d, want %d", got, pos, e, n)
	}
	j.ents = j.ents[:0]
	size := l.ds.Len()
	for _, id := range j.IDs {
		if id < 0 || id >= size {
			return nil, fmt.Errorf("loader: sampler gave id %d outside [0, %d) in epoch %d", id, size, e)
		}
		loc := l.ds.Locate(id)
		j.ents = append(j.ents, entry{obj: loc.Object, off: loc.Off, n: loc.Len, id: id})
	}
	if !l.opts.Ordered || l.window() > 1 {
		// Fetch order: by location, so neighbours coalesce and the device
		// sees ascending offsets.
		slices.SortFunc(j.ents, func(a, b entry) int {
			if c := cmp.Compare(a.obj, b.obj); c != 0 {
				return c
			}
			return cmp.Compare(a.off, b.off)
		})
	}
	if l.labels {
		j.Labels = grow(j.Labels, n)
	} else {
		j.Labels = nil
	}
	j.reads = j.reads[:0]
	a := int64(l.align)
	gap := int64(l.opts.CoalesceGap)
	if a > 1 {
		gap = 0
	}
	for k, en := range j.ents {
		j.IDs[k], j.Len[k] = en.id, en.n
		if l.labels {
			j.Labels[k] = l.ds.Label(en.id)
		}
		start := en.off - int64(l.head)
		end := en.off + int64(en.n) + int64(l.tail)
		as, ae := start/a*a, (end+a-1)/a*a
		if m := len(j.reads) - 1; m >= 0 {
			cur := &j.reads[m]
			curEnd := cur.off + int64(cur.n)
			if en.obj == cur.obj && as >= cur.off && as <= curEnd+gap {
				cur.n = int(max(curEnd, ae) - cur.off)
				cur.hi = k + 1
				j.Off[k] = cur.dst + int(en.off-cur.off)
				continue
			}
		}
		dst := 0
		if m := len(j.reads) - 1; m >= 0 {
			dst = int((int64(j.reads[m].dst+j.reads[m].n) + a - 1) / a * a)
		}
		j.reads = append(j.reads, read{obj: en.obj, off: as, n: int(ae - as), dst: dst, lo: k, hi: k + 1})
		j.Off[k] = dst + int(en.off-as)
	}
	j.left.Store(int64(len(j.reads)))
	j.weight = min(int64(j.size()), l.opts.MemoryBytes)
	if l.window() > 1 {
		j.win = newWindow(j, b, nb, bs)
	}
	return j, nil
}

func grow(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

// nextTask waits for a share of reads; false when the planner is done or
// the loader stops.
func (l *Loader) nextTask() (task, bool) {
	select {
	case t, ok := <-l.tasks:
		return t, ok
	case <-l.ctx.Done():
		return task{}, false
	}
}

// work serves reads until the planner is done.
func (l *Loader) work() error {
	for {
		t, ok := l.nextTask()
		if !ok {
			return nil
		}
		j := t.j
		for _, r := range j.reads[t.lo:t.hi] {
			if j.failed.Load() || l.ctx.Err() != nil {
				continue
			}
			l.readDone(j, r, l.ds.Object(r.obj).ReadAt(l.ctx, j.Data[r.dst:r.dst+r.n], r.off))
		}
		l.readsLeft(j, t.hi-t.lo)
	}
}

// readDone checks the records of a finished read.
func (l *Loader) readDone(j *job, r read, err error) {
	if err != nil {
		j.fail(err)
		return
	}
	l.reads.Add(1)
	l.bytes.Add(int64(r.n))
	if l.framed != nil {
		for k := r.lo; k < r.hi; k++ {
			frame := j.Data[j.Off[k]-l.head : j.Off[k]+j.Len[k]+l.tail]
			if err := l.framed.Verify(j.IDs[k], frame); err != nil {
				j.fail(err)
				return
			}
		}
	}
	if j.win != nil {
		j.win.arrive(r.lo, r.hi)
	}
}

// readsLeft counts n of j's reads as finished and completes j after its last.
func (l *Loader) readsLeft(j *job, n int) {
	if j.left.Add(-int64(n)) == 0 {
		if l.flight != nil {
			l.flight.done(len(j.reads))
		}
		close(j.done)
	}
}

// Adaptive read-ahead bounds.
const (
	minAhead = 4
	maxAhead = 1024
)

// flight tracks the batches being read, for the adaptive read-ahead: the
// planner may start another batch while fewer than minBatches are being
// read or fewer than maxReads reads are in flight.
type flight struct {
	mu         sync.Mutex
	cond       *sync.Cond
	batches    int
	reads      int
	minBatches int
	maxReads   int
}

func (f *flight) admit(ctx context.Context, reads int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.batches >= f.minBatches && f.reads >= f.maxReads {
		if ctx.Err() != nil {
			return false
		}
		f.cond.Wait()
	}
	f.batches++
	f.reads += reads
	return ctx.Err() == nil
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

func (j *job) fail(err error) {
	j.errOnce.Do(func() {
		j.err = err
		j.failed.Store(true)
	})
}

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
		// Workers may still be writing into j's buffer; leave it to the GC.
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
	l.state = State{Epoch: j.Epoch, Batch: j.Index + 1}
	if j.Last {
		l.state = State{Epoch: j.Epoch + 1}
	}
	return &j.Batch, nil
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
	l.freeJobs.Put(j)
}

// State is the place of the next batch Next will return.
func (l *Loader) State() State { return l.state }

// Stats returns counts of the work done so far.
func (l *Loader) Stats() Stats {
	return Stats{Batches: l.batches.Load(), Records: l.records.Load(), Reads: l.reads.Load(), Bytes: l.bytes.Load()}
}

// Close stops loading and waits for every goroutine. Batches already
// returned stay valid until released.
func (l *Loader) Close() error {
	l.cancel()
	err := l.g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
