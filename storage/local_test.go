package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// confined makes a root with one file inside, a secret outside and links
// to both, and a store confined to the root.
func confined(t *testing.T) (l *Local, root, inside, secret string) {
	t.Helper()
	dir := t.TempDir()
	root = filepath.Join(dir, "root")
	os.MkdirAll(filepath.Join(root, "sub"), 0o755)
	inside = filepath.Join(root, "sub", "in.bin")
	os.WriteFile(inside, []byte("inside bytes"), 0o644)
	secret = filepath.Join(dir, "secret")
	os.WriteFile(secret, []byte("the secret!!"), 0o644)
	os.Symlink(secret, filepath.Join(root, "out-link"))
	os.Symlink(inside, filepath.Join(root, "in-link"))
	l, err := NewLocal(false, []string{root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, root, inside, secret
}

func TestConfinedOpen(t *testing.T) {
	l, root, inside, secret := confined(t)
	ctx := context.Background()
	for _, ok := range []string{inside, filepath.Join(root, "in-link"), filepath.Join(root, "sub", "..", "sub", "in.bin")} {
		r, err := l.Open(ctx, ok)
		if err != nil {
			t.Fatalf("%s: %v", ok, err)
		}
		r.Close()
	}
	for _, bad := range []string{secret, filepath.Join(root, "out-link"), filepath.Join(root, "..", "secret")} {
		_, err := l.Open(ctx, bad)
		var se *Error
		if !errors.Is(err, ErrOutsideRoots) || !errors.As(err, &se) || se.Object != bad {
			t.Fatalf("%s: %v, want an error naming it as outside the roots", bad, err)
		}
		if _, err := l.Stat(ctx, bad); !errors.Is(err, ErrOutsideRoots) {
			t.Fatalf("stat %s: %v", bad, err)
		}
	}
}

// A link swapped between an inside and an outside target while opens
// happen never yields the outside file: what is opened is what was checked.
func TestConfinedSwapRace(t *testing.T) {
	l, root, inside, secret := confined(t)
	link := filepath.Join(root, "swap")
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tmp := link + ".tmp"
		for i := 0; !stop.Load(); i++ {
			target := inside
			if i%2 == 1 {
				target = secret
			}
			os.Remove(tmp)
			os.Symlink(target, tmp)
			os.Rename(tmp, link)
		}
	}()
	deadline := time.Now().Add(500 * time.Millisecond)
	opens := 0
	for time.Now().Before(deadline) {
		r, err := l.Open(context.Background(), link)
		if err != nil {
			continue
		}
		b := make([]byte, 12)
		r.ReadAt(context.Background(), b, 0)
		r.Close()
		opens++
		if bytes.Equal(b, []byte("the secret!!")) {
			stop.Store(true)
			wg.Wait()
			t.Fatal("a confined open read the file outside the root")
		}
	}
	stop.Store(true)
	wg.Wait()
	if opens == 0 {
		t.Fatal("no open succeeded: the race was not exercised")
	}
}

// A FIFO, a device or a socket is refused at once, never opened for a
// read that would block.
func TestNotRegularRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	l, _ := NewLocal(false, nil)
	done := make(chan error, 1)
	go func() {
		_, err := l.Open(context.Background(), fifo)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrNotRegular) {
			t.Fatalf("open of a FIFO: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("open of a FIFO blocked")
	}
	if _, err := l.Open(context.Background(), "/dev/zero"); !errors.Is(err, ErrNotRegular) {
		t.Fatalf("open of /dev/zero: %v", err)
	}
}

// Small files (sidecar indexes) are read only if regular, not links, and
// within their bound.
func TestReadFileBounds(t *testing.T) {
	dir := t.TempDir()
	l, _ := NewLocal(false, nil)
	ctx := context.Background()
	p := filepath.Join(dir, "small")
	os.WriteFile(p, []byte("0123456789"), 0o644)
	if b, err := l.ReadFile(ctx, p, 10); err != nil || string(b) != "0123456789" {
		t.Fatalf("read: %q %v", b, err)
	}
	if _, err := l.ReadFile(ctx, p, 9); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("read over its bound: %v", err)
	}
	z := filepath.Join(dir, "zero")
	os.Symlink("/dev/zero", z)
	if _, err := l.ReadFile(ctx, z, 1<<20); err == nil {
		t.Fatal("read a link to /dev/zero")
	}
}

