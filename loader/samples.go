package loader

import (
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sequence"
)

// Samples are a token corpus's samples as the loader reads them
// (sequence.Batcher): what an epoch holds, and a batch of them laid out as
// a dataset.RowBatch whose cells are each sample's pieces, a number of
// its own a sample, which Assemble puts together as the batch's arrays.
// A batch of samples is read as a batch of rows is (Rows), its cells
// coalesced and read at once, then put together on its own goroutine.
type Samples interface {
	Len(epoch int) int
	BatchOf(epoch int, ids []int) (dataset.RowBatch, error)
}

// arrayed is a RowBatch put together as named arrays (sequence.Batch):
// their layout, once assembled.
type arrayed interface {
	Arrays() []sequence.Array
}

// cellsOf lays out the batch of records ids of epoch read as cells: rows of
// columns (of any epoch), or an epoch's samples.
func (l *Loader) cellsOf(epoch int, ids []int) (dataset.RowBatch, error) {
	if l.samples != nil {
		return l.samples.BatchOf(epoch, ids)
	}
	return l.rows.BatchOf(ids)
}

// assembled says a batch's records are read as cells and put together:
// rows of columns, or samples.
func (l *Loader) assembled() bool { return l.rows != nil || l.samples != nil }

// putSamples puts a batch of samples together in its buffer from its
// pieces as read: its arrays, filled by sequence's one definition.
func (l *Loader) putSamples(j *load, cell func(slot, k int) []byte) {
	if _, err := j.rowsOut.Assemble(l.ctx, cell, j.Data); err != nil {
		j.fail(err)
		return
	}
	if a, ok := j.rowsOut.(arrayed); ok {
		j.Arrays = a.Arrays()
	}
}
