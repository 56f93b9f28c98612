package corpus

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/dataset"
)

// A tokenized column of Arrow IPC files, a Hugging Face save_to_disk
// directory or Parquet files: each row's list of token ids is a document.
// Parquet pages and compressed Arrow record batches are packed blocks
// (packed.go); of uncompressed Arrow, riffle's Arrow
// index (dataset/arrow.go) keeps every row's start in each
// variable-length buffer, so a row of an uncompressed list<int> column is
// one byte range of the file: its slice of the list's values buffer, the
// fourth of its cells (the list's validity bits, its offsets, the
// values' validity bits, the values). Rows of one record batch lie back to
// back, so a corpus keeps a run per record batch, not a place per row.
//
// Refused by name, with what to do: a column that is not a list (or
// large_list) of integers, and nulls (a row with no list, a null token),
// which no token id stands for: of uncompressed Arrow at open, where a
// validity bitmap shows; of a packed corpus when its block is unpacked,
// naming the row (its index keeps lengths, not bitmaps), except that a
// null list, of no tokens, is refused at open as an empty document is.

// rowsChunk is how many rows' cells are planned at once while opening.
const rowsChunk = 4096

func openRows(ctx context.Context, opts Options, format string, names []string) (*Corpus, error) {
	col := opts.Column
	if col == "" {
		col = "input_ids"
	}
	ds, err := dataset.Open(ctx, dataset.Options{Format: format, Columns: []string{col}, Store: opts.Store, Split: opts.Split,
		IndexDir: opts.IndexDir, IndexInDirOnly: opts.IndexInDirOnly}, names...)
	if err != nil {
		return nil, err
	}
	c, err := rowsCorpus(ctx, ds, col)
	if err != nil {
		ds.Close()
		return nil, err
	}
	return c, nil
}

func rowsCorpus(ctx context.Context, ds dataset.Dataset, col string) (*Corpus, error) {
	inf := ds.Info()
	where := describe(inf.Paths)
	rows, ok := ds.(dataset.Rows)
	if !ok {
		return nil, fmt.Errorf("%s: a %s dataset has no columns: %w", where, inf.Format, ErrUnsupported)
	}
	if len(inf.Columns) != 1 || inf.Columns[0].Layout != "list" || len(inf.Columns[0].Children) != 1 || inf.Columns[0].Children[0].Layout != "fixed" {
		typ := "missing"
		if len(inf.Columns) == 1 {
			typ = inf.Columns[0].Type
		}
		return nil, fmt.Errorf("%s: column %q is %s, not a list of integer token ids: %w", where, col, typ, ErrUnsupported)
	}
	d, err := ParseDtype(inf.Columns[0].Children[0].Dtype)
	if err != nil {
		return nil, fmt.Errorf("%s: column %q: %v: %w", where, col, err, ErrUnsupported)
	}
	c := &Corpus{inf: Info{Dtype: d, Paths: inf.Paths, Versions: inf.Versions, Files: inf.Paths}, closer: ds}
	for i := range inf.Paths {
		c.objs = append(c.objs, ds.Object(i))
	}
	if _, packed := ds.(dataset.Blocker); packed {
		lr, ok := ds.(dataset.ListRows)
		if !ok {
			return nil, fmt.Errorf("%s: a %s dataset of packed blocks whose rows' lists riffle cannot take: %w", where, inf.Format, ErrUnsupported)
		}
		return packedCorpus(ctx, c, lr, col)
	}
	if rows.NumCells() != 4 {
		return nil, fmt.Errorf("%s: column %q has %d cells a row, not a list's 4: %w", where, col, rows.NumCells(), ErrUnsupported)
	}
	sz := int64(d.Size())
	n := ds.Len()
	c.lens = make([]uint32, 0, n)
	ids := make([]int, 0, rowsChunk)
	var cells []dataset.Loc
	end := dataset.Loc{Object: -1}
	for lo := 0; lo < n; lo += rowsChunk {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		ids = ids[:0]
		for id := lo; id < min(n, lo+rowsChunk); id++ {
			ids = append(ids, id)
		}
		rb, err := rows.BatchOf(ids)
		if err != nil {
			return nil, err
		}
		for slot, id := range ids {
			cells = rb.Cells(slot, cells[:0])
			v := cells[3]
			name := ds.Object(cells[1].Object).Name()
			if cells[0].Len > 0 || cells[2].Len > 0 {
				rb.Release()
				return nil, &FormatError{Path: name, Offset: cells[1].Off, Err: fmt.Errorf("row %d's record batch has nulls in column %q (a validity bitmap): no token id stands for a null; drop or fill them and save again: %w", id, col, ErrUnsupported)}
			}
			if v.Len == 0 {
				rb.Release()
				return nil, &FormatError{Path: name, Offset: cells[1].Off, Err: fmt.Errorf("row %d is an empty document (no tokens in %q): %w", id, col, ErrCorrupt)}
			}
			if int64(v.Len)/sz > 1<<32-1 {
				rb.Release()
				return nil, &FormatError{Path: name, Offset: v.Off, Err: fmt.Errorf("row %d has %d tokens: %w", id, int64(v.Len)/sz, ErrUnsupported)}
			}
			if v.Object != end.Object || v.Off != end.Off {
				c.runs = append(c.runs, run{doc: id, obj: v.Object, off: v.Off})
			}
			end = dataset.Loc{Object: v.Object, Off: v.Off + int64(v.Len)}
			c.lens = append(c.lens, uint32(int64(v.Len)/sz))
		}
		rb.Release()
	}
	if err := c.finish(); err != nil {
		return nil, err
	}
	return c, nil
}

// packedCorpus finishes c, a corpus of rows of packed blocks, with its
// documents' lengths from the dataset's index: no block is read.
func packedCorpus(ctx context.Context, c *Corpus, rows dataset.ListRows, col string) (*Corpus, error) {
	c.rows = rows
	n := rows.Len()
	c.lens = make([]uint32, n)
	for id := range n {
		if id%rowsChunk == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		k := rows.ListLen(id)
		if k <= 0 {
			l := rows.Locate(id)
			return nil, &FormatError{Path: c.objs[l.Object].Name(), Offset: l.Off, Err: fmt.Errorf("row %d is an empty document (no tokens in %q, or a null; the offset is its block's): %w", id, col, ErrCorrupt)}
		}
		if k > 1<<32-1 {
			l := rows.Locate(id)
			return nil, &FormatError{Path: c.objs[l.Object].Name(), Offset: l.Off, Err: fmt.Errorf("row %d has %d tokens: %w", id, k, ErrUnsupported)}
		}
		c.lens[id] = uint32(k)
	}
	if err := c.finish(); err != nil {
		return nil, err
	}
	return c, nil
}
