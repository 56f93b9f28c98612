// Package storage is where riffle's bytes live: every tier (local files, an
// S3 store, and in front of it the nodes' memory and this node's disk,
// packages storage/peer and storage/tier) is a Reader that serves byte
// ranges of one named object. storage/stack builds them into one stack.
//
// The shape follows pebble's objstorage.Readable: ReadAt fills the whole
// buffer or fails (no partial reads), and is safe for concurrent calls, so
// the loader can keep many reads of one object in flight at once. Nothing
// above this package sees a file descriptor, which is what lets a dataset move
// to S3-style ranged GETs without its loader changing.
//
// An Engine keeps many reads in flight: io_uring for local files, a pool of
// goroutines for object stores. How many is chosen per device (a file's
// st_dev) and per store from the rate and latency measured as the job runs,
// by Little's law and a search in the manner of TCP Vegas and BBR
// (depth.go), instead of a constant tuned on one disk.
package storage

import (
	"context"
	"errors"
	"fmt"
)

// Reader reads byte ranges of one object.
//
// ReadAt reads exactly len(p) bytes at offset off. A range that reaches past
// the end of the object is an error wrapping io.ErrUnexpectedEOF. ReadAt is
// safe to call from many goroutines at once. Implementations return an
// *Error naming the object and offset.
type Reader interface {
	ReadAt(ctx context.Context, p []byte, off int64) error
	// Size is the object's size when it was opened.
	Size() int64
	// Name identifies the object in errors: a path or a URL.
	Name() string
	// Version identifies the object's bytes as they were opened
	// (ObjectInfo.Version), so that what was read and what is described
	// are the same object; "" when the store cannot say.
	Version() string
	// Hints say how the object likes to be read; a field left 0 is
	// DefaultHints' (HintsOf fills them in).
	Hints() Hints
	Close() error
}

// Error records a failed read and where it happened, like os.PathError.
type Error struct {
	Op     string // "read", "open", "stat"
	Object string // path or URL
	Offset int64
	Len    int
	Err    error
}

func (e *Error) Error() string {
	if e.Op == "read" {
		return fmt.Sprintf("%s %s at offset %d (%d bytes): %v", e.Op, e.Object, e.Offset, e.Len, e.Err)
	}
	return fmt.Sprintf("%s %s: %v", e.Op, e.Object, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrShrunk says an object became shorter than when it was opened: a read
// reached bytes that were there before.
var ErrShrunk = errors.New("object is shorter than when it was opened")
