package storage

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Request is one read for an Engine: len(P) bytes of R at Off.
//
// Done is called exactly once, from one of the engine's goroutines, with
// nil or the read's error (an *Error naming the object and offset, or the
// context's error). P must stay alive and untouched until then: the kernel
// may be writing into it.
type Request struct {
	Ctx  context.Context
	R    Reader
	P    []byte
	Off  int64
	Done func(err error)
	// PastCache reads a local file's bytes past the page cache (O_DIRECT,
	// through a descriptor of its own) where P, Off and len(P) are
	// aligned, so that the read leaves the page cache as it was: a
	// reader that keeps the pages it needs soonest (share.Steward) reads
	// the others so. Elsewhere the read goes through the cache, with the
	// same bytes.
	PastCache bool

	file    *File       // the file under R, when the read can go to the ring
	lane    *lane       // the file's device in the ring
	release func()      // gives the file back (a FileSet's descriptor)
	ic      Interceptor // R's, once it has let the read through
	first   int         // an injected short first read, 0 for none
	delayed bool        // an injected delay has passed
}

// EngineOptions configures an Engine. The zero value works.
type EngineOptions struct {
	// Depth, when above 0, pins how many reads of each device are in flight
	// at once through io_uring (an explicit depth= option). By default the
	// depth of each device adapts to what the device does (depth.go),
	// starting at its Hints' Depth (256 for local files).
	Depth int
	// MaxDepth bounds the adaptive depth of each device; default MaxDepth.
	// A loader sets it from its memory bound: the reads in flight times
	// the read size stay within what it may hold.
	MaxDepth int
	// NoRing reads local files with goroutines calling ReadAt instead of
	// io_uring.
	NoRing bool
}

// Engine keeps many reads of many Readers in flight for every loader that
// shares it; one engine per device is the daemon's design, so that jobs
// sharing a disk share its queue instead of each sizing its own.
//
// Reads of local files (File, a FileSet's files, and the Wrappers of
// either) go through io_uring: one goroutine keeps each device's depth of
// them in flight with one system call per round, where as many goroutines
// blocked in pread would reach the device's queue depth only as fast as
// Go's runtime hands their scheduler slots over (on a 2-core machine, a
// third of what the device does). Before a read goes to the ring, one
// worker per CPU copies it from a mapping of its file if the page cache
// holds its pages (mapped.go: no system call a read), else tries it with
// RWF_NOWAIT, which copies cached pages and fails at once on a miss: warm
// data is read by every core, cold data at the device's depth (while the
// probes keep missing, reads skip them: see probe). That depth is chosen
// per device (the st_dev a file lives on) from the rate and latency the
// ring measures as it goes (depth.go), unless EngineOptions.Depth pins it.
// Reads of other Readers (object stores) are served by a pool of
// goroutines that grows with the requests their stores allow in flight.
type Engine struct {
	opts EngineOptions
	ctx  context.Context
	stop context.CancelFunc
	g    *errgroup.Group

	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*Request // submitted; queue[head:] not yet taken by a worker
	head    int
	workers int
	closed  bool

	misses chan *Request // cache misses for the ring
	blocks chan *Request // reads for the goroutine pool
	ring   bool

	inFlight, reads, bytes atomic.Int64 // for Stats
	mapped                 atomic.Int64 // reads copied from a mapping (mapped.go), for Stats

	// The cache probe's misses in a row, and the reads sent to the ring
	// unprobed while they are many (probe).
	missRun, unprobed atomic.Int64
	pool              atomic.Int64 // goroutines serving blocks

	lanesMu sync.Mutex
	lanes   []*lane // the ring's devices, for Stats
}

// EngineStats is what an engine has done so far.
type EngineStats struct {
	// InFlight is the reads submitted and not yet done: queued, being
	// copied from cached pages, or at the device.
	InFlight int64
	// Reads and Bytes count the reads that succeeded and their bytes,
	// cached pages included: a reader of Bytes over time sees the device's
	// MB/s as the jobs see it.
	Reads, Bytes int64
	// Depth is the reads of a device allowed in flight at the device now
	// (the deepest device's, when the engine reads several), and Latency
	// the mean time its reads spent there over the last window (Little's
	// law: reads in flight over rate); 0 before the first window.
	Depth   int
	Latency time.Duration
	// Mapped counts the reads copied from a mapping of their file, the
	// page cache holding their pages (mapped.go); they are among Reads.
	Mapped int64
}

