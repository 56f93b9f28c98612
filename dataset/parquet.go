package dataset

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/apache/arrow-go/v18/parquet/schema"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/storage"
)

// Parquet files. A row lives in one page of each of its columns, and a
// page is compressed and encoded whole: a row costs the read and the
// decoding of its pages (and of its column chunk's dictionary page). So a
// row's cells are those pages, the loader reads each page a batch needs
// once, and the dataset decodes each once per batch, keeping decoded
// pages in a small cache (the one claim/fill/wait cache.Cache: of the
// batches that miss a page one decodes it, the others wait) so that a page
// used by the next batches is not decoded again. A record-level global
// shuffle still decodes a whole page
// for each row it takes from it; the block-aware order with a page as its
// block (Blocks; the default for Parquet) reads and decodes each page once
// per epoch.
//
// One scan indexes a file: each page's place and rows (from the page
// headers; a page of a repeated column that does not start a row is
// grouped with the one before), and, from the page decoded once, where
// each row's values start in it, so that a batch's size is known before
// its pages are read. Pages are decoded by arrow-go's Parquet reader (all
// codecs, encodings and logical types), given a one-column, one-page file
// made of the page's bytes. A column of several leaves (a struct, a map,
// a list of structs) is read a row group at a time (the note above groupSpan says why).
// A column whose type riffle cannot lay out is refused by name when no
// columns= is given, never dropped unseen. Types are pyarrow's reading of
// the file (timestampsAsPyarrow), the reference riffle is tested against.

func init() {
	RegisterFormat(Format{Name: "parquet", Extensions: []string{".parquet", ".pq"}, Indexed: true, OpenFiles: openParquet})
}

const parquetVariant = 0x50515232 // "PQR2": columns of several leaves are indexed too

// pqPage is a group of pages of one column chunk holding whole rows.
type pqPage struct {
	off, length int64 // headers and bodies, in the file
	values      int64
	first, rows int64            // in the row group
	starts      [][]int64        // the column's Var nodes: rows+1 starts each
	skel        *columnar.Source // the starts alone: what a batch is planned from
}

// pqChunk is one column of one row group.
type pqChunk struct {
	dictOff, dictLen int64
	pages            []pqPage
	codec            compress.Compression
}

// pqColumn is a top-level column riffle reads: a field of one leaf or
// of several.
type pqColumn struct {
	name  string
	leaf  int
	field arrow.Field
	// group lists the leaves of a column of several (a struct, a map, a
	// list of structs), in the file's order; nil for a column of one.
	group []int
	lay   *columnar.Layout // the column alone
	sub   *schema.Schema   // its Parquet schema alone
	kv    metadata.KeyValueMetadata
}

type pqFile struct {
	r      storage.Reader
	meta   *metadata.FileMetaData
	rgRows []int64      // first row of each row group; one extra at the end
	chunks [][]*pqChunk // [row group][column index among all readable]
}

type parquetSet struct {
	inf    Info
	files  []*pqFile
	starts []int
	all    []*pqColumn // every readable column
	cols   []int       // the projection, as indexes into all
	lay    *columnar.Layout
	pages  *cache.Cache // decoded page groups: one claim/fill/wait cache, as the record cache
	blocks []int
}

// readerAt adapts a storage.Reader to what arrow-go's Parquet reader takes.
type readerAt struct {
	ctx context.Context
	r   storage.Reader
	off int64
}

func (a *readerAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= a.r.Size() {
		return 0, io.EOF
	}
	n := min(int64(len(p)), a.r.Size()-off)
	if err := a.r.ReadAt(a.ctx, p[:n], off); err != nil {
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

func (a *readerAt) Read(p []byte) (int, error) {
	n, err := a.ReadAt(p, a.off)
	a.off += int64(n)
	return n, err
}

func (a *readerAt) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		a.off = off
	case io.SeekCurrent:
		a.off += off
	case io.SeekEnd:
		a.off = a.r.Size() + off
	}
	if a.off < 0 {
		return 0, fmt.Errorf("seek before the start")
	}
	return a.off, nil
}

// hfFeatures is the Hugging Face features a file written by datasets
// (Dataset.to_parquet, the Hub's files) keeps under its "huggingface" key,
// as dataset_info.json's "features" are for a save_to_disk directory: how a
// client knows which columns are Images and what a ClassLabel's names are.
// An Arrow file written by datasets (save_to_disk's, and a pack of any of
// these) keeps the same key in its schema's metadata.
func hfFeatures(v *string) string {
	if v == nil {
		return ""
	}
	var meta struct {
		Info struct {
			Features json.RawMessage `json:"features"`
		} `json:"info"`
	}
	var b bytes.Buffer
	if json.Unmarshal([]byte(*v), &meta) != nil || len(meta.Info.Features) == 0 || json.Compact(&b, meta.Info.Features) != nil {
		return ""
	}
	return b.String()
}

