package dataset_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	. "github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/storage"
)

// record reads record id of ds the way the loader does, checking frames.
func record(t *testing.T, ds Dataset, id int) []byte {
	t.Helper()
	loc := ds.Locate(id)
	head, tail := 0, 0
	f, framed := ds.(Framed)
	if framed {
		head, tail = f.Frame()
	}
	b := make([]byte, loc.Len+head+tail)
	if err := ds.Object(loc.Object).ReadAt(context.Background(), b, loc.Off-int64(head)); err != nil {
		t.Fatalf("record %d: %v", id, err)
	}
	if framed && head+tail > 0 {
		if err := f.Verify(id, b); err != nil {
			t.Fatalf("record %d: %v", id, err)
		}
	}
	return b[head : head+loc.Len]
}

func TestFormats(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	fixed := filepath.Join(dir, "a.bin")
	must(synth.WriteFixed(fixed, 100, 64, 16))
	npy := filepath.Join(dir, "a.npy")
	must(synth.WriteNpy(npy, 50, 3))
	tf := filepath.Join(dir, "a.tfrecord")
	must(synth.WriteTFRecord(tf, 77))
	lines := map[string]string{}
	for _, f := range []string{"libsvm", "jsonl", "text"} {
		lines[f] = filepath.Join(dir, "a."+map[string]string{"libsvm": "svm", "jsonl": "jsonl", "text": "txt"}[f])
		must(synth.WriteLines(lines[f], f, 123, false))
	}
	csv := filepath.Join(dir, "a.csv")
	must(synth.WriteLines(csv, "csv", 40, true))

	t.Run("fixed", func(t *testing.T) {
		ds, err := Open(context.Background(), Options{RecordSize: 64, HeaderBytes: 16}, fixed)
		must(err)
		defer ds.Close()
		if ds.Len() != 100 || ds.Info().RecordSize != 64 {
			t.Fatalf("len %d size %d", ds.Len(), ds.Info().RecordSize)
		}
		for id := range 100 {
			must(synth.CheckRecord(record(t, ds, id), id))
		}
	})
	t.Run("npy", func(t *testing.T) {
		ds, err := Open(context.Background(), Options{}, npy)
		must(err)
		defer ds.Close()
		inf := ds.Info()
		if ds.Len() != 50 || inf.Dtype != "<u8" || fmt.Sprint(inf.Shape) != "[3]" || inf.RecordSize != 24 {
			t.Fatalf("info %+v len %d", inf, ds.Len())
		}
		for id := range 50 {
			if got := synth.IDOf(record(t, ds, id)); got != id {
				t.Fatalf("row %d starts with %d", id, got)
			}
		}
	})
	t.Run("tfrecord", func(t *testing.T) {
		ds, err := Open(context.Background(), Options{}, tf)
		must(err)
		defer ds.Close()
		if ds.Len() != 77 {
			t.Fatalf("len %d", ds.Len())
		}
		for id := range 77 {
			must(synth.CheckRecord(record(t, ds, id), id))
		}
	})
	for f, p := range lines {
		t.Run(f, func(t *testing.T) {
			ds, err := Open(context.Background(), Options{}, p)
			must(err)
			defer ds.Close()
			if ds.Len() != 123 || ds.Info().Format != f {
				t.Fatalf("len %d format %s", ds.Len(), ds.Info().Format)
			}
			for id := range 123 {
				if got, want := string(record(t, ds, id)), synth.Line(f, id); got != want {
					t.Fatalf("line %d: %q, want %q", id, got, want)
				}
			}
		})
	}
	t.Run("csv", func(t *testing.T) {
		ds, err := Open(context.Background(), Options{CSVHeader: true}, csv)
		must(err)
		defer ds.Close()
		if ds.Len() != 40 || ds.Info().Header != "id,text,n" {
			t.Fatalf("len %d header %q", ds.Len(), ds.Info().Header)
		}
		for id := range 40 {
			if got, want := string(record(t, ds, id)), synth.Line("csv", id); got != want {
				t.Fatalf("csv record %d: %q, want %q", id, got, want)
			}
		}
	})
	t.Run("shards", func(t *testing.T) {
		for i := range 3 {
			must(synth.WriteTFRecord(filepath.Join(dir, fmt.Sprintf("s.tfrecord-%05d", i)), 10+i))
		}
		ds, err := Open(context.Background(), Options{}, filepath.Join(dir, "s.tfrecord-*"))
		must(err)
		defer ds.Close()
		if ds.Len() != 33 || len(ds.Info().Paths) != 3 {
			t.Fatalf("len %d paths %v", ds.Len(), ds.Info().Paths)
		}
		id := 0
		for k := range 3 {
			for i := range 10 + k {
				loc := ds.Locate(id)
				if loc.Object != k {
					t.Fatalf("record %d in object %d, want %d", id, loc.Object, k)
				}
				must(synth.CheckRecord(record(t, ds, id), i))
				id++
			}
		}
	})
	t.Run("dir", func(t *testing.T) {
		root := filepath.Join(dir, "tree")
		must(synth.WriteTree(root, []string{"zebra", "ant", "cat"}, 5))
		must(os.WriteFile(filepath.Join(root, "ant", ".hidden"), []byte("x"), 0o644))
		ds, err := Open(context.Background(), Options{}, root)
		must(err)
		defer ds.Close()
		inf := ds.Info()
		if ds.Len() != 15 || fmt.Sprint(inf.Classes) != "[ant cat zebra]" {
			t.Fatalf("len %d classes %v", ds.Len(), inf.Classes)
		}
		// WriteTree numbered zebra's files 0-4, ant's 5-9, cat's 10-14;
		// sorted classes put ant first.
		written := map[string]int{"zebra": 0, "ant": 5, "cat": 10}
		for id := range 15 {
			class := inf.Classes[ds.Label(id)]
			if class != []string{"ant", "cat", "zebra"}[id/5] {
				t.Fatalf("record %d labelled %s", id, class)
			}
			must(synth.CheckRecord(record(t, ds, id), written[class]+id%5))
		}
	})
}

