package dataset

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/schema"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/storage"
)

// Parquet files. A row lives in one page of each of its columns, and a
// page is compressed and encoded whole: a row costs the read and the
// decoding of its pages (and of its column chunk's dictionary page). So a
// row's cells are those pages, the loader reads each page a batch needs
// once, and the dataset decodes each once per batch, keeping it unpacked
// (decoded, laid out as a record batch's body) in a small cache (the one
// claim/fill/wait cache.Cache: of the batches that miss a page one unpacks
// it, the others wait) so that a page used by the next batches is not
// decoded again. A record-level global
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
	pages  *cache.Cache // unpacked page groups: one claim/fill/wait cache, as the record cache
	blocks []int
}

func openParquet(ctx context.Context, names []string, opts Options) (Dataset, error) {
	d := &parquetSet{starts: []int{0}, pages: newUnpackedCache()}
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
		func(p []byte) error { return f.readIndex(p, cols) },
		func() ([]byte, error) {
			if err := f.scan(ctx, cols, opts); err != nil {
				return nil, err
			}
			return f.writeIndex(), nil
		})
	if err != nil {
		return nil, nil, err
	}
	return f, cols, nil
}

func (f *pqFile) bad(off int64, format string, args ...any) error {
	return &FormatError{Path: f.r.Name(), Offset: off, Err: fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)}
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
// unpacked while their rows are taken).
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
