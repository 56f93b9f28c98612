package dataset

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/riffle-ml/riffle/columnar"
)

// scan builds the index: the record batches' and dictionaries' places and
// metadata (from the footer of a file, or one pass over a stream's
// message headers, skipping bodies), and every row's child starts.
func (f *arrowFile) scan(ctx context.Context, full *columnar.Layout, schemaAt int64, opts Options) error {
	f.batches, f.dicts = nil, nil
	add := func(off int64, meta []byte, hl int64) (int64, error) {
		m, err := columnar.ParseMessage(meta)
		if err != nil {
			if errors.Is(err, columnar.ErrCodec) {
				return 0, &FormatError{Path: f.r.Name(), Offset: off, Err: fmt.Errorf("%w: %w", err, ErrUnsupported)}
			}
			return 0, f.bad(off, "message: %v", err)
		}
		body := off + hl
		if m.BodyLen > f.r.Size()-body {
			return 0, f.bad(off, "message body of %d bytes past the end of the file (%d bytes)", m.BodyLen, f.r.Size())
		}
		b := arrowBatch{src: columnar.Source{Body: body, Meta: &m.Batch}, body: body, bodyLen: m.BodyLen, msgOff: off}
		var unpacked []byte
		if b.compressed() && m.Type != 1 {
			// A compressed batch is read and decompressed whole once
			// here, for its buffers' places and its rows' starts.
			b.packed, m.Batch.Buffers = m.Batch.Buffers, nil
			if unpacked, err = f.readUnpacked(ctx, &b); err != nil {
				return 0, err
			}
		}
		switch m.Type {
		case 3:
			if err := f.index(ctx, full, &b, unpacked); err != nil {
				return 0, err
			}
			f.batches = append(f.batches, b)
		case 2:
			b.dictID, b.delta, b.before = m.DictID, m.Delta, len(f.batches)
			f.dicts = append(f.dicts, b)
		case 1:
			return 0, f.bad(off, "a second schema message")
		}
		if opts.Progress != nil {
			opts.Progress(body+m.BodyLen, f.r.Size())
		}
		return body + m.BodyLen, nil
	}
	if !f.stream {
		return f.scanFooter(ctx, add)
	}
	_, hl, _, err := f.message(ctx, schemaAt)
	if err != nil {
		return err
	}
	for off := schemaAt + hl; off < f.r.Size(); {
		if err := ctx.Err(); err != nil {
			return err
		}
		meta, hl, eos, err := f.message(ctx, off)
		if err != nil {
			return err
		}
		if eos {
			break
		}
		if off, err = add(off, meta, hl); err != nil {
			return err
		}
	}
	return nil
}

// index reads a record batch's offsets buffers (from the file, or from
// the decompressed body of a compressed batch) for its rows' child starts
// and checks the batch against every column.
func (f *arrowFile) index(ctx context.Context, full *columnar.Layout, b *arrowBatch, unpacked []byte) error {
	if b.compressed() {
		b.src.Body = 0
	}
	size := b.srcLen()
	starts, err := full.StartsFrom(b.src.Meta, size, func(n *columnar.Node) ([]byte, error) {
		loc, ok := b.src.OffsetsBuffer(n)
		if !ok || loc.Offset < 0 || loc.Length < 0 || loc.Offset > size || loc.Length > size-loc.Offset {
			return nil, f.bad(b.msgOff, "column %q: offsets buffer outside the batch's body", n.Name)
		}
		if b.compressed() {
			return unpacked[loc.Offset : loc.Offset+loc.Length], nil
		}
		buf := make([]byte, loc.Length)
		if err := f.r.ReadAt(ctx, buf, b.src.Body+loc.Offset); err != nil {
			return nil, err
		}
		return buf, nil
	})
	if err != nil {
		var fe *FormatError
		if errors.As(err, &fe) {
			return err
		}
		if errors.Is(err, columnar.ErrUnreadRow) {
			return &FormatError{Path: f.r.Name(), Offset: b.msgOff, Err: fmt.Errorf("%w: %w", err, ErrUnsupported)}
		}
		return f.bad(b.msgOff, "%v", err)
	}
	b.src.Starts = starts
	if err := full.Check(&b.src, size); err != nil {
		return f.bad(b.msgOff, "record batch: %v", err)
	}
	return nil
}

// writeIndex writes the index payload, in words: the dictionary batches and
// the record batches, each its place, metadata and, for a compressed one,
// its buffers as packed; a record batch then its runs of row starts.
func (f *arrowFile) writeIndex() []byte {
	var w wordWriter
	put := func(b *arrowBatch, dict bool) {
		m := b.src.Meta
		w.Int(b.msgOff, b.body, b.bodyLen, m.Rows, int64(len(m.Nodes)), int64(len(m.Buffers)), int64(len(m.Variadic)))
		for _, n := range m.Nodes {
			w.Int(n.Length, n.NullCount)
		}
		for _, x := range m.Buffers {
			w.Int(x.Offset, x.Length)
		}
		w.Int(m.Variadic...)
		w.Int(int64(m.Codec))
		if b.compressed() {
			w.Int(b.unpacked, int64(len(b.packed)))
			for _, x := range b.packed {
				w.Int(x.Offset, x.Length)
			}
		}
		if dict {
			d := int64(0)
			if b.delta {
				d = 1
			}
			w.Int(b.dictID, d, int64(b.before))
			return
		}
		w.Int(int64(len(b.src.Starts)))
		for _, s := range b.src.Starts {
			w.Run(s)
		}
	}
	w.Int(int64(len(f.dicts)), int64(len(f.batches)))
	for i := range f.dicts {
		put(&f.dicts[i], true)
	}
	for i := range f.batches {
		put(&f.batches[i], false)
	}
	return w.Bytes()
}

