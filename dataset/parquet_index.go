package dataset

import (
	"context"
	"fmt"
	"math"

	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"

	"github.com/riffle-ml/riffle/columnar"
)

// scan reads every column chunk once: its pages' headers, and each page
// decoded, for its rows and their starts.
func (f *pqFile) scan(ctx context.Context, cols []*pqColumn, opts Options) error {
	f.chunks = make([][]*pqChunk, f.meta.NumRowGroups())
	for rg := range f.chunks {
		rgm := f.meta.RowGroup(rg)
		if rgm.NumRows() == 0 {
			// No rows, so no pages to read (pyarrow writes an empty
			// table's chunks with a data page offset of 0): a chunk of
			// no pages a column.
			for range cols {
				f.chunks[rg] = append(f.chunks[rg], &pqChunk{})
			}
			continue
		}
		for _, c := range cols {
			if err := ctx.Err(); err != nil {
				return err
			}
			if c.group != nil {
				ch, err := f.scanGroup(ctx, c, rgm)
				if err != nil {
					return err
				}
				f.chunks[rg] = append(f.chunks[rg], ch)
				if opts.Progress != nil {
					opts.Progress(ch.pages[0].off+ch.pages[0].length, f.r.Size())
				}
				continue
			}
			cm, err := rgm.ColumnChunk(c.leaf)
			if err != nil {
				return f.bad(0, "row group %d column %q: %v", rg, c.name, err)
			}
			ch, err := f.scanChunk(ctx, c, cm, rgm.NumRows())
			if err != nil {
				return err
			}
			f.chunks[rg] = append(f.chunks[rg], ch)
			if opts.Progress != nil {
				opts.Progress(cm.DataPageOffset()+cm.TotalCompressedSize(), f.r.Size())
			}
		}
	}
	return nil
}

func (f *pqFile) scanChunk(ctx context.Context, c *pqColumn, cm *metadata.ColumnChunkMetaData, rows int64) (*pqChunk, error) {
	start := chunkStart(cm)
	size := cm.TotalCompressedSize()
	if start < 0 || size < 0 || start > f.r.Size() || size > f.r.Size()-start {
		return nil, f.bad(start, "column %q chunk of %d bytes outside the file", c.name, size)
	}
	buf := make([]byte, size)
	if err := f.r.ReadAt(ctx, buf, start); err != nil {
		return nil, err
	}
	ch := &pqChunk{codec: cm.Compression()}
	var pages []pqPage
	for at := int64(0); at < size; {
		h, err := parsePageHeader(buf[at:])
		if err != nil {
			return nil, f.bad(start+at, "column %q page header: %v", c.name, err)
		}
		end := at + int64(h.headerLen) + int64(h.compressed)
		if end > size {
			return nil, f.bad(start+at, "column %q page of %d bytes past its column chunk", c.name, h.compressed)
		}
		if err := h.check(buf[at+int64(h.headerLen) : end]); err != nil {
			return nil, f.bad(start+at, "column %q page: %v", c.name, err)
		}
		switch h.typ {
		case 2:
			ch.dictOff, ch.dictLen = start+at, end-at
		case 0, 3:
			p := pqPage{off: start + at, length: end - at, values: int64(h.values)}
			if len(pages) > 0 && c.sub.Column(0).MaxRepetitionLevel() > 0 && h.typ == 0 {
				// A v1 page of a repeated column may start inside a row:
				// such a page joins the one before.
				cont, err := f.continues(ch, c, buf, start, p)
				if err != nil {
					return nil, err
				}
				if cont {
					last := &pages[len(pages)-1]
					last.length = p.off + p.length - last.off
					last.values += p.values
					at = end
					continue
				}
			}
			pages = append(pages, p)
		}
		at = end
	}
	first := int64(0)
	for i := range pages {
		p := &pages[i]
		dict := chunkDict(ch, buf, start)
		arr, err := decodePage(c, ch.codec, dict, buf[p.off-start:p.off-start+p.length], p.values)
		if err != nil {
			return nil, f.bad(p.off, "column %q page: %v", c.name, err)
		}
		src, _, err := pageSource(c, arr)
		arr.Release()
		if err != nil {
			return nil, f.bad(p.off, "column %q page: %v", c.name, err)
		}
		p.first, p.rows, p.starts = first, src.Meta.Rows, src.Starts
		p.skel = &columnar.Source{Starts: p.starts}
		first += p.rows
	}
	if first != rows {
		return nil, f.bad(start, "column %q: pages hold %d rows, the row group %d", c.name, first, rows)
	}
	ch.pages = pages
	return ch, nil
}

