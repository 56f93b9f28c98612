package dataset

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/riffle-ml/riffle/storage"
)

// Format is one entry of the format registry: how a format is named, how
// its files are recognised and how they are opened.
type Format struct {
	// Name is what Options.Format and the CLI's --format say.
	Name string
	// Extensions recognise a file of the format by its name (".npy").
	Extensions []string
	// Indexed says the format keeps a sidecar index (an offset table).
	Indexed bool
	// OpenPart opens one file of a files format: several files (or a glob)
	// make one dataset, the records of file k after those of file k-1.
	OpenPart func(ctx context.Context, f storage.Reader, opts Options) (Part, error)
	// OpenFiles opens a format that makes one dataset of several files
	// itself (Arrow, Parquet: rows of columns, Rows).
	OpenFiles func(ctx context.Context, names []string, opts Options) (Dataset, error)
	// OpenDir opens a directory format from its root.
	OpenDir func(ctx context.Context, root string, opts Options) (Dataset, error)
	// DetectDir, for a directory format, says whether a directory is one
	// (a marker file); the plain "dir" format takes any directory.
	DetectDir func(ctx context.Context, store storage.Store, root string) bool
}

// Part is one file's records, for a files format.
type Part interface {
	// Count is the number of records.
	Count() int
	// Locate returns record i's offset and length in the file.
	Locate(i int) (off int64, n int)
	// Bytes is the bytes of all records.
	Bytes() int64
	// Info describes the file's records (RecordSize, Dtype, Shape, Header).
	Info() Info
}

// framedPart is a Part whose records are read with a frame around them.
type framedPart interface {
	Part
	Frame() (head, tail int)
	Verify(frame []byte, path string, off int64) error
}

var (
	formatsMu sync.RWMutex
	formats   = map[string]*Format{}
	order     []string // registration order, for detection and listings
)

// RegisterFormat adds a format to the registry; a second format of the
// same name is a programming error.
func RegisterFormat(f Format) {
	formatsMu.Lock()
	defer formatsMu.Unlock()
	if _, dup := formats[f.Name]; dup {
		panic("dataset: format " + f.Name + " registered twice")
	}
	formats[f.Name] = &f
	order = append(order, f.Name)
}

func lookupFormat(name string) (*Format, bool) {
	formatsMu.RLock()
	defer formatsMu.RUnlock()
	f, ok := formats[name]
	return f, ok
}

// Formats lists the registered formats' names.
func Formats() []string {
	formatsMu.RLock()
	defer formatsMu.RUnlock()
	return slices.Clone(order)
}

// compressed extensions: such files have no random access.
var compressed = []string{".gz", ".zst", ".bz2", ".xz", ".lz4", ".tgz"}

// DetectFormat guesses a file's format from its name alone; "" if it
// cannot tell.
func DetectFormat(name string) string {
	lower := strings.ToLower(name)
	for _, s := range compressed {
		if strings.HasSuffix(lower, s) {
			return ""
		}
	}
	ext := path.Ext(lower)
	formatsMu.RLock()
	defer formatsMu.RUnlock()
	for _, n := range order {
		if slices.Contains(formats[n].Extensions, ext) {
			return n
		}
	}
	for _, n := range order {
		// Sharded names like train.tfrecord-00001-of-00064.
		for _, e := range formats[n].Extensions {
			if strings.Contains(lower, e+"-") {
				return n
			}
		}
	}
	return ""
}

// Detect tells the format of an object or directory: directories by their
// marker files, files by their names.
func Detect(ctx context.Context, store storage.Store, name string) (string, error) {
	if info, err := store.Stat(ctx, name); err == nil && info.Dir {
		formatsMu.RLock()
		names := slices.Clone(order)
		formatsMu.RUnlock()
		for _, n := range names {
			f, _ := lookupFormat(n)
			if f.DetectDir != nil && f.DetectDir(ctx, store, name) {
				return n, nil
			}
		}
		return "dir", nil
	}
	if n := DetectFormat(name); n != "" {
		return n, nil
	}
	lower := strings.ToLower(name)
	for _, s := range compressed {
		if strings.HasSuffix(lower, s) {
			return "", fmt.Errorf("%s: %w: a compressed file has no random access to its records; decompress it (or convert it with riffle pack)", name, ErrUnsupported)
		}
	}
	return "", fmt.Errorf("%s: %w (give a format: %s)", name, ErrUnknownFormat, strings.Join(Formats(), ", "))
}
