package dataset

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/columnar"
)

// Lists: a row's list taken where it lies. A token corpus's documents are
// the rows of one list column (input_ids), and its samples take pieces of
// them: putting a batch of such rows together as an Arrow message would
// copy every document whole, only for the corpus to copy its pieces out.
// So the Rows datasets whose rows may lie in packed blocks (Arrow, Parquet)
// also give each row's list values as they lie, in the file or in its
// block unpacked in the dataset's cache (unpacked.go: read and unpacked
// once for every batch and job that takes rows of it), and each row's
// number of elements from the index, which already keeps every row's
// start in each list (arrow_index.go, parquet_index.go).

// ListRows is implemented by the Rows datasets (Arrow, Parquet) whose
// batches (BatchOf) are ListBatches.
type ListRows interface {
	Rows
	// ListLen is the number of elements of row id's list in the first
	// column read, as the index keeps it (no read): 0 for an empty list
	// and for a null one; -1 if that column is no list.
	ListLen(id int) int64
}

// ListBatch is a batch of rows whose first column read is a list of
// fixed-width values (ints), which can be taken row by row instead of
// assembled as a message.
type ListBatch interface {
	RowBatch
	// Lists, once the batch's cells are read (cell, as Assemble takes
	// them), unpacks the blocks it claimed (or waits for those other
	// batches unpack) and calls f with each slot's list values in slot
	// order: the bytes are valid until f returns. A null list or a null
	// element is a *FormatError naming the row, its file and its block
	// (wrapping ErrUnsupported: no value stands for a null). It takes the
	// place of Assemble: after it, Release does nothing.
	Lists(ctx context.Context, cell func(slot, k int) []byte, f func(slot int, values []byte) error) error
}

var (
	_ ListRows  = (*arrowSet)(nil)
	_ ListRows  = (*parquetSet)(nil)
	_ ListBatch = (*arrowRows)(nil)
	_ ListBatch = (*pqRows)(nil)
)

// listLen is the elements of row of a list node n whose rows' starts are t.
func listLen(n *columnar.Node, t [][]int64, row int64) int64 {
	if n.Kind != columnar.KList || n.Paired || n.Var < 0 || n.Var >= len(t) {
		return -1
	}
	return t[n.Var][row+1] - t[n.Var][row]
}

// listValues is the values of row of list node n (of fixed-width
// elements) from the row's cells as they lie (cell(k), Layout.Cells'
// order: the list's validity bits, its offsets, the elements' validity
// bits, the values), checking that neither the list nor an element is
// null. starts are the batch's (or page's) Var starts.
func listValues(n *columnar.Node, starts [][]int64, row int64, cell func(k int) []byte) ([]byte, error) {
	if n.Kind != columnar.KList || len(n.Children) != 1 || n.Children[0].Kind != columnar.KFixed {
		return nil, fmt.Errorf("column %q is no list of fixed-width values", n.Name)
	}
	// A validity cell is the bytes holding the row's bits, from the
	// byte of its first (columnar.Source.cells' bits); none when the
	// batch has no bitmap.
	if v := cell(0); len(v) > 0 && v[0]>>(row%8)&1 == 0 {
		return nil, fmt.Errorf("a null list in column %q", n.Name)
	}
	from := starts[n.Var][row]
	to := starts[n.Var][row+1]
	if v := cell(2); len(v) > 0 {
		for i := from; i < to; i++ {
			j := i - from + from%8
			if j/8 >= int64(len(v)) || v[j/8]>>(j%8)&1 == 0 {
				return nil, fmt.Errorf("element %d of its list in column %q is null", i-from, n.Name)
			}
		}
	}
	values := cell(3)
	if want := (to - from) * int64(n.Children[0].Width); int64(len(values)) != want {
		return nil, fmt.Errorf("%d bytes of values in column %q, its offsets say %d", len(values), n.Name, want)
	}
	return values, nil
}

// ListLen is row id's elements in the first column read.
func (d *arrowSet) ListLen(id int) int64 {
	k, bi, row := d.row(id)
	return listLen(d.lay.Columns[0], d.files[k].batches[bi].src.Starts, row)
}

// ListLen is row id's elements in the first column read.
func (d *parquetSet) ListLen(id int) int64 {
	k, rg, row := d.where(id)
	c := d.cols[0]
	_, p := d.page(k, rg, c, row)
	return listLen(d.all[c].lay.Columns[0], p.starts, row-p.first)
}

// Lists calls f with each row's list values as they lie: in the file,
// or in its compressed batch decompressed.
func (b *arrowRows) Lists(ctx context.Context, cell func(slot, k int) []byte, f func(slot int, values []byte) error) error {
	values, err := b.open(ctx, cell)
	if b.holds != nil {
		defer b.holds.unpin()
	}
	if err != nil {
		return err
	}
	n := b.d.lay.Columns[0]
	for slot, id := range b.ids {
		ref := b.refs[slot]
		v, err := listValues(n, ref.S.Starts, ref.Row, func(k int) []byte { return values(slot, k) })
		if err != nil {
			key := b.batches[slot]
			ab := &b.d.files[key.file].batches[key.batch]
			return &FormatError{Path: b.d.files[key.file].r.Name(), Offset: ab.msgOff,
				Err: fmt.Errorf("row %d (row %d of record batch %d): %v: %w", id, ref.Row, key.batch, err, ErrUnsupported)}
		}
		if err := f(slot, v); err != nil {
			return err
		}
	}
	return nil
}

// Lists calls f with each row's list values in its page group unpacked.
func (b *pqRows) Lists(ctx context.Context, cell func(slot, k int) []byte, f func(slot int, values []byte) error) error {
	have, values, err := b.open(ctx, cell)
	defer b.pages.unpin()
	if err != nil {
		return err
	}
	d := b.d
	n := d.all[d.cols[0]].lay.Columns[0]
	for slot := range b.n {
		key, row := b.keys[slot][0], b.rows[slot][0]
		v, err := listValues(n, have[key].src.Starts, row, func(k int) []byte { return values(slot, k) })
		if err != nil {
			p := &d.files[key.file].chunks[key.rg][key.col].pages[key.page]
			return &FormatError{Path: d.files[key.file].r.Name(), Offset: p.off,
				Err: fmt.Errorf("row %d (row %d of row group %d): %v: %w", d.starts[key.file]+int(d.files[key.file].rgRows[key.rg]+p.first+row), p.first+row, key.rg, err, ErrUnsupported)}
		}
		if err := f(slot, v); err != nil {
			return err
		}
	}
	return nil
}
