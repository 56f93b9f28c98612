package dataset

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/storage"
)

// Arrow IPC files, in the file format (a footer lists every record batch:
// ".arrow", ".feather") or the stream format (messages one after another:
// what Hugging Face datasets writes as data-*.arrow). A record is a row.
//
// Rinas (rinas.txt §5, Figure 9) makes a stream file indexable by
// rewriting it in the file format, whose footer gives each record batch's
// place; and then reads a whole record batch to take one row of it. riffle
// indexes the stream in place with one scan of its message headers (no
// rewrite), and goes one step further: the index keeps, for every row, where
// its values start in each variable-length buffer (the file's own offsets,
// read once), so a row is read as the few byte ranges that hold it, not as
// its record batch: for a shuffled batch of 256 rows out of record batches
// of 1000, that is 1/1000 of Rinas's bytes. Rows that share pages still
// coalesce into one read (the loader's rule), which is the whole record
// batch when a block-aware order asks for all of its rows.
//
// A file's schema is taken from its footer (the schema message after the
// magic is optional, and Polars and Arrow JS write none); a stream's from
// its first message. string_view and binary_view columns are read, each
// row's value (or, under a list, the range of the one data buffer its
// values lie in) located in the index, and reach the user as string and
// binary; run-end encoded columns (of numbers, booleans, strings), each
// row's run found in the index, reach the user as their values' type; and
// list views, each row's range of elements kept in the index, as lists.
// A column of a type riffle does not read (a run-end encoded column or a
// list view under a list, unions) refuses the dataset unless columns=
// leaves it out; a row whose views under a list lie in three data
// buffers or more (writers fill one, then the next) is refused, naming it.
//
// A record batch with compressed buffers (LZ4_FRAME or ZSTD: Feather v2's
// default, IpcWriteOptions(compression=)) has no row's bytes in the file:
// such a batch is a block, as a Parquet page is. Indexing decompresses it
// once for its buffers' places and its rows' starts, in a body laid out as
// an uncompressed one's; a batch of rows reads each such block it needs
// whole, once, decompresses it once, and keeps it in the dataset's decoded
// cache (decoded.go) for the next batches, gathering rows from it as from
// a file. The default order is block-aware over record batches
// (packedArrow), so that each is read and decompressed once per epoch.

func init() {
	RegisterFormat(Format{Name: "arrow", Extensions: []string{".arrow", ".feather", ".arrows", ".ipc"}, Indexed: true,
		OpenFiles: func(ctx context.Context, names []string, opts Options) (Dataset, error) {
			d, err := openArrow(ctx, names, opts)
			if err != nil {
				return nil, err
			}
			return d.dataset(), nil
		}})
}

var arrowMagic = []byte("ARROW1")

// arrowBatch is one record batch (or dictionary batch) of a file.
type arrowBatch struct {
	// src is the batch as rows are read from it: in the file, or for a
	// compressed batch (src.Meta.Codec) in its decompressed body, whose
	// buffers' places src.Meta.Buffers gives (src.Body is then 0).
	src     columnar.Source
	body    int64 // where its body starts in the file
	bodyLen int64
	msgOff  int64 // where its message starts, for errors
	// A compressed batch's buffers as its message places them in the
	// body, and the length of its decompressed body.
	packed   []columnar.BufferLoc
	unpacked int64
	dictID   int64 // dictionary batches
	delta    bool
	before   int // dictionary batches: the record batches before it
}

func (b *arrowBatch) compressed() bool { return b.src.Meta.Codec != columnar.CodecNone }

// srcLen is the length of the body src's buffers lie in.
func (b *arrowBatch) srcLen() int64 {
	if b.compressed() {
		return b.unpacked
	}
	return b.bodyLen
}

// arrowFile is one file's index: its schema and batches.
type arrowFile struct {
	r       storage.Reader
	schema  *arrow.Schema
	sinfo   *columnar.SchemaInfo
	batches []arrowBatch
	dicts   []arrowBatch
	rows    []int64 // rows[b] is the first row of batch b; one extra at the end
	stream  bool
}

// arrowSet is a dataset of one or more Arrow files with one schema.
type arrowSet struct {
	inf    Info
	files  []*arrowFile
	starts []int // the first row id of each file; one extra at the end
	full   *columnar.Layout
	lay    *columnar.Layout // the projection read
	// unpacked holds compressed batches decompressed: the one
	// claim/fill/wait cache, under the budget of Parquet's decoded pages.
	unpacked *cache.Cache
}

