package storage

import (
	"context"
	"errors"
	"os"
	"time"
)

// Store is where named objects live: the local file system (Local), later
// object stores. Everything above storage names objects through a Store,
// never with os.Stat or filepath.Glob, so a dataset can move to an object
// store without its formats, index or daemon changing.
type Store interface {
	// Open opens a regular object for reading.
	Open(ctx context.Context, name string) (Reader, error)
	// Stat describes an object (or, locally, a directory).
	Stat(ctx context.Context, name string) (ObjectInfo, error)
	// Glob returns the objects a pattern names, sorted.
	Glob(ctx context.Context, pattern string) ([]string, error)
	// Walk calls fn for every regular object under root, in lexical order,
	// skipping names that start with a dot; fn may return SkipDir for a
	// directory it is called with.
	Walk(ctx context.Context, root string, fn func(name string, info ObjectInfo) error) error
	// ReadFile reads a whole small object of at most max bytes (a sidecar
	// index), refusing anything larger or not a regular object.
	ReadFile(ctx context.Context, name string, max int64) ([]byte, error)
	// WriteFile writes a small object atomically: a reader sees the old
	// object or the new one, never a part.
	WriteFile(ctx context.Context, name string, b []byte) error
	// Hints are how the store's objects like to be read.
	Hints() Hints
}

// ObjectInfo describes an object.
type ObjectInfo struct {
	Name    string
	Size    int64
	ModTime time.Time
	// Version changes whenever the object's bytes may have: device, inode,
	// mtime, size and ctime of a local file (utime cannot set the ctime
	// back), the ETag of a remote object.
	Version string
	Dir     bool
}

// Errors a caller can test for with errors.Is.
var (
	// ErrOutsideRoots says a name resolves outside the directories a
	// confined store may read.
	ErrOutsideRoots = errors.New("outside the allowed roots")
	// ErrNotRegular says an object is not a regular file (a FIFO, a
	// device, a socket), which riffle never opens.
	ErrNotRegular = errors.New("not a regular file")
	// ErrTooLarge says a small object is larger than its reader allows.
	ErrTooLarge = errors.New("larger than allowed")
)

// SkipDir, returned by a Walk callback for a directory, skips it.
var SkipDir = errors.New("skip this directory")

// notExist reports whether err says an object is not there.
func notExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
