package storage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Local is the local file system as a Store. With Roots it is confined:
// every name must resolve beneath one of them, and what is opened is what
// was checked. A name is opened with openat2(RESOLVE_BENEATH) relative to
// its root's descriptor, so no symlink, swapped in before or during the
// open, can lead outside; where the kernel lacks openat2 the resolved path
// is opened with O_NOFOLLOW and the descriptor's own path is checked after.
//
// Only regular files are opened, with O_NONBLOCK so that a FIFO given as a
// dataset fails at once instead of blocking until a writer appears.
type Local struct {
	direct bool
	roots  []root
}

type root struct {
	path string // absolute, symlinks resolved
	fd   int    // O_PATH descriptor of the directory
}

// NewLocal returns the local file system, read with O_DIRECT if direct,
// confined to roots if any are given.
func NewLocal(direct bool, roots []string) (*Local, error) {
	l := &Local{direct: direct}
	for _, r := range roots {
		abs, err := filepath.Abs(r)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("root %s: %w", r, err)
		}
		fd, err := unix.Open(abs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			l.Close()
			return nil, &Error{Op: "open", Object: abs, Err: err}
		}
		l.roots = append(l.roots, root{path: abs, fd: fd})
	}
	return l, nil
}

// WithDirect returns the same store reading with or without O_DIRECT.
func (l *Local) WithDirect(direct bool) *Local {
	c := *l
	c.direct = direct
	return &c
}

// Hints are those of local files: aligned to pages with O_DIRECT.
func (l *Local) Hints() Hints {
	h := DefaultHints
	if l.direct {
		h.Align = DirectAlign
	}
	return h
}

// Roots returns the resolved roots, none if unconfined.
func (l *Local) Roots() []string {
	var out []string
	for _, r := range l.roots {
		out = append(out, r.path)
	}
	return out
}

// Close releases the roots' descriptors.
func (l *Local) Close() error {
	for _, r := range l.roots {
		unix.Close(r.fd)
	}
	l.roots = nil
	return nil
}

// beneath resolves name's symlinks and finds the root the result lies
// under, and the resolved name relative to it.
func (l *Local) beneath(name string) (root, string, error) {
	abs, err := filepath.Abs(name)
	if err != nil {
		return root{}, "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return root{}, "", err
	}
	for _, r := range l.roots {
		if real == r.path {
			return r, ".", nil
		}
		if strings.HasPrefix(real, r.path+string(filepath.Separator)) {
			return r, real[len(r.path)+1:], nil
		}
	}
	return root{}, "", fmt.Errorf("%w (%s)", ErrOutsideRoots, strings.Join(l.Roots(), ", "))
}