const arrowVariant = 0x41525233 // "ARR3": compressed batches keep their codec and both layouts

func openArrow(ctx context.Context, names []string, opts Options) (*arrowSet, error) {
	d := &arrowSet{starts: []int{0}}
	for _, name := range names {
		r, err := opts.Store.Open(ctx, name)
		if err != nil {
			d.Close()
			return nil, err
		}
		f, err := openArrowFile(ctx, r, opts)
		if err != nil {
			r.Close()
			d.Close()
			return nil, err
		}
		if len(d.files) > 0 && !f.schema.Equal(d.files[0].schema) {
			r.Close()
			d.Close()
			return nil, &FormatError{Path: name, Err: fmt.Errorf("schema %s differs from %s's %s: %w", f.schema, names[0], d.files[0].schema, ErrCorrupt)}
		}
		d.files = append(d.files, f)
		d.starts = append(d.starts, d.starts[len(d.starts)-1]+int(f.rows[len(f.rows)-1]))
		d.inf.Versions = append(d.inf.Versions, version(r))
	}
	f0 := d.files[0]
	full, unread, err := columnar.NewLayout(f0.schema, f0.sinfo.DictIDs)
	if err != nil {
		d.Close()
		return nil, &FormatError{Path: names[0], Err: err}
	}
	if len(unread) > 0 && len(opts.Columns) == 0 {
		d.Close()
		return nil, fmt.Errorf("%s: %w: %w", describe(names), &columnar.UnreadError{Unread: unread, Readable: full.Names()}, ErrUnsupported)
	}
	d.full = full
	if d.lay, err = full.Project(opts.Columns); err != nil {
		d.Close()
		return nil, fmt.Errorf("%s: %w", describe(names), err)
	}
	// The index was built and checked against every column; the sources
	// get their dictionaries now that the value nodes are known.
	for _, f := range d.files {
		if err := f.attachDicts(ctx, full); err != nil {
			d.Close()
			return nil, err
		}
	}
	d.inf.Format = "arrow"
	d.inf.Paths = names
	for _, f := range d.files {
		for _, b := range f.batches {
			d.inf.Bytes += b.bodyLen
		}
	}
	d.inf.Columns = d.lay.Describe()
	if md := f0.schema.Metadata(); md.FindKey("huggingface") >= 0 {
		v := md.Values()[md.FindKey("huggingface")]
		d.inf.Features = hfFeatures(&v)
	}
	if d.inf.Schema, err = columnar.SchemaBytes(d.lay.OutputSchema()); err != nil {
		d.Close()
		return nil, err
	}
	if d.Len() == 0 {
		d.Close()
		return nil, fmt.Errorf("%s: %w", describe(names), ErrEmpty)
	}
	return d, nil
}

// openArrowFile reads a file's schema and loads or builds its index.
func openArrowFile(ctx context.Context, r storage.Reader, opts Options) (*arrowFile, error) {
	f := &arrowFile{r: r}
	head := make([]byte, min(8, r.Size()))
	if err := r.ReadAt(ctx, head, 0); err != nil {
		return nil, err
	}
	schemaAt := int64(0)
	f.stream = !bytes.HasPrefix(head, arrowMagic)
	if err := f.readSchema(ctx, schemaAt); err != nil {
		return nil, err
	}
	full, _, err := columnar.NewLayout(f.schema, f.sinfo.DictIDs)
	if err != nil {
		return nil, &FormatError{Path: r.Name(), Err: err}
	}
	err = loadOrBuildFramed(ctx, r, arrowVariant, opts,
		func(p []byte) error { return f.decode(p, full) },
		func() ([]byte, error) {
			if err := f.scan(ctx, full, schemaAt, opts); err != nil {
				return nil, err
			}
			return f.encode(), nil
		})
	if err != nil {
		return nil, err
	}
	f.rows = make([]int64, len(f.batches)+1)
	for i, b := range f.batches {
		f.rows[i+1] = f.rows[i] + b.src.Meta.Rows
	}
	return f, nil
}

