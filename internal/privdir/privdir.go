// Package privdir keeps a process's files in a directory no other user can
// write: the disk tier's blocks, the catalogue of persisted outputs, the
// sidecar indexes of read-only data. riffle serves what it finds there
// (a block whose CRC checks, a shard whose manifest matches), so a
// directory another user created first, or can write, would let that user
// plant data the daemon serves as ours.
//
// Open opens (or makes, mode 0700) a directory and refuses it unless it is
// owned by the process's effective uid and writable by neither group nor
// others, as OpenSSH checks a socket directory before using it; a
// directory of ours that others may read (0755, as earlier versions made
// them) is narrowed to 0700, since a listing names datasets. The checked
// handle is what every later call goes through (openat, mkdirat, renameat,
// unlinkat, relative to it, with O_NOFOLLOW), so a directory renamed or a
// symlink swapped in after the check redirects nothing; files are created
// 0600 and subdirectories 0700.
package privdir

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNotPrivate says a directory is another user's or writable by others.
var ErrNotPrivate = errors.New("not private to this user")

// Error describes a directory refused: who owns it and its mode.
type Error struct {
	Path string
	UID  int    // its owner
	Mode uint32 // its permission bits, as stat(2) gives them (0o1777 for /tmp)
}

func (e *Error) Error() string {
	fix := "remove it (riffle makes it again, mode 0700) or choose another directory"
	if e.UID == os.Geteuid() {
		fix = fmt.Sprintf("chmod go-w %s, or remove it, or choose another directory", e.Path)
	}
	return fmt.Sprintf("%s is owned by uid %d with mode %04o: %v (riffle keeps its data only in a directory owned by uid %d "+
		"and writable by no one else, or another user could plant data it would serve): %s",
		e.Path, e.UID, e.Mode, ErrNotPrivate, os.Geteuid(), fix)
}

func (e *Error) Unwrap() error { return ErrNotPrivate }

// Dir is an open private directory. Its methods take names of entries
// directly inside it (one path element, no "/", not "." or ".."). It is
// safe for concurrent use; Close it when done.
type Dir struct {
	path string
	fd   int
	shut atomic.Bool
}

// Open opens the directory at path, making it (and missing parents) with
// mode 0700 if it is not there, and checks that it is private. Symlinks in
// path are followed (the user chose it); the directory they lead to is
// what is checked and used.
func Open(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("privdir: no directory given")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := unix.Mkdir(path, 0o700); err != nil && err != unix.EEXIST {
		return nil, &fs.PathError{Op: "mkdir", Path: path, Err: err}
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return check(path, fd)
}

// check refuses fd unless it is a directory of ours that only we may
// write, narrows its mode to 0700, and wraps it.
func check(path string, fd int) (*Dir, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: path, Err: unix.ENOTDIR}
	}
	if err := Trusted(path, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	perm := st.Mode & 0o7777
	if perm&0o077 != 0 {
		if err := unix.Fchmod(fd, perm&0o700); err != nil {
			unix.Close(fd)
			return nil, &fs.PathError{Op: "chmod", Path: path, Err: err}
		}
	}
	return &Dir{path: path, fd: fd}, nil
}

// Trusted says whether what st describes (a directory, or a file in one)
// is ours alone to write, as Open requires of a directory: owned by the
// process's effective uid and writable by neither group nor others. It
// is an *Error when not.
func Trusted(path string, st *unix.Stat_t) error {
	perm := st.Mode & 0o7777
	if int(st.Uid) != os.Geteuid() || perm&0o022 != 0 {
		return &Error{Path: path, UID: int(st.Uid), Mode: perm}
	}
	return nil
}

// Path is the directory's path as it was opened, for messages.
func (d *Dir) Path() string { return d.path }

// Close closes the handle.
func (d *Dir) Close() error {
	if d.shut.Swap(true) {
		return nil
	}
	return unix.Close(d.fd)
}

func (d *Dir) join(name string) string { return filepath.Join(d.path, name) }

// entry checks that name is one entry of the directory.
func (d *Dir) entry(op, name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return &fs.PathError{Op: op, Path: d.join(name), Err: fmt.Errorf("privdir: %q is not a name inside the directory", name)}
	}
	return nil
}

// Mkdir opens the subdirectory name, making it with mode 0700 if it is not
// there, with the checks Open makes; a symlink in its place is refused.
func (d *Dir) Mkdir(name string) (*Dir, error) {
	if err := d.entry("mkdir", name); err != nil {
		return nil, err
	}
	if err := unix.Mkdirat(d.fd, name, 0o700); err != nil && err != unix.EEXIST {
		return nil, &fs.PathError{Op: "mkdir", Path: d.join(name), Err: err}
	}
	return d.OpenDir(name)
}

// OpenDir opens the existing subdirectory name, with the checks Open
// makes; a symlink in its place is refused.
func (d *Dir) OpenDir(name string) (*Dir, error) {
	if err := d.entry("open", name); err != nil {
		return nil, err
	}
	fd, err := unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	return check(d.join(name), fd)
}

// OpenFile opens the entry name with flag (os.O_* or unix.O_*), never
// through a symlink (O_NOFOLLOW); a file it creates has mode 0600. What it
// opens must be a regular file.
func (d *Dir) OpenFile(name string, flag int) (*os.File, error) {
	if err := d.entry("open", name); err != nil {
		return nil, err
	}
	// O_NONBLOCK: a FIFO planted in a file's place must not block the open.
	fd, err := unix.Openat(d.fd, name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0o600)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "stat", Path: d.join(name), Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: d.join(name), Err: errors.New("privdir: not a regular file")}
	}
	return os.NewFile(uintptr(fd), d.join(name)), nil
}