// columnsOf lays out the file's readable top-level columns, and returns
// the fields of the others.
func columnsOf(meta *metadata.FileMetaData) ([]*pqColumn, []arrow.Field, error) {
	kv := meta.KeyValueMetadata()
	if err := checkStoredSchema(kv); err != nil {
		return nil, nil, err
	}
	man, err := pqarrow.NewSchemaManifest(meta.Schema, kv, &pqarrow.ArrowReadProperties{})
	if err != nil {
		return nil, nil, err
	}
	var cols []*pqColumn
	var skipped []arrow.Field
	root := meta.Schema.Root()
	for i, f := range man.Fields {
		var leaves []int // in the file's order, which is the type's pre-order
		var walk func(s *pqarrow.SchemaField)
		walk = func(s *pqarrow.SchemaField) {
			if s.IsLeaf() {
				leaves = append(leaves, s.ColIndex)
			}
			for k := range s.Children {
				walk(&s.Children[k])
			}
		}
		walk(&man.Fields[i])
		if len(leaves) == 0 {
			skipped = append(skipped, *f.Field)
			continue
		}
		var group []int
		if len(leaves) > 1 {
			group = leaves
		}
		int96 := make([]bool, len(leaves))
		for k, l := range leaves {
			int96[k] = meta.Schema.Column(l).PhysicalType() == parquet.Types.Int96
		}
		field := *f.Field
		// Read dense, as every other column: a batch's dictionary would be
		// the page's, not the file's.
		field.Type = denseType(field.Type)
		var origin arrow.DataType
		if man.OriginSchema != nil {
			if fs, ok := man.OriginSchema.FieldsByName(field.Name); ok && len(fs) == 1 {
				origin = fs[0].Type
			}
		}
		field.Type = timestampsAsPyarrow(field.Type, origin, &int96)
		one := arrow.NewSchema([]arrow.Field{field}, nil)
		lay, bad, err := columnar.NewLayout(one, nil)
		if err != nil || len(bad) > 0 {
			skipped = append(skipped, *f.Field)
			continue
		}
		g, err := schema.NewGroupNode("schema", parquet.Repetitions.Repeated, schema.FieldList{root.Field(i)}, -1)
		if err != nil {
			return nil, nil, err
		}
		// The page is decoded as the schema stored with it says; arrow-go
		// reads no durations, which are int64s of the same layout.
		sb, err := columnar.SchemaBytes(arrow.NewSchema([]arrow.Field{{Name: field.Name, Type: decodeType(field.Type), Nullable: field.Nullable}}, nil))
		if err != nil {
			return nil, nil, err
		}
		ckv := metadata.NewKeyValueMetadata()
		ckv.Append("ARROW:schema", base64.StdEncoding.EncodeToString(sb[:len(sb)-8]))
		cols = append(cols, &pqColumn{name: field.Name, leaf: leaves[0], group: group, field: field, lay: lay, sub: schema.NewSchema(g), kv: ckv})
	}
	return cols, skipped, nil
}

func openParquet(ctx context.Context, names []string, opts Options) (Dataset, error) {
	d := &parquetSet{starts: []int{0}, pages: newDecodedCache()}
	for _, name := range names {
		r, err := opts.Store.Open(ctx, name)
		if err != nil {
			d.Close()
			return nil, err
		}
		f, cols, err := openParquetFile(ctx, r, opts)
		if err != nil {
			r.Close()
			d.Close()
			return nil, err
		}
		if d.all == nil {
			d.all = cols
		} else if len(cols) != len(d.all) || !sameFields(cols, d.all) {
			r.Close()
			d.Close()
			return nil, &FormatError{Path: name, Err: fmt.Errorf("columns differ from %s's: %w", names[0], ErrCorrupt)}
		}
		d.files = append(d.files, f)
		d.starts = append(d.starts, d.starts[len(d.starts)-1]+int(f.rgRows[len(f.rgRows)-1]))
		d.inf.Versions = append(d.inf.Versions, version(r))
	}
	if len(d.all) == 0 {
		d.Close()
		return nil, fmt.Errorf("%s: no column riffle reads: %w", describe(names), ErrUnsupported)
	}
	byName := map[string]int{}
	for i, c := range d.all {
		byName[c.name] = i
	}
	if len(opts.Columns) == 0 {
		for i := range d.all {
			d.cols = append(d.cols, i)
		}
	}
	for _, name := range opts.Columns {
		i, ok := byName[name]
		if !ok {
			err := fmt.Errorf("%s: %w %q", describe(names), columnar.ErrNoColumn, name)
			if rootHas(d.files[0].meta, name) {
				err = fmt.Errorf("%s: column %q has a type riffle does not read yet: leave it out of columns=: %w", describe(names), name, ErrUnsupported)
			}
			d.Close()
			return nil, err
		}
		d.cols = append(d.cols, i)
	}
	var nodes []*columnar.Node
	var fields []arrow.Field
	for _, i := range d.cols {
		nodes = append(nodes, d.all[i].lay.Columns[0])
		fields = append(fields, d.all[i].field)
	}
	d.lay = columnar.Compose(arrow.NewSchema(fields, nil), nodes)
	d.inf.Format = "parquet"
	d.inf.Paths = names
	d.inf.Columns = d.lay.Describe()
	d.inf.Features = hfFeatures(d.files[0].meta.KeyValueMetadata().FindValue("huggingface"))
	var err error
	if d.inf.Schema, err = columnar.SchemaBytes(d.lay.OutputSchema()); err != nil {
		d.Close()
		return nil, err
	}
	for _, f := range d.files {
		for _, rg := range f.chunks {
			for _, c := range d.cols {
				for _, p := range rg[c].pages {
					d.inf.Bytes += p.length
				}
			}
		}
	}
	d.blocks = d.pageBlocks()
	if d.Len() == 0 {
		d.Close()
		return nil, fmt.Errorf("%s: %w", describe(names), ErrEmpty)
	}
	return d, nil
}

