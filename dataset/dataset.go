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
// Records are read through storage.Reader, never a file descriptor, so a
// dataset's bytes may live in local files now and in object stores later.
package dataset

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

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
}

// Info describes a dataset.
type Info struct {
	Format     string   // "fixed", "npy", "libsvm", "jsonl", "csv", "text", "tfrecord", "dir"
	Paths      []string // the files (or, for "dir", the root)
	RecordSize int      // bytes per record; 0 when records vary in length
	Dtype      string   // numpy dtype string of a .npy array ("<f4")
	Shape      []int    // shape of one record of a .npy array (the array's shape without axis 0)
	Classes    []string // "dir": class names, in label order
	Header     string   // "csv": the header line, when Options.CSVHeader
	Bytes      int64    // total bytes of all records
}

// Indexed reports whether the format keeps a sidecar index (an offset table).
func (i Info) Indexed() bool {
	switch i.Format {
	case "libsvm", "jsonl", "csv", "text", "tfrecord":
		return true
	}
	return false
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
	// Format is one of "fixed", "npy", "libsvm", "jsonl", "csv", "text",
	// "tfrecord", "dir"; empty means detect from the extension.
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
	// whose size is not a multiple of the record size, a last line without
	// its newline) instead of failing.
	DropPartialTail bool
	// IndexDir holds sidecar indexes when the data's own directory is not
	// writable; default $XDG_CACHE_HOME/riffle (or ~/.cache/riffle).
	IndexDir string
	// Index says what to do with an existing sidecar index.
	Index IndexMode
	// Direct reads records with O_DIRECT.
	Direct bool
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

// Formats lists the format names Open accepts.
var Formats = []string{"fixed", "npy", "libsvm", "jsonl", "csv", "text", "tfrecord", "dir"}

// DetectFormat guesses a file's format from its name.
func DetectFormat(path string) string {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return "dir"
	}
	name := strings.ToLower(path)
	for _, s := range []string{".gz", ".zst", ".bz2", ".xz"} {
		if strings.HasSuffix(name, s) {
			return "" // compressed files have no random access
		}
	}
	switch ext := filepath.Ext(name); ext {
	case ".npy":
		return "npy"
	case ".tfrecord", ".tfrecords", ".tfr":
		return "tfrecord"
	case ".jsonl", ".ndjson":
		return "jsonl"
	case ".csv":
		return "csv"
	case ".libsvm", ".svm", ".svmlight":
		return "libsvm"
	case ".txt":
		return "text"
	case ".bin", ".raw", ".dat":
		return "fixed"
	}
	if strings.Contains(name, ".tfrecord") {
		return "tfrecord" // sharded names like train.tfrecord-00001-of-00064
	}
	return ""
}

// ExpandPaths expands globs and returns the files in a stable order.
func ExpandPaths(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		if strings.ContainsAny(p, "*?[") {
			m, err := filepath.Glob(p)
			if err != nil {
				return nil, fmt.Errorf("glob %q: %w", p, err)
			}
			if len(m) == 0 {
				return nil, fmt.Errorf("glob %q matches no file: %w", p, os.ErrNotExist)
			}
			sort.Strings(m)
			out = append(out, m...)
			continue
		}
		out = append(out, p)
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
	files, err := ExpandPaths(paths)
	if err != nil {
		return nil, err
	}
	format := opts.Format
	if format == "" {
		format = DetectFormat(files[0])
		if format == "" {
			return nil, fmt.Errorf("%s: %w (give a format: %s)", files[0], ErrUnknownFormat, strings.Join(Formats, ", "))
		}
	}
	if format == "dir" {
		if len(files) != 1 {
			return nil, fmt.Errorf("a dir dataset has one root, got %d paths", len(files))
		}
		return openTree(ctx, files[0], opts)
	}
	var scan func(context.Context, *storage.File, Options) (part, error)
	switch format {
	case "fixed":
		if opts.RecordSize <= 0 {
			return nil, fmt.Errorf("%s: a fixed-size dataset needs a record size", files[0])
		}
		scan = openFixed
	case "npy":
		scan = openNpy
	case "libsvm", "jsonl", "text":
		scan = func(ctx context.Context, f *storage.File, o Options) (part, error) {
			return openLines(ctx, f, o, format, false)
		}
	case "csv":
		scan = func(ctx context.Context, f *storage.File, o Options) (part, error) {
			return openLines(ctx, f, o, format, true)
		}
	case "tfrecord":
		scan = openTFRecord
	default:
		return nil, fmt.Errorf("format %q: %w (known: %s)", format, ErrUnknownFormat, strings.Join(Formats, ", "))
	}
	return openFiles(ctx, files, format, opts, scan)
}
