package loader

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// Loader loads batches of a dataset in a sampler's order.
type Loader struct {
	ds       dataset.Dataset
	smp      sampler.Sampler
	stateful sampler.Stateful // nil unless the sampler is a stream
	staged   sampler.Staged   // nil unless the sampler shuffles in memory
	opts     Options
	align    int
	bufAlign int // of batch buffers: align, or O_DIRECT's for PastCache
	head     int
	tail     int
	framed   dataset.Framed
	labels   bool
	rows     dataset.Rows // records are rows of columns, read as cells
	ncells   int
	samples  Samples       // records are a token corpus's samples, read as cells (samples.go)
	rowTf    *rowTransform // rows: the transform of a column, if any
	// gathered is the block order whose windows are loaded whole, each a
	// load its batches are cut from in order (window.go); nil if not.
	gathered *sampler.Block
	outCache *cache.Cache // rows: where the transform's outputs are kept (Options.Cache)
	owedMu   sync.Mutex
	owed     map[int]int // rows: uses of outputs taken and not settled (owe)

	engine     *storage.Engine
	ownEngine  bool
	tf         Transform       // nil: records go to batches as they are
	rnd        RandomTransform // tf, if its outputs depend on a draw: the cache keeps records
	workers    *Workers
	ownWorkers bool
	cache      *cache.Cache
	space      uint64
	stage      stager

	ctx     context.Context
	cancel  context.CancelFunc
	g       *errgroup.Group
	deliver chan *load
	mem     *bound
	// ahead are the loads sent to deliver and not yet taken by Next,
	// oldest first, which shed may give the memory of back (memory.go).
	aheadMu     sync.Mutex
	ahead       []*load
	shedKick    chan struct{}
	scheduleEnd chan struct{} // closed when schedule returns: the shedder ends too
	flight      *flight       // adaptive read-ahead; nil with a fixed Prefetch

	io      sync.WaitGroup // reads submitted to the engine and not yet done
	started chan struct{}  // closed when planning may begin (Lazy: at the first Next)
	start   sync.Once

	// freeLoads keeps released loads, with their slices and read callbacks,
	// for reuse (a sync.Pool would drop them at every collection).
	freeLoads chan *load
	pending   *load // delivered but not yet complete when the consumer gave up waiting
	state     State
	stMu      sync.Mutex // state, mark and places: read by other goroutines than Next's
	mark      any        // the sampler's mark at state
	places    [placesKept]place
	nplaces   int
	complete  atomic.Bool // the planner handed out every batch
	err       error
	waitOnce  sync.Once

	batches, records, reads, bytes, hits, stagedBytes, sharedDecodes atomic.Int64
}

