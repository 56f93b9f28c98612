package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/alignbuf"
)

// FileOptions configures how a local file is read. The zero value reads
// through the page cache.
type FileOptions struct {
	// Direct opens the file with O_DIRECT so a dataset larger than memory
	// does not churn the page cache. Reads must then use buffers, offsets and
	// lengths aligned to its Hints().Align; the loader does this.
	Direct bool
}

// DirectAlign is the alignment O_DIRECT reads use: the logical block size of
// every NVMe and virtio disk we target, and the page size.
const DirectAlign = 4096

// File is a local file read with pread(2). It is safe for concurrent use.
//
// It holds the descriptor itself, not an *os.File: a file opened
// O_NONBLOCK (so that a FIFO's open does not wait for a writer) is one
// os.NewFile asks the kernel about (fcntl) and offers to the poller
// (epoll_ctl, refused for a regular file), two system calls an open that
// reads are plain preads never uses. With a file a record (an image
// tree) they were two of the seven calls an image cost.
type File struct {
	name    string
	fd      int
	closed  *atomic.Bool // its own allocation: the cleanup must not hold f
	size    int64
	direct  bool // O_DIRECT is on
	pad     bool // reads are aligned and may run past the end
	version string
	dev     uint64 // the device it lives on (st_dev): an engine's depth is per device
	// past is the file opened again with O_DIRECT, for reads that leave
	// the page cache as it was (Request.PastCache), made at the first
	// such read; nil where the file system refuses O_DIRECT.
	pastOnce sync.Once
	past     *File
	// mapped is the file mapped for copies of cached pages (mapped.go),
	// made at the first such read; nil where it is not mapped.
	mapOnce sync.Once
	mapped  atomic.Pointer[fileMap]
	// opened is the file's version at open; reads after which an fstat
	// finds another fail (changed.go): moved says one did, shortest is
	// the least size it found.
	opened   stamp
	moved    atomic.Bool
	shortest atomic.Int64
}

// A File has every optional behaviour a wrapper unwraps to.
var (
	_ Dropper    = (*File)(nil)
	_ Descriptor = (*File)(nil)
	_ ringer     = (*File)(nil)
)

// OpenFile opens path for reading: a regular file of the unconfined
// local file system.
func OpenFile(path string, opts FileOptions) (*File, error) {
	return (&Local{direct: opts.Direct}).OpenFile(path)
}

// newFile wraps an open file. direct says O_DIRECT is on; pad that the
// caller asked for it, so reads are aligned and may run past the end even
// where the file system refused O_DIRECT (tmpfs): the loader's layout does
// not depend on what the file system under it allows.
func newFile(fd int, name string, size int64, direct, pad bool) *File {
	if !direct {
		// The loader's reads are random; the kernel's readahead would only
		// read bytes nobody asked for.
		_ = unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM)
	}
	f := &File{name: name, fd: fd, closed: new(atomic.Bool), size: size, direct: direct, pad: direct || pad}
	f.shortest.Store(size)
	// As an *os.File would: a File dropped unclosed does not keep its
	// descriptor.
	runtime.AddCleanup(f, func(c *atomic.Bool) {
		if !c.Load() {
			unix.Close(fd)
		}
	}, f.closed)
	return f
}

// Name returns the file's path.
func (f *File) Name() string { return f.name }

// Size returns the file's size when it was opened.
func (f *File) Size() int64 { return f.size }

// Drop asks the kernel to drop the cached pages of n bytes at off: a
// reader that knows which of its pages it will need again keeps those in
// the page cache, not the ones the kernel's LRU would keep. The file's
// bytes are untouched; a later read of them reads the device.
func (f *File) Drop(off, n int64) error {
	defer runtime.KeepAlive(f)
	if f.closed.Load() {
		// Its descriptor's number may be another file's by now.
		return &Error{Op: "fadvise", Object: f.name, Offset: off, Len: int(n), Err: os.ErrClosed}
	}
	if m := f.mapped.Load(); m != nil {
		m.stop() // a page this process maps is not dropped
	}
	if err := unix.Fadvise(f.fd, off, n, unix.FADV_DONTNEED); err != nil {
		return &Error{Op: "fadvise", Object: f.name, Offset: off, Len: int(n), Err: err}
	}
	return nil
}

// Hints are a local file's (DefaultHints), its buffers, offsets and
// lengths aligned to DirectAlign if it was opened with O_DIRECT.
func (f *File) Hints() Hints {
	h := DefaultHints
	if f.pad {
		h.Align = DirectAlign
	}
	return h
}

// Close closes the file; a second Close is an error, never a close of
// whatever file has the descriptor by then.
func (f *File) Close() error {
	if f.closed.Swap(true) {
		return &Error{Op: "close", Object: f.name, Err: os.ErrClosed}
	}
	f.pastOnce.Do(func() {}) // no twin is opened after this
	if f.past != nil {
		f.past.Close()
	}
	if err := unix.Close(f.fd); err != nil {
		return &Error{Op: "close", Object: f.name, Err: err}
	}
	return nil
}

// ReadAt reads len(p) bytes at off with as many pread calls as it takes,
// then checks that the file is still as it was opened (changed.go): a
// write or truncation since fails the read, naming the file. With O_DIRECT, an aligned read may run past Size up to the next
// aligned boundary; the bytes past Size are left as they were. An
// unaligned one (a footer, a page of a dataset of rows) is read through an
// aligned buffer of its own, which the kernel would otherwise refuse
// (EINVAL).
func (f *File) ReadAt(ctx context.Context, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	if err := f.readAt(ctx, p, off); err != nil {
		return err
	}
	return f.changed()(off, len(p))
}

