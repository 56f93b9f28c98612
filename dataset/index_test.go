package dataset_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	. "github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir/privdirtest"
	"github.com/riffle-ml/riffle/internal/synth"
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

// forge rewrites the offset table of the index at from into to, as
// change makes its offsets, its checksum fixed: what another user who can
// write beside the data can plant.
func forge(t *testing.T, from, to string, change func(offs []uint64)) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	count := binary.LittleEndian.Uint64(b[32:])
	offs := make([]uint64, count+1)
	for i := range offs {
		offs[i] = binary.LittleEndian.Uint64(b[48+8*i:])
	}
	change(offs)
	for i, o := range offs {
		binary.LittleEndian.PutUint64(b[48+8*i:], o)
	}
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], crc32.MakeTable(crc32.Castagnoli)))
	if err := os.WriteFile(to, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// An index beside the data is read only where the daemon would trust a
// cache directory: in a data directory another user can write, or owns,
// one planted there (every offset shifted, its checksum fixed: each
// record read wrong) is not read, and the index is built and kept in the
// index directory; in a directory of ours, one anyone may write, or
// (as root) another user owns, is not read either.
func TestForgedIndexBesideTheData(t *testing.T) {
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	ctx := context.Background()
	want, data := lines(300, 5)
	shift := func(offs []uint64) {
		for i := 1; i < len(offs)-1; i++ {
			offs[i]++
		}
	}
	// check reads p's records, and finds the index kept in idx, or (a
	// directory of ours) beside the data, ours in place of the planted.
	check := func(t *testing.T, p, idx string, beside bool) {
		t.Helper()
		ds, err := Open(ctx, Options{Format: "text", IndexDir: idx}, p)
		if err != nil {
			t.Fatal(err)
		}
		defer ds.Close()
		wrong := 0
		for id := range ds.Len() {
			if string(record(t, ds, id)) != want[id] {
				wrong++
			}
		}
		if wrong > 0 || ds.Len() != len(want) {
			t.Fatalf("%d of %d records read wrong through a planted index", wrong, ds.Len())
		}
		kept := IndexPaths(p, idx, true)[0]
		if beside {
			kept = p + IndexExt
		}
		var st unix.Stat_t
		if err := unix.Stat(kept, &st); err != nil || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
			t.Fatalf("the index kept at %s: %v, owner %d mode %o", kept, err, st.Uid, st.Mode&0o777)
		}
	}
	plant := func(t *testing.T, dir string) (p, idx string) {
		p = filepath.Join(dir, "d.txt")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		idx = filepath.Join(t.TempDir(), "idx")
		ds, err := Open(ctx, Options{Format: "text", IndexDir: idx, IndexInDirOnly: true}, p)
		if err != nil {
			t.Fatal(err)
		}
		ds.Close()
		forge(t, IndexPaths(p, idx, true)[0], p+IndexExt, shift)
		os.Remove(IndexPaths(p, idx, true)[0])
		return p, idx
	}
	for _, d := range privdirtest.UnsafeDirs(t) {
		t.Run(filepath.Base(d)+" directory", func(t *testing.T) {
			p, idx := plant(t, d)
			check(t, p, idx, false)
		})
	}
	t.Run("file anyone may write", func(t *testing.T) {
		p, idx := plant(t, t.TempDir())
		if err := os.Chmod(p+IndexExt, 0o666); err != nil {
			t.Fatal(err)
		}
		check(t, p, idx, true)
	})
	if os.Geteuid() == 0 {
		t.Run("file another user owns", func(t *testing.T) {
			p, idx := plant(t, t.TempDir())
			if err := os.Chown(p+IndexExt, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			check(t, p, idx, true)
		})
	}
	// In a directory of ours, the index is kept beside the data.
	p := filepath.Join(t.TempDir(), "d.txt")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := Open(ctx, Options{Format: "text", IndexDir: filepath.Join(t.TempDir(), "idx")}, p)
	if err != nil {
		t.Fatal(err)
	}
	ds.Close()
	if _, err := os.Stat(p + IndexExt); err != nil {
		t.Fatalf("no index beside data in a directory of ours: %v", err)
	}
}

// An index that no scan of its format makes is refused where it is
// trusted too, and rebuilt: records of no bytes (a line's span without
// its newline, which reached the client as length -1 and, shuffled,
// panicked the daemon), a TFRecord frame shorter than its 16 bytes, a
// tar sample off its 512-byte blocks. A TFRecord index shifted within
// the file, read with skip_crc, is an error naming the file and offset at
// the record: its frame's length and CRC are checked still.
func TestIndexOfNoScan(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	want, data := lines(50, 6)
	p := filepath.Join(dir, "d.txt")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(p string, opts Options) Dataset {
		t.Helper()
		ds, err := Open(ctx, opts, p)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	open(p, Options{Format: "text"}).Close()
	forge(t, p+IndexExt, p+IndexExt, func(offs []uint64) { offs[3] = offs[2] })
	if _, err := Open(ctx, Options{Format: "text", Index: IndexVerify}, p); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "record 2 spans 0 bytes") {
		t.Fatalf("verifying an index of a zero-width line: %v", err)
	}
	ds := open(p, Options{Format: "text"})
	for id := range ds.Len() {
		if string(record(t, ds, id)) != want[id] {
			t.Fatalf("record %d read wrong after the index was rebuilt", id)
		}
	}
	ds.Close()

	tf := filepath.Join(dir, "d.tfrecord")
	if err := synth.WriteTFRecord(tf, 20); err != nil {
		t.Fatal(err)
	}
	open(tf, Options{}).Close()
	good, _ := os.ReadFile(tf + IndexExt)
	forge(t, tf+IndexExt, tf+IndexExt, func(offs []uint64) { offs[5] = offs[4] + 15 })
	if _, err := Open(ctx, Options{Index: IndexVerify}, tf); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("verifying an index of a 15-byte TFRecord frame: %v", err)
	}
	os.WriteFile(tf+IndexExt, good, 0o644)
	forge(t, tf+IndexExt, tf+IndexExt, func(offs []uint64) { offs[5] += 3 })
	ds = open(tf, Options{SkipCRC: true, Index: IndexVerify})
	defer ds.Close()
	loc := ds.Locate(5)
	head, tail := ds.(Framed).Frame()
	frame := make([]byte, head+loc.Len+tail)
	if err := ds.Object(0).ReadAt(ctx, frame, loc.Off-int64(head)); err != nil {
		t.Fatal(err)
	}
	var fe *FormatError
	if err := ds.(Framed).Verify(5, frame); !errors.As(err, &fe) || fe.Path != tf || fe.Offset != loc.Off-int64(head)+8 {
		t.Fatalf("a TFRecord index shifted 3 bytes, with skip_crc: %v, want a length CRC error at %d of %s", err, loc.Off-int64(head)+8, tf)
	}
}