// New starts loading ds in the order of s. Close it when done.
func New(ctx context.Context, ds dataset.Dataset, s sampler.Sampler, opts Options) (*Loader, error) {
	if ds.Len() == 0 {
		return nil, fmt.Errorf("loader: dataset has no records: %w", dataset.ErrEmpty)
	}
	// An order of no positions (a part with nothing left of the epoch it
	// resumes) delivers no batch: its epochs end at once.
	hints := storage.HintsOf(ds.Object(0))
	opts, err := opts.withDefaults(hints)
	if err != nil {
		return nil, err
	}
	l := &Loader{ds: ds, smp: s, opts: opts, align: hints.Align, bufAlign: hints.Align}
	if opts.PastCache != nil {
		l.bufAlign = max(l.align, storage.DirectAlign)
	}
	if f, ok := ds.(dataset.Framed); ok && f.Checks() {
		l.head, l.tail = f.Frame()
		l.framed = f
	}
	l.labels = ds.Label(0) >= 0
	l.state = State{Epoch: opts.Epoch, Batch: opts.Batch, Sampler: opts.SamplerState, Skip: opts.Skip}
	if st, ok := s.(sampler.Stateful); ok && sampler.IsStream(s) {
		l.stateful = st
		if opts.SamplerState != nil {
			e, pos, err := st.Restore(opts.SamplerState)
			if err != nil {
				return nil, fmt.Errorf("loader: resuming: %w", err)
			}
			// A stream is only ever moved forward: a state at or before the
			// next batch's position (a strided loader's state lies after its
			// own last batch) continues there. An opportunistic window is
			// taken from the sampler whole, so a state saved inside one is
			// at its end, and the window is loaded again less Skip.
			bs := l.Batches()
			want, _ := bs.Span(opts.Batch)
			if step := l.window(); step > 1 {
				if end := (opts.Batch/step + 1) * step; end >= bs.Count() {
					want = bs.Len
				} else {
					want, _ = bs.Span(end)
				}
			}
			// A state at the end of the epoch before is the start of this
			// one (a stream that delivered its whole epoch).
			next := e+1 == opts.Epoch && pos == s.Len() && opts.Batch == 0
			if (e != opts.Epoch || pos > want) && !next {
				return nil, fmt.Errorf("loader: resuming: sampler state is at epoch %d position %d, the loader at epoch %d batch %d (position %d): %w",
					e, pos, opts.Epoch, opts.Batch, want, sampler.ErrState)
			}
		} else if opts.Batch > 0 {
			return nil, fmt.Errorf("loader: resuming a %T mid-epoch needs its saved state: %w", s, sampler.ErrState)
		}
	} else if len(opts.SamplerState) > 0 {
		// A state this order has no use for was saved for another (a
		// buffered order's from before its place was computed): going on
		// by position would deliver another order's records.
		return nil, fmt.Errorf("loader: a saved sampler state for an order that keeps none (%T): it was saved for another order, or by an older riffle; resume from the state's epoch and position: %w", s, sampler.ErrState)
	}
	if len(opts.Skip) > 0 && opts.Opportunistic <= 1 {
		return nil, errors.New("loader: Skip is the state of an opportunistic window; Opportunistic is off")
	}
	l.cache, l.space = opts.Cache, opts.CacheSpace
	if rows, ok := ds.(dataset.Rows); ok {
		// A row is several cells put together per batch: it is not one
		// record to cache. A transform reads one of its columns, whose
		// outputs take its place (rowtf.go).
		if opts.Transform != nil {
			if l.rowTf, err = newRowTransform(rows, opts.Transform, opts.Column); err != nil {
				return nil, fmt.Errorf("loader: %w", err)
			}
			if _, random := opts.Transform.(RandomTransform); !random {
				l.outCache = opts.Cache // a row's output is kept, as a record's is
			}
		}
		l.rows, l.ncells, l.cache = rows, rows.NumCells(), nil
		if l.workers = opts.Workers; l.workers == nil {
			l.workers, l.ownWorkers = NewWorkers(0), true
		}
	} else if opts.Column != "" {
		return nil, fmt.Errorf("loader: column %q: a dataset of %s has records, not columns", opts.Column, ds.Info().Format)
	}
	if opts.Samples != nil {
		// A batch of samples is its arrays, put together from its pieces
		// as read: nothing of it is one record to cache or transform.
		if l.rows != nil || opts.Transform != nil || opts.Opportunistic > 1 {
			return nil, fmt.Errorf("loader: samples of a token corpus are read from a dataset of documents, with no transform and no opportunistic windows")
		}
		if _, staged := s.(sampler.Staged); staged {
			return nil, fmt.Errorf("loader: samples of a token corpus in a %T order: its stages are records", s)
		}
		l.samples, l.cache = opts.Samples, nil
		l.bufAlign = max(l.bufAlign, 8) // the arrays are int64
	}
	if st, ok := s.(sampler.Staged); ok && !l.assembled() && opts.Transform == nil {
		// A stage's raw records wait in the cache for their batches. With
		// a transform the cache holds its outputs, under the same keys:
		// each record is read when its batch needs it instead.
		l.staged = st
		if l.cache == nil {
			l.cache = cache.New(cache.Options{Budget: l.stageBudget(), DropUnreferenced: true})
		}
	}
	l.gathered = gatheredOf(ds, s, opts)
	l.rnd, _ = opts.Transform.(RandomTransform)
	if l.tf = opts.Transform; l.tf != nil && l.workers == nil {
		if l.workers = opts.Workers; l.workers == nil {
			l.workers, l.ownWorkers = NewWorkers(0), true
		}
	}
	l.engine = opts.Engine
	if l.engine == nil {
		l.engine = storage.NewEngine(storage.EngineOptions{Depth: opts.Depth, MaxDepth: maxDepth(ds, opts, l.align), NoRing: opts.NoRing})
		l.ownEngine = true
	}
	l.ctx, l.cancel = context.WithCancel(ctx)
	l.g, l.ctx = errgroup.WithContext(l.ctx)
	ahead := opts.Prefetch
	if ahead == 0 {
		ahead = maxAhead
		l.flight = newFlight(l.ctx, minAhead, l.Depth, opts.Epoch)
	}
	l.deliver = make(chan *load, ahead)
	l.freeLoads = make(chan *load, 64)
	l.mem = newBound(opts.MemoryStart)
	l.started = make(chan struct{})
	if !opts.Lazy {
		close(l.started)
	}
	l.scheduleEnd = make(chan struct{})
	l.g.Go(l.schedule)
	if l.sheddable() {
		l.shedKick = make(chan struct{}, 1)
		l.g.Go(l.shedder)
	}
	return l, nil
}