// readAt reads len(p) bytes at off with as many pread calls as it
// takes, unchecked: ReadAt's and the engine's callers check.
func (f *File) readAt(ctx context.Context, p []byte, off int64) error {
	// f's cleanup closes the descriptor once f is unreachable, which a
	// caller's last use of f can make it while a pread runs.
	defer runtime.KeepAlive(f)
	if f.direct && (off%DirectAlign != 0 || len(p)%DirectAlign != 0 || !alignbuf.Aligned(p, DirectAlign)) {
		return f.readBounced(ctx, p, off)
	}
	want := len(p)
	if f.pad && off+int64(len(p)) > f.size && off < f.size {
		want = int(f.size - off)
	}
	done := 0
	for done < want {
		n, err := unix.Pread(f.fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &Error{Op: "read", Object: f.Name(), Offset: off, Len: len(p), Err: err}
		}
		if n == 0 {
			return &Error{Op: "read", Object: f.Name(), Offset: off, Len: len(p), Err: f.endError(off, want, done)}
		}
		done += n
		if ctx.Err() != nil && done < want {
			return ctx.Err()
		}
	}
	return nil
}

// readBounced reads p at off through an aligned buffer spanning it.
func (f *File) readBounced(ctx context.Context, p []byte, off int64) error {
	if off+int64(len(p)) > f.size {
		return &Error{Op: "read", Object: f.Name(), Offset: off, Len: len(p), Err: f.endError(off, len(p), int(max(0, f.size-off)))}
	}
	lo := off &^ (DirectAlign - 1)
	hi := (off + int64(len(p)) + DirectAlign - 1) &^ (DirectAlign - 1)
	buf := alignbuf.Make(int(hi-lo), DirectAlign)
	if err := f.readAt(ctx, buf, lo); err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Offset, e.Len = off, len(p) // the read asked for, not its aligned span
		}
		return err
	}
	copy(p, buf[off-lo:])
	return nil
}

// pastCache returns the file opened again with O_DIRECT, opened at the
// first call, or nil: the file is read with O_DIRECT already, or closed,
// or its file system refuses O_DIRECT (tmpfs). It opens the descriptor's
// own file (/proc/self/fd), not the path, which may name another file by
// now.
func (f *File) pastCache() *File {
	if f.direct {
		return nil
	}
	f.pastOnce.Do(func() {
		if f.closed.Load() {
			return
		}
		fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", f.fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		runtime.KeepAlive(f)
		if err != nil {
			return
		}
		p := newFile(fd, f.name, f.size, true, true)
		p.version, p.dev = f.version, f.dev
		p.opened = f.opened
		f.past = p
	})
	return f.past
}

// CanPastCache says a read of p at off of r goes past the page cache if
// its Request asks (Request.PastCache): r is a local file read through
// the cache, on a file system that allows O_DIRECT, and the read is
// aligned as O_DIRECT needs.
func CanPastCache(r Reader, p []byte, off int64) bool {
	f, ok := As[*File](r)
	return ok && pastAligned(p, off) && f.pastCache() != nil
}

// pastAligned says a read of p at off can go past the page cache as it
// is: O_DIRECT takes aligned buffers, offsets and lengths.
func pastAligned(p []byte, off int64) bool {
	return off%DirectAlign == 0 && len(p)%DirectAlign == 0 && alignbuf.Aligned(p, DirectAlign)
}

// endError explains a read of want bytes at off that found the end of the
// file after done bytes: the file shrank since it was opened, or the read
// asked for bytes past its end.
func (f *File) endError(off int64, want, done int) error {
	if off+int64(want) <= f.size {
		return fmt.Errorf("%w (opened at %d bytes, ends at %d now): %w", ErrShrunk, f.size, off+int64(done), io.ErrUnexpectedEOF)
	}
	return io.ErrUnexpectedEOF
}

// Version identifies the file's content as it was opened: device, inode,
// mtime, size and ctime (see ObjectInfo.Version).
func (f *File) Version() string { return f.version }

// Direct reports whether the file is read with O_DIRECT.
func (f *File) Direct() bool { return f.direct }

// Fd is the file's descriptor, for Async reads.
func (f *File) Fd() int { return f.fd }

// TryReadAt reads len(p) bytes at off only if they are all in the page cache
// (preadv2 with RWF_NOWAIT), so it never waits for the device. It reports
// whether it read them; when it did not, read them with ReadAt or Async.
func (f *File) TryReadAt(p []byte, off int64) bool {
	if f.direct || len(p) == 0 {
		return false
	}
	iov := unix.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	n, _, errno := unix.Syscall6(unix.SYS_PREADV2, uintptr(f.fd), uintptr(unsafe.Pointer(&iov)), 1, uintptr(off), 0, unix.RWF_NOWAIT)
	runtime.KeepAlive(f) // as in ReadAt: not closed by its cleanup under the read
	return errno == 0 && int(n) == len(p)
}

func unixTime(t unix.Timespec) time.Time { return time.Unix(t.Sec, t.Nsec) }

// DeviceOf returns the device r's object lives on, 0 when it is not an
// open local file (an object store's, a FileSet's file, which opens at its
// first read): readers of one device share a read engine.
func DeviceOf(r Reader) uint64 {
	if f, ok := As[*File](r); ok {
		return f.dev
	}
	return 0
}
