package storage

// Hints say how a Reader likes to be read, so that the loader and the
// block-aware sampler adapt to the storage under them instead of assuming a
// local disk: a remote object store wants many more requests in flight,
// coalesces across larger gaps (a request costs more than the bytes in a
// gap) and reads larger blocks.
type Hints struct {
	// Depth is how many reads to keep in flight at first; the engine (or,
	// for S3, the store's limiter) then adapts it to what the device does
	// (depth.go).
	Depth int
	// CoalesceGap is the largest gap, in bytes, worth reading to merge two
	// neighbouring reads into one.
	CoalesceGap int
	// BlockSize is the natural unit of a read: a page for local files.
	BlockSize int
	// Align is the required alignment of offsets, lengths and buffers
	// (O_DIRECT); 1 when there is none.
	Align int
}

// DefaultHints are those of a local file read through the page cache. Its
// depth search starts deep: a depth too deep costs latency, one too
// shallow costs rate, and from 256 a fast NVMe (about 200 at its knee) or
// a disk whose rate still grows there reaches its rate at once, while a
// device that needs fewer is searched down without losing rate on the way.
// Its gap is 0: a read of another record's bytes leaves a hole in the
// batch, which is then not one array (the loader spans the few bytes that
// frame neighbouring records instead: loader.neighbourGap).
var DefaultHints = Hints{Depth: 256, CoalesceGap: 0, BlockSize: 4096, Align: 1}

// HintsOf returns r's hints, with DefaultHints for what r leaves 0.
func HintsOf(r Reader) Hints {
	h, got := DefaultHints, r.Hints()
	if got.Depth > 0 {
		h.Depth = got.Depth
	}
	if got.CoalesceGap > 0 {
		h.CoalesceGap = got.CoalesceGap
	}
	if got.BlockSize > 0 {
		h.BlockSize = got.BlockSize
	}
	if got.Align > 0 {
		h.Align = got.Align
	}
	return h
}

// AlignmentOf returns r's required alignment, 1 if it has none.
func AlignmentOf(r Reader) int { return HintsOf(r).Align }
