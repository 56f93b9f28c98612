package storage

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/mincore"
)

// Cached pages copied from a mapping of the file, not read.
//
// A read of a cached page costs a system call: on this project's VMs
// (Spectre mitigations on every entry) a 4 KiB pread or RWF_NOWAIT probe
// took 1.6-1.9 µs, where copying the same page from a mapping of the file
// took 0.5-0.75 µs, its first touch's minor fault included. Warm epochs
// of small records spend most of their CPU there. So a local file read
// through the page cache is mapped (once, read-only, MADV_RANDOM so a
// fault reads no neighbours) and a read whose pages the cache holds is a
// copy from the mapping.
//
// Which pages the cache holds comes from mincore over the whole file (2-3
// ns a page: 3 ms for 4 GiB), refreshed when a read finds its pages
// missing and the last refresh of any file is old enough that refreshing
// costs at most 1/refreshShare of one core (a dataset of many files past
// memory misses in all of them); never per read, which would cost the
// system call saved. A page evicted since the last refresh is read by
// the copy's page fault: the right bytes, at a blocking read's cost. A
// page cached since is read as before (probe, ring) until a refresh sees
// it.
//
// What a mapping must not change:
//   - A file truncated under its mapping faults (SIGBUS) past its new end:
//     the copy runs with debug.SetPanicOnFault (the engine's workers set
//     it) and a fault is no copy, so the read goes the old way and fails
//     naming the file and offset. Within the new end's last page the
//     mapping reads zeros where pread would stop short, so a copied read
//     is checked against the file's size and version once the copies of a
//     worker's round are done (Engine.settle, changed.go), one fstat a
//     file a round.
//   - A page dropped (File.Drop, the steward's) must leave the cache, and
//     POSIX_FADV_DONTNEED skips pages mapped by a process: the first Drop
//     ends the file's mapped reads and unmaps its pages (MADV_DONTNEED)
//     before dropping. A file a steward keeps pages of is larger than the
//     cache anyway.
//   - Unmapping under a copy would read whatever is mapped there next, so
//     a mapping is unmapped only once its File is unreachable (a cleanup),
//     never at Close.
//
// Files under mapMin are not mapped (a directory of small files: a
// mapping a file costs two system calls and reads each once an epoch),
// nor files larger than the machine's memory (which the cache cannot
// hold, and whose look would take a byte of memory a page), nor more than
// maxMaps at once (the kernel's 65,530 mappings a process).
const (
	mapMin       = 1 << 20
	maxMaps      = 1024
	refreshShare = 50                    // looks cost at most 1/50 of the time between them
	refreshMin   = 20 * time.Millisecond // between two looks at one file
)

// maps counts the live mappings of every File.
var maps atomic.Int64

// looks rations the looks at the cache (mincore) of every file: the next
// is taken no sooner than refreshShare times the last one's cost after it.
var looks struct {
	sync.Mutex
	next time.Time
}

// mapMax is the largest file mapped: the machine's memory.
var mapMax = sync.OnceValue(func() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit)
})

// fileMap is a File's mapping and what the page cache held of it at the
// last look. It is its own allocation so that the File's cleanup, which
// unmaps it, does not keep the File alive.
type fileMap struct {
	mem []byte

	mu      sync.Mutex
	vec     atomic.Pointer[[]byte] // mincore's: bit 0 of byte i says page i was cached
	next    time.Time              // the file's next look, no sooner than refreshMin after its last
	stopped atomic.Bool            // the file's pages are being dropped: no mapped reads
}

// mapping returns f's mapping, mapping it at the first call; nil when f
// is not to be mapped or cannot be.
func (f *File) mapping() *fileMap {
	if f.direct || f.size < mapMin || f.size > mapMax() {
		return nil
	}
	f.mapOnce.Do(func() {
		if f.closed.Load() || maps.Add(1) > maxMaps {
			maps.Add(-1)
			return
		}
		mem, err := unix.Mmap(f.fd, 0, int(f.size), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			maps.Add(-1)
			return
		}
		_ = unix.Madvise(mem, unix.MADV_RANDOM)
		m := &fileMap{mem: mem}
		runtime.AddCleanup(f, func(m *fileMap) {
			_ = unix.Munmap(m.mem)
			maps.Add(-1)
		}, m)
		f.mapped.Store(m)
	})
	m := f.mapped.Load()
	if m == nil || m.stopped.Load() {
		return nil
	}
	return m
}

// cached says whether the last look found every page of n bytes at off
// in the page cache, taking a new look first if it did not and the last
// is old enough.
func (m *fileMap) cached(off int64, n int) bool {
	if m.pagesIn(off, n) {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pagesIn(off, n) {
		return true // another read took a look while this one waited
	}
	looks.Lock()
	start := time.Now()
	if start.Before(looks.next) || start.Before(m.next) {
		looks.Unlock()
		return false
	}
	looks.next, m.next = start.Add(refreshMin), start.Add(refreshMin) // a look is under way: others wait for it
	looks.Unlock()
	vec, err := mincore.Mapped(m.mem)
	cost := time.Since(start)
	looks.Lock()
	looks.next = start.Add(refreshShare * cost)
	looks.Unlock()
	if err != nil {
		m.stopped.Store(true) // mincore refused: read as before
		return false
	}
	m.vec.Store(&vec)
	return m.pagesIn(off, n)
}

func (m *fileMap) pagesIn(off int64, n int) bool {
	vp := m.vec.Load()
	if vp == nil {
		return false
	}
	vec := *vp
	for p := off / mincore.PageSize; p <= (off+int64(n)-1)/mincore.PageSize; p++ {
		if vec[p]&1 == 0 {
			return false
		}
	}
	return true
}

// copyAt copies len(p) bytes at off from the mapping; false if a page
// faulted (the file shrank under it).
func (m *fileMap) copyAt(p []byte, off int64) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	copy(p, m.mem[off:off+int64(len(p))])
	return true
}

// stop ends mapped reads of the file and unmaps its pages from this
// process, so that a drop of them can take them out of the page cache.
func (m *fileMap) stop() {
	if m.stopped.Swap(true) {
		return
	}
	_ = unix.Madvise(m.mem, unix.MADV_DONTNEED)
}

// CopyCached copies len(p) bytes at off from f's mapping if the page
// cache holds them by its last look, and reports whether it did. The
// caller must call debug.SetPanicOnFault(true) in its goroutine first (a
// truncated file faults) and check the copy against the file's stamp
// after (Engine.settle): bytes past a shrunk end within its last page
// read as zeros.
func (f *File) CopyCached(p []byte, off int64) bool {
	if len(p) == 0 || off < 0 || off+int64(len(p)) > f.size {
		return false
	}
	m := f.mapping()
	if m == nil || !m.cached(off, len(p)) {
		return false
	}
	return m.copyAt(p, off)
}