// Open opens the file name for reading.
func (d *Dir) Open(name string) (*os.File, error) { return d.OpenFile(name, unix.O_RDONLY) }

// ReadFile reads the whole file name, of at most max bytes.
func (d *Dir) ReadFile(name string, max int64) ([]byte, error) {
	f, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, &fs.PathError{Op: "read", Path: d.join(name), Err: fmt.Errorf("privdir: larger than %d bytes", max)}
	}
	return b, nil
}

var tmpSeq atomic.Uint64

// CreateTemp creates a new file, mode 0600, named prefix followed by a
// unique suffix and ".tmp", and returns it and its name.
func (d *Dir) CreateTemp(prefix string) (*os.File, string, error) {
	for range 100 {
		name := prefix + "." + strconv.FormatInt(time.Now().UnixNano()%1e9, 36) + strconv.FormatUint(tmpSeq.Add(1), 36) +
			strconv.Itoa(os.Getpid()) + ".tmp"
		f, err := d.OpenFile(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, name, err
	}
	return nil, "", &fs.PathError{Op: "create", Path: d.join(prefix), Err: fs.ErrExist}
}

// WriteFile writes b to the file name atomically (a reader sees the old
// file or the new one, never a part): through a temporary file, mode
// 0600, renamed over it.
func (d *Dir) WriteFile(name string, b []byte) error { return d.writeFile(name, b, false) }

// WriteFileSync is WriteFile that also survives a crash: the file is
// synced before the rename, and the directory after it.
func (d *Dir) WriteFileSync(name string, b []byte) error { return d.writeFile(name, b, true) }

func (d *Dir) writeFile(name string, b []byte, durable bool) error {
	if err := d.entry("write", name); err != nil {
		return err
	}
	f, tmp, err := d.CreateTemp(name)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = d.Rename(tmp, name)
	}
	if err != nil {
		d.Remove(tmp)
		return err
	}
	if durable {
		return d.Sync()
	}
	return nil
}

// Sync makes the directory's entries (its renames) durable.
func (d *Dir) Sync() error {
	if err := unix.Fsync(d.fd); err != nil {
		return &fs.PathError{Op: "sync", Path: d.path, Err: err}
	}
	return nil
}

// Rename renames the entry old to new (which it replaces; a symlink at new
// is replaced, not followed).
func (d *Dir) Rename(old, new string) error {
	if err := d.entry("rename", old); err != nil {
		return err
	}
	if err := d.entry("rename", new); err != nil {
		return err
	}
	if err := unix.Renameat(d.fd, old, d.fd, new); err != nil {
		return &os.LinkError{Op: "rename", Old: d.join(old), New: d.join(new), Err: err}
	}
	return nil
}

// Remove removes the file (or empty directory) name.
func (d *Dir) Remove(name string) error {
	if err := d.entry("remove", name); err != nil {
		return err
	}
	err := unix.Unlinkat(d.fd, name, 0)
	if err == unix.EISDIR {
		err = unix.Unlinkat(d.fd, name, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return &fs.PathError{Op: "remove", Path: d.join(name), Err: err}
	}
	return nil
}

// RemoveAll removes name and, if it is a directory, everything in it,
// following no symlink. A name that is not there is no error.
func (d *Dir) RemoveAll(name string) error {
	if err := d.entry("remove", name); err != nil {
		return err
	}
	return removeAll(d.fd, name, d.join(name))
}

func removeAll(parent int, name, path string) error {
	err := unix.Unlinkat(parent, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR {
		return &fs.PathError{Op: "remove", Path: path, Err: err}
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	names, err := f.Readdirnames(-1)
	if err != nil {
		f.Close()
		return err
	}
	for _, n := range names {
		if err := removeAll(fd, n, filepath.Join(path, n)); err != nil {
			f.Close()
			return err
		}
	}
	f.Close()
	if err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return &fs.PathError{Op: "remove", Path: path, Err: err}
	}
	return nil
}

// ReadDir lists the directory's entries, sorted by name.
func (d *Dir) ReadDir() ([]fs.DirEntry, error) {
	// A fresh open of ".", not a dup: a dup shares the directory's read
	// position with the handle.
	fd, err := unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: d.path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	return f.ReadDir(-1)
}

// Lstat describes the entry name itself (a symlink is described, not
// followed).
func (d *Dir) Lstat(name string) (fs.FileMode, int64, error) {
	if err := d.entry("lstat", name); err != nil {
		return 0, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return 0, 0, &fs.PathError{Op: "lstat", Path: d.join(name), Err: err}
	}
	mode := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFREG:
	default:
		mode |= fs.ModeIrregular
	}
	return mode, st.Size, nil
}

// Touch sets the entry name's access and modification times to now,
// without following a symlink.
func (d *Dir) Touch(name string) error {
	if err := d.entry("touch", name); err != nil {
		return err
	}
	now := unix.NsecToTimespec(time.Now().UnixNano())
	if err := unix.UtimesNanoAt(d.fd, name, []unix.Timespec{now, now}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &fs.PathError{Op: "touch", Path: d.join(name), Err: err}
	}
	return nil
}
