package loader

import (
	"fmt"
	"sync"

	"github.com/riffle-ml/riffle/internal/alignbuf"
)

// Options configures a Loader. The zero value works.
type Options struct {
	// BatchSize is the number of records per batch; default 256.
	BatchSize int
	// DropLast drops the last short batch of each epoch.
	DropLast bool
	// Depth is the number of reads in flight; default 64, where NVMe and
	// virtio disks reach their random-read peak.
	Depth int
	// Prefetch is how many batches are read ahead of the consumer. The
	// default adapts: at least 4 batches, and more while fewer than twice
	// Depth reads are in flight, so that batches of a few large reads (a
	// block-aware shuffle) still keep the device queue full; MemoryBytes
	// bounds it either way.
	Prefetch int
	// MemoryBytes bounds the bytes of batch buffers alive at once, read
	// ahead or held by the consumer; default 512 MiB. A batch larger than
	// the bound is still loaded, alone.
	MemoryBytes int64
	// Ordered keeps records in the sampler's order inside each batch
	// instead of the order they are fetched in (sorted by location).
	Ordered bool
	// CoalesceGap merges two reads of one object whose gap is at most this
	// many bytes, reading the gap too; 0 merges only touching reads.
	CoalesceGap int
	// Epoch and Batch are where to start: the state saved from State().
	Epoch, Batch int
	// Epochs is how many epochs to load from Epoch; 0 means 1, negative
	// means without end.
	Epochs int
	// Opportunistic, when above 1, is DeepIO's entropy-aware opportunistic
	// ordering (deepio.txt §III-C): the reads of this many consecutive
	// batches are issued together and each batch is made of whichever of
	// their records arrive first. Every record still comes once per epoch,
	// but which batch holds it depends on timing, so batches are not
	// reproducible and a resumed loader restarts at the window's first batch.
	Opportunistic int
	// NoRing reads with Depth goroutines calling ReadAt instead of io_uring,
	// which is otherwise used for local files where the kernel allows it.
	NoRing bool
	// Alloc provides batch buffers; default a reusing heap pool.
	Alloc Allocator
}

func (o Options) withDefaults() (Options, error) {
	if o.BatchSize == 0 {
		o.BatchSize = 256
	}
	if o.Depth == 0 {
		o.Depth = 64
	}
	if o.MemoryBytes == 0 {
		o.MemoryBytes = 512 << 20
	}
	if o.Epochs == 0 {
		o.Epochs = 1
	}
	if o.Alloc == nil {
		o.Alloc = &Pool{}
	}
	if o.BatchSize < 0 || o.Depth < 0 || o.Prefetch < 0 || o.MemoryBytes < 0 || o.CoalesceGap < 0 || o.Epoch < 0 || o.Batch < 0 {
		return o, fmt.Errorf("loader options: negative size in %+v", o)
	}
	return o, nil
}

// Allocator provides batch buffers. Alloc returns n bytes starting at a
// multiple of align; Free takes back a buffer Alloc returned, once nothing
// reads it. Both are called from several goroutines.
type Allocator interface {
	Alloc(n, align int) ([]byte, error)
	Free(b []byte)
}

// Pool is the default Allocator: it keeps freed buffers and hands them out
// again, so a loader in steady state allocates no memory for batches.
type Pool struct {
	once sync.Once
	free chan []byte
}

const poolKeep = 16

func (p *Pool) init() {
	p.once.Do(func() { p.free = make(chan []byte, poolKeep) })
}

// Alloc reuses a kept buffer that is large and aligned enough, or makes one.
func (p *Pool) Alloc(n, align int) ([]byte, error) {
	p.init()
	for range len(p.free) {
		select {
		case b := <-p.free:
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
	select {
	case p.free <- b[:cap(b)]:
	default:
	}
}
