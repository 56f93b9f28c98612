package corpus

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/dataset"
)

// A tokenized column of Arrow IPC files or a Hugging Face save_to_disk
// directory: each row's list of token ids is a document. riffle's Arrow
// index (dataset/arrow.go) keeps every row's start in each
// variable-length buffer, so a row of an uncompressed list<int> column is
// one byte range of the file: its slice of the list's values buffer, the
// fourth of its cells (the list's validity bits, its offsets, the
// values' validity bits, the values). Rows of one record batch lie back to
// back, so a corpus keeps a run per record batch, not a place per row.
//
// Refused by name, with what to do: compressed record batches (a row's
// tokens are then no range of the file), a column that is not a list of
// integers, and nulls (a row with no list, a null token), which no token
// id stands for.

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
	if _, packed := ds.(dataset.Blocker); packed {
		return nil, fmt.Errorf("%s: %w: its record batches are compressed (LZ4 or ZSTD), so a row's tokens are no byte range of the file: rewrite it uncompressed (riffle convert, or pyarrow's IpcWriteOptions(compression=None))", where, ErrUnsupported)
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
	if rows.NumCells() != 4 {
		return nil, fmt.Errorf("%s: column %q has %d cells a row, not a list's 4: %w", where, col, rows.NumCells(), ErrUnsupported)
	}
	c := &Corpus{inf: Info{Dtype: d, Paths: inf.Paths, Versions: inf.Versions, Files: inf.Paths}, closer: ds}
	for i := range inf.Paths {
		c.objs = append(c.objs, ds.Object(i))
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