// openErr opens a dataset that must fail and returns the error.
func openErr(t *testing.T, opts Options, path string) error {
	t.Helper()
	ds, err := Open(context.Background(), opts, path)
	if err == nil {
		ds.Close()
		t.Fatalf("%s opened without error", path)
	}
	return err
}

// Bad input gets a clear error that names the file and the offset.
func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	goodTF := dataset0(t, dir)
	badCRC := append([]byte{}, goodTF...)
	badCRC[len(badCRC)-6] ^= 0xff // inside the last record's data
	badLen := append([]byte{}, goodTF...)
	badLen[0] ^= 1

	cases := []struct {
		name   string
		path   string
		opts   Options
		is     error
		offset int64
	}{
		{"fixed size not a multiple", write("odd.bin", make([]byte, 1000)), Options{RecordSize: 64}, ErrPartial, 960},
		{"fixed shorter than header", write("short.bin", make([]byte, 10)), Options{RecordSize: 64, HeaderBytes: 16}, ErrPartial, 10},
		{"unterminated csv quote", write("q.csv", []byte("1,2\n\"open,3\n4,5\n")), Options{}, ErrCorrupt, 4},
		{"tfrecord length crc", write("len.tfrecord", badLen), Options{}, ErrCRC, 8},
		{"tfrecord cut short", write("cut.tfrecord", goodTF[:len(goodTF)-3]), Options{}, ErrPartial, int64(len(goodTF)) - (12 + 57 + 4)}, // the last frame starts there
		{"tfrecord cut in a header", write("head.tfrecord", goodTF[:len(goodTF)-(57+4+7)]), Options{}, ErrPartial, int64(len(goodTF)) - (12 + 57 + 4)},
		{"npy bad magic", write("bad.npy", []byte("not an npy file at all")), Options{}, ErrCorrupt, 0},
		{"npy too short for shape", write("short.npy", npyBytes(t, dir)[:200]), Options{}, ErrPartial, 200},
		{"empty fixed", write("empty.bin", nil), Options{RecordSize: 8}, ErrEmpty, -1},
		{"empty lines", write("empty.txt", nil), Options{}, ErrEmpty, -1},
		{"unknown format", write("x.unknown", []byte("abc")), Options{}, ErrUnknownFormat, -1},
		// Object arrays as numpy writes them now and as older numpy did (the size of a pointer), and as a field.
		{"npy object array", write("obj.npy", npyWithDescr("'|O'", 3)), Options{}, ErrUnsupported, -1},
		{"npy object array of old numpy", write("obj8.npy", npyWithDescr("'|O8'", 3)), Options{}, ErrUnsupported, -1},
		{"npy object field", write("objf.npy", npyWithDescr("[('id', '<i8'), ('meta', '|O8')]", 3)), Options{}, ErrUnsupported, -1},
	}
	// What a message says where it is not plain from the error and offset:
	// a frame cut in its header has no end to say.
	says := map[string]string{
		"tfrecord cut short":       fmt.Sprintf("frame ends at %d", len(goodTF)),
		"tfrecord cut in a header": "5 of its 12-byte header there",
		// Why riffle refuses it, and what to save instead.
		"npy object array":              "pickled Python objects, which riffle does not unpickle",
		"npy object array of old numpy": "save instead a fixed-dtype array",
		"npy object field":              "a structured dtype for rows of several fields, or one record per file",
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := openErr(t, c.opts, c.path)
			if !errors.Is(err, c.is) {
				t.Fatalf("error %v, want %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.path) {
				t.Fatalf("error %q does not name %s", err, c.path)
			}
			if want := says[c.name]; !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not say %q", err, want)
			}
			if c.offset >= 0 {
				var fe *FormatError
				if !errors.As(err, &fe) || fe.Offset != c.offset {
					t.Fatalf("error %v: want a FormatError at offset %d", err, c.offset)
				}
			}
		})
	}

	t.Run("tfrecord data crc on read", func(t *testing.T) {
		p := write("data.tfrecord", badCRC)
		ds, err := Open(context.Background(), Options{}, p)
		if err != nil {
			t.Fatal(err) // the index scan reads only frame headers' CRCs
		}
		defer ds.Close()
		last := ds.Len() - 1
		loc := ds.Locate(last)
		frame := make([]byte, loc.Len+16)
		ds.Object(0).ReadAt(context.Background(), frame, loc.Off-12)
		err = ds.(Framed).Verify(last, frame)
		var fe *FormatError
		if !errors.Is(err, ErrCRC) || !errors.As(err, &fe) || fe.Path != p || fe.Offset != loc.Off+int64(loc.Len) {
			t.Fatalf("error %v, want a data CRC error at %d of %s", err, loc.Off+int64(loc.Len), p)
		}
		ds2, err := Open(context.Background(), Options{SkipCRC: true}, p)
		if err != nil {
			t.Fatal(err)
		}
		defer ds2.Close()
		// SkipCRC reads the frame and checks its length and the length's
		// CRC (where the index says a record is), not the data's CRC.
		if err := ds2.(Framed).Verify(last, frame); err != nil {
			t.Fatalf("SkipCRC checks the data's CRC: %v", err)
		}
		binary.LittleEndian.PutUint64(frame, uint64(loc.Len+1))
		if err := ds2.(Framed).Verify(last, frame); !errors.Is(err, ErrCRC) || !errors.As(err, &fe) || fe.Offset != loc.Off-12+8 {
			t.Fatalf("SkipCRC, a frame whose length is not its own: %v, want a length CRC error at %d", err, loc.Off-12+8)
		}
	})
	t.Run("drop partial tail", func(t *testing.T) {
		ds, err := Open(context.Background(), Options{RecordSize: 64, DropPartialTail: true}, filepath.Join(dir, "odd.bin"))
		if err != nil || ds.Len() != 15 {
			t.Fatalf("len %v err %v, want 15 records", ds, err)
		}
		ds.Close()
		ds, err = Open(context.Background(), Options{DropPartialTail: true}, filepath.Join(dir, "cut.tfrecord"))
		if err != nil || ds.Len() != 3 {
			t.Fatalf("err %v, want 3 whole records", err)
		}
		ds.Close()
	})
	t.Run("unreadable", func(t *testing.T) {
		p := write("secret.bin", make([]byte, 64))
		os.Chmod(p, 0)
		defer os.Chmod(p, 0o644)
		if os.Geteuid() == 0 {
			// root reads anything; a missing file is unreadable for everyone.
			p = filepath.Join(dir, "missing.bin")
		}
		err := openErr(t, Options{RecordSize: 8}, p)
		var se *storage.Error
		if !errors.As(err, &se) || se.Object != p {
			t.Fatalf("error %v does not name %s", err, p)
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("error %v", err)
		}
	})
}