// chunkDict is the chunk's dictionary page, as read in buf (from start).
func chunkDict(ch *pqChunk, buf []byte, start int64) []byte {
	if ch.dictLen == 0 {
		return nil
	}
	return buf[ch.dictOff-start : ch.dictOff-start+ch.dictLen]
}

// continues reports whether page p's first value continues a row (its
// repetition level is not 0).
func (f *pqFile) continues(ch *pqChunk, c *pqColumn, buf []byte, start int64, p pqPage) (cont bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			cont, err = false, f.bad(p.off, "column %q page: %v", c.name, r)
		}
	}()
	rd, err := pageFile(c, ch.codec, chunkDict(ch, buf, start), buf[p.off-start:p.off-start+p.length], p.values)
	if err != nil {
		return false, f.bad(p.off, "column %q page: %v", c.name, err)
	}
	defer rd.Close()
	cr, err := rd.RowGroup(0).Column(0)
	if err != nil {
		return false, f.bad(p.off, "column %q page: %v", c.name, err)
	}
	rep := make([]int16, 1)
	def := make([]int16, 1)
	var n int64
	switch r := cr.(type) {
	case *file.Int32ColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]int32, 1), def, rep)
	case *file.Int64ColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]int64, 1), def, rep)
	case *file.Int96ColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]parquet.Int96, 1), def, rep)
	case *file.Float32ColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]float32, 1), def, rep)
	case *file.Float64ColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]float64, 1), def, rep)
	case *file.BooleanColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]bool, 1), def, rep)
	case *file.ByteArrayColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]parquet.ByteArray, 1), def, rep)
	case *file.FixedLenByteArrayColumnChunkReader:
		n, _, err = r.ReadBatch(1, make([]parquet.FixedLenByteArray, 1), def, rep)
	default:
		return false, fmt.Errorf("column %q: reader %T", c.name, cr)
	}
	if err != nil {
		return false, f.bad(p.off, "column %q page: %v", c.name, err)
	}
	return n > 0 && rep[0] > 0, nil
}

// A column of several leaves (a struct such as Hugging Face's Image,
// struct<bytes, path>; a map; a list of structs) is read a row group at a
// time: its leaves' column chunks, which a writer puts side by side in the
// file, are one byte range, and that range is its one "page" in the row
// group. Its leaves' pages start at rows of their own, so no smaller unit
// holds whole rows of every leaf; and reassembling the rows from the
// leaves' repetition and definition levels (Dremel's record assembly) is
// what arrow-go's pqarrow does, given every leaf of the column, so riffle
// hands it the row group's chunks as a file of one row group rather than
// assemble records by hand. Writers of such columns keep row groups
// small: the datasets library writes 100 rows a row group for images.

// groupSpan is the byte range of column c's leaves' chunks in a row group.
func groupSpan(c *pqColumn, rgm *metadata.RowGroupMetaData) (start, end int64, err error) {
	start, end = -1, -1
	for _, l := range c.group {
		cm, err := rgm.ColumnChunk(l)
		if err != nil {
			return 0, 0, err
		}
		s := chunkStart(cm)
		e := s + cm.TotalCompressedSize()
		if s < 0 || cm.TotalCompressedSize() < 0 || e < s {
			return 0, 0, fmt.Errorf("leaf %d chunk at %d of %d bytes", l, s, cm.TotalCompressedSize())
		}
		if start < 0 || s < start {
			start = s
		}
		end = max(end, e)
	}
	return start, end, nil
}

// chunkStart is where a column chunk's first page (its dictionary's, if
// any) begins.
func chunkStart(cm *metadata.ColumnChunkMetaData) int64 {
	start := cm.DataPageOffset()
	if cm.HasDictionaryPage() && cm.DictionaryPageOffset() > 0 && cm.DictionaryPageOffset() < start {
		start = cm.DictionaryPageOffset()
	}
	return start
}

