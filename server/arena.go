package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/job"
)

// Arena is a job's shared memory: a memfd mapped by the daemon, whose
// descriptor is passed to the client so that the client maps the same
// pages. The loader reads records straight into it and the client reads
// them from it: a batch crosses the process boundary without a copy.
//
// Space is handed out first-fit from a sorted free list and coalesced on
// free. A region stays allocated until the client releases its batch, so a
// batch the user still holds is never overwritten. Alloc waits for space
// rather than failing while the job's memory bound (the loader's
// MemoryBytes, at most half the arena) leaves fragmentation as the only
// reason to wait.
type Arena struct {
	fd      int
	mem     []byte
	mu      sync.Mutex
	cond    *sync.Cond
	waiting int    // Allocs waiting for space, for tests
	free    []span // sorted by off, never adjacent
	used    map[int64]int64
	done    bool
	// limit bounds where regions end: the bytes the daemon's budget gives
	// the job now (setLimit), at most the arena's size. fit, if set, is
	// called once no region ends above fitAt.
	limit int64
	fit   func()
	fitAt int64
}

type span struct{ off, n int64 }

// ErrArenaClosed is returned by Alloc after Close.
var ErrArenaClosed = errors.New("arena closed")

// NewArena makes a shared arena of size bytes.
func NewArena(name string, size int64) (*Arena, error) {
	if size <= 0 || size > job.MaxMemory()*3 {
		return nil, fmt.Errorf("shared memory of %d bytes: want 1 to %d", size, job.MaxMemory()*3)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sizing shared memory to %d bytes: %w", size, err)
	}
	// The client gets this descriptor. Had it shrunk the file, the
	// daemon's next write into the pages gone would be a SIGBUS, which
	// ends every job; so its size is sealed (and the seals too, so that
	// no one seals writes away), and the kernel refuses the change.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sealing shared memory's size: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mapping shared memory: %w", err)
	}
	a := &Arena{fd: fd, mem: mem, free: []span{{0, size}}, used: map[int64]int64{}, limit: size}
	a.cond = sync.NewCond(&a.mu)
	return a, nil
}

// Fd is the memfd to pass to the client.
func (a *Arena) Fd() int { return a.fd }

// Size is the arena's size.
func (a *Arena) Size() int64 { return int64(len(a.mem)) }

