package dataset

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/riffle-ml/riffle/columnar"
)

// message reads the encapsulated message at off: its metadata, the
// length of prefix and metadata, and whether it is the end of the stream.
func (f *arrowFile) message(ctx context.Context, off int64) (meta []byte, headLen int64, eos bool, err error) {
	if off+4 > f.r.Size() {
		return nil, 0, false, f.bad(off, "message prefix cut short (file of %d bytes)", f.r.Size())
	}
	pre := make([]byte, min(8, f.r.Size()-off))
	if err := f.r.ReadAt(ctx, pre, off); err != nil {
		return nil, 0, false, err
	}
	n, plen, eos, err := columnar.Prefix(pre)
	if err != nil {
		return nil, 0, false, f.bad(off, "%v", err)
	}
	if eos {
		return nil, int64(plen), true, nil
	}
	if off+int64(plen)+int64(n) > f.r.Size() {
		return nil, 0, false, f.bad(off, "message metadata of %d bytes past the end of the file (%d bytes)", n, f.r.Size())
	}
	meta = make([]byte, n)
	if err := f.r.ReadAt(ctx, meta, off+int64(plen)); err != nil {
		return nil, 0, false, err
	}
	return meta, int64(plen) + int64(n), false, nil
}

// readSchema reads a stream's schema, the message at off, or a file's,
// from its footer: the schema message after a file's magic is optional
// (Polars and Arrow JS write none).
func (f *arrowFile) readSchema(ctx context.Context, off int64) error {
	if !f.stream {
		fb, at, err := f.footer(ctx)
		if err != nil {
			return err
		}
		meta, err := columnar.FooterSchema(fb)
		if err != nil {
			return f.bad(at, "footer: %v", err)
		}
		return f.parseSchema(meta, at)
	}
	meta, _, eos, err := f.message(ctx, off)
	if err != nil {
		return err
	}
	if eos {
		return f.bad(off, "stream ends before its schema")
	}
	return f.parseSchema(meta, off)
}

// parseSchema reads a Schema message's metadata (found at off, for
// errors), with riffle's own parser for what it checks (endianness,
// dictionary ids) and arrow-go's for the types.
func (f *arrowFile) parseSchema(meta []byte, off int64) error {
	var err error
	if f.sinfo, err = columnar.ParseSchemaMessage(meta); err != nil {
		return f.bad(off, "schema: %v", err)
	}
	if f.sinfo.BigEndian {
		return &FormatError{Path: f.r.Name(), Offset: off, Err: fmt.Errorf("a big-endian Arrow file: %w (rewrite it little-endian)", ErrUnsupported)}
	}
	// arrow-go reads the body a message claims, allocating it first: a
	// schema has none, and a corrupt length would run the process out of
	// memory.
	if m, err := columnar.ParseMessage(meta); err != nil || m.BodyLen != 0 {
		if err == nil {
			err = fmt.Errorf("a schema message with a body of %d bytes", m.BodyLen)
		}
		return f.bad(off, "schema: %v", err)
	}
	var msg bytes.Buffer
	var pre [8]byte
	binary.LittleEndian.PutUint32(pre[:], 0xFFFFFFFF)
	binary.LittleEndian.PutUint32(pre[4:], uint32(len(meta)))
	msg.Write(pre[:])
	msg.Write(meta)
	msg.Write([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0})
	rd, err := ipc.NewReader(&msg)
	if err != nil {
		return f.bad(off, "schema: %v", err)
	}
	f.schema = rd.Schema()
	rd.Release()
	return nil
}

// footer reads a file's footer flatbuffer, and where it starts.
func (f *arrowFile) footer(ctx context.Context) ([]byte, int64, error) {
	size := f.r.Size()
	if size < 16 {
		return nil, 0, f.bad(0, "Arrow file of %d bytes, too short for a footer", size)
	}
	tail := make([]byte, 10)
	if err := f.r.ReadAt(ctx, tail, size-10); err != nil {
		return nil, 0, err
	}
	if !bytes.Equal(tail[4:], arrowMagic) {
		return nil, 0, f.bad(size-6, "no ARROW1 magic at the end: the file is cut short or not an Arrow file (a stream file? name it .arrows)")
	}
	n := int64(int32(binary.LittleEndian.Uint32(tail)))
	if n <= 0 || n > size-18 {
		return nil, 0, f.bad(size-10, "footer of %d bytes in a file of %d", n, size)
	}
	fb := make([]byte, n)
	if err := f.r.ReadAt(ctx, fb, size-10-n); err != nil {
		return nil, 0, err
	}
	return fb, size - 10 - n, nil
}

