package loader

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/internal/alignbuf"
	"github.com/riffle-ml/riffle/storage"
)

// Options configures a Loader. The zero value works.
type Options struct {
	// BatchSize is the number of records per batch; default 256.
	BatchSize int
	// DropLast drops the last short batch of each epoch.
	DropLast bool
	// Depth, when set, pins the number of reads in flight. By default the
	// read engine chooses it per device from the rate and latency it
	// measures (storage's depth.go), within MaxDepth and MemoryBytes:
	// about 200 for a fast NVMe, a few dozen for a RAM disk, more for a
	// disk whose rate keeps growing with depth. With a shared Engine it
	// bounds only this loader's read-ahead; the engine chooses the depth.
	Depth int
	// Prefetch is how many batches are read ahead of the consumer. The
	// default adapts: at least 4 batches, and more while fewer than twice
	// the depth's reads are in flight, so that batches of a few large reads (a
	// block-aware shuffle) still keep the device queue full; MemoryBytes
	// bounds it either way.
	Prefetch int
	// MemoryBytes bounds the bytes of batch buffers alive at once, read
	// ahead or held by the consumer; default 512 MiB. A batch larger than
	// the bound is still loaded, alone.
	MemoryBytes int64
	// MemoryStart, if set, is the bound the loader starts at, below
	// MemoryBytes; SetMemory moves it later, up to MemoryBytes.
	MemoryStart int64
	// Ordered keeps records in the sampler's order inside each batch.
	// Otherwise a batch's records come in a uniformly random order of
	// their own, a function of (Seed, epoch, batch): whatever the sampler
	// and the storage layout, no batch is sorted by file position (or, in
	// a directory dataset, by class).
	Ordered bool
	// Seed keys the order of records inside each batch, and a random
	// transform's draws.
	Seed uint64
	// CoalesceGap merges two reads of one object whose gap is at most this
	// many bytes, reading the gap too; default the storage's hint (0 for
	// local files: merge only touching reads).
	CoalesceGap int
	// Epoch and Batch are where to start: the state saved from State().
	Epoch, Batch int
	// SamplerState resumes a Stateful sampler (State().Sampler).
	SamplerState []byte
	// Skip lists records of the first opportunistic window already
	// delivered before a checkpoint (State().Skip).
	Skip []int
	// Epochs is how many epochs to load from Epoch; 0 means 1, negative
	// means without end.
	Epochs int
	// BatchStride and BatchOffset make the loader deliver only batches
	// BatchOffset, BatchOffset+BatchStride, ... of each epoch (windows,
	// with Opportunistic): how DataLoader workers split one rank's share
	// without padding it, so an epoch holds the same records for any
	// number of workers. Default 1 and 0: every batch.
	BatchStride, BatchOffset int
	// Opportunistic, when above 1, is DeepIO's entropy-aware opportunistic
	// ordering (deepio.txt §III-C): the reads of this many consecutive
	// batches are issued together and each batch is made of whichever of
	// their records arrive first. Every record still comes once per epoch,
	// but which batch holds it depends on timing; State saves which
	// records of the current window were delivered, so a resumed loader
	// delivers each remaining record exactly once.
	Opportunistic int
	// NoRing reads local files with goroutines calling pread instead of
	// io_uring. Ignored with Engine.
	NoRing bool
	// Engine is the read engine to share (one per device, in the daemon);
	// default one of the loader's own.
	Engine *storage.Engine
	// Cache is the record cache to consult and fill: records another
	// loader read (or will read) are copied from it, records a Staged
	// sampler loads ahead wait in it. Default none, or a private one for
	// a Staged sampler.
	Cache *cache.Cache
	// CacheSpace keys this dataset's records in Cache (see cache.Key);
	// CacheKey, if set, keys each record instead (per file, so datasets
	// sharing files share their records).
	CacheSpace uint64
	CacheKey   func(id int) cache.Key
	// StageBytes is the budget of the private cache a Staged sampler's
	// records wait in; default room for three stages, at least 64 MiB.
	StageBytes int64
	// Lazy starts reading at the first Next instead of at New: a job that
	// shares its reads should not race ahead of jobs that open after it
	// while its own consumer is not even asking yet.
	Lazy bool
	// Alloc provides batch buffers; default a reusing heap pool.
	Alloc Allocator
	// Transform, if set, runs on every record: a batch holds the outputs
	// (each Transform.Size bytes, packed in delivery order) and the cache
	// keeps outputs, so a transform shared by jobs runs once per record. A
	// RandomTransform's outputs differ per job and epoch: the cache keeps
	// the records it reads instead, and each batch transforms its own.
	Transform Transform
	// Column, on a dataset of rows, is the column Transform reads (a
	// binary column, or a Hugging Face Image's bytes): its outputs take the
	// column's place in each batch. Default the dataset's only Image
	// column, or its only column of bytes (RowsColumn).
	Column string
	// Samples, if set, makes the records an epoch's samples of a token
	// corpus whose documents are the dataset's (package sequence): a
	// batch's ids are samples of its epoch, each read as byte ranges of
	// the dataset's objects (its pieces, coalesced with their neighbours
	// as a row's cells are) and put together as the batch's arrays
	// (Batch.Arrays). The sampler's ids are below Samples.Len(epoch).
	Samples Samples
	// Workers run the transform; default GOMAXPROCS goroutines of the
	// loader's own. The daemon shares one set among its jobs.
	Workers *Workers
	// PastCache, if set, is asked once a load (of epoch e) which of its
	// records ids to read past the page cache (storage.Request.PastCache),
	// setting past[i] for ids[i]: those whose pages a steward of the page
	// cache would not keep until their next reads. It is asked only of
	// records read alone whose reads can go past the cache
	// (storage.CanPastCache), so its answers are what the reads do.
	// Batch buffers are then aligned for O_DIRECT.
	PastCache func(e int, ids []int, past []bool)
}

