//go:build linux

package storage

import (
	"golang.org/x/sys/unix"
)

// Async keeps many reads of local files in flight through one Ring and
// completes each in full: short reads continue where they stopped, EAGAIN
// and EINTR retry, and a read that finds the file shorter than when it was
// opened fails with ErrShrunk, as File.ReadAt does. It is used by one
// goroutine.
type Async struct {
	ring *Ring
	reqs []asyncReq
	free []int
}

type asyncReq struct {
	f    *File
	p    []byte
	off  int64
	done int
	want int
	tag  uint64
}

// NewAsync returns a queue with room for depth reads in flight.
func NewAsync(depth int) (*Async, error) {
	r, err := NewRing(depth)
	if err != nil {
		return nil, err
	}
	depth = min(depth, r.Cap())
	a := &Async{ring: r, reqs: make([]asyncReq, depth), free: make([]int, depth)}
	for i := range a.free {
		a.free[i] = depth - 1 - i
	}
	return a, nil
}

// Cap is how many reads may be in flight.
func (a *Async) Cap() int { return len(a.reqs) }

// InFlight is how many reads are in flight.
func (a *Async) InFlight() int { return len(a.reqs) - len(a.free) }

// Add queues a read of len(p) bytes of f at off. It reports false when
// Cap reads are already in flight. p must stay alive until its completion.
func (a *Async) Add(f *File, p []byte, off int64, tag uint64) bool {
	return a.AddFirst(f, p, off, tag, 0)
}

// AddFirst is Add whose first attempt asks for only first bytes (0 for
// all), so that the continuation of a short read is exercised on purpose.
func (a *Async) AddFirst(f *File, p []byte, off int64, tag uint64, first int) bool {
	if len(a.free) == 0 {
		return false
	}
	i := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	want := len(p)
	if f.pad && off+int64(len(p)) > f.size && off < f.size {
		want = int(f.size - off) // O_DIRECT reads end at EOF, not at the aligned end
	}
	a.reqs[i] = asyncReq{f: f, p: p, off: off, want: want, tag: tag}
	if first <= 0 || first > len(p) {
		first = len(p) // an O_DIRECT read asks for whole blocks, even past the end
	}
	a.ring.Prep(f.fd, p[:first], off, uint64(i))
	return true
}

// Wait submits what was added, waits for at least one read to finish and
// calls done for every read that finished, with nil or an *Error.
func (a *Async) Wait(done func(tag uint64, err error)) error {
	if err := a.ring.Wait(); err != nil {
		return err
	}
	a.ring.Reap(func(i uint64, res int32) {
		r := &a.reqs[i]
		var err error
		switch {
		case res == -int32(unix.EAGAIN) || res == -int32(unix.EINTR):
		case res < 0:
			err = unix.Errno(-res)
		case res == 0 && r.done < r.want:
			err = r.f.endError(r.off, r.want, r.done)
		case res == 0:
			// A zero-length read is complete, not the end of the file.
		default:
			r.done += int(res)
		}
		if err == nil && r.done < r.want {
			a.ring.Prep(r.f.fd, r.p[r.done:], r.off+int64(r.done), i)
			return
		}
		if err != nil {
			err = &Error{Op: "read", Object: r.f.Name(), Offset: r.off, Len: len(r.p), Err: err}
		}
		tag := r.tag
		*r = asyncReq{}
		a.free = append(a.free, int(i))
		done(tag, err)
	})
	return nil
}

// Close releases the ring; every read must have finished.
func (a *Async) Close() error { return a.ring.Close() }