func (f *arrowFile) bad(off int64, format string, args ...any) error {
	return &FormatError{Path: f.r.Name(), Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
}

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

func (d *arrowSet) Len() int   { return d.starts[len(d.starts)-1] }
func (d *arrowSet) Info() Info { return d.inf }

// row finds id's file, batch and row in the batch.
func (d *arrowSet) row(id int) (file, batch int, row int64) {
	k := 0
	if len(d.files) > 1 {
		k = sort.SearchInts(d.starts, id+1) - 1
	}
	f := d.files[k]
	r := int64(id - d.starts[k])
	b := sort.Search(len(f.batches), func(b int) bool { return f.rows[b+1] > r })
	return k, b, r - f.rows[b]
}

func (d *arrowSet) NumCells() int { return d.lay.NumCells }

// cells appends row's ranges: a slice of each buffer of its columns, in
// the file, or for a compressed batch in its decompressed body.
func (d *arrowSet) cells(b *arrowBatch, row int64, dst []Loc, k int) []Loc {
	var buf [16]columnar.Range
	for _, c := range d.lay.Cells(&b.src, int(row), buf[:0]) {
		dst = append(dst, Loc{Object: k, Off: c.Off, Len: int(c.Len)})
	}
	return dst
}

// Locate places a row at its largest cell, with the bytes of all its cells:
// where block-aware orders group it, and what errors name. A row of a
// compressed batch is placed at the batch's body, with its cells'
// decompressed bytes and its share of the body, which is read whole.
func (d *arrowSet) Locate(id int) Loc {
	k, bi, row := d.row(id)
	b := &d.files[k].batches[bi]
	var best Loc
	total := 0
	for _, c := range d.cells(b, row, nil, k) {
		total += c.Len
		if c.Len > best.Len {
			best = c
		}
	}
	if b.compressed() {
		rows := max(1, b.src.Meta.Rows)
		return Loc{Object: k, Off: b.body, Len: total + int((b.bodyLen+rows-1)/rows)}
	}
	if best.Len == 0 {
		best = Loc{Object: k, Off: b.body}
	}
	best.Len = total
	return best
}

func (d *arrowSet) Label(int) int               { return -1 }
func (d *arrowSet) Object(i int) storage.Reader { return d.files[i].r }

func (d *arrowSet) Close() error {
	var errs []error
	for _, f := range d.files {
		errs = append(errs, f.r.Close())
	}
	d.files = nil
	return errors.Join(errs...)
}

// packedArrow is a dataset of Arrow files some of whose record batches
// are compressed. A compressed record batch is a block, as a Parquet page
// is: read whole and decompressed once, then kept decompressed (the
// dataset's decoded cache) while batches take its rows. Its default order
// is block-aware over record batches, so that each is read and
// decompressed once per epoch.
type packedArrow struct {
	*arrowSet
	blocks []int
}

// Blocks are the rows of each record batch.
func (d *packedArrow) Blocks() []int { return d.blocks }

// BlockBytes is the largest decompressed body of a record batch.
func (d *packedArrow) BlockBytes() int64 {
	var most int64
	for _, f := range d.files {
		for i := range f.batches {
			most = max(most, f.batches[i].srcLen())
		}
	}
	return most
}

// dataset is d as a Dataset: a packedArrow if it has a compressed batch.
func (d *arrowSet) dataset() Dataset {
	var blocks []int
	packed := false
	for k, f := range d.files {
		for i, b := range f.batches {
			packed = packed || b.compressed()
			if b.src.Meta.Rows > 0 { // blocks have rows
				blocks = append(blocks, d.starts[k]+int(f.rows[i]))
			}
		}
	}
	if !packed {
		return d
	}
	d.unpacked = newDecodedCache()
	return &packedArrow{arrowSet: d, blocks: append(blocks, d.Len())}
}

// batchKey names a record batch: its file and its index there.
type batchKey struct{ file, batch int }

// cacheKey is k as the decoded cache names it. The cache belongs to the
// dataset, which read one version of each file.
func (k batchKey) cacheKey() cache.Key {
	return cache.Key{Space: uint64(uint32(k.file)), ID: int64(k.batch)}
}

// unpacked is a compressed record batch's decompressed body.
type unpacked struct{ body []byte }

type arrowRows struct {
	d       *arrowSet
	ids     []int
	batches []batchKey
	refs    []columnar.RowRef
	plan    *columnar.Plan
	// Compressed batches the rows lie in: pinned, and those claimed
	// read (their whole body, as the cells of their first row here) and
	// decompressed by this batch. nil when none is.
	holds *holds[batchKey, *unpacked]
	first map[batchKey]int // the first slot of each claimed batch
	done  bool
}

func (d *arrowSet) PlanBatch(ids []int) (RowBatch, error) {
	b := &arrowRows{d: d, ids: ids, refs: make([]columnar.RowRef, len(ids)), batches: make([]batchKey, len(ids))}
	for i, id := range ids {
		k, bi, row := d.row(id)
		ab := &d.files[k].batches[bi]
		b.refs[i], b.batches[i] = columnar.RowRef{S: &ab.src, Row: row}, batchKey{k, bi}
		if ab.compressed() {
			if b.holds == nil {
				b.holds, b.first = newHolds[batchKey, *unpacked](d.unpacked), map[batchKey]int{}
			}
			key := batchKey{k, bi}
			b.holds.add(key, key.cacheKey())
			if _, ok := b.first[key]; !ok && b.holds.claimed(key) {
				b.first[key] = i
			}
		}
	}
	var err error
	if b.plan, err = d.lay.Plan(b.refs); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

func (b *arrowRows) Size() int                     { return b.plan.Size }
func (b *arrowRows) Buffers() []columnar.BufferLoc { return b.plan.Buffers }

// Release gives up the batch's claims if it is not to be assembled.
func (b *arrowRows) Release() {
	if !b.done && b.holds != nil {
		b.holds.abandon()
		b.holds.unpin()
	}
	b.done = true
}

// Cells are a row's slice of each buffer; for a row of a compressed
// batch, the batch's whole body in the first cell of the first of its
// rows, if this batch claimed it, and nothing else.
func (b *arrowRows) Cells(slot int, dst []Loc) []Loc {
	key := b.batches[slot]
	ab := &b.d.files[key.file].batches[key.batch]
	if !ab.compressed() {
		return b.d.cells(ab, b.refs[slot].Row, dst, key.file)
	}
	n := b.d.lay.NumCells
	if s, ok := b.first[key]; ok && s == slot {
		dst = append(dst, Loc{Object: key.file, Off: ab.body, Len: int(ab.bodyLen)})
		n--
	}
	for range n {
		dst = append(dst, Loc{})
	}
	return dst
}

func (b *arrowRows) Assemble(ctx context.Context, cell func(slot, k int) []byte, out []byte) (int, error) {
	values := cell
	if b.holds != nil {
		b.done = true
		defer b.holds.unpin()
		have, err := b.unpack(ctx, cell)
		if err != nil {
			b.holds.abandon()
			return 0, err
		}
		// A compressed row's cells are slices of its decompressed body.
		var ranges []columnar.Range
		cur := -1
		values = func(slot, k int) []byte {
			key := b.batches[slot]
			u, ok := have[key]
			if !ok {
				return cell(slot, k)
			}
			if slot != cur {
				cur, ranges = slot, b.d.lay.Cells(b.refs[slot].S, int(b.refs[slot].Row), ranges[:0])
			}
			r := ranges[k]
			return u.body[r.Off : r.Off+r.Len]
		}
	}
	n, err := b.plan.Assemble(b.refs, values, out)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", describe(b.d.inf.Paths), err)
	}
	return n, nil
}

// unpack decompresses each compressed batch this batch claimed, once,
// and publishes it; then waits for those other batches decompress.
func (b *arrowRows) unpack(ctx context.Context, cell func(slot, k int) []byte) (map[batchKey]*unpacked, error) {
	d := b.d
	for key, slot := range b.first {
		f := d.files[key.file]
		ab := &f.batches[key.batch]
		body, err := f.unpack(ab, cell(slot, 0))
		u := &unpacked{body: body}
		b.holds.publish(key, u, body, err)
		if err != nil {
			return nil, err
		}
	}
	return b.holds.await(ctx, func(key batchKey) (*unpacked, error) {
		f := d.files[key.file]
		body, err := f.readUnpacked(ctx, &f.batches[key.batch])
		if err != nil {
			return nil, err
		}
		return &unpacked{body: body}, nil
	})
}

func (b *arrowRows) Table() (nodes [][2]int64, buffers [][2]int64, body int) {
	ns, bs := b.plan.Table()
	for _, n := range ns {
		nodes = append(nodes, [2]int64{n.Length, n.NullCount})
	}
	for _, x := range bs {
		buffers = append(buffers, [2]int64{x.Offset, x.Length})
	}
	return nodes, buffers, b.plan.Body
}
