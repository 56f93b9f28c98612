package storage

import (
	"context"
	"sync/atomic"
	"time"
)

// Faulty wraps a Reader and injects faults, as pebble's errorfs does for its
// file system: a test decides per read whether it fails, comes back short or
// is slow, without a mock standing in for the real file underneath.
type Faulty struct {
	Reader
	// Inject is called before each read; a non-nil error fails the read.
	Inject func(off int64, n int) error
	// Delay, when set, sleeps before each read (or until ctx is done).
	Delay time.Duration
	// Reads counts the reads that reached the wrapped Reader.
	Reads atomic.Int64
}

// ReadAt injects the configured fault, then reads from the wrapped Reader.
func (f *Faulty) ReadAt(ctx context.Context, p []byte, off int64) error {
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if f.Inject != nil {
		if err := f.Inject(off, len(p)); err != nil {
			return &Error{Op: "read", Object: f.Name(), Offset: off, Len: len(p), Err: err}
		}
	}
	f.Reads.Add(1)
	return f.Reader.ReadAt(ctx, p, off)
}
