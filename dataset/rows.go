package dataset

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/columnar"
)

// Rows is implemented by datasets whose records are rows of columns
// (Arrow record batches, Parquet pages). A row is no one byte range: it
// lies in NumCells ranges (a slice of each buffer of its columns, or the
// pages that hold it), which the loader reads like records, coalesced with
// their neighbours' and never a byte twice in one batch; the dataset then
// puts a batch's rows together as one Arrow record batch (RowBatch).
type Rows interface {
	Dataset
	// NumCells is how many ranges every row has.
	NumCells() int
	// BatchOf lays out the batch of rows ids (in delivery order), before
	// any is read: what to read of each, and the batch's size.
	BatchOf(ids []int) (RowBatch, error)
}

// Blocker is implemented by datasets with blocks of their own: runs of
// records best read together (a Parquet page, read and unpacked whole).
// Blocks returns the first record of each block and Len() at the end: the
// block-aware order's blocks, and its default order.
type Blocker interface {
	Blocks() []int
}

// RowBatch reads and writes one batch of rows.
type RowBatch interface {
	// Cells appends the ranges to read of the row in slot (NumCells of
	// them); a zero-length one needs no read.
	Cells(slot int, dst []Loc) []Loc
	// Size is the bytes the batch needs.
	Size() int
	// Assemble writes the batch into out (Size bytes) from each row's
	// cells as read (cell(slot, k)), and returns the bytes it wrote.
	// Errors name the object and offset of the row at fault. A wait for a
	// block another batch unpacks, and any read Assemble makes itself,
	// end when ctx is done.
	Assemble(ctx context.Context, cell func(slot, k int) []byte, out []byte) (int, error)
	// Release gives back what the batch holds if it is not to be
	// assembled (its loader stopped, a read failed); after Assemble it
	// does nothing.
	Release()
	// Table describes the batch written, for a reader without an Arrow
	// library: each node's length and null count, each buffer's offset
	// (from Body) and length, and where the body starts.
	Table() (nodes [][2]int64, buffers [][2]int64, body int)
	// Buffers are the batch's buffers as planned, before any read: their
	// places in the body and their lengths (a dictionary's strings, at
	// most), in the pre-order of the columns' nodes.
	Buffers() []columnar.BufferLoc
}

// ReadRows reads rows ids of ds one cell at a time, without a loader, and
// returns the batch they make (an Arrow IPC message) and its description:
// for inspecting a few rows and for tests, not for speed.
func ReadRows(ctx context.Context, ds Rows, ids []int) ([]byte, RowBatch, error) {
	for _, id := range ids {
		if id < 0 || id >= ds.Len() {
			return nil, nil, fmt.Errorf("row %d is not in [0, %d)", id, ds.Len())
		}
	}
	rb, err := ds.BatchOf(ids)
	if err != nil {
		return nil, nil, err
	}
	out, err := readPlanned(ctx, ds, rb, len(ids))
	if err != nil {
		return nil, nil, err
	}
	return out, rb, nil
}

// readPlanned reads and assembles a planned batch of n rows one cell at a
// time, and releases it.
func readPlanned(ctx context.Context, ds Rows, rb RowBatch, n int) ([]byte, error) {
	k := ds.NumCells()
	cells := make([][]byte, n*k)
	var locs []Loc
	for slot := range n {
		locs = rb.Cells(slot, locs[:0])
		for c, l := range locs {
			if l.Len == 0 {
				continue
			}
			b := make([]byte, l.Len)
			if err := ds.Object(l.Object).ReadAt(ctx, b, l.Off); err != nil {
				rb.Release()
				return nil, err
			}
			cells[slot*k+c] = b
		}
	}
	out := make([]byte, rb.Size())
	m, err := rb.Assemble(ctx, func(slot, c int) []byte { return cells[slot*k+c] }, out)
	rb.Release()
	if err != nil {
		return nil, err
	}
	return out[:m], nil
}

// tableOf is Rows.Table of a batch written as msg: both row kinds (Arrow's
// and Parquet's) write their batch as one columnar message.
func tableOf(msg *columnar.BatchMessage) (nodes [][2]int64, buffers [][2]int64, body int) {
	ns, bs := msg.Table()
	for _, n := range ns {
		nodes = append(nodes, [2]int64{n.Length, n.NullCount})
	}
	for _, x := range bs {
		buffers = append(buffers, [2]int64{x.Offset, x.Length})
	}
	return nodes, buffers, msg.Body
}