// readIndex reads an index payload and checks every batch again.
func (f *arrowFile) readIndex(p []byte, full *columnar.Layout) error {
	r, err := newWordReader(p)
	if err != nil {
		return err
	}
	read := func(dict bool) (arrowBatch, error) {
		var b arrowBatch
		var m columnar.BatchMeta
		if err := r.Ints(&b.msgOff, &b.body, &b.bodyLen, &m.Rows); err != nil {
			return b, err
		}
		var counts [3]int // nodes, buffers, variadic counts
		for i := range counts {
			var err error
			if counts[i], err = r.Count(math.MaxInt64); err != nil {
				return b, err
			}
		}
		m.Nodes = make([]columnar.FieldNode, counts[0])
		for i := range m.Nodes {
			if err := r.Ints(&m.Nodes[i].Length, &m.Nodes[i].NullCount); err != nil {
				return b, err
			}
		}
		m.Buffers = make([]columnar.BufferLoc, counts[1])
		for i := range m.Buffers {
			if err := r.Ints(&m.Buffers[i].Offset, &m.Buffers[i].Length); err != nil {
				return b, err
			}
		}
		m.Variadic = make([]int64, counts[2])
		for i := range m.Variadic {
			if err := r.Ints(&m.Variadic[i]); err != nil {
				return b, err
			}
		}
		codec, err := r.Int()
		if err != nil {
			return b, err
		}
		if codec < int64(columnar.CodecNone) || codec > int64(columnar.CodecZstd) {
			return b, fmt.Errorf("index codec %d", codec)
		}
		m.Codec = columnar.Codec(codec)
		b.src.Meta, b.src.Body = &m, b.body
		if b.compressed() {
			b.src.Body = 0
			if b.unpacked, err = r.Int(); err != nil {
				return b, err
			}
			np, err := r.Count(math.MaxInt64)
			if err != nil {
				return b, err
			}
			b.packed = make([]columnar.BufferLoc, np)
			for i := range b.packed {
				if err := r.Ints(&b.packed[i].Offset, &b.packed[i].Length); err != nil {
					return b, err
				}
			}
			if b.unpacked < 0 || len(b.packed) != len(m.Buffers) {
				return b, fmt.Errorf("compressed batch of %d buffers, %d decompressed, in %d bytes", len(b.packed), len(m.Buffers), b.unpacked)
			}
		}
		if b.body < 0 || b.bodyLen < 0 || b.body > f.r.Size() || b.bodyLen > f.r.Size()-b.body || m.Rows < 0 {
			return b, fmt.Errorf("batch body outside the file")
		}
		if dict {
			var d, bf int64
			if err := r.Ints(&b.dictID, &d, &bf); err != nil {
				return b, err
			}
			b.delta, b.before = d != 0, int(bf)
			return b, nil
		}
		ns, err := r.Count(math.MaxInt64)
		if err != nil {
			return b, err
		}
		if ns != full.Vars {
			return b, fmt.Errorf("index keeps %d start columns, the schema has %d", ns, full.Vars)
		}
		b.src.Starts = make([][]int64, ns)
		for i := range b.src.Starts {
			// A view's or a list view's starts need not increase:
			// full.Check bounds them.
			if b.src.Starts[i], err = r.Run(math.MaxInt64, false); err != nil {
				return b, err
			}
		}
		if err := full.Check(&b.src, b.srcLen()); err != nil {
			return b, err
		}
		return b, nil
	}
	nd, err := r.Count(math.MaxInt64)
	if err != nil {
		return err
	}
	nbat, err := r.Count(math.MaxInt64)
	if err != nil {
		return err
	}
	f.dicts, f.batches = make([]arrowBatch, nd), make([]arrowBatch, nbat)
	for i := range f.dicts {
		if f.dicts[i], err = read(true); err != nil {
			return err
		}
	}
	for i := range f.batches {
		if f.batches[i], err = read(false); err != nil {
			return err
		}
	}
	// A dictionary applies from the record batch it came before: at most
	// the last, in the file's order, as the scan found them. A forged
	// place would apply a dictionary to batches it does not describe.
	for i, d := range f.dicts {
		if d.before < 0 || d.before > len(f.batches) || i > 0 && d.before < f.dicts[i-1].before {
			return fmt.Errorf("dictionary batch %d comes before record batch %d of %d (after %d)", i, d.before, len(f.batches), f.dicts[max(i-1, 0)].before)
		}
	}
	return r.Done()
}
