package dataset

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"

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
// whole, once, decompresses it once, and keeps it in the dataset's unpacked
// cache (unpacked.go) for the next batches, gathering rows from it as from
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
	// claim/fill/wait cache, under the budget of Parquet's unpacked pages.
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
		func(p []byte) error { return f.readIndex(p, full) },
		func() ([]byte, error) {
			if err := f.scan(ctx, full, schemaAt, opts); err != nil {
				return nil, err
			}
			return f.writeIndex(), nil
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
// dataset's unpacked cache) while batches take its rows. Its default order
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
	d.unpacked = newUnpackedCache()
	return &packedArrow{arrowSet: d, blocks: append(blocks, d.Len())}
}