// openFd opens name with flags, confined if the store is: symlinks are
// resolved once, the result is checked against the roots, and the checked
// path is opened relative to its root with openat2 refusing any symlink or
// escape on the way, so a link swapped in after the check fails the open
// instead of redirecting it.
func (l *Local) openFd(name string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if len(l.roots) == 0 {
		return unix.Open(name, flags, 0)
	}
	var err error
	for range 3 { // a link swapped between resolving and opening: resolve again
		var r root
		var rel string
		if r, rel, err = l.beneath(name); err != nil {
			return -1, err
		}
		var fd int
		fd, err = unix.Openat2(r.fd, rel, &unix.OpenHow{Flags: uint64(flags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
		switch err {
		case nil:
			return fd, nil
		case unix.ELOOP, unix.EXDEV:
			continue
		case unix.ENOSYS, unix.EPERM:
			// No openat2 (old kernel, seccomp): open without following a
			// final link, then check where the descriptor is.
			fd, err := unix.Open(filepath.Join(r.path, rel), flags|unix.O_NOFOLLOW, 0)
			if err != nil {
				return -1, err
			}
			at, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
			if err != nil || (at != r.path && !strings.HasPrefix(at, r.path+"/")) {
				unix.Close(fd)
				return -1, fmt.Errorf("%w: %s is %s", ErrOutsideRoots, name, at)
			}
			return fd, nil
		}
		return -1, err
	}
	return -1, fmt.Errorf("%w: the path changed while it was opened (%v)", ErrOutsideRoots, err)
}

// Open opens a regular file.
func (l *Local) Open(ctx context.Context, name string) (Reader, error) {
	return l.OpenFile(name)
}

// OpenFile opens a regular file as a *File.
func (l *Local) OpenFile(name string) (*File, error) {
	flags := unix.O_RDONLY | unix.O_NONBLOCK
	direct := l.direct
	if direct {
		flags |= unix.O_DIRECT
	}
	fd, err := l.openFd(name, flags)
	if err == unix.EINVAL && direct {
		// Some file systems (tmpfs) refuse O_DIRECT; read through the cache there.
		direct = false
		fd, err = l.openFd(name, flags&^unix.O_DIRECT)
	}
	if err != nil {
		return nil, &Error{Op: "open", Object: name, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &Error{Op: "stat", Object: name, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		unix.Close(fd)
		return nil, &Error{Op: "open", Object: name, Err: fmt.Errorf("is a directory")}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &Error{Op: "open", Object: name, Err: ErrNotRegular}
	}
	f := newFile(fd, name, st.Size, direct, l.direct)
	info, _ := statInfo(name, &st)
	f.version = info.Version
	f.dev = uint64(st.Dev)
	f.opened = stampOf(&st)
	return f, nil
}

// Stat describes a file or directory, through the confinement.
func (l *Local) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	fd, err := l.openFd(name, unix.O_PATH)
	if err != nil {
		return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: err}
	}
	return statInfo(name, &st)
}

func statInfo(name string, st *unix.Stat_t) (ObjectInfo, error) {
	mode := st.Mode & unix.S_IFMT
	if mode != unix.S_IFREG && mode != unix.S_IFDIR {
		return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: ErrNotRegular}
	}
	mt := unixTime(st.Mtim)
	// The ctime is in the version because the mtime can be put back: an
	// edit in place that keeps the size and restores the mtime (cp -p,
	// rsync --inplace -t, a utime call) leaves device, inode, mtime and
	// size as they were, but every write and every utime sets the ctime to
	// now, and no call sets it back.
	return ObjectInfo{
		Name: name, Size: st.Size, ModTime: mt, Dir: mode == unix.S_IFDIR,
		Version: fmt.Sprintf("%d:%d:%d:%d:%d", st.Dev, st.Ino, mt.UnixNano(), st.Size, unixTime(st.Ctim).UnixNano()),
	}, nil
}

// Glob expands a pattern; a name without glob characters is itself.
func (l *Local) Glob(ctx context.Context, pattern string) ([]string, error) {
	if !strings.ContainsAny(pattern, "*?[") {
		return []string{pattern}, nil
	}
	m, err := filepath.Glob(pattern)
	if err != nil {
		return nil, fmt.Errorf("glob %q: %w", pattern, err)
	}
	slices.Sort(m)
	return m, nil
}

// Walk calls fn for every regular file under root in lexical order,
// following symlinked files (as ImageFolder does) but checking, when
// confined, that each resolves beneath the roots.
func (l *Local) Walk(ctx context.Context, root string, fn func(string, ObjectInfo) error) error {
	return filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return &Error{Op: "open", Object: p, Err: err}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p != root && strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() {
			if p == root {
				return nil
			}
			info, err := l.Stat(ctx, p)
			if err != nil {
				return err
			}
			if err := fn(p, info); err == SkipDir {
				return filepath.SkipDir
			} else if err != nil {
				return err
			}
			return nil
		}
		info, err := l.Stat(ctx, p)
		if err != nil {
			if e.Type()&fs.ModeSymlink != 0 && notExist(err) {
				return nil // a dangling link is no record
			}
			if errors.Is(err, ErrNotRegular) {
				return nil // sockets, FIFOs: not records
			}
			return err
		}
		if info.Dir {
			return nil // a symlinked directory is not walked into
		}
		return fn(p, info)
	})
}

// ReadFile reads a small regular file of at most max bytes, refusing a
// symlink at the end of the path.
func (l *Local) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	fd, err := l.openFd(name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW)
	if err != nil {
		return nil, &Error{Op: "open", Object: name, Err: err}
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, &Error{Op: "stat", Object: name, Err: err}
	}
	if !st.Mode().IsRegular() {
		return nil, &Error{Op: "open", Object: name, Err: ErrNotRegular}
	}
	if st.Size() > max {
		return nil, &Error{Op: "open", Object: name, Err: fmt.Errorf("%w: %d bytes, at most %d", ErrTooLarge, st.Size(), max)}
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil {
		return nil, &Error{Op: "read", Object: name, Len: len(b), Err: err}
	}
	return b, nil
}

// WriteFile writes b to name through a temporary file and a rename, so a
// reader never sees half of it and concurrent writers do not collide.
func (l *Local) WriteFile(ctx context.Context, name string, b []byte) error {
	if len(l.roots) > 0 {
		if _, _, err := l.beneath(filepath.Dir(name)); err != nil {
			return &Error{Op: "write", Object: name, Err: err}
		}
	}
	// Parents it makes are its user's alone: a listing names datasets.
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(name), filepath.Base(name)+".tmp*")
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Close()
	} else {
		f.Close()
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}
