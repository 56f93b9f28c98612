// Package dataset says what the records are: a Dataset is N records, each a
// byte range (object, offset, length) with an optional label.
//
// This is LIRS's data-format-aware location generator (lirs.txt §4.1): for
// fixed-size records a record's offset is its id times the record size, so no
// table is kept; for variable-length formats (text lines, TFRecord) one
// sequential scan builds an offset table of 8 bytes per record, saved as a
// sidecar index next to the data and reused while the data is unchanged.
// With a record's location known, any record can be read with one random
// read, which is what lets riffle shuffle indices instead of data.
//
// Every format is one entry of a registry (format.go), as image.RegisterFormat
// keeps decoders: its name, extensions, whether it keeps an index, and its
// open function. Objects are named and read through a storage.Store, never
// a file descriptor or os.Stat, so a dataset's bytes may live in local
// files, confined to a daemon's roots, or in an object store.
package dataset

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/storage"
)

// Loc locates one record: Len bytes at Off in object Object.
type Loc struct {
	Object int
	Off    int64
	Len    int
}

// Dataset is an indexed collection of records. Its methods are safe for
// concurrent use; Locate and Label are cheap enough to call per record.
type Dataset interface {
	// Len is the number of records.
	Len() int
	// Locate returns where record id lives. id must be in [0, Len()).
	Locate(id int) Loc
	// Label returns record id's label, or -1 if the dataset has none.
	Label(id int) int
	// Object returns the reader of object i, as named by a Loc.
	Object(i int) storage.Reader
	// Info describes the dataset.
	Info() Info
	Close() error
}

// Framed is implemented by datasets whose records sit inside a frame that is
// read along with them so the frame can be checked (TFRecord's length and
// CRCs). The loader reads Head bytes before and Tail bytes after each record
// and calls Verify on the whole frame.
type Framed interface {
	Frame() (head, tail int)
	Verify(id int, frame []byte) error
	// Checks says whether records are verified at all.
	Checks() bool
}

// Counted is implemented by datasets that know how many objects (files)
// their records lie in without locating every record: Object(i) is valid
// for i below Objects().
type Counted interface {
	Objects() int
}

// Info describes a dataset.
type Info struct {
	Format     string   // a registered format's name: "fixed", "npy", "libsvm", ...
	Paths      []string // the files (or, for a directory format, the root)
	RecordSize int      // bytes per record; 0 when records vary in length
	Dtype      string   // numpy dtype string of a .npy array ("<f4")
	Shape      []int    // shape of one record of a .npy array (the array's shape without axis 0)
	Classes    []string // "dir": class names, in label order
	Header     string   // "csv": the header line, when Options.CSVHeader
	Bytes      int64    // total bytes of all records
	// Columns and Schema describe the batches of a Rows dataset: its
	// columns' layouts, and its Arrow schema as an IPC stream.
	Columns []columnar.Column
	Schema  []byte
	// Features is a Hugging Face dataset's features (dataset_info.json),
	// as JSON.
	Features string
	// Transform, for a pack of a transform's outputs (riffle pack
	// --transform), is the transform, canonical with its version.
	Transform string

	labels bool // a pack's records carry labels
	// Versions are the store's versions of the objects the dataset was
	// opened from (Paths, or a directory's root and classes): any change
	// to the data changes one of them.
	Versions []string
}

// Indexed reports whether the format keeps a sidecar index (an offset table).
func (i Info) Indexed() bool {
	f, ok := lookupFormat(i.Format)
	return ok && f.Indexed
}

// Ranger is implemented by datasets that can say which records a byte
// range of an object touches (RecordsIn): what a block cache needs to ask
// a job when the block is next wanted.
type Ranger interface {
	RecordsIn(obj int, off, n int64) (lo, hi int, ok bool)
}

// Originer is implemented by datasets of several files: a record's file
// (an index into Info.Paths and Info.Versions) and its index there.
type Originer interface {
	Origin(id int) (file int, index int)
}

// Locator adapts ds to the form samplers locate records by
// (sampler.BlockBounds): a record's object, offset and length.
func Locator(ds Dataset) func(id int) (obj int, off int64, length int) {
	return func(id int) (int, int64, int) {
		l := ds.Locate(id)
		return l.Object, l.Off, l.Len
	}
}

