package privdir_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/privdir"
)

// nobody is a uid the test's process is not (it runs as root to chown).
const nobody = 65534

func mode(t *testing.T, p string) fs.FileMode {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode()
}

// A directory that is missing is made 0700 (parents too); files made in it
// are 0600, subdirectories 0700; an existing one of ours that others may
// read is narrowed to 0700.
func TestMakesPrivate(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	base := t.TempDir()
	p := filepath.Join(base, "a", "b")
	d, err := privdir.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if m := mode(t, p); m.Perm() != 0o700 || !m.IsDir() {
		t.Fatalf("made %v", m)
	}
	if m := mode(t, filepath.Join(base, "a")); m.Perm() != 0o700 {
		t.Fatalf("parent made %v", m)
	}
	if err := d.WriteFile("f", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if m := mode(t, filepath.Join(p, "f")); m.Perm() != 0o600 {
		t.Fatalf("file made %v", m)
	}
	if b, err := d.ReadFile("f", 100); err != nil || string(b) != "hello" {
		t.Fatalf("read back %q %v", b, err)
	}
	if _, err := d.ReadFile("f", 4); err == nil {
		t.Fatal("a file larger than the limit was read")
	}
	sub, err := d.Mkdir("s")
	if err != nil {
		t.Fatal(err)
	}
	sub.Close()
	if m := mode(t, filepath.Join(p, "s")); m.Perm() != 0o700 {
		t.Fatalf("subdirectory made %v", m)
	}
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o755)
	d2, err := privdir.Open(open)
	if err != nil {
		t.Fatal(err)
	}
	d2.Close()
	if m := mode(t, open); m.Perm() != 0o700 {
		t.Fatalf("an existing 0755 directory of ours is %v after Open, want 0700", m)
	}
	for _, bad := range []string{"", ".", "..", "x/y", "../f"} {
		if _, err := d.Open(bad); err == nil {
			t.Fatalf("opened %q", bad)
		}
	}
}

// Another user's directory, or one others may write, is refused with an
// error naming the path, the owner and the mode.
func TestRefusesForeignOrWritable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	base := t.TempDir()
	foreign := filepath.Join(base, "foreign")
	os.Mkdir(foreign, 0o700)
	if err := os.Chown(foreign, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	world := filepath.Join(base, "world")
	os.Mkdir(world, 0o700)
	os.Chmod(world, 0o777)
	group := filepath.Join(base, "group")
	os.Mkdir(group, 0o700)
	os.Chmod(group, 0o770)
	sticky := filepath.Join(base, "sticky")
	os.Mkdir(sticky, 0o700)
	unix.Chmod(sticky, 0o1777)
	for _, c := range []struct {
		path, owner, mode string
	}{
		{foreign, "uid 65534", "0700"},
		{world, "uid 0", "0777"},
		{group, "uid 0", "0770"},
		{sticky, "uid 0", "1777"},
	} {
		d, err := privdir.Open(c.path)
		if err == nil {
			d.Close()
			t.Fatalf("%s opened", c.path)
		}
		var pe *privdir.Error
		if !errors.Is(err, privdir.ErrNotPrivate) || !errors.As(err, &pe) {
			t.Fatalf("%s: %v", c.path, err)
		}
		for _, s := range []string{c.path, c.owner, c.mode, "remove it"} {
			if !strings.Contains(err.Error(), s) {
				t.Fatalf("%s: the error does not say %q: %v", c.path, s, err)
			}
		}
	}
	// The same for a subdirectory, and a symlink to a directory of ours
	// planted as a subdirectory is not followed.
	d, err := privdir.Open(filepath.Join(base, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	os.Mkdir(filepath.Join(base, "mine", "theirs"), 0o700)
	os.Chown(filepath.Join(base, "mine", "theirs"), nobody, nobody)
	if _, err := d.Mkdir("theirs"); !errors.Is(err, privdir.ErrNotPrivate) {
		t.Fatalf("another user's subdirectory: %v", err)
	}
	os.Symlink(filepath.Join(base, "open-elsewhere"), filepath.Join(base, "mine", "link"))
	os.Mkdir(filepath.Join(base, "open-elsewhere"), 0o700)
	if _, err := d.Mkdir("link"); err == nil {
		t.Fatal("a symlinked subdirectory was followed")
	}
}

// A symlink planted where a file goes is neither read through nor written
// through; renaming over it replaces the link, not its target.
func TestSymlinkNotFollowed(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	if err := os.WriteFile(target, []byte("planted"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := privdir.Open(filepath.Join(base, "d"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	link := filepath.Join(base, "d", "f")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ReadFile("f", 100); !errors.Is(err, unix.ELOOP) {
		t.Fatalf("read through a symlink: %v", err)
	}
	if _, err := d.OpenFile("f", os.O_WRONLY|os.O_CREATE|os.O_TRUNC); err == nil {
		t.Fatal("opened a symlink for writing")
	}
	if err := d.WriteFile("f", []byte("ours")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(target); string(b) != "planted" {
		t.Fatalf("the symlink's target was written: %q", b)
	}
	if m := mode(t, link); !m.IsRegular() || m.Perm() != 0o600 {
		t.Fatalf("the file written over the link is %v", m)
	}
	// A FIFO in a file's place is refused without blocking.
	if err := unix.Mkfifo(filepath.Join(base, "d", "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Open("fifo"); err == nil {
		t.Fatal("opened a FIFO")
	}
	// RemoveAll removes a tree and follows no symlink out of it.
	sub, err := d.Mkdir("tree")
	if err != nil {
		t.Fatal(err)
	}
	sub.WriteFile("x", []byte("x"))
	os.Symlink(base, filepath.Join(base, "d", "tree", "out"))
	sub.Close()
	if err := d.RemoveAll("tree"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Fatalf("RemoveAll followed a symlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "d", "tree")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the tree is still there: %v", err)
	}
}

// WriteFileSync writes as WriteFile does, synced, and Sync syncs the
// directory through its own descriptor.
func TestWriteFileSync(t *testing.T) {
	d, err := privdir.Open(filepath.Join(t.TempDir(), "d"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.WriteFileSync("m.json", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	b, err := d.ReadFile("m.json", 1<<10)
	st, serr := os.Stat(filepath.Join(d.Path(), "m.json"))
	if err != nil || string(b) != "{}" || serr != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("read %q %v, mode %v %v", b, err, st.Mode(), serr)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}
