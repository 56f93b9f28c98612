package corpus

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/dataset"
)

// Packed documents: a tokenized column of Parquet files or of compressed
// (LZ4, ZSTD) Arrow record batches. A document is a row, and its tokens
// lie in a block that is read and unpacked whole (a Parquet page group, a
// record batch), so they are no byte range of the file: a batch of
// samples reads its documents as a batch of rows of the dataset
// (DocsOf), whose blocks the dataset reads and unpacks once for every
// batch and job that takes rows of them (its unpacked cache, with its
// claims: dataset/unpacked.go), and takes each document's tokens where
// they lie unpacked (dataset.ListBatch). The documents' lengths come from
// the dataset's index, which keeps every row's start in its list (built
// by one pass over the column the first time the file is opened, then
// read from its sidecar).

// Packed says the documents are rows of packed blocks: their tokens are
// read through DocsOf, and Locate names only the block a document lies in.
func (c *Corpus) Packed() bool { return c.rows != nil }

// DocBatch is a batch of documents of a packed corpus read as rows: the
// cells to read of each (Cells, in the corpus's objects), then their
// tokens (Tokens). Release it if Tokens is not called.
type DocBatch struct {
	c    *Corpus
	docs []int
	rb   dataset.ListBatch
}

// DocsOf plans the reading of documents docs of a packed corpus.
func (c *Corpus) DocsOf(docs []int) (*DocBatch, error) {
	if c.rows == nil {
		return nil, fmt.Errorf("%s: documents read as rows of a corpus whose documents are byte ranges", describe(c.inf.Paths))
	}
	rb, err := c.rows.BatchOf(docs)
	if err != nil {
		return nil, err
	}
	lb, ok := rb.(dataset.ListBatch)
	if !ok {
		rb.Release()
		return nil, fmt.Errorf("%s: a batch of its rows (%T) gives no list values", describe(c.inf.Paths), rb)
	}
	return &DocBatch{c: c, docs: docs, rb: lb}, nil
}

// NumCells is the cells each document has.
func (b *DocBatch) NumCells() int { return b.c.rows.NumCells() }

// Cells appends the ranges to read of document j of the batch (NumCells
// of them; a zero-length one needs no read).
func (b *DocBatch) Cells(j int, dst []dataset.Loc) []dataset.Loc { return b.rb.Cells(j, dst) }

// Release gives up what the batch holds (its claims on blocks) if Tokens
// is not to be called; after Tokens it does nothing.
func (b *DocBatch) Release() { b.rb.Release() }

// Tokens, once the batch's cells are read (cell(j, k)), calls f with each
// document of the batch in turn and a function that decodes tokens
// off..off+len(dst) of it into dst, checking each against the
// vocabulary; that function is valid until f returns.
func (b *DocBatch) Tokens(ctx context.Context, cell func(j, k int) []byte, f func(j int, read func(off int64, dst []int64) error) error) error {
	c := b.c
	sz := int64(c.size)
	return b.rb.Lists(ctx, cell, func(j int, values []byte) error {
		doc := b.docs[j]
		if int64(len(values)) != c.Len(doc)*sz {
			l := c.rows.Locate(doc)
			return &FormatError{Path: c.objs[l.Object].Name(), Offset: l.Off,
				Err: fmt.Errorf("document %d (row %d) holds %d bytes of tokens, the index %d tokens of %d: %w", doc, doc, len(values), c.Len(doc), sz, ErrCorrupt)}
		}
		return f(j, func(off int64, dst []int64) error {
			if off < 0 || off+int64(len(dst)) > c.Len(doc) {
				return fmt.Errorf("tokens %d..%d of document %d of %d tokens", off, off+int64(len(dst)), doc, c.Len(doc))
			}
			c.inf.Dtype.decode(dst, values[off*sz:(off+int64(len(dst)))*sz])
			for i, v := range dst {
				if v < 0 || c.inf.Vocab > 0 && v >= c.inf.Vocab {
					l := c.rows.Locate(doc)
					return &FormatError{Path: c.objs[l.Object].Name(), Offset: l.Off,
						Err: fmt.Errorf("document %d (row %d), token %d (in the block at this offset): token %d is outside the vocabulary [0, %d): %w", doc, doc, off+int64(i), uint64(v), c.inf.Vocab, ErrVocab)}
				}
			}
			return nil
		})
	})
}

// readPacked reads tokens off..off+len(dst) of document doc of a packed
// corpus, one cell at a time: its block, unless the dataset's cache
// holds it unpacked.
func (c *Corpus) readPacked(ctx context.Context, doc int, off int64, dst []int64) error {
	b, err := c.DocsOf([]int{doc})
	if err != nil {
		return err
	}
	locs := b.Cells(0, nil)
	cells := make([][]byte, len(locs))
	for k, l := range locs {
		if l.Len == 0 {
			continue
		}
		cells[k] = make([]byte, l.Len)
		if err := c.objs[l.Object].ReadAt(ctx, cells[k], l.Off); err != nil {
			b.Release()
			return err
		}
	}
	return b.Tokens(ctx, func(_, k int) []byte { return cells[k] }, func(_ int, read func(int64, []int64) error) error {
		return read(off, dst)
	})
}