// Stats reads the engine's counts; safe at any time, from any goroutine.
func (e *Engine) Stats() EngineStats {
	s := EngineStats{InFlight: e.inFlight.Load(), Reads: e.reads.Load(), Bytes: e.bytes.Load(), Mapped: e.mapped.Load()}
	e.lanesMu.Lock()
	for _, ln := range e.lanes {
		if d := ln.ctl.Limit(); d > s.Depth {
			s.Depth, s.Latency = d, time.Duration(ln.latency.Load())
		}
	}
	e.lanesMu.Unlock()
	return s
}

// finish ends a submitted read: every one ends here exactly once, so that
// InFlight comes back to zero.
func (e *Engine) finish(r *Request, err error) {
	if err == nil && len(r.P) > 0 {
		e.reads.Add(1)
		e.bytes.Add(int64(len(r.P)))
	}
	e.inFlight.Add(-1)
	r.Done(err)
}

// NewEngine starts an engine. Close it when no reads are left to submit.
func NewEngine(opts EngineOptions) *Engine {
	opts.Depth = max(0, opts.Depth)
	if opts.MaxDepth <= 0 {
		opts.MaxDepth = MaxDepth
	}
	ringDepth := opts.MaxDepth
	if opts.Depth > 0 {
		ringDepth = opts.Depth
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{opts: opts, ctx: ctx, stop: cancel, misses: make(chan *Request, 256), blocks: make(chan *Request)}
	e.cond = sync.NewCond(&e.mu)
	e.g, _ = errgroup.WithContext(ctx)
	var async *Async
	if !opts.NoRing {
		a, err := NewAsync(ringDepth)
		if err != nil {
			slog.Info("io_uring unavailable, reading with goroutines", "err", err)
		} else {
			async, e.ring = a, true
		}
	}
	var front sync.WaitGroup
	e.workers = runtime.GOMAXPROCS(0)
	for range e.workers {
		front.Add(1)
		e.g.Go(func() error {
			defer front.Done()
			e.serve()
			return nil
		})
	}
	// The goroutine pool serves object stores, which bound their own
	// requests in flight (S3's limiter, per store); it starts as deep as a
	// pinned depth or the depth a search starts at, and grows while every
	// goroutine is busy, up to the most a store is given (toPool).
	for range cmp.Or(opts.Depth, s3StartDepth) {
		e.growPool()
	}
	e.g.Go(func() error {
		front.Wait()
		close(e.blocks)
		close(e.misses)
		return nil
	})
	if async != nil {
		e.g.Go(func() error { return e.runRing(async) })
	}
	return e
}

// Submit queues reads; it never blocks. Each request's Done is called once.
func (e *Engine) Submit(reqs ...*Request) {
	e.inFlight.Add(int64(len(reqs)))
	e.enqueue(reqs...)
}

// enqueue queues submitted reads (a delayed read comes back through it
// without being counted twice).
func (e *Engine) enqueue(reqs ...*Request) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		for _, r := range reqs {
			e.finish(r, errEngineClosed)
		}
		return
	}
	if e.head > 1024 && e.head > len(e.queue)/2 {
		e.queue = e.queue[:copy(e.queue, e.queue[e.head:])]
		e.head = 0
	}
	e.queue = append(e.queue, reqs...)
	e.mu.Unlock()
	if len(reqs) == 1 {
		e.cond.Signal()
	} else {
		e.cond.Broadcast()
	}
}

var errEngineClosed = errors.New("storage engine closed")