// dataset0 returns a TFRecord file of 4 records of 8..57 bytes.
func dataset0(t *testing.T, dir string) []byte {
	var b []byte
	for id := range 4 {
		b = AppendTFRecord(b, synth.Record(id, 8+id*(57-8)/3))
	}
	return b
}

// npyWithDescr is a version 1.0 .npy file of n rows of 8 bytes whose header names descr (a Python literal).
func npyWithDescr(descr string, n int) []byte {
	h := fmt.Sprintf("{'descr': %s, 'fortran_order': False, 'shape': (%d,), }", descr, n)
	for (10+len(h)+1)%64 != 0 {
		h += " "
	}
	h += "\n"
	b := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8))
	return append(append(b, h...), make([]byte, 8*n)...)
}

func npyBytes(t *testing.T, dir string) []byte {
	p := filepath.Join(dir, "src.npy")
	if err := synth.WriteNpy(p, 20, 4); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	return b
}

func TestSidecarIndex(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.jsonl")
	if err := synth.WriteLines(p, "jsonl", 500, false); err != nil {
		t.Fatal(err)
	}
	ds, err := Open(context.Background(), Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	ds.Close()
	side := p + IndexExt
	st, err := os.Stat(side)
	if err != nil {
		t.Fatalf("no sidecar: %v", err)
	}
	if st.Size() != indexHeaderBytes+8*501+4 {
		t.Fatalf("sidecar of %d bytes for 500 records: more than 8 bytes a record", st.Size())
	}

	t.Run("reused", func(t *testing.T) {
		// Make the sidecar's content distinguishable: if Open rebuilt it, the
		// mtime would change.
		old := time.Now().Add(-time.Hour)
		os.Chtimes(side, old, old)
		ds, err := Open(context.Background(), Options{Index: IndexVerify}, p)
		if err != nil {
			t.Fatal(err)
		}
		ds.Close()
		if st, _ := os.Stat(side); !st.ModTime().Equal(old) {
			t.Fatal("a valid sidecar was rebuilt")
		}
	})
	t.Run("stale", func(t *testing.T) {
		f, _ := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
		f.WriteString(synth.Line("jsonl", 500) + "\n")
		f.Close()
		err := openErr(t, Options{Index: IndexVerify}, p)
		var fe *FormatError
		if !errors.Is(err, ErrStaleIndex) || !errors.As(err, &fe) || fe.Path != side {
			t.Fatalf("error %v, want a stale index error naming %s", err, side)
		}
		ds, err := Open(context.Background(), Options{}, p) // IndexAuto rebuilds
		if err != nil || ds.Len() != 501 {
			t.Fatalf("rebuilt: %v", err)
		}
		ds.Close()
	})
	t.Run("corrupt", func(t *testing.T) {
		b, _ := os.ReadFile(side)
		b[indexHeaderBytes+8*10] ^= 0x40
		os.WriteFile(side, b, 0o644)
		err := openErr(t, Options{Index: IndexVerify}, p)
		var fe *FormatError
		if !errors.Is(err, ErrCorrupt) || !errors.As(err, &fe) || fe.Path != side || fe.Offset != int64(len(b)-4) {
			t.Fatalf("error %v, want a checksum error at the end of %s", err, side)
		}
		ds, err := Open(context.Background(), Options{}, p)
		if err != nil || ds.Len() != 501 {
			t.Fatalf("rebuilt: %v", err)
		}
		ds.Close()
	})
	t.Run("read-only directory", func(t *testing.T) {
		if os.Geteuid() == 0 {
			// root writes anywhere; point the sidecar at an impossible place instead.
			ro := filepath.Join(dir, "ro")
			os.MkdirAll(ro, 0o755)
			q := filepath.Join(ro, "d.txt")
			synth.WriteLines(q, "text", 10, false)
			os.Mkdir(q+IndexExt, 0o755) // a directory where the sidecar would go
			cache := filepath.Join(dir, "cache")
			ds, err := Open(context.Background(), Options{IndexDir: cache}, q)
			if err != nil {
				t.Fatal(err)
			}
			ds.Close()
			if m, _ := filepath.Glob(filepath.Join(cache, "*"+IndexExt)); len(m) != 1 {
				t.Fatalf("no index in the cache directory: %v", m)
			}
			return
		}
	})
}

func TestExpandPaths(t *testing.T) {
	local, _ := storage.NewLocal(false, nil)
	if _, err := ExpandPaths(context.Background(), local, []string{filepath.Join(t.TempDir(), "*.none")}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("glob matching nothing: %v", err)
	}
}

func TestDetectFormat(t *testing.T) {
	for name, want := range map[string]string{
		"a.npy": "npy", "b.tfrecords": "tfrecord", "train.tfrecord-00001-of-00002": "tfrecord",
		"c.jsonl": "jsonl", "d.csv": "csv", "e.svm": "libsvm", "f.bin": "fixed", "g.jsonl.gz": "", "h": "",
	} {
		if got := DetectFormat(name); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
}

func TestScanLinesMatchesSplit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "big.txt")
	// Lines that straddle the scanner's chunk boundaries.
	var b bytes.Buffer
	for i := 0; b.Len() < 12<<20; i++ {
		b.WriteString(strings.Repeat("z", i%5000))
		b.WriteByte('\n')
	}
	os.WriteFile(p, b.Bytes(), 0o644)
	f, err := storage.OpenFile(p, storage.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	offs, _, _, err := ScanLines(context.Background(), f, 0, "text", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []int64{0}
	for i, c := range b.Bytes() {
		if c == '\n' {
			want = append(want, int64(i+1))
		}
	}
	if fmt.Sprint(offs) != fmt.Sprint(want) {
		t.Fatalf("%d offsets, want %d", len(offs), len(want))
	}
}

// indexHeaderBytes is the sidecar's header size, from the format in index.go.
const indexHeaderBytes = 48

func TestCancelledIndexBuild(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.jsonl")
	synth.WriteLines(p, "jsonl", 100000, false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, Options{}, p); !errors.Is(err, context.Canceled) {
		t.Fatalf("index build under a cancelled context: %v", err)
	}
	if _, err := os.Stat(p + IndexExt); err == nil {
		t.Fatal("a cancelled build left an index")
	}
}

// A file of no records among others (an empty tar shard, an empty JSONL
// file) adds none and takes none: the records after it are all there,
// each in its own file.
func TestEmptyFileAmongOthers(t *testing.T) {
	dir := t.TempDir()
	shard := func(name string, samples ...string) string {
		var b bytes.Buffer
		w := tar.NewWriter(&b)
		for _, s := range samples {
			w.WriteHeader(&tar.Header{Name: s + ".txt", Mode: 0o644, Size: int64(len(s))})
			w.Write([]byte(s))
		}
		w.Close()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lines := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name  string
		paths []string
		want  []string // each record's bytes contain it, in id order
		objs  []int    // and it lies in that file
	}{
		{"tar", []string{shard("a.tar", "a0", "a1", "a2"), shard("b.tar"), shard("c.tar", "c0", "c1")},
			[]string{"a0", "a1", "a2", "c0", "c1"}, []int{0, 0, 0, 2, 2}},
		{"tar first", []string{shard("e.tar"), shard("f.tar", "f0")}, []string{"f0"}, []int{1}},
		{"jsonl", []string{lines("a.jsonl", "{\"a\":0}\n{\"a\":1}\n"), lines("b.jsonl", ""), lines("c.jsonl", "{\"c\":0}\n")},
			[]string{`{"a":0}`, `{"a":1}`, `{"c":0}`}, []int{0, 0, 2}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ds, err := Open(context.Background(), Options{}, c.paths...)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			if ds.Len() != len(c.want) {
				t.Fatalf("%d records, want %d", ds.Len(), len(c.want))
			}
			for id, w := range c.want {
				if got := record(t, ds, id); !bytes.Contains(got, []byte(w)) || ds.Locate(id).Object != c.objs[id] {
					t.Errorf("record %d: %q in file %d, want %q in file %d", id, got, ds.Locate(id).Object, w, c.objs[id])
				}
			}
		})
	}
}