// Record hashes (dedup's) are kept as indexes are: a hash file planted in
// a directory another user can write, saying every record is the same,
// is not read (dedup would keep one record of all), and none is kept
// there.
func TestRecordHashesPrivate(t *testing.T) {
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	ctx := context.Background()
	p := filepath.Join(t.TempDir(), "d.txt")
	_, data := lines(100, 7)
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := Open(ctx, Options{Format: "text", IndexDir: t.TempDir()}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	mine := t.TempDir()
	want, fresh, err := RecordHashes(ctx, ds, mine)
	if err != nil || !fresh {
		t.Fatalf("hashes: fresh %v, %v", fresh, err)
	}
	ents, _ := os.ReadDir(mine)
	if len(ents) != 1 {
		t.Fatalf("%d files kept in %s, want the hashes", len(ents), mine)
	}
	b, _ := os.ReadFile(filepath.Join(mine, ents[0].Name()))
	for i := 8; i < len(b); i++ {
		b[i] = 0 // every record's hash the same
	}
	for _, d := range privdirtest.UnsafeDirs(t) {
		planted := filepath.Join(d, ents[0].Name())
		if err := os.WriteFile(planted, b, 0o644); err != nil {
			t.Fatal(err)
		}
		got, fresh, err := RecordHashes(ctx, ds, d)
		if err != nil || !fresh || !slices.Equal(got, want) {
			t.Fatalf("%s: hashes fresh %v, %v, the records' own: %v", d, fresh, err, slices.Equal(got, want))
		}
		if ents, _ := os.ReadDir(d); len(ents) != 1 {
			t.Fatalf("%d files in %s, which is not private", len(ents), d)
		}
	}
}