// Options says how to open a dataset. The zero value detects the format from
// the file name and checks everything it can.
type Options struct {
	// Format is a registered format's name (Formats); empty means detect
	// it from the name, or from a record size (fixed).
	Format string
	// RecordSize is the size of one record in a "fixed" file.
	RecordSize int
	// HeaderBytes are skipped at the start of each "fixed" file.
	HeaderBytes int64
	// CSVHeader says the first line of each CSV file names the columns.
	CSVHeader bool
	// SkipCRC turns off TFRecord CRC checks on read.
	SkipCRC bool
	// DropPartialTail drops a trailing partial record (a fixed-size file
	// whose size is not a multiple of the record size, a TFRecord cut
	// short) instead of failing.
	DropPartialTail bool
	// IndexDir holds sidecar indexes when the data's own directory is not
	// writable; default $XDG_CACHE_HOME/riffle (or ~/.cache/riffle).
	IndexDir string
	// IndexInDirOnly keeps sidecar indexes in IndexDir only, never beside
	// the data: for a daemon reading files of users who did not ask for
	// new files next to theirs.
	IndexInDirOnly bool
	// Index says what to do with an existing sidecar index.
	Index IndexMode
	// Direct reads records with O_DIRECT.
	Direct bool
	// Store is where the objects are; default the local file system.
	Store storage.Store
	// Columns, for a dataset of rows (Arrow, Parquet), are the columns
	// read; empty means all that riffle reads.
	Columns []string
	// Split names a split of a Hugging Face DatasetDict directory.
	Split string
	// Extensions, if set, are the only file name endings a directory
	// dataset takes as records (case-insensitive, with the dot), as
	// torchvision's ImageFolder takes only IMG_EXTENSIONS: a labels.csv in
	// a class folder is then not an image to decode.
	Extensions []string
	// Only, if set, are the only files of a directory dataset that are
	// records: one generation of a dataset that grows (the files found
	// since the generation before), labelled by the classes of the whole
	// tree.
	Only []string
	// Progress, if set, is told how many source bytes the index scan has read.
	Progress func(done, total int64)
}

// IndexMode says how a sidecar index is used.
type IndexMode int

const (
	// IndexAuto reuses a valid index and rebuilds a stale or damaged one.
	IndexAuto IndexMode = iota
	// IndexRebuild always rebuilds.
	IndexRebuild
	// IndexVerify fails on a stale or damaged index instead of rebuilding it.
	IndexVerify
)

// Errors a caller can test for with errors.Is.
var (
	ErrCorrupt       = errors.New("corrupt data")
	ErrPartial       = errors.New("partial record at end of file")
	ErrEmpty         = errors.New("dataset has no records")
	ErrStaleIndex    = errors.New("index was built for another version of the file")
	ErrCRC           = errors.New("CRC mismatch")
	ErrUnsupported   = errors.New("unsupported")
	ErrUnknownFormat = errors.New("cannot tell the format")
)

// FormatError reports bad data at a byte offset of a file, like os.PathError.
type FormatError struct {
	Path   string
	Offset int64
	Err    error
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s at offset %d: %v", e.Path, e.Offset, e.Err)
}

func (e *FormatError) Unwrap() error { return e.Err }

// store returns the options' store, the local file system by default.
func (o Options) store() storage.Store {
	if o.Store != nil {
		switch s := o.Store.(type) {
		case *storage.Local:
			if o.Direct {
				return s.WithDirect(true)
			}
		case *storage.Router:
			if o.Direct {
				return s.WithLocal(s.Local.WithDirect(true))
			}
		}
		return o.Store
	}
	l, _ := storage.NewLocal(o.Direct, nil)
	return storage.NewRouter(l, storage.S3Options{}, nil)
}

// ExpandPaths expands globs in store and returns the names in a stable
// order.
func ExpandPaths(ctx context.Context, store storage.Store, paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		m, err := store.Glob(ctx, p)
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("glob %q matches no file: %w", p, fs.ErrNotExist)
		}
		out = append(out, m...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no path given: %w", ErrEmpty)
	}
	return out, nil
}

// Open opens the dataset made of the given files (globs allowed) or of one
// directory tree. Building a missing index scans the files; cancelling ctx
// stops it.
func Open(ctx context.Context, opts Options, paths ...string) (Dataset, error) {
	opts.Store = opts.store()
	files, err := ExpandPaths(ctx, opts.Store, paths)
	if err != nil {
		return nil, err
	}
	return openExpanded(ctx, opts, files)
}

// OpenExpanded is Open of names ExpandPaths gave (files, or one directory
// tree): it globs none of them again. A caller that resolved its paths
// once (a job: the files it keys its source by) opens those, not what a
// second glob would match by now.
func OpenExpanded(ctx context.Context, opts Options, names ...string) (Dataset, error) {
	if len(names) == 0 {
		return nil, fmt.Errorf("no path given: %w", ErrEmpty)
	}
	opts.Store = opts.store()
	return openExpanded(ctx, opts, names)
}

func openExpanded(ctx context.Context, opts Options, files []string) (Dataset, error) {
	var err error
	name := opts.Format
	if name == "" && opts.RecordSize > 0 {
		name = "fixed" // a record size means fixed-size records
	}
	if name == "" {
		if name, err = Detect(ctx, opts.Store, files[0]); err != nil {
			return nil, err
		}
	}
	f, ok := lookupFormat(name)
	if !ok {
		return nil, fmt.Errorf("format %q: %w (known: %s)", name, ErrUnknownFormat, strings.Join(Formats(), ", "))
	}
	if f.OpenDir != nil {
		if len(files) != 1 {
			return nil, fmt.Errorf("a %s dataset has one root, got %d paths", f.Name, len(files))
		}
		return f.OpenDir(ctx, files[0], opts)
	}
	if f.OpenFiles != nil {
		return f.OpenFiles(ctx, files, opts)
	}
	return openFiles(ctx, files, f, opts)
}
