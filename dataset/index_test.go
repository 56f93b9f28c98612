package dataset_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	. "github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir/privdirtest"
)

// lines makes n lines whose lengths depend on seed, padded so that every
// seed's file has the same size.
func lines(n, seed int) ([]string, []byte) {
	var ls []string
	var b strings.Builder
	for i := range n {
		l := fmt.Sprintf("r%d-%s", i, strings.Repeat("x", (i*7+seed*13)%23))
		ls = append(ls, l)
		b.WriteString(l + "\n")
	}
	return ls, []byte(b.String())
}

func ctimeOf(t *testing.T, p string) unix.Timespec {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ctim
}

// A file edited in place with its size and mtime put back (rsync
// --inplace -t, cp -p) is not read through its old index: the index is
// rebuilt and every record is the new file's. The index beside the data
// and the one in the index directory alike.
func TestIndexSeesInPlaceEdit(t *testing.T) {
	for _, inDirOnly := range []bool{false, true} {
		t.Run(fmt.Sprint("in-dir-only=", inDirOnly), func(t *testing.T) {
			ctx := context.Background()
			p := filepath.Join(t.TempDir(), "d.txt")
			_, old := lines(5000, 1)
			want, edited := lines(5000, 2)
			// Pad the shorter to the longer's size: the same size, other lines.
			for len(old) < len(edited) {
				old = append(old[:len(old)-1], 'y', '\n')
			}
			for len(edited) < len(old) {
				edited = append(edited[:len(edited)-1], 'y', '\n')
				want[len(want)-1] += "y"
			}
			if err := os.WriteFile(p, old, 0o644); err != nil {
				t.Fatal(err)
			}
			opts := Options{Format: "text", IndexDir: filepath.Join(t.TempDir(), "idx"), IndexInDirOnly: inDirOnly}
			ds, err := Open(ctx, opts, p)
			if err != nil {
				t.Fatal(err)
			}
			ds.Close()
			before, _ := os.Stat(p)
			ctime := ctimeOf(t, p)

			// Edit in place, then put the mtime back; until the kernel's
			// clock has moved on, the ctime may not have.
			f, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(edited, 0); err != nil {
				t.Fatal(err)
			}
			f.Close()
			for deadline := time.Now().Add(5 * time.Second); ; {
				if err := os.Chtimes(p, before.ModTime(), before.ModTime()); err != nil {
					t.Fatal(err)
				}
				if ctimeOf(t, p) != ctime {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the ctime did not change")
				}
			}
			after, _ := os.Stat(p)
			if after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
				t.Fatalf("size and mtime not restored: %d %v, were %d %v", after.Size(), after.ModTime(), before.Size(), before.ModTime())
			}

			ds, err = Open(ctx, opts, p)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			if ds.Len() != len(want) {
				t.Fatalf("%d records, want %d", ds.Len(), len(want))
			}
			wrong := 0
			for id := range ds.Len() {
				if string(record(t, ds, id)) != want[id] {
					wrong++
				}
			}
			if wrong > 0 {
				t.Fatalf("%d of %d records read wrong: the old index was reused", wrong, len(want))
			}
		})
	}
}

// An index of the previous version (3, whose key had no ctime) is stale:
// verifying it says so, and opening rebuilds it.
func TestOldIndexVersionRebuilt(t *testing.T) {
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "d.txt")
	want, data := lines(100, 3)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := Open(ctx, Options{Format: "text"}, p)
	if err != nil {
		t.Fatal(err)
	}
	ds.Close()
	b, err := os.ReadFile(p + IndexExt)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(b[8:], 3)
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], crc32.MakeTable(crc32.Castagnoli)))
	if err := os.WriteFile(p+IndexExt, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, Options{Format: "text", Index: IndexVerify}, p); !errors.Is(err, ErrStaleIndex) {
		t.Fatalf("verifying a version 3 index: %v", err)
	}
	ds, err = Open(ctx, Options{Format: "text"}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	for id := range ds.Len() {
		if string(record(t, ds, id)) != want[id] {
			t.Fatalf("record %d read wrong", id)
		}
	}
	if nb, _ := os.ReadFile(p + IndexExt); binary.LittleEndian.Uint32(nb[8:]) == 3 {
		t.Fatal("the old index was not replaced")
	}
}

// The index directory is the user's own: made 0700 with files 0600, and
// one another user owns, or anyone may write, is not used (the index is
// built, and not kept there).
func TestIndexDirPrivate(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "d.txt")
	want, data := lines(50, 4)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cache", "riffle")
	ds, err := Open(ctx, Options{Format: "text", IndexDir: dir, IndexInDirOnly: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	ds.Close()
	idx := IndexPaths(p, dir, true)[0]
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o700}, {idx, 0o600}} {
		st, err := os.Stat(c.path)
		if err != nil || st.Mode().Perm() != c.mode {
			t.Fatalf("%s: %v %v, want mode %v", c.path, st.Mode(), err, c.mode)
		}
	}

	for _, d := range privdirtest.UnsafeDirs(t) {
		ds, err := Open(ctx, Options{Format: "text", IndexDir: d, IndexInDirOnly: true}, p)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if string(record(t, ds, 7)) != want[7] {
			t.Fatalf("%s: record 7 read wrong", d)
		}
		ds.Close()
		if ents, _ := os.ReadDir(d); len(ents) != 0 {
			t.Fatalf("an index was kept in %s, which is not private", d)
		}
		if _, err := Open(ctx, Options{Format: "text", IndexDir: d, IndexInDirOnly: true, Index: IndexVerify}, p); err == nil ||
			!strings.Contains(err.Error(), d) {
			t.Fatalf("verifying in %s: %v", d, err)
		}
	}
}