// scanGroup indexes column c (of several leaves) in row group rg: one page
// of the whole row group.
func (f *pqFile) scanGroup(ctx context.Context, c *pqColumn, rgm *metadata.RowGroupMetaData) (*pqChunk, error) {
	start, end, err := groupSpan(c, rgm)
	if err != nil {
		return nil, f.bad(0, "column %q: %v", c.name, err)
	}
	if start > f.r.Size() || end > f.r.Size() {
		return nil, f.bad(start, "column %q chunks of %d bytes outside the file", c.name, end-start)
	}
	span := make([]byte, end-start)
	if err := f.r.ReadAt(ctx, span, start); err != nil {
		return nil, err
	}
	arr, err := decodeGroup(c, rgm, span, start)
	if err != nil {
		return nil, f.bad(start, "column %q: %v", c.name, err)
	}
	src, _, err := pageSource(c, arr)
	arr.Release()
	if err != nil {
		return nil, f.bad(start, "column %q: %v", c.name, err)
	}
	if src.Meta.Rows != rgm.NumRows() {
		return nil, f.bad(start, "column %q: %d rows, the row group %d", c.name, src.Meta.Rows, rgm.NumRows())
	}
	p := pqPage{off: start, length: end - start, values: rgm.NumRows(), rows: src.Meta.Rows, starts: src.Starts}
	p.skel = &columnar.Source{Starts: p.starts}
	return &pqChunk{pages: []pqPage{p}}, nil
}

// writeIndex writes the index payload, in words: the row groups, and in each
// its columns' chunks, their pages, and each page's runs of row starts.
func (f *pqFile) writeIndex() []byte {
	var w wordWriter
	w.Int(int64(len(f.chunks)))
	for _, rg := range f.chunks {
		w.Int(int64(len(rg)))
		for _, ch := range rg {
			w.Int(int64(ch.codec), ch.dictOff, ch.dictLen, int64(len(ch.pages)))
			for _, p := range ch.pages {
				w.Int(p.off, p.length, p.values, p.first, p.rows, int64(len(p.starts)))
				for _, s := range p.starts {
					w.Run(s)
				}
			}
		}
	}
	return w.Bytes()
}

// readIndex reads an index payload, checking it against the file: its row
// groups and columns, each page within the file and its rows following
// the page before, each page's row starts in order, nothing left over.
func (f *pqFile) readIndex(p []byte, cols []*pqColumn) error {
	r, err := newWordReader(p)
	if err != nil {
		return err
	}
	nrg, err := r.Count(int64(f.meta.NumRowGroups()))
	if err != nil || nrg != f.meta.NumRowGroups() {
		return fmt.Errorf("index of %d row groups, the file has %d (%v)", nrg, f.meta.NumRowGroups(), err)
	}
	f.chunks = make([][]*pqChunk, nrg)
	for rg := range f.chunks {
		nc, err := r.Count(int64(len(cols)))
		if err != nil || nc != len(cols) {
			return fmt.Errorf("index of %d columns, the file has %d readable", nc, len(cols))
		}
		for ci := range nc {
			var codec int64
			ch := &pqChunk{}
			if err := r.Ints(&codec, &ch.dictOff, &ch.dictLen); err != nil {
				return err
			}
			ch.codec = compress.Compression(codec)
			np, err := r.Count(math.MaxInt64)
			if err != nil {
				return err
			}
			first := int64(0)
			for range np {
				var pg pqPage
				if err := r.Ints(&pg.off, &pg.length, &pg.values, &pg.first, &pg.rows); err != nil {
					return err
				}
				if pg.off < 0 || pg.length < 0 || pg.off > f.r.Size() || pg.length > f.r.Size()-pg.off || pg.first != first || pg.rows < 0 {
					return fmt.Errorf("page outside the file or out of order")
				}
				first += pg.rows
				ns, err := r.Count(1 << 20)
				if err != nil || ns != cols[ci].lay.Vars {
					return fmt.Errorf("page with %d start columns, the column has %d", ns, cols[ci].lay.Vars)
				}
				for range ns {
					s, err := r.Run(pg.rows+1, true)
					if err != nil {
						return err
					}
					if int64(len(s)) != pg.rows+1 {
						return fmt.Errorf("page starts of %d rows, the page has %d", len(s)-1, pg.rows)
					}
					pg.starts = append(pg.starts, s)
				}
				pg.skel = &columnar.Source{Starts: pg.starts}
				ch.pages = append(ch.pages, pg)
			}
			if first != f.meta.RowGroup(rg).NumRows() {
				return fmt.Errorf("pages hold %d rows, the row group %d", first, f.meta.RowGroup(rg).NumRows())
			}
			if ch.dictOff < 0 || ch.dictLen < 0 || ch.dictOff > f.r.Size() || ch.dictLen > f.r.Size()-ch.dictOff {
				return fmt.Errorf("dictionary page outside the file")
			}
			f.chunks[rg] = append(f.chunks[rg], ch)
		}
	}
	return r.Done()
}