// Transform turns a record's bytes into its output (package transform).
type Transform interface {
	Size() int
	Apply(raw, out []byte) error
}

// A RandomTransform's output also depends on a draw, which the loader
// makes from (Seed, epoch, record id) with transform.Draw: an
// augmentation's crop is the same whoever reads the record, and after a
// resume (package transform's Random).
type RandomTransform interface {
	ApplyRandom(raw, out []byte, draw uint64) error
}

// A SharedTransform is a RandomTransform whose output can also be cut from
// a decoded form of the record, to the same bytes (package transform's
// Shared): jobs sharing a record share its decode.
type SharedTransform interface {
	RandomTransform
	Decode(raw []byte) ([]byte, error)
	FromDecoded(dec, out []byte, draw uint64) (bool, error)
}

// Workers is a set of goroutines that run CPU work (transforms) for
// loaders; its zero value is unusable: use NewWorkers.
type Workers struct {
	tasks chan func()
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// yieldAfter is how long a task runs before its worker yields the P
// between it and the next: sysmon's first tick.
const yieldAfter = 20 * time.Microsecond

// NewWorkers starts n goroutines (GOMAXPROCS if n <= 0).
func NewWorkers(n int) *Workers {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	w := &Workers{tasks: make(chan func(), 4*n), done: make(chan struct{})}
	for range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for f := range w.tasks {
				start := time.Now()
				f()
				// f's last act may have woken whoever waits on its
				// output (a batch, a window), and the runtime put that
				// goroutine on this worker's own P. A worker that went
				// straight into its next task, a C decode, held the P
				// with it waiting there until sysmon took the P back, at
				// its 20 µs ticks, which kept sysmon ticking: 12 context
				// switches an image. Yielding runs it first: warm JPEGs
				// on 2 cores, 1,135-1,236 images/s against 894-1,015,
				// 1,300 context switches against 78,000 for 6,000
				// images, and 17-20% less CPU an image. Only after a
				// long task: a yield after each of a Go transform's
				// few-µs tasks (a LIBSVM line) cost it 10-20%, and a
				// short next task gives the P back soon anyway.
				if time.Since(start) >= yieldAfter {
					runtime.Gosched()
				}
			}
		}()
	}
	return w
}

// Go runs f on one of the workers.
func (w *Workers) Go(f func()) { w.tasks <- f }

// Close stops the workers once the work given them is done.
func (w *Workers) Close() {
	w.once.Do(func() { close(w.tasks) })
	w.wg.Wait()
}