// take waits for submitted reads and moves a fair share of them (at least
// one) into batch: taking several per lock keeps the hand-off cheap when
// a batch's hundreds of reads arrive at once. It returns false once the
// engine is closed and its queue is empty.
func (e *Engine) take(batch []*Request) ([]*Request, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.head == len(e.queue) {
		if e.closed {
			return batch, false
		}
		e.cond.Wait()
	}
	left := e.queue[e.head:]
	k := min(len(left), max(1, len(left)/e.workers), cap(batch))
	batch = append(batch, left[:k]...)
	clear(left[:k])
	e.head += k
	if e.head == len(e.queue) {
		e.queue, e.head = e.queue[:0], 0 // keep the backing array
	}
	return batch, true
}

// serve is a front worker: it fails cancelled reads, applies injected
// faults, serves cached pages (from a mapping, or with RWF_NOWAIT) and
// forwards the rest.
func (e *Engine) serve() {
	debug.SetPanicOnFault(true) // a copy from a mapped file that shrank faults (mapped.go)
	batch := make([]*Request, 0, 64)
	var landed []*Request
	for {
		var ok bool
		batch, ok = e.take(batch[:0])
		if !ok {
			return
		}
		for _, r := range batch {
			if e.serveOne(r) {
				landed = append(landed, r)
			}
		}
		e.settle(landed)
		clear(batch)
		landed = landed[:0]
		// Serving a read-ahead from the cache never blocks, so without a
		// yield the workers would hold every P until it is done, and the
		// goroutine that hands a batch to its consumer would wait behind them.
		runtime.Gosched()
	}
}

// serveOne serves r or sends it on; it reports true for a read copied
// from the page cache (a mapping's, or with RWF_NOWAIT), which settle
// completes.
func (e *Engine) serveOne(r *Request) bool {
	if err := r.Ctx.Err(); err != nil {
		e.finish(r, err)
		return false
	}
	if len(r.P) == 0 {
		e.finish(r, nil) // a zero-length record costs no read
		return false
	}
	if ic, ok := As[Interceptor](r.R); ok {
		if d := ic.Hold(); d > 0 && !r.delayed {
			// A slow read must not hold a worker: it comes back later,
			// or fails as soon as its context is done.
			r.delayed = true
			var once sync.Once
			t := time.AfterFunc(d, func() { once.Do(func() { e.enqueue(r) }) })
			context.AfterFunc(r.Ctx, func() {
				once.Do(func() {
					t.Stop()
					e.finish(r, r.Ctx.Err())
				})
			})
			return false
		}
		first, err := ic.Intercept(r.Off, len(r.P))
		if err != nil {
			e.finish(r, err)
			return false
		}
		r.ic, r.first = ic, first
	}
	rf, ok := As[ringer](r.R)
	if !ok {
		e.toPool(r)
		return false
	}
	file, release, err := rf.ringFile()
	if errors.Is(err, errNotFile) {
		e.toPool(r)
		return false
	}
	if err != nil {
		e.finish(r, err)
		return false
	}
	r.file, r.release = r.through(file), release
	if r.first == 0 && r.file.CopyCached(r.P, r.Off) {
		e.mapped.Add(1)
		e.hit()
		return true
	}
	if !e.ring {
		if r.release != nil {
			r.release() // the pool's ReadAt holds the file itself
		}
		r.file, r.release = nil, nil
		e.toPool(r)
		return false
	}
	if r.first == 0 && !r.file.direct && e.probe() {
		if r.file.TryReadAt(r.P, r.Off) {
			e.hit()
			return true
		}
		e.missRun.Add(1)
	}
	select {
	case e.misses <- r:
	case <-r.Ctx.Done():
		e.complete(r, r.Ctx.Err())
	}
	return false
}

// Probing the page cache with RWF_NOWAIT is not free on a miss: the kernel
// starts the page's readahead before it answers EAGAIN (filemap_get_pages
// reads ahead under IOCB_NOWAIT; only the in-kernel IOCB_NOIO would not),
// so a cold read would cost a system call that submits it to the device
// and then a ring read that waits for it, and the device's queue would be
// whatever the probes submitted, not the lane's depth. While the probes
// keep missing (a cold epoch) most reads go to the ring unprobed, where a
// cached page is still copied at once; one in probeEvery is probed, and
// its first hit turns probing back on for all.
const (
	probeMissRun = 64
	probeEvery   = 32
)

