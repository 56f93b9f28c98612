//go:build linux

package storage

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ring is a minimal io_uring for reads: many reads are queued and submitted
// with one system call, and their completions reaped together. It is what
// fio's io_uring and libaio engines do, and what Go cannot do with blocking
// pread calls: each of those holds a scheduler slot (a P) until the runtime's
// monitor notices, so on a 2-core machine only a few reads are really in
// flight. A Ring is used by one goroutine at a time.
//
// Buffers handed to Prep must stay alive and unmoved until their completion
// is reaped; Go's collector does not move heap objects, and the loader keeps
// each batch's buffer referenced until all of its reads complete.
type Ring struct {
	fd      int
	sqRing  []byte
	cqRing  []byte
	sqes    []byte
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqArray []uint32
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []byte
	entries uint32
	pending uint32 // prepared, not yet submitted
	// wake is an eventfd the kernel signals for every completion, read
	// through Go's poller (nil where it could not be registered: Wait
	// then blocks in io_uring_enter).
	wake *os.File
}

type ringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  [8]uint32
	sqUserAddr                                                             uint64
	cqOff                                                                  [8]uint32
	cqUserAddr                                                             uint64
}

const (
	opRead         = 22 // IORING_OP_READ
	registerEvfd   = 4  // IORING_REGISTER_EVENTFD
	enterGetEvents = 1  // IORING_ENTER_GETEVENTS
	featSingleMmap = 1  // IORING_FEAT_SINGLE_MMAP
	offSQRing      = 0
	offCQRing      = 0x8000000
	offSQEs        = 0x10000000
	sqeSize        = 64
	cqeSize        = 16
)

// NewRing sets up a ring with room for entries reads in flight. It fails
// where io_uring is missing or forbidden (old kernels, seccomp sandboxes);
// callers then read with blocking calls.
func NewRing(entries int) (*Ring, error) {
	var p ringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), entries: p.sqEntries}
	sqSize := int(p.sqOff[6] + p.sqEntries*4)
	cqSize := int(p.cqOff[5] + p.cqEntries*cqeSize)
	if p.features&featSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqRing, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	if p.features&featSingleMmap != 0 {
		r.cqRing = r.sqRing
	} else if r.cqRing, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	if r.sqes, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		r.Close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead, r.sqTail = u32(r.sqRing, p.sqOff[0]), u32(r.sqRing, p.sqOff[1])
	r.sqMask = *u32(r.sqRing, p.sqOff[2])
	r.sqArray = unsafe.Slice(u32(r.sqRing, p.sqOff[6]), p.sqEntries)
	r.cqHead, r.cqTail = u32(r.cqRing, p.cqOff[0]), u32(r.cqRing, p.cqOff[1])
	r.cqMask = *u32(r.cqRing, p.cqOff[2])
	r.cqes = r.cqRing[p.cqOff[5] : p.cqOff[5]+p.cqEntries*cqeSize]
	r.wake = ringEventfd(r.fd)
	return r, nil
}

// ringEventfd registers an eventfd with the ring fd, non-blocking so that
// os.NewFile reads it through Go's poller, or returns nil.
func ringEventfd(ring int) *os.File {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil
	}
	fd := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(ring), registerEvfd, uintptr(unsafe.Pointer(&fd)), 1, 0, 0); errno != 0 {
		unix.Close(efd)
		return nil
	}
	return os.NewFile(uintptr(efd), "io_uring completions")
}

// Cap is how many reads may be prepared before a Submit.
func (r *Ring) Cap() int { return int(r.entries) }

// Prep queues a read of len(p) bytes at off of fd, tagged for its
// completion. It reports false when the submission queue is full.
func (r *Ring) Prep(fd int, p []byte, off int64, tag uint64) bool {
	tail := *r.sqTail // only this goroutine writes the tail
	if tail-atomic.LoadUint32(r.sqHead) >= r.entries {
		return false
	}
	i := tail & r.sqMask
	sqe := r.sqes[i*sqeSize : (i+1)*sqeSize]
	clear(sqe)
	sqe[0] = opRead
	*(*int32)(unsafe.Pointer(&sqe[4])) = int32(fd)
	*(*uint64)(unsafe.Pointer(&sqe[8])) = uint64(off)
	*(*uint64)(unsafe.Pointer(&sqe[16])) = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p))))
	*(*uint32)(unsafe.Pointer(&sqe[24])) = uint32(len(p))
	*(*uint64)(unsafe.Pointer(&sqe[32])) = tag
	r.sqArray[i] = i
	atomic.StoreUint32(r.sqTail, tail+1)
	r.pending++
	return true
}

// Submit hands the prepared reads to the kernel and, if wait > 0, blocks
// until at least wait completions are ready.
func (r *Ring) Submit(wait int) error {
	flags := uintptr(0)
	if wait > 0 {
		flags = enterGetEvents
	}
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(r.pending), uintptr(wait), flags, 0, 0)
		if errno == unix.EINTR {
			// Submitted ones are consumed even when the wait is interrupted.
			r.pending -= min(r.pending, uint32(n))
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		r.pending -= min(r.pending, uint32(n))
		return nil
	}
}

// Wait submits the prepared reads and waits until a completion is ready.
//
// It waits parked in Go's poller on the ring's eventfd, not blocked in
// io_uring_enter: a goroutine blocked in a system call holds its P until
// the runtime's monitor takes it away, and then waits for a P again when
// the call returns, so each round of a busy loader's ring paid a hand-off
// both ways (10% of a job's samples were the monitor's polling; the
// ring's reads took ~12% longer than fio's at the same depth on the
// disk). The kernel posts a read's completion from task work of the
// thread that submitted it, which it interrupts or wakes for that (the
// ring is set up without COOP_TASKRUN or DEFER_TASKRUN), so the thread
// need not be the one waiting. Where no eventfd could be registered it
// blocks in the call.
func (r *Ring) Wait() error {
	if r.wake == nil {
		return r.Submit(1)
	}
	if r.pending > 0 {
		if err := r.Submit(0); err != nil {
			return err
		}
	}
	var b [8]byte
	for !r.ready() {
		// The eventfd counts completions posted since its last read: one
		// posted before this read makes it return at once, so none is
		// missed; a count left from completions reaped already only
		// costs a second look.
		if _, err := r.wake.Read(b[:]); err != nil {
			return fmt.Errorf("io_uring completions: %w", err)
		}
	}
	return nil
}

// ready says a completion waits to be reaped.
func (r *Ring) ready() bool { return atomic.LoadUint32(r.cqTail) != *r.cqHead }

// Reap calls fn for every ready completion: the tag given to Prep and the
// read's result, bytes read or a negative errno. It returns how many.
func (r *Ring) Reap(fn func(tag uint64, res int32)) int {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		c := r.cqes[(head&r.cqMask)*cqeSize:]
		fn(*(*uint64)(unsafe.Pointer(&c[0])), *(*int32)(unsafe.Pointer(&c[8])))
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// Close releases the ring. Reads still in flight must be reaped first.
func (r *Ring) Close() error {
	if r.wake != nil {
		r.wake.Close()
	}
	if r.sqes != nil {
		unix.Munmap(r.sqes)
	}
	if r.cqRing != nil && &r.cqRing[0] != &r.sqRing[0] {
		unix.Munmap(r.cqRing)
	}
	if r.sqRing != nil {
		unix.Munmap(r.sqRing)
	}
	return unix.Close(r.fd)
}