// Batches says how an epoch of this loader is cut into batches.
func (l *Loader) Batches() sampler.Batches {
	return sampler.Batches{Len: l.smp.Len(), Size: l.opts.BatchSize, DropLast: l.opts.DropLast}
}

// schedule turns batches into reads, in order, and starts them
// (prepare.go says how a batch's reads are made).
func (l *Loader) schedule() error {
	defer close(l.scheduleEnd)
	defer close(l.deliver)
	select {
	case <-l.started:
	case <-l.ctx.Done():
		return nil
	}
	bs := l.Batches()
	if bs.Len == 0 {
		l.complete.Store(true)
		return nil
	}
	if bs.Count() == 0 {
		return fmt.Errorf("loader: %d records make no batch of %d with drop_last: %w", bs.Len, bs.Size, dataset.ErrEmpty)
	}
	stride, offset := l.opts.BatchStride, l.opts.BatchOffset
	for e := l.opts.Epoch; l.opts.Epochs < 0 || e < l.opts.Epoch+l.opts.Epochs; e++ {
		if l.gathered != nil {
			first := 0
			if e == l.opts.Epoch && l.opts.Batch > 0 {
				first = l.gatherStart(e, l.opts.Batch, bs) // a window is loaded whole, from its first batch
			}
			for b := first; b < bs.Count(); {
				end := l.gatherSpan(e, b, bs)
				if ok, err := l.load(e, b, end-b, bs, nil); !ok {
					return err
				}
				b = end
			}
			continue
		}
		step := l.window()
		if offset*step >= bs.Count() {
			// A part with no batch in any epoch (a DataLoader worker of
			// an epoch of fewer batches than workers): nothing to load,
			// now or in an epoch to come; going round the epochs for ever
			// held a core.
			break
		}
		// This loader's batches (windows) are offset, offset+stride, ...
		first := offset * step
		var skip []int
		if e == l.opts.Epoch && l.opts.Batch > 0 {
			first = max(first, l.opts.Batch/step*step) // a window is loaded whole, less what was delivered
			if rem := (first/step - offset) % stride; rem != 0 {
				first += (stride - rem) * step
			}
			if step > 1 {
				skip = l.opts.Skip
			}
		}
		for b := first; b < bs.Count(); b += step * stride {
			if ok, err := l.load(e, b, min(step, bs.Count()-b), bs, skip); !ok {
				return err
			}
			skip = nil
		}
	}
	l.complete.Store(true)
	return nil
}

// load plans batches [b, b+nb) of epoch e as one load, waits for its
// memory and its turn, and starts it; false if loading stops (with the
// error, if one stopped it).
func (l *Loader) load(e, b, nb int, bs sampler.Batches, skip []int) (bool, error) {
	j, err := l.prepare(e, b, nb, bs, skip)
	if err != nil {
		return false, err
	}
	if err := l.mem.Acquire(l.ctx, j.weight); err != nil {
		j.unpin()
		return false, nil
	}
	if l.flight != nil && !l.flight.admit(len(j.units), e) {
		l.mem.Release(j.weight)
		j.unpin()
		return false, nil
	}
	l.claim(j)
	if j.Data, err = l.opts.Alloc.Alloc(l.ctx, j.size(), l.bufAlign); err != nil {
		l.mem.Release(j.weight)
		j.unpin()
		return false, fmt.Errorf("loader: allocating %d bytes for batch %d of epoch %d: %w", j.size(), b, e, err)
	}
	j.Batch.j = j
	j.sheddable = l.canShed(j)
	l.dispatch(j)
	l.aheadOf(j) // after dispatch, which the shedder must not overlap; before Next can take it
	select {
	case l.deliver <- j:
		return true, nil
	case <-l.ctx.Done():
		return false, nil
	}
}

// Stats returns counts of the work done so far.
func (l *Loader) Stats() Stats {
	return Stats{Batches: l.batches.Load(), Records: l.records.Load(), Reads: l.reads.Load(), Bytes: l.bytes.Load(),
		CacheHits: l.hits.Load(), Staged: l.stagedBytes.Load(), SharedDecodes: l.sharedDecodes.Load()}
}

// Close stops loading and waits for every goroutine. Batches already
// returned stay valid until released.
func (l *Loader) Close() error {
	l.cancel()
	err := l.g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	// Reads already submitted still land in their buffers, which may be
	// shared memory about to be unmapped: wait for every one.
	l.io.Wait()
	if l.outCache != nil {
		l.giveBackOwed()
	}
	if l.ownEngine {
		l.engine.Close()
	}
	if l.ownWorkers {
		l.workers.Close()
	}
	return err
}