// hit says the page cache answered a read (a probe, or a copy from a
// mapping): probing is on again.
func (e *Engine) hit() {
	if e.missRun.Load() != 0 {
		e.missRun.Store(0) // read first: a store on every warm read would bounce the cache line between the workers
	}
}

func (e *Engine) probe() bool {
	return e.missRun.Load() < probeMissRun || e.unprobed.Add(1)%probeEvery == 0
}

func (e *Engine) toPool(r *Request) {
	select {
	case e.blocks <- r:
		return
	default:
	}
	// Every goroutine is busy: a store whose depth grew needs more. Only
	// the front workers call toPool, and blocks closes after they are
	// done, so a goroutine started here always finds it open.
	if e.opts.Depth == 0 && e.pool.Load() < int64(min(e.opts.MaxDepth, s3MaxDepth)) {
		e.growPool()
	}
	select {
	case e.blocks <- r:
	case <-r.Ctx.Done():
		e.finish(r, r.Ctx.Err())
	}
}

func (e *Engine) growPool() {
	e.pool.Add(1)
	e.g.Go(func() error {
		for r := range e.blocks {
			e.complete(r, r.readAt())
		}
		return nil
	})
}

func (e *Engine) complete(r *Request, err error) {
	if r.release != nil {
		r.release()
		r.release = nil
	}
	if r.ic != nil {
		r.ic.Served(err)
	}
	e.finish(r, err)
}

// lane is one device's part of the ring: its reads at the device, those
// waiting for room under its depth, and the controller choosing the depth.
// Only the ring's goroutine touches it, but for the atomics Stats reads.
type lane struct {
	dev      uint64
	ctl      *depthControl
	meter    depthMeter
	inFlight int
	peak     int        // the most reads in flight at once
	parked   []*Request // parked[head:] wait, oldest first
	head     int
	latency  atomic.Int64 // the last window's, in ns
}

// laneOf returns the lane of r's device, making it on the device's first
// read, its depth starting at r's hint.
func (e *Engine) laneOf(lanes []*lane, r *Request) ([]*lane, *lane) {
	dev := r.file.dev
	for _, ln := range lanes {
		if ln.dev == dev {
			return lanes, ln
		}
	}
	pin := e.opts.Depth > 0
	ln := &lane{dev: dev, ctl: newDepthControl(cmp.Or(e.opts.Depth, HintsOf(r.R).Depth), cmp.Or(e.opts.Depth, e.opts.MaxDepth), pin)}
	e.lanesMu.Lock()
	e.lanes = append(e.lanes, ln)
	e.lanesMu.Unlock()
	return append(lanes, ln), ln
}