// Walking a confined tree follows links to files inside the roots and
// fails, naming it, on a link that leads out.
func TestConfinedWalk(t *testing.T) {
	l, root, _, _ := confined(t)
	err := l.Walk(context.Background(), root, func(string, ObjectInfo) error { return nil })
	if !errors.Is(err, ErrOutsideRoots) {
		t.Fatalf("walk with a link out: %v", err)
	}
	os.Remove(filepath.Join(root, "out-link"))
	var names []string
	if err := l.Walk(context.Background(), root, func(p string, info ObjectInfo) error {
		if !info.Dir {
			names = append(names, filepath.Base(p))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || names[0] != "in-link" || names[1] != "in.bin" {
		t.Fatalf("walked %v", names)
	}
}

// A file rewritten in place with the same size and its mtime put back
// (cp -p, rsync --inplace -t) has another version: its ctime moved, and
// nothing can set a ctime back.
func TestVersionSeesEditRestoringMtime(t *testing.T) {
	l, err := NewLocal(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := filepath.Join(t.TempDir(), "d.bin")
	if err := os.WriteFile(p, []byte("first bytes!"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := l.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.OpenFile(p)
	if err != nil {
		t.Fatal(err)
	}
	opened := f.Version()
	f.Close()
	if opened != before.Version {
		t.Fatalf("an open file's version %q, its stat's %q", opened, before.Version)
	}
	var st0, st syscall.Stat_t
	syscall.Stat(p, &st0)
	// Rewrite until the ctime has moved: a file system whose clock ticks
	// coarsely keeps the ctime of a rewrite in the same tick.
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err := os.WriteFile(p, []byte("other bytes!"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, before.ModTime, before.ModTime); err != nil {
			t.Fatal(err)
		}
		syscall.Stat(p, &st)
		if st.Ctim != st0.Ctim {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ctime did not move in 10s")
		}
	}
	after, err := l.Stat(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size != before.Size || !after.ModTime.Equal(before.ModTime) || st.Ino != st0.Ino {
		t.Fatalf("the edit was not in place with size and mtime kept: %+v, was %+v", after, before)
	}
	if after.Version == before.Version {
		t.Fatalf("an edit in place that restored size and mtime kept the version %q", after.Version)
	}
}

// WriteFile makes missing parents private to its user.
func TestWriteFileParentsPrivate(t *testing.T) {
	l, err := NewLocal(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := l.WriteFile(context.Background(), filepath.Join(dir, "f"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want mode 0700", d, st.Mode(), err)
		}
	}
}

// A File holds its descriptor itself: a second Close must not close
// whatever file the number belongs to by then, and a File dropped unclosed
// gives its descriptor back, as an *os.File does.
func TestFileDescriptorClosedOnce(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("aaaa"), 0o644)
	os.WriteFile(b, []byte("bbbb"), 0o644)
	fa, err := OpenFile(a, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fd := fa.fd
	if err := fa.Close(); err != nil {
		t.Fatal(err)
	}
	// b at a's old number, as the next open would have it.
	raw, err := unix.Open(b, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if raw != fd {
		if err := unix.Dup3(raw, fd, unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(raw)
	}
	defer unix.Close(fd)
	if err := fa.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("second Close: %v, want os.ErrClosed", err)
	}
	p := make([]byte, 4)
	if n, err := unix.Pread(fd, p, 0); err != nil || n != 4 || string(p) != "bbbb" {
		t.Fatalf("b after a's second Close: %q, %v", p, err)
	}

	// Dropped unclosed: its descriptor is closed once the File is gone.
	fc, err := OpenFile(a, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	link := filepath.Join("/proc/self/fd", fmt.Sprint(fc.fd))
	fc = nil
	for deadline := time.Now().Add(10 * time.Second); ; {
		runtime.GC()
		if target, err := os.Readlink(link); err != nil || target != a {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a File dropped unclosed kept its descriptor")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