func (f *arrowFile) scanFooter(ctx context.Context, add func(off int64, meta []byte, hl int64) (int64, error)) error {
	size := f.r.Size()
	fb, at, err := f.footer(ctx)
	if err != nil {
		return err
	}
	foot, err := columnar.ParseFooter(fb)
	if err != nil {
		return f.bad(at, "footer: %v", err)
	}
	for _, list := range [][]columnar.Block{foot.Dictionaries, foot.Batches} {
		for _, b := range list {
			if err := ctx.Err(); err != nil {
				return err
			}
			if b.Offset < 8 || b.Offset >= size || b.MetaLen <= 0 {
				return f.bad(at, "footer block at %d with %d bytes of metadata", b.Offset, b.MetaLen)
			}
			meta, hl, eos, err := f.message(ctx, b.Offset)
			if err != nil {
				return err
			}
			if eos || hl > int64(b.MetaLen) {
				return f.bad(b.Offset, "footer block of %d bytes of metadata holds no message", b.MetaLen)
			}
			if _, err := add(b.Offset, meta, int64(b.MetaLen)); err != nil {
				return err
			}
		}
	}
	// Dictionaries of a file apply to every batch.
	for i := range f.dicts {
		f.dicts[i].before = 0
	}
	return nil
}

// readUnpacked reads a compressed batch's body and decompresses it. The
// first time (b.src.Meta.Buffers nil: the scan) it sets the decompressed
// buffers' places; after, it checks them.
func (f *arrowFile) readUnpacked(ctx context.Context, b *arrowBatch) ([]byte, error) {
	raw := make([]byte, b.bodyLen)
	if err := f.r.ReadAt(ctx, raw, b.body); err != nil {
		return nil, err
	}
	return f.unpack(b, raw)
}

// unpack decompresses a compressed batch's body, raw (bodyLen bytes): a
// body that does not decompress to the buffers the index holds is an
// error naming the byte of the file where the buffer at fault starts.
func (f *arrowFile) unpack(b *arrowBatch, raw []byte) ([]byte, error) {
	m := b.src.Meta
	if int64(len(raw)) != b.bodyLen {
		return nil, f.bad(b.body, "%v record batch body of %d bytes, read %d", m.Codec, b.bodyLen, len(raw))
	}
	out, bufs, err := columnar.Decompress(m.Codec, b.packed, raw)
	if err != nil {
		at := b.body
		var be *columnar.BufferError
		if errors.As(err, &be) {
			at += be.Offset
		}
		return nil, f.bad(at, "%v batch (message at %d): %v", m.Codec, b.msgOff, err)
	}
	if m.Buffers == nil {
		m.Buffers, b.unpacked = bufs, int64(len(out))
		return out, nil
	}
	if int64(len(out)) != b.unpacked || !slices.Equal(bufs, m.Buffers) {
		return nil, f.bad(b.body, "%v batch (message at %d) decompresses to %d bytes, not the %d indexed: the file changed since it was indexed", m.Codec, b.msgOff, len(out), b.unpacked)
	}
	return out, nil
}

// attachDicts reads the dictionaries and gives each record batch those in
// force for it.
func (f *arrowFile) attachDicts(ctx context.Context, full *columnar.Layout) error {
	values := map[int64]*columnar.Node{}
	var walk func(n *columnar.Node)
	walk = func(n *columnar.Node) {
		if n.Kind == columnar.KDict {
			values[n.DictID] = n.Values
		}
		for _, k := range n.Children {
			walk(k)
		}
	}
	for _, n := range full.Columns {
		walk(n)
	}
	cur := map[int64]*columnar.Dict{}
	k := 0
	for i := range f.batches {
		changed := false
		for ; k < len(f.dicts) && f.dicts[k].before <= i; k++ {
			db := &f.dicts[k]
			v, ok := values[db.dictID]
			if !ok {
				continue // a dictionary of a column riffle does not read
			}
			body := make([]byte, db.bodyLen)
			if err := f.r.ReadAt(ctx, body, db.body); err != nil {
				return err
			}
			if db.compressed() {
				var err error
				if body, err = f.unpack(db, body); err != nil {
					return err
				}
			}
			d, err := columnar.NewDict(v, db.src.Meta, body)
			if err != nil {
				return f.bad(db.msgOff, "dictionary %d: %v", db.dictID, err)
			}
			if !changed {
				next := make(map[int64]*columnar.Dict, len(cur))
				for id, x := range cur {
					next[id] = x
				}
				cur, changed = next, true
			}
			if db.delta && cur[db.dictID] != nil {
				d = cur[db.dictID].Append(d)
			}
			cur[db.dictID] = d
		}
		f.batches[i].src.Dicts = cur
	}
	return nil
}