// runRing keeps the misses in flight through io_uring until the front
// workers are done and every read has finished: each device's reads up to
// its lane's depth, the rest parked in the lane until reads of it finish.
func (e *Engine) runRing(a *Async) error {
	defer a.Close()
	slots := make([]*Request, a.Cap())
	free := make([]int, 0, a.Cap())
	for i := range slots {
		free = append(free, i)
	}
	var lanes []*lane
	start := func(r *Request) {
		s := free[len(free)-1]
		free = free[:len(free)-1]
		slots[s] = r
		r.lane.inFlight++
		r.lane.peak = max(r.lane.peak, r.lane.inFlight)
		a.AddFirst(r.file, r.P, r.Off, uint64(s), r.first)
	}
	// unpark starts the parked reads that fit under their lanes' depths.
	unpark := func() {
		for _, ln := range lanes {
			for ln.head < len(ln.parked) && ln.inFlight < ln.ctl.Limit() && len(free) > 0 {
				r := ln.parked[ln.head]
				ln.parked[ln.head] = nil
				ln.head++
				if err := r.Ctx.Err(); err != nil {
					e.complete(r, err)
					continue
				}
				start(r)
			}
			if ln.head == len(ln.parked) {
				ln.parked, ln.head = ln.parked[:0], 0
			}
		}
	}
	closed := false
	var landed []*Request // this round's reads done, for settle
	for {
		// Take what has arrived, blocking only when nothing is in flight
		// (a lane parks reads only while it has some in flight).
	fill:
		for len(free) > 0 && !closed {
			var r *Request
			var ok bool
			if a.InFlight() == 0 {
				r, ok = <-e.misses
			} else {
				select {
				case r, ok = <-e.misses:
				default:
					break fill
				}
			}
			if !ok {
				closed = true
				break
			}
			if err := r.Ctx.Err(); err != nil {
				e.complete(r, err)
				continue
			}
			lanes, r.lane = e.laneOf(lanes, r)
			if r.lane.inFlight >= r.lane.ctl.Limit() || r.lane.head < len(r.lane.parked) {
				r.lane.parked = append(r.lane.parked, r)
				continue
			}
			start(r)
		}
		// One clock reading per round: each lane's reads in flight since
		// the last one, and a new depth when its window is done.
		now := monoNow()
		for _, ln := range lanes {
			ln.meter.advance(now, ln.inFlight)
			if s, ok := ln.meter.sample(now, ln.ctl); ok {
				ln.ctl.observe(s)
				if slog.Default().Enabled(e.ctx, slog.LevelDebug) {
					slog.Debug("storage: a window of reads", "device", ln.dev, "reads", s.Reads, "in_flight", s.InFlight,
						"rate", s.Rate(), "latency", s.Latency(), "depth", ln.ctl.Limit())
				}
				ln.latency.Store(int64(s.Latency()))
			}
		}
		unpark()
		if a.InFlight() == 0 {
			if closed {
				return nil
			}
			continue
		}
		// Reads in flight always finish before the ring goes: the kernel
		// writes into their buffers.
		if err := a.Wait(func(tag uint64, err error) {
			r := slots[tag]
			slots[tag] = nil
			free = append(free, int(tag))
			r.lane.inFlight--
			r.lane.meter.reads++
			r.lane = nil
			if err != nil {
				e.complete(r, err)
				return
			}
			landed = append(landed, r)
		}); err != nil {
			return err
		}
		e.settle(landed)
		landed = landed[:0]
		unpark()
	}
}

// Close stops taking reads, finishes those submitted, and waits for the
// engine's goroutines.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cond.Broadcast()
	err := e.g.Wait()
	e.stop()
	return err
}

// Ring reports whether local files are read through io_uring.
func (e *Engine) Ring() bool { return e.ring }

// ringer is implemented by Readers whose reads can go to io_uring: it
// returns the open file under the Reader and a function to call once the
// read has finished. It is found through Unwrap (As).
type ringer interface {
	ringFile() (*File, func(), error)
}

func (f *File) ringFile() (*File, func(), error) { return f, nil, nil }

// errNotFile says a Reader has no local file under it.
var errNotFile = errors.New("not a local file")

// through is the file r reads f through: its O_DIRECT twin where r asks
// to read past the page cache and can, else f.
func (r *Request) through(f *File) *File {
	if r.PastCache && pastAligned(r.P, r.Off) {
		if past := f.pastCache(); past != nil {
			return past
		}
	}
	return f
}

// readAt serves a request with blocking reads, for the goroutine pool.
// An Interceptor's faults were injected already: the read is served by
// the reader under it, its short first read as two reads, as a
// continuation after a short read would be.
func (r *Request) readAt() error {
	rd := r.R
	if r.ic != nil {
		rd = r.ic.Unwrap()
	}
	if f, ok := rd.(*File); ok {
		rd = r.through(f)
	}
	if r.first > 0 {
		if err := rd.ReadAt(r.Ctx, r.P[:r.first], r.Off); err != nil {
			return err
		}
		return rd.ReadAt(r.Ctx, r.P[r.first:], r.Off+int64(r.first))
	}
	return rd.ReadAt(r.Ctx, r.P, r.Off)
}

// Read reads len(p) bytes of r at off through the engine and waits for it:
// a convenience for one read where a caller has no batch to overlap.
func (e *Engine) Read(ctx context.Context, r Reader, p []byte, off int64) error {
	done := make(chan error, 1)
	e.Submit(&Request{Ctx: ctx, R: r, P: p, Off: off, Done: func(err error) { done <- err }})
	return <-done
}
