package storage

import (
	"context"
	"sync/atomic"
	"time"
)

// Faulty wraps a Reader and injects faults, as pebble's errorfs does for its
// file system: a test decides per read whether it fails, comes back short or
// is slow, without a mock standing in for the real file underneath. It is
// an Interceptor: an Engine injects the same faults on the path the wrapped
// reader's reads take (io_uring for a local file), so fault tests exercise
// the path users run. Its version and hints are the wrapped reader's, and
// the wrapped reader's Drop and descriptor are found through it (As).
type Faulty struct {
	Reader
	// Inject is called before each read; a non-nil error fails the read.
	Inject func(off int64, n int) error
	// Short, when set, says how many bytes the first attempt of a read
	// returns (0 or n for all of them): the rest must be read by a
	// continuation, as after a short read from the kernel.
	Short func(off int64, n int) int
	// Delay, when set, makes each read wait this long first (or until its
	// context is done).
	Delay time.Duration
	// Reads counts the reads that reached the wrapped Reader and succeeded.
	Reads atomic.Int64
}

var _ Interceptor = (*Faulty)(nil)

// Unwrap is the wrapped Reader.
func (f *Faulty) Unwrap() Reader { return f.Reader }

// Hold is Delay.
func (f *Faulty) Hold() time.Duration { return f.Delay }

// Intercept applies Inject and Short to a read of n bytes at off: the
// error to fail it with, or the length of its short first attempt (0 for
// none).
func (f *Faulty) Intercept(off int64, n int) (int, error) {
	if f.Inject != nil {
		if err := f.Inject(off, n); err != nil {
			return 0, &Error{Op: "read", Object: f.Name(), Offset: off, Len: n, Err: err}
		}
	}
	if f.Short != nil {
		if k := f.Short(off, n); k > 0 && k < n {
			return k, nil
		}
	}
	return 0, nil
}

// Served counts a read that succeeded.
func (f *Faulty) Served(err error) {
	if err == nil {
		f.Reads.Add(1)
	}
}

// ReadAt injects the configured faults, then reads from the wrapped Reader.
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
	first, err := f.Intercept(off, len(p))
	if err != nil {
		return err
	}
	if first > 0 {
		err = f.Reader.ReadAt(ctx, p[:first], off)
		p, off = p[first:], off+int64(first)
	}
	if err == nil {
		err = f.Reader.ReadAt(ctx, p, off)
	}
	f.Served(err)
	return err
}