// checkStoredSchema checks the Arrow schema a writer stored in the footer
// (the ARROW:schema key) with riffle's own flatbuffer reader, which bounds
// every vector by the bytes that hold it, before arrow-go's reads it:
// arrow-go sizes what it allocates by the counts the schema claims, and a
// corrupt count runs the process out of memory, which no recover catches.
func checkStoredSchema(kv metadata.KeyValueMetadata) error {
	v := kv.FindValue("ARROW:schema")
	if v == nil {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(*v)
	if len(b) == 0 || err != nil {
		b, err = base64.RawStdEncoding.DecodeString(*v)
	}
	if err != nil {
		return fmt.Errorf("stored Arrow schema: %v", err)
	}
	n, pre, eos, err := columnar.Prefix(b)
	if err == nil && (eos || n > len(b)-pre) {
		err = fmt.Errorf("a message of %d bytes in %d", n, len(b))
	}
	if err == nil {
		_, err = columnar.ParseSchemaMessage(b[pre : pre+n])
	}
	if err == nil {
		var m *columnar.Message
		if m, err = columnar.ParseMessage(b[pre : pre+n]); err == nil && m.BodyLen > int64(len(b)-pre-n) {
			err = fmt.Errorf("a body of %d bytes after the schema, in %d", m.BodyLen, len(b)-pre-n)
		}
	}
	if err != nil {
		return fmt.Errorf("stored Arrow schema: %v", err)
	}
	return nil
}

// timestampsAsPyarrow gives a column's timestamps the type pyarrow reads
// them as where arrow-go's differs (Arrow C++'s parquet/arrow/schema.cc,
// ApplyOriginalStorageMetadata): an INT96 timestamp is timestamp[ns] with
// no zone (arrow-go says UTC), and a UTC-adjusted timestamp takes the zone
// its stored Arrow schema (origin, the ARROW:schema key) gave it even when
// its unit was coerced on write (arrow-go keeps the zone only when the
// unit is the same). The values are the same int64s either way. int96
// says, for each leaf of t in pre-order (the file's order of its leaf
// columns), whether it is stored as INT96; each leaf takes its own.
func timestampsAsPyarrow(t, origin arrow.DataType, int96 *[]bool) arrow.DataType {
	field := func(e arrow.Field, o arrow.DataType) arrow.Field {
		e.Type = timestampsAsPyarrow(e.Type, o, int96)
		return e
	}
	elem := func(o arrow.DataType) arrow.DataType {
		if ol, ok := o.(arrow.ListLikeType); ok {
			return ol.Elem()
		}
		return nil
	}
	switch tt := t.(type) {
	case *arrow.ListType:
		return arrow.ListOfField(field(tt.ElemField(), elem(origin)))
	case *arrow.LargeListType:
		return arrow.LargeListOfField(field(tt.ElemField(), elem(origin)))
	case *arrow.FixedSizeListType:
		return arrow.FixedSizeListOfField(tt.Len(), field(tt.ElemField(), elem(origin)))
	case *arrow.MapType:
		// pyarrow (22) gives a map's timestamps no zone back from the
		// stored schema: a UTC-adjusted one is UTC there, whatever zone
		// it was written with (arrow-go keeps the zone when the unit is
		// the same).
		m := arrow.MapOfFields(field(tt.KeyField(), nil), field(tt.ItemField(), nil))
		m.KeysSorted = tt.KeysSorted
		return mapLeaves(m, func(t arrow.DataType) arrow.DataType {
			if ts, ok := t.(*arrow.TimestampType); ok && ts.TimeZone != "" {
				return &arrow.TimestampType{Unit: ts.Unit, TimeZone: "UTC"}
			}
			return t
		})
	case *arrow.StructType:
		os, _ := origin.(*arrow.StructType)
		fs := make([]arrow.Field, tt.NumFields())
		for k, f := range tt.Fields() {
			var o arrow.DataType
			if os != nil && os.NumFields() == len(fs) {
				o = os.Field(k).Type
			}
			fs[k] = field(f, o)
		}
		return arrow.StructOf(fs...)
	}
	is96 := false
	if len(*int96) > 0 {
		is96, *int96 = (*int96)[0], (*int96)[1:]
	}
	if tt, ok := t.(*arrow.TimestampType); ok {
		if is96 {
			return &arrow.TimestampType{Unit: arrow.Nanosecond}
		}
		if ot, ok := origin.(*arrow.TimestampType); ok && tt.TimeZone == "UTC" && ot.TimeZone != "" {
			return &arrow.TimestampType{Unit: tt.Unit, TimeZone: ot.TimeZone}
		}
	}
	return t
}

// mapLeaves rebuilds a nested type with fn applied to each of its leaf
// types (those neither a list, a map nor a struct).
func mapLeaves(t arrow.DataType, fn func(arrow.DataType) arrow.DataType) arrow.DataType {
	field := func(f arrow.Field) arrow.Field {
		f.Type = mapLeaves(f.Type, fn)
		return f
	}
	switch tt := t.(type) {
	case *arrow.ListType:
		return arrow.ListOfField(field(tt.ElemField()))
	case *arrow.LargeListType:
		return arrow.LargeListOfField(field(tt.ElemField()))
	case *arrow.FixedSizeListType:
		return arrow.FixedSizeListOfField(tt.Len(), field(tt.ElemField()))
	case *arrow.MapType:
		m := arrow.MapOfFields(field(tt.KeyField()), field(tt.ItemField()))
		m.KeysSorted = tt.KeysSorted
		return m
	case *arrow.StructType:
		fs := make([]arrow.Field, tt.NumFields())
		for k, f := range tt.Fields() {
			fs[k] = field(f)
		}
		return arrow.StructOf(fs...)
	}
	return fn(t)
}

// denseType is t with every dictionary read as its values.
func denseType(t arrow.DataType) arrow.DataType {
	return mapLeaves(t, func(t arrow.DataType) arrow.DataType {
		if dt, ok := t.(*arrow.DictionaryType); ok {
			return dt.ValueType
		}
		return t
	})
}

// decodeType is the type a page of type t is decoded as: t, but for
// durations (read as the int64s they are stored as).
func decodeType(t arrow.DataType) arrow.DataType {
	return mapLeaves(t, func(t arrow.DataType) arrow.DataType {
		if _, ok := t.(*arrow.DurationType); ok {
			return arrow.PrimitiveTypes.Int64
		}
		return t
	})
}

func rootHas(meta *metadata.FileMetaData, name string) bool {
	root := meta.Schema.Root()
	for i := range root.NumFields() {
		if root.Field(i).Name() == name {
			return true
		}
	}
	return false
}

func sameFields(a, b []*pqColumn) bool {
	for i := range a {
		if !arrow.TypeEqual(a[i].field.Type, b[i].field.Type) || a[i].name != b[i].name {
			return false
		}
	}
	return true
}

// maxFooter bounds a Parquet footer riffle will parse: arrow-go's Thrift
// reader sizes what it allocates by the counts the footer claims.
const maxFooter = 16 << 20

// parquetMeta reads a file's footer and readable columns.
func parquetMeta(ctx context.Context, r storage.Reader) (*metadata.FileMetaData, []*pqColumn, error) {
	meta, cols, _, err := parquetFooter(ctx, r)
	return meta, cols, err
}

// parquetFooter reads a file's footer, its readable columns and the fields
// of the others, with arrow-go, after checking the footer's length; its
// panics on a malformed footer are errors.
func parquetFooter(ctx context.Context, r storage.Reader) (meta *metadata.FileMetaData, cols []*pqColumn, unread []arrow.Field, err error) {
	size := r.Size()
	bad := func(off int64, format string, args ...any) error {
		return &FormatError{Path: r.Name(), Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
	}
	if size < 12 {
		return nil, nil, nil, bad(0, "Parquet file of %d bytes", size)
	}
	tail := make([]byte, 8)
	if err := r.ReadAt(ctx, tail, size-8); err != nil {
		return nil, nil, nil, err
	}
	if string(tail[4:]) != "PAR1" {
		return nil, nil, nil, bad(size-4, "no PAR1 magic at the end: cut short, or not a Parquet file (an encrypted one?)")
	}
	if n := int64(binary.LittleEndian.Uint32(tail)); n > size-12 || n > maxFooter {
		return nil, nil, nil, bad(size-8, "footer of %d bytes in a file of %d", n, size)
	}
	defer func() {
		if p := recover(); p != nil {
			meta, cols, unread, err = nil, nil, nil, bad(size-8, "footer: %v", p)
		}
	}()
	pr, err := file.NewParquetReader(&readerAt{ctx: ctx, r: r})
	if err != nil {
		return nil, nil, nil, bad(size-8, "footer: %v", err)
	}
	meta = pr.MetaData()
	pr.Close()
	if cols, unread, err = columnsOf(meta); err != nil {
		return nil, nil, nil, bad(size-8, "schema: %v", err)
	}
	return meta, cols, unread, nil
}

func openParquetFile(ctx context.Context, r storage.Reader, opts Options) (*pqFile, []*pqColumn, error) {
	meta, cols, unread, err := parquetFooter(ctx, r)
	if err != nil {
		return nil, nil, err
	}
	if len(unread) > 0 && len(opts.Columns) == 0 {
		names := make([]string, len(cols))
		for i, c := range cols {
			names[i] = c.name
		}
		return nil, nil, fmt.Errorf("%s: %w: %w", r.Name(), &columnar.UnreadError{Unread: unread, Readable: names}, ErrUnsupported)
	}
	f := &pqFile{r: r, meta: meta, rgRows: []int64{0}}
	for rg := range meta.NumRowGroups() {
		f.rgRows = append(f.rgRows, f.rgRows[rg]+meta.RowGroup(rg).NumRows())
	}
	err = loadOrBuildFramed(ctx, r, parquetVariant, opts,
		func(p []byte) error { return f.decode(p, cols) },
		func() ([]byte, error) {
			if err := f.scan(ctx, cols, opts); err != nil {
				return nil, err
			}
			return f.encode(), nil
		})
	if err != nil {
		return nil, nil, err
	}
	return f, cols, nil
}

func (f *pqFile) bad(off int64, format string, args ...any) error {
	return &FormatError{Path: f.r.Name(), Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
}

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

// pageFile is a Parquet file of one column, one row group and one group
// of pages (with its dictionary page): what arrow-go's reader decodes.
func pageFile(c *pqColumn, codec compress.Compression, dict, pages []byte, values int64) (*file.Reader, error) {
	var b bytes.Buffer
	b.WriteString("PAR1")
	info := metadata.ChunkMetaInfo{NumValues: values, IndexPageOffset: -1, DataPageOffset: 4,
		CompressedSize: int64(len(dict) + len(pages)), UncompressedSize: int64(len(dict) + len(pages))}
	if len(dict) > 0 {
		info.DictPageOffset, info.DataPageOffset = 4, int64(4+len(dict))
		b.Write(dict)
	}
	b.Write(pages)
	props := parquet.NewWriterProperties(parquet.WithCompression(codec), parquet.WithStats(false))
	fmb := metadata.NewFileMetadataBuilder(c.sub, props, c.kv)
	rgb := fmb.AppendRowGroup()
	ccb := rgb.NextColumnChunk()
	if err := ccb.Finish(info, len(dict) > 0, false, metadata.EncodingStats{}); err != nil {
		return nil, err
	}
	rgb.SetNumRows(int(values))
	if err := rgb.Finish(info.CompressedSize, 0); err != nil {
		return nil, err
	}
	return finishFile(&b, fmb)
}

// finishFile ends a one-row-group file made in memory (b holds its magic
// and column chunks): its footer, its length and the magic, and opens it
// for arrow-go's reader.
func finishFile(b *bytes.Buffer, fmb *metadata.FileMetaDataBuilder) (*file.Reader, error) {
	fm, err := fmb.Finish()
	if err != nil {
		return nil, err
	}
	at := b.Len()
	if _, err := fm.WriteTo(b, nil); err != nil {
		return nil, err
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(b.Len()-at))
	b.Write(n[:])
	b.WriteString("PAR1")
	rp := parquet.NewReaderProperties(memory.DefaultAllocator)
	rp.BufferedStreamEnabled = false
	return file.NewParquetReader(bytes.NewReader(b.Bytes()), file.WithReadProps(rp))
}

// decodePage decodes a group of pages into the column's Arrow array.
func decodePage(c *pqColumn, codec compress.Compression, dict, pages []byte, values int64) (arr arrow.Array, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decoding: %v", p)
		}
	}()
	rd, err := pageFile(c, codec, dict, pages, values)
	if err != nil {
		return nil, err
	}
	return readColumn(rd)
}

// readColumn reads a file of one column (a page file or a group file)
// whole, as one array.
func readColumn(rd *file.Reader) (arrow.Array, error) {
	defer rd.Close()
	fr, err := pqarrow.NewFileReader(rd, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		return nil, err
	}
	tab, err := fr.ReadTable(context.Background())
	if err != nil {
		return nil, err
	}
	defer tab.Release()
	chunks := tab.Column(0).Data().Chunks()
	if len(chunks) == 1 {
		chunks[0].Retain()
		return chunks[0], nil
	}
	return array.Concatenate(chunks, memory.DefaultAllocator)
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

// groupFile is a Parquet file of column c's leaves in one row group, from
// span, their chunks' bytes, read from offset off of the file.
func groupFile(c *pqColumn, rgm *metadata.RowGroupMetaData, span []byte, off int64) (*file.Reader, error) {
	var b bytes.Buffer
	b.WriteString("PAR1")
	b.Write(span)
	var props []parquet.WriterProperty
	infos := make([]metadata.ChunkMetaInfo, len(c.group))
	dicts := make([]bool, len(c.group))
	for k, l := range c.group {
		cm, err := rgm.ColumnChunk(l)
		if err != nil {
			return nil, err
		}
		start, data := chunkStart(cm), cm.DataPageOffset()
		if start < off || data < off || start+cm.TotalCompressedSize() > off+int64(len(span)) {
			return nil, fmt.Errorf("leaf %d chunk outside its column's bytes", l)
		}
		infos[k] = metadata.ChunkMetaInfo{NumValues: cm.NumValues(), IndexPageOffset: -1, DataPageOffset: 4 + data - off,
			CompressedSize: cm.TotalCompressedSize(), UncompressedSize: cm.TotalUncompressedSize()}
		if start < data {
			infos[k].DictPageOffset, dicts[k] = 4+start-off, true
		}
		props = append(props, parquet.WithCompressionFor(c.sub.Column(k).ColumnPath().String(), cm.Compression()))
	}
	fmb := metadata.NewFileMetadataBuilder(c.sub, parquet.NewWriterProperties(append(props, parquet.WithStats(false))...), c.kv)
	rgb := fmb.AppendRowGroup()
	var total int64
	for k := range c.group {
		if err := rgb.NextColumnChunk().Finish(infos[k], dicts[k], false, metadata.EncodingStats{}); err != nil {
			return nil, err
		}
		total += infos[k].CompressedSize
	}
	rgb.SetNumRows(int(rgm.NumRows()))
	if err := rgb.Finish(total, 0); err != nil {
		return nil, err
	}
	return finishFile(&b, fmb)
}

// decodeGroup decodes column c's leaves in a row group, from their bytes
// span read at offset off.
func decodeGroup(c *pqColumn, rgm *metadata.RowGroupMetaData, span []byte, off int64) (arr arrow.Array, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decoding: %v", p)
		}
	}()
	rd, err := groupFile(c, rgm, span, off)
	if err != nil {
		return nil, err
	}
	return readColumn(rd)
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

// pageSource lays a decoded page out as a one-column record batch body.
func pageSource(c *pqColumn, arr arrow.Array) (*columnar.Source, []byte, error) {
	return columnar.SourceOf(c.lay, arr)
}

// encode writes the index payload: little-endian int64s.
func (f *pqFile) encode() []byte {
	var w []int64
	w = append(w, int64(len(f.chunks)))
	for _, rg := range f.chunks {
		w = append(w, int64(len(rg)))
		for _, ch := range rg {
			w = append(w, int64(ch.codec), ch.dictOff, ch.dictLen, int64(len(ch.pages)))
			for _, p := range ch.pages {
				w = append(w, p.off, p.length, p.values, p.first, p.rows, int64(len(p.starts)))
				for _, s := range p.starts {
					w = append(w, int64(len(s)))
					w = append(w, s...)
				}
			}
		}
	}
	b := make([]byte, 8*len(w))
	for i, v := range w {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return b
}

func (f *pqFile) decode(p []byte, cols []*pqColumn) error {
	at := 0
	next := func() (int64, error) {
		if at+8 > len(p) {
			return 0, fmt.Errorf("index payload cut short")
		}
		v := int64(binary.LittleEndian.Uint64(p[at:]))
		at += 8
		return v, nil
	}
	count := func(limit int64) (int, error) {
		v, err := next()
		if err == nil && (v < 0 || v > limit || v > int64(len(p)-at)/8+1) {
			err = fmt.Errorf("index count %d", v)
		}
		return int(v), err
	}
	nrg, err := count(int64(f.meta.NumRowGroups()))
	if err != nil || nrg != f.meta.NumRowGroups() {
		return fmt.Errorf("index of %d row groups, the file has %d (%v)", nrg, f.meta.NumRowGroups(), err)
	}
	f.chunks = make([][]*pqChunk, nrg)
	for rg := range f.chunks {
		nc, err := count(int64(len(cols)))
		if err != nil || nc != len(cols) {
			return fmt.Errorf("index of %d columns, the file has %d readable", nc, len(cols))
		}
		for ci := range nc {
			vals := make([]int64, 4)
			for i := range vals {
				if vals[i], err = next(); err != nil {
					return err
				}
			}
			ch := &pqChunk{codec: compress.Compression(vals[0]), dictOff: vals[1], dictLen: vals[2]}
			if vals[3] < 0 || vals[3] > int64(len(p)) {
				return fmt.Errorf("index count %d", vals[3])
			}
			first := int64(0)
			for range vals[3] {
				pv := make([]int64, 5)
				for i := range pv {
					if pv[i], err = next(); err != nil {
						return err
					}
				}
				pg := pqPage{off: pv[0], length: pv[1], values: pv[2], first: pv[3], rows: pv[4]}
				if pg.off < 0 || pg.length < 0 || pg.off > f.r.Size() || pg.length > f.r.Size()-pg.off || pg.first != first || pg.rows < 0 {
					return fmt.Errorf("page outside the file or out of order")
				}
				first += pg.rows
				ns, err := count(1 << 20)
				if err != nil || ns != cols[ci].lay.Vars {
					return fmt.Errorf("page with %d start columns, the column has %d", ns, cols[ci].lay.Vars)
				}
				for range ns {
					n, err := count(pg.rows + 1)
					if err != nil || int64(n) != pg.rows+1 {
						return fmt.Errorf("page starts of %d rows, the page has %d", n-1, pg.rows)
					}
					s := make([]int64, n)
					for k := range s {
						if s[k], err = next(); err != nil {
							return err
						}
						if k > 0 && s[k] < s[k-1] {
							return fmt.Errorf("page starts out of order")
						}
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
	if at != len(p) {
		return fmt.Errorf("%d bytes after the index payload", len(p)-at)
	}
	return nil
}

func (d *parquetSet) Len() int   { return d.starts[len(d.starts)-1] }
func (d *parquetSet) Info() Info { return d.inf }

// where finds row id's file, row group and row there.
func (d *parquetSet) where(id int) (k, rg int, row int64) {
	if len(d.files) > 1 {
		k = sort.SearchInts(d.starts, id+1) - 1
	}
	f := d.files[k]
	r := int64(id - d.starts[k])
	rg = sort.Search(len(f.rgRows)-1, func(g int) bool { return f.rgRows[g+1] > r })
	return k, rg, r - f.rgRows[rg]
}

// page finds the page group of column c (an index into all) holding row.
func (d *parquetSet) page(k, rg, c int, row int64) (int, *pqPage) {
	pages := d.files[k].chunks[rg][c].pages
	i := sort.Search(len(pages), func(i int) bool { return pages[i].first+pages[i].rows > row })
	return i, &pages[i]
}

// Locate places a row at its page of the first column read.
func (d *parquetSet) Locate(id int) Loc {
	k, rg, row := d.where(id)
	total := 0
	var first Loc
	for i, c := range d.cols {
		_, p := d.page(k, rg, c, row)
		total += int(p.length)
		if i == 0 {
			first = Loc{Object: k, Off: p.off}
		}
	}
	first.Len = total
	return first
}

func (d *parquetSet) Label(int) int               { return -1 }
func (d *parquetSet) Object(i int) storage.Reader { return d.files[i].r }
func (d *parquetSet) NumCells() int               { return 2 * len(d.cols) }

// Blocks are the rows of each page group of the column with the most
// bytes: the blocks of a block-aware order that reads and decodes each of
// its pages once per epoch (the other columns' pages, smaller, are kept
// decoded while their rows are taken).
func (d *parquetSet) Blocks() []int { return d.blocks }

func (d *parquetSet) pageBlocks() []int {
	big, most := 0, int64(-1)
	for _, c := range d.cols {
		var n int64
		for _, f := range d.files {
			for _, rg := range f.chunks {
				for _, p := range rg[c].pages {
					n += p.length
				}
			}
		}
		if n > most {
			big, most = c, n
		}
	}
	bounds := []int{}
	for k, f := range d.files {
		for rg := range f.chunks {
			for _, p := range f.chunks[rg][big].pages {
				bounds = append(bounds, d.starts[k]+int(f.rgRows[rg]+p.first))
			}
		}
	}
	return append(bounds, d.Len())
}

func (d *parquetSet) Close() error {
	var errs []error
	for _, f := range d.files {
		errs = append(errs, f.r.Close())
	}
	d.files = nil
	return errors.Join(errs...)
}

// pageKey names a page group in the cache of decoded pages.
type pageKey struct{ file, rg, col, page int }

// cacheKey is k as the cache names it, exactly: each number fits 32 bits.
func (k pageKey) cacheKey() cache.Key {
	return cache.Key{Space: uint64(uint32(k.file))<<32 | uint64(uint32(k.rg)), ID: int64(uint32(k.col))<<32 | int64(uint32(k.page))}
}

type decoded struct {
	src  *columnar.Source
	body []byte
}

// pqRows is one batch of Parquet rows. Each page group it needs is one of
// three: decoded in the cache already; being read and decoded by another
// batch (it waits for that one); or its own to read and decode (it
// claimed it, and publishes the result for the others).
type pqRows struct {
	d     *parquetSet
	n     int
	keys  [][]pageKey // [slot][projected column]
	rows  [][]int64   // [slot][projected column]: the row in its page
	pages *holds[pageKey, *decoded]
	plan  *columnar.Plan
	done  bool
}

func (d *parquetSet) PlanBatch(ids []int) (RowBatch, error) {
	b := &pqRows{d: d, n: len(ids), keys: make([][]pageKey, len(ids)), rows: make([][]int64, len(ids)),
		pages: newHolds[pageKey, *decoded](d.pages)}
	refs := make([]columnar.RowRef, len(ids))
	for slot, id := range ids {
		k, rg, row := d.where(id)
		b.keys[slot] = make([]pageKey, len(d.cols))
		b.rows[slot] = make([]int64, len(d.cols))
		refs[slot].Cols = make([]columnar.ColRef, len(d.cols))
		for i, c := range d.cols {
			pi, p := d.page(k, rg, c, row)
			key := pageKey{k, rg, c, pi}
			b.keys[slot][i], b.rows[slot][i] = key, row-p.first
			b.pages.add(key, key.cacheKey())
			refs[slot].Cols[i] = columnar.ColRef{S: p.skel, Row: row - p.first}
		}
	}
	var err error
	if b.plan, err = d.lay.Plan(refs); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

func (b *pqRows) Size() int                     { return b.plan.Size }
func (b *pqRows) Buffers() []columnar.BufferLoc { return b.plan.Buffers }

// Cells are a row's dictionary page and page group in each column, for
// the pages this batch claimed; none for the others.
func (b *pqRows) Cells(slot int, dst []Loc) []Loc {
	for _, key := range b.keys[slot] {
		if !b.pages.claimed(key) {
			dst = append(dst, Loc{}, Loc{})
			continue
		}
		ch := b.d.files[key.file].chunks[key.rg][key.col]
		p := &ch.pages[key.page]
		dst = append(dst, Loc{Object: key.file, Off: ch.dictOff, Len: int(ch.dictLen)}, Loc{Object: key.file, Off: p.off, Len: int(p.length)})
	}
	return dst
}

// decode decodes page group key from its dictionary and page bytes.
func (b *pqRows) decode(key pageKey, dict, pages []byte) (*decoded, int, error) {
	d := b.d
	ch := d.files[key.file].chunks[key.rg][key.col]
	p := &ch.pages[key.page]
	c := d.all[key.col]
	bad := func(err error) error {
		return &FormatError{Path: d.files[key.file].r.Name(), Offset: p.off, Err: fmt.Errorf("column %q page: %v: %w", c.name, err, ErrCorrupt)}
	}
	var arr arrow.Array
	var err error
	if c.group != nil {
		arr, err = decodeGroup(c, d.files[key.file].meta.RowGroup(key.rg), pages, p.off)
	} else {
		arr, err = decodePage(c, ch.codec, dict, pages, p.values)
	}
	if err != nil {
		return nil, 0, bad(err)
	}
	src, body, err := pageSource(c, arr)
	arr.Release()
	if err == nil && src.Meta.Rows != p.rows {
		err = fmt.Errorf("%d rows, the index says %d", src.Meta.Rows, p.rows)
	}
	if err != nil {
		return nil, 0, bad(err)
	}
	return &decoded{src: src, body: body}, len(body), nil
}

// readAndDecode reads a page group itself: when the batch that claimed
// it gave up before decoding it.
func (b *pqRows) readAndDecode(ctx context.Context, key pageKey) (*decoded, error) {
	f := b.d.files[key.file]
	ch := f.chunks[key.rg][key.col]
	p := &ch.pages[key.page]
	dict := make([]byte, ch.dictLen)
	pages := make([]byte, p.length)
	if err := f.r.ReadAt(ctx, dict, ch.dictOff); err != nil {
		return nil, err
	}
	if err := f.r.ReadAt(ctx, pages, p.off); err != nil {
		return nil, err
	}
	dec, _, err := b.decode(key, dict, pages)
	return dec, err
}

func (b *pqRows) Assemble(ctx context.Context, cell func(slot, k int) []byte, out []byte) (int, error) {
	d := b.d
	b.done = true
	// Decode each page this batch claimed, once, and publish it.
	published := map[pageKey]bool{}
	for slot, keys := range b.keys {
		for i, key := range keys {
			if !b.pages.claimed(key) || published[key] {
				continue
			}
			published[key] = true
			dec, _, err := b.decode(key, cell(slot, 2*i), cell(slot, 2*i+1))
			b.pages.publish(key, dec, bodyOf(dec), err)
			if err != nil {
				b.pages.abandon()
				b.pages.unpin()
				return 0, err
			}
		}
	}
	// Wait for the pages other batches decode (or decode them here).
	defer b.pages.unpin()
	have, err := b.pages.await(ctx, func(key pageKey) (*decoded, error) { return b.readAndDecode(ctx, key) })
	if err != nil {
		return 0, err
	}
	refs := make([]columnar.RowRef, b.n)
	bases := make([]int, len(d.cols)+1)
	for i, c := range d.cols {
		bases[i+1] = bases[i] + d.all[c].lay.NumCells
	}
	for slot := range refs {
		refs[slot].Cols = make([]columnar.ColRef, len(d.cols))
		for i, key := range b.keys[slot] {
			refs[slot].Cols[i] = columnar.ColRef{S: have[key].src, Row: b.rows[slot][i]}
		}
	}
	var ranges [][]columnar.Range // [column] for the current slot
	cur := -1
	valueCell := func(slot, k int) []byte {
		if slot != cur {
			cur = slot
			ranges = make([][]columnar.Range, len(d.cols))
			for i, c := range d.cols {
				ranges[i] = d.all[c].lay.Cells(have[b.keys[slot][i]].src, int(b.rows[slot][i]), nil)
			}
		}
		i := sort.SearchInts(bases[1:], k+1)
		r := ranges[i][k-bases[i]]
		return have[b.keys[slot][i]].body[r.Off : r.Off+r.Len]
	}
	n, err := b.plan.Assemble(refs, valueCell, out)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", describe(d.inf.Paths), err)
	}
	return n, nil
}

// bodyOf is a decoded page group's bytes, or none.
func bodyOf(dec *decoded) []byte {
	if dec == nil {
		return nil
	}
	return dec.body
}

// Release gives up the batch's claims if it is not to be assembled.
func (b *pqRows) Release() {
	if !b.done {
		b.done = true
		b.pages.abandon()
		b.pages.unpin()
	}
}

func (b *pqRows) Table() (nodes [][2]int64, buffers [][2]int64, body int) {
	ns, bs := b.plan.Table()
	for _, n := range ns {
		nodes = append(nodes, [2]int64{n.Length, n.NullCount})
	}
	for _, x := range bs {
		buffers = append(buffers, [2]int64{x.Offset, x.Length})
	}
	return nodes, buffers, b.plan.Body
}