// Alloc returns n bytes aligned to align (at most the page size), waiting
// for space until ctx is done if need be.
func (a *Arena) Alloc(ctx context.Context, n, align int) ([]byte, error) {
	if align < 64 {
		align = 64 // cache lines; also keeps numpy views aligned for any dtype
	}
	size := int64(n+align-1) / int64(align) * int64(align)
	if size == 0 {
		size = int64(align)
	}
	if size > int64(len(a.mem)) {
		return nil, fmt.Errorf("a batch of %d bytes does not fit the %d-byte shared arena: raise the job's memory", n, len(a.mem))
	}
	stop := context.AfterFunc(ctx, func() {
		a.mu.Lock()
		a.cond.Broadcast()
		a.mu.Unlock()
	})
	defer stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	for {
		if a.done {
			return nil, ErrArenaClosed
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for i, s := range a.free {
			// Free spans start at multiples of 64; align inside the span.
			start := (s.off + int64(align) - 1) / int64(align) * int64(align)
			if start+size > a.limit {
				break // spans are sorted: none after fits under the limit
			}
			if start+size > s.off+s.n {
				continue
			}
			a.take(i, start, size)
			return a.mem[start : start+int64(n) : start+size], nil
		}
		a.waiting++
		a.cond.Wait()
		a.waiting--
	}
}

// take carves [start, start+size) out of free span i.
func (a *Arena) take(i int, start, size int64) {
	s := a.free[i]
	var repl []span
	if start > s.off {
		repl = append(repl, span{s.off, start - s.off})
	}
	if end := start + size; end < s.off+s.n {
		repl = append(repl, span{end, s.off + s.n - end})
	}
	a.free = append(a.free[:i], append(repl, a.free[i+1:]...)...)
	a.used[start] = size
}

// Offset is b's offset in the arena.
func (a *Arena) Offset(b []byte) int64 {
	return int64(uintptr(unsafe.Pointer(unsafe.SliceData(b))) - uintptr(unsafe.Pointer(unsafe.SliceData(a.mem))))
}

// Free returns b, which Alloc returned, to the arena.
func (a *Arena) Free(b []byte) {
	off := a.Offset(b)
	a.mu.Lock()
	n, ok := a.used[off]
	if !ok {
		a.mu.Unlock()
		return // freed twice, or after Close
	}
	delete(a.used, off)
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	a.free = append(a.free, span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = span{off, n}
	// Merge with the next and the previous span.
	if i+1 < len(a.free) && a.free[i].off+a.free[i].n == a.free[i+1].off {
		a.free[i].n += a.free[i+1].n
		a.free = append(a.free[:i+1], a.free[i+2:]...)
	}
	if i > 0 && a.free[i-1].off+a.free[i-1].n == a.free[i].off {
		a.free[i-1].n += a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	}
	a.cond.Broadcast()
	var fit func()
	if a.fit != nil && off+n > a.fitAt && a.end() <= a.fitAt {
		fit, a.fit = a.fit, nil
		a.trim()
	}
	a.mu.Unlock()
	if fit != nil {
		fit()
	}
}

// setLimit bounds where regions end from now on to n bytes (the
// daemon's budget bent the job's memory, budget.go), and reports whether
// none ends above it now, the pages above then given back to the
// system; if some do, fit is called once the last of them is freed (from
// Free, without the arena's lock), the pages given back first. A later
// setLimit replaces fit.
func (a *Arena) setLimit(n int64, fit func()) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	lower := n < a.limit
	a.limit = min(n, int64(len(a.mem)))
	a.fit = nil
	a.cond.Broadcast() // a raised limit makes room for those waiting
	if a.end() > a.limit {
		a.fit, a.fitAt = fit, a.limit
		return false
	}
	if lower {
		a.trim()
	}
	return true
}

// end is where the last region ends; the lock is held.
func (a *Arena) end() int64 {
	var e int64
	for off, n := range a.used {
		e = max(e, off+n)
	}
	return e
}

// trim gives the pages above the limit, where no region lies, back to the
// system (holes punched in the memfd, charged to nobody); the lock is held.
func (a *Arena) trim() {
	if a.done {
		return // the descriptor may be closed, its number another file's
	}
	page := int64(unix.Getpagesize())
	from := (a.limit + page - 1) / page * page
	if size := int64(len(a.mem)); from < size {
		if err := unix.Fallocate(a.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, from, size-from); err != nil {
			slog.Warn("giving back a job's shared memory", "err", err)
		}
	}
}

// InUse is the bytes allocated now.
func (a *Arena) InUse() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var t int64
	for _, n := range a.used {
		t += n
	}
	return t
}

// dropExcept gives the arena's pages outside keep (regions Alloc
// returned) back to the system: holes punched in the memfd, which reads
// as zeros after. A client maps the memfd, and its pages stay charged to
// the daemon's memory cgroup until the last mapping goes, so a closing
// job keeps only the pages of batches its client may still read.
func (a *Arena) dropExcept(keep [][]byte) error {
	spans := make([]span, 0, len(keep))
	for _, b := range keep {
		spans = append(spans, span{a.Offset(b), int64(cap(b))})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	page := int64(unix.Getpagesize())
	at := int64(0)
	punch := func(from, to int64) error {
		from = (from + page - 1) / page * page
		to = to / page * page
		if to <= from {
			return nil
		}
		return unix.Fallocate(a.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, from, to-from)
	}
	for _, s := range spans {
		if err := punch(at, s.off); err != nil {
			return fmt.Errorf("freeing shared memory: %w", err)
		}
		at = max(at, s.off+s.n)
	}
	if err := punch(at, int64(len(a.mem))); err != nil {
		return fmt.Errorf("freeing shared memory: %w", err)
	}
	return nil
}

// Close unmaps the arena and closes its memfd. Nothing may write into it
// after: the loader that filled it must be closed first. A client's mapping
// stays valid, so batches the user holds survive the job.
func (a *Arena) Close() error {
	a.stop()
	err := unix.Munmap(a.mem)
	if e := unix.Close(a.fd); err == nil {
		err = e
	}
	return err
}

// stop makes Alloc fail from now on, waking those that wait.
func (a *Arena) stop() {
	a.mu.Lock()
	a.done = true
	a.cond.Broadcast()
	a.mu.Unlock()
}
