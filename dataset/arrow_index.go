package dataset

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

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

// encode writes the index payload: little-endian int64s.
func (f *arrowFile) encode() []byte {
	var w []int64
	put := func(b *arrowBatch, dict bool) {
		m := b.src.Meta
		w = append(w, b.msgOff, b.body, b.bodyLen, m.Rows, int64(len(m.Nodes)), int64(len(m.Buffers)), int64(len(m.Variadic)))
		for _, n := range m.Nodes {
			w = append(w, n.Length, n.NullCount)
		}
		for _, x := range m.Buffers {
			w = append(w, x.Offset, x.Length)
		}
		w = append(w, m.Variadic...)
		w = append(w, int64(m.Codec))
		if b.compressed() {
			w = append(w, b.unpacked, int64(len(b.packed)))
			for _, x := range b.packed {
				w = append(w, x.Offset, x.Length)
			}
		}
		if dict {
			d := int64(0)
			if b.delta {
				d = 1
			}
			w = append(w, b.dictID, d, int64(b.before))
			return
		}
		w = append(w, int64(len(b.src.Starts)))
		for _, s := range b.src.Starts {
			w = append(w, int64(len(s)))
			w = append(w, s...)
		}
	}
	w = append(w, int64(len(f.dicts)), int64(len(f.batches)))
	for i := range f.dicts {
		put(&f.dicts[i], true)
	}
	for i := range f.batches {
		put(&f.batches[i], false)
	}
	b := make([]byte, 8*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

// decode reads an index payload and checks every batch again.
func (f *arrowFile) decode(p []byte, full *columnar.Layout) error {
	if len(p)%8 != 0 {
		return fmt.Errorf("index payload of %d bytes", len(p))
	}
	at := 0
	next := func() (int64, error) {
		if at+8 > len(p) {
			return 0, fmt.Errorf("index payload cut short")
		}
		v := int64(binary.LittleEndian.Uint64(p[at:]))
		at += 8
		return v, nil
	}
	count := func() (int, error) {
		v, err := next()
		if err == nil && (v < 0 || v > int64(len(p)-at)/8+1) {
			err = fmt.Errorf("index count %d", v)
		}
		return int(v), err
	}
	read := func(dict bool) (arrowBatch, error) {
		var b arrowBatch
		var m columnar.BatchMeta
		var err error
		vals := make([]int64, 4)
		for i := range vals {
			if vals[i], err = next(); err != nil {
				return b, err
			}
		}
		b.msgOff, b.body, b.bodyLen, m.Rows = vals[0], vals[1], vals[2], vals[3]
		nn, err := count()
		if err != nil {
			return b, err
		}
		nb, err := count()
		if err != nil {
			return b, err
		}
		nv, err := count()
		if err != nil {
			return b, err
		}
		m.Nodes = make([]columnar.FieldNode, nn)
		for i := range m.Nodes {
			if m.Nodes[i].Length, err = next(); err != nil {
				return b, err
			}
			if m.Nodes[i].NullCount, err = next(); err != nil {
				return b, err
			}
		}
		m.Buffers = make([]columnar.BufferLoc, nb)
		for i := range m.Buffers {
			if m.Buffers[i].Offset, err = next(); err != nil {
				return b, err
			}
			if m.Buffers[i].Length, err = next(); err != nil {
				return b, err
			}
		}
		m.Variadic = make([]int64, nv)
		for i := range m.Variadic {
			if m.Variadic[i], err = next(); err != nil {
				return b, err
			}
		}
		codec, err := next()
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
			if b.unpacked, err = next(); err != nil {
				return b, err
			}
			np, err := count()
			if err != nil {
				return b, err
			}
			b.packed = make([]columnar.BufferLoc, np)
			for i := range b.packed {
				if b.packed[i].Offset, err = next(); err != nil {
					return b, err
				}
				if b.packed[i].Length, err = next(); err != nil {
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
			if b.dictID, err = next(); err != nil {
				return b, err
			}
			d, err := next()
			if err != nil {
				return b, err
			}
			b.delta = d != 0
			bf, err := next()
			if err != nil {
				return b, err
			}
			b.before = int(bf)
			return b, nil
		}
		ns, err := count()
		if err != nil {
			return b, err
		}
		if ns != full.Vars {
			return b, fmt.Errorf("index keeps %d start columns, the schema has %d", ns, full.Vars)
		}
		b.src.Starts = make([][]int64, ns)
		for i := range b.src.Starts {
			n, err := count()
			if err != nil {
				return b, err
			}
			s := make([]int64, n)
			for k := range s {
				if s[k], err = next(); err != nil {
					return b, err
				}
			}
			b.src.Starts[i] = s
		}
		if err := full.Check(&b.src, b.srcLen()); err != nil {
			return b, err
		}
		return b, nil
	}
	nd, err := count()
	if err != nil {
		return err
	}
	nbat, err := count()
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
	if at != len(p) {
		return fmt.Errorf("%d bytes after the index payload", len(p)-at)
	}
	return nil
}