// Limits on options, so that a request cannot make the loader allocate
// without bound.
const (
	MaxBatchSize = 1 << 20
	MaxDepth     = 4096
	MaxPrefetch  = 1024
	MaxWindow    = 256
	// DefaultBatchSize is the batch size when none is given: the one
	// default, which job.Options, the CLI and Python (riffle/spec.py) take.
	DefaultBatchSize = 256
)

func (o Options) withDefaults(h storage.Hints) (Options, error) {
	if o.BatchSize < 0 || o.Depth < 0 || o.Prefetch < 0 || o.MemoryBytes < 0 || o.MemoryStart < 0 || o.CoalesceGap < 0 || o.Epoch < 0 ||
		o.Batch < 0 || o.Opportunistic < 0 || o.StageBytes < 0 || o.BatchStride < 0 || o.BatchOffset < 0 {
		return o, fmt.Errorf("loader options: negative value in %+v", o)
	}
	if o.BatchSize > MaxBatchSize || o.Depth > MaxDepth || o.Prefetch > MaxPrefetch || o.Opportunistic > MaxWindow {
		return o, fmt.Errorf("loader options: batch size %d (at most %d), depth %d (at most %d), prefetch %d (at most %d), opportunistic %d (at most %d)",
			o.BatchSize, MaxBatchSize, o.Depth, MaxDepth, o.Prefetch, MaxPrefetch, o.Opportunistic, MaxWindow)
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.BatchStride == 0 {
		o.BatchStride = 1
	}
	if o.BatchOffset >= o.BatchStride {
		return o, fmt.Errorf("loader options: batch offset %d of stride %d", o.BatchOffset, o.BatchStride)
	}
	if o.CoalesceGap == 0 {
		o.CoalesceGap = h.CoalesceGap
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = 512 << 20
	}
	if o.MemoryStart == 0 || o.MemoryStart > o.MemoryBytes {
		o.MemoryStart = o.MemoryBytes
	}
	if o.Epochs == 0 {
		o.Epochs = 1
	}
	if o.Alloc == nil {
		// Buffers given back wait in the pool beside those in flight (at
		// most MemoryBytes): keeping a quarter as much again reuses a gathered
		// window's buffer for the next.
		o.Alloc = &Pool{Max: o.MemoryBytes / 4}
	}
	return o, nil
}

// Allocator provides batch buffers. Alloc returns n bytes starting at a
// multiple of align, waiting for room at most until ctx is done; Free
// takes back a buffer Alloc returned, once nothing reads it. Both are
// called from several goroutines.
type Allocator interface {
	Alloc(ctx context.Context, n, align int) ([]byte, error)
	Free(b []byte)
}

// Pool is the default Allocator: it keeps freed buffers and hands them out
// again, so a loader in steady state allocates no memory for batches.
type Pool struct {
	// Max, if not 0, bounds the bytes of the buffers kept: a loader's
	// buffers in flight are bounded by its memory, and keeping more than
	// that for later (16 of a gathered window's loads) is memory no batch
	// can use.
	Max int64

	once sync.Once
	free chan []byte
	kept atomic.Int64
}

const poolKeep = 16

func (p *Pool) init() {
	p.once.Do(func() { p.free = make(chan []byte, poolKeep) })
}

// Alloc reuses a kept buffer that is large and aligned enough, or makes one.
func (p *Pool) Alloc(_ context.Context, n, align int) ([]byte, error) {
	p.init()
	for range len(p.free) {
		select {
		case b := <-p.free:
			p.kept.Add(-int64(cap(b)))
			if cap(b) >= n && alignbuf.Aligned(b, align) {
				return b[:n], nil
			}
			if cap(b) < n {
				continue // too small for today's batches: let it go
			}
			p.Free(b)
		default:
		}
	}
	// Round up so that slightly larger variable-length batches fit later.
	return alignbuf.Make(n+n/8, align)[:n], nil
}

// Free keeps b for reuse, up to a few buffers.
func (p *Pool) Free(b []byte) {
	p.init()
	if p.Max > 0 && p.kept.Load()+int64(cap(b)) > p.Max {
		return
	}
	select {
	case p.free <- b[:cap(b)]:
		p.kept.Add(int64(cap(b)))
	default:
	}
}
