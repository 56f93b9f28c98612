package loader

import (
	"slices"

	"github.com/riffle-ml/riffle/sequence"
)

// Batch is one batch of records. Record i is IDs[i], its bytes are
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
	// Columns, for a dataset of rows (dataset.Rows), is the batch as one
	// Arrow record batch, an IPC message at the start of Data; Off and
	// Len are then zero.
	Columns *Columns
	// Arrays, for a batch of a token corpus's samples (Options.Samples),
	// are the arrays it is, in Data (sequence's layout); Off and Len are
	// then zero.
	Arrays []sequence.Array

	j   *load
	own bool // Data is the batch's own, not its load's (a batch of rows cut from a window)
}

// Columns describes a batch written as an Arrow IPC message: its length,
// where its body starts, and its nodes (length, null count) and buffers
// (offset from the body, length), for a reader without an Arrow library.
type Columns struct {
	Len     int
	Body    int
	Nodes   [][2]int64
	Buffers [][2]int64
}

// Used is the bytes of Data the batch holds: its Arrow message, its
// arrays, or all of it.
func (b *Batch) Used() []byte {
	switch {
	case b.Columns != nil:
		return b.Data[:b.Columns.Len]
	case len(b.Arrays) > 0:
		end := 0
		for _, a := range b.Arrays {
			end = max(end, a.Off+a.Len)
		}
		return b.Data[:end]
	}
	return b.Data
}

// Record returns record i's bytes, valid until Release.
func (b *Batch) Record(i int) []byte { return b.Data[b.Off[i] : b.Off[i]+b.Len[i]] }

// Contiguous reports whether the records are packed back to back from the
// start of Data in their order, as fixed-size records read without
// O_DIRECT are, so the batch can be viewed as one (n, size) array without
// a copy.
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

// PackedOrder is the order that delivers b's records as they lie in its
// memory, back to back from its start, or nil if b is already so (or its
// records do not fill it: O_DIRECT padding, variable gaps). The loader
// lays a batch out unit by unit, a run of neighbouring records read by one
// read landing together, in the order of each unit's first record; a run
// whose records the batch's shuffle put far apart breaks the batch's
// delivery order from its memory order, and a client would have to gather
// the batch into a copy to see it as one array. When the client did not
// ask for the sampler's order inside batches the order there is the
// batch's own (a function of seed, epoch and batch, as the layout is, for
// the orders whose batches the loader reads itself: sampler.Packed), so
// delivering records in memory order keeps it one and makes the batch one
// array without a copy. Records of one size only: their offsets are then
// distinct multiples of the size. perm's room is reused.
func (b *Batch) PackedOrder(perm []int) []int {
	n := len(b.IDs)
	if n < 2 || b.Contiguous() {
		return nil
	}
	size := b.Len[0]
	if size <= 0 || n*size != len(b.Data) {
		return nil
	}
	perm = slices.Grow(perm[:0], n)[:n]
	for i := range perm {
		perm[i] = -1
	}
	for i, off := range b.Off {
		if b.Len[i] != size || off%size != 0 || off/size >= n || perm[off/size] >= 0 {
			return nil
		}
		perm[off/size] = i
	}
	return perm
}

// Release gives the batch's buffer back. The Batch must not be used after.
func (b *Batch) Release() {
	if j := b.j; j != nil {
		b.j = nil
		if b.own {
			j.l.opts.Alloc.Free(b.Data)
			b.Data, b.own = nil, false
		}
		j.l.release(j)
	}
}

// State is a loader's place: the next batch it will deliver. Saved with a
// checkpoint, it resumes the same sequence of batches exactly (the
// Options fields of the same names).
type State struct {
	Epoch int `json:"epoch"`
	Batch int `json:"batch"`
	// Sampler is a Stateful sampler's state at that place.
	Sampler []byte `json:"sampler,omitempty"`
	// Skip lists the records of the current opportunistic window already
	// delivered.
	Skip []int `json:"skip,omitempty"`
}

// Stats counts a loader's work so far.
type Stats struct {
	Batches, Records, Reads int64
	Bytes                   int64 // bytes read from storage, alignment and gaps included
	CacheHits               int64 // records copied from the cache instead of read
	Staged                  int64 // bytes read ahead for a Staged sampler
	// SharedDecodes counts a random transform's outputs cut from a decode
	// another job's batch made (or made for others).
	SharedDecodes int64
}
