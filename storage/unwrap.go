package storage

import "time"

// What a Reader may do beyond the interface (drop its cached pages, give
// its descriptor, be read through io_uring, intercept its reads) is found
// through one rule, as net/http's ResponseController finds a Flusher
// through the writers wrapping one: a Reader that wraps another, and whose
// reads may be served by that one in its place, says so with Unwrap, and
// As walks the chain to the first reader that has the behaviour.
//
// A wrapper unwraps only where its inner reader may be read in its place:
// an engine reads a local file through io_uring, not through the
// wrappers' ReadAt. Faulty does (its reads may fail, come back short or
// wait, and the engine applies those faults itself: Interceptor). A
// wrapper that must see every read does not: a cache in front of its
// inner reader (the disk tier, the nodes' memory), whose bytes come from
// elsewhere, or a test's counter. It states what it keeps (Version,
// Hints) as a Reader, and the rest is not found through it: dropping the
// inner file's pages, or reading that file through io_uring, would go
// around it.

// Wrapper is a Reader whose reads may be served by the Reader it wraps
// in its place.
type Wrapper interface {
	Reader
	Unwrap() Reader
}

// As finds in r, or the readers r wraps (Wrapper), the first that is a T,
// as errors.As finds an error in a chain.
func As[T any](r Reader) (T, bool) {
	for r != nil {
		if t, ok := r.(T); ok {
			return t, true
		}
		w, ok := r.(Wrapper)
		if !ok {
			break
		}
		r = w.Unwrap()
	}
	var zero T
	return zero, false
}

// Dropper is a Reader whose cached pages can be dropped (File.Drop): a
// local file read through the page cache.
type Dropper interface {
	Drop(off, n int64) error
}

// Descriptor is a Reader of a local file held open as long as the reader
// is: its descriptor, for an fstat of the bytes being read (the ctime in
// an index's key, the owner of a file read beside a dataset).
type Descriptor interface {
	Fd() int
}

// Interceptor is a Reader that decides the fate of each of its reads
// before the read is served, as Faulty does. An Engine asks it (found
// through Unwrap), then serves the read from the reader it wraps on the
// path any read of that reader takes (io_uring for a local file), so that
// an injected fault is met where a real one would be.
type Interceptor interface {
	Wrapper
	// Hold is how long each read waits before it is served (a slow
	// device), or fails as soon as its context is done; 0 for none.
	Hold() time.Duration
	// Intercept is called once for each read of n bytes at off, after its
	// hold. A non-nil error fails the read. A first in (0, n) is how many
	// bytes the read's first attempt returns: the rest must be read by a
	// continuation, as after a short read from the kernel.
	Intercept(off int64, n int) (first int, err error)
	// Served is called once for each read Intercept let through, with the
	// read's outcome.
	Served(err error)
}
