package corpus

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// docsOf makes n documents of varied lengths and token values.
func docsOf(n int, vocab int64) [][]int64 {
	docs := make([][]int64, n)
	for d := range docs {
		l := 1 + (d*37)%150
		docs[d] = make([]int64, l)
		for i := range docs[d] {
			docs[d][i] = int64(d*1000+i*7) % vocab
		}
	}
	return docs
}

// writeMegatron writes docs as prefix.bin and prefix.idx.
func writeMegatron(t *testing.T, prefix string, d Dtype, docs [][]int64) {
	t.Helper()
	var bin bytes.Buffer
	var lens []int64
	for _, doc := range docs {
		b := make([]byte, len(doc)*d.Size())
		d.put(b, doc)
		bin.Write(b)
		lens = append(lens, int64(len(doc)))
	}
	var idx bytes.Buffer
	if err := WriteIndex(&idx, d, lens); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prefix+".bin", bin.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prefix+".idx", idx.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readAll reads every document of c.
func readAll(t *testing.T, c *Corpus) [][]int64 {
	t.Helper()
	out := make([][]int64, c.Docs())
	for d := range out {
		out[d] = make([]int64, c.Len(d))
		if err := c.Read(context.Background(), d, 0, out[d]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func equalDocs(t *testing.T, got, want [][]int64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d documents, want %d", len(got), len(want))
	}
	for d := range got {
		if !slices.Equal(got[d], want[d]) {
			t.Fatalf("document %d: %v, want %v", d, got[d], want[d])
		}
	}
}

func TestMegatronEveryDtype(t *testing.T) {
	for _, d := range []Dtype{Uint8, Int8, Int16, Uint16, Int32, Int64} {
		t.Run(d.String(), func(t *testing.T) {
			dir := t.TempDir()
			vocab := int64(120)
			docs := docsOf(200, vocab)
			writeMegatron(t, filepath.Join(dir, "a"), d, docs[:130])
			writeMegatron(t, filepath.Join(dir, "b"), d, docs[130:])
			// A prefix, a .idx name, a .bin name and a glob all name
			// the same corpus.
			for _, names := range [][]string{
				{filepath.Join(dir, "a"), filepath.Join(dir, "b")},
				{filepath.Join(dir, "a.idx"), filepath.Join(dir, "b.bin")},
				{filepath.Join(dir, "*.idx")},
				{filepath.Join(dir, "*")},
			} {
				c, err := Open(context.Background(), Options{Vocab: vocab}, names...)
				if err != nil {
					t.Fatalf("%v: %v", names, err)
				}
				if c.Info().Format != "megatron" || c.Dtype() != d || c.Docs() != 200 {
					t.Fatalf("%v: %+v", names, c.Info())
				}
				equalDocs(t, readAll(t, c), docs)
				// Tokens in the middle of a document, past a checkpoint.
				got := make([]int64, 5)
				if err := c.Read(context.Background(), 151, 3, got); err != nil || !slices.Equal(got, docs[151][3:8]) {
					t.Fatalf("document 151 tokens 3..8: %v %v, want %v", got, err, docs[151][3:8])
				}
				c.Close()
			}
		})
	}
}

// corrupt writes a good corpus, changes its .idx or .bin, and opens it.
func corrupt(t *testing.T, edit func(idx, bin []byte) ([]byte, []byte)) (string, error) {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "c")
	writeMegatron(t, p, Uint16, docsOf(100, 500))
	idx, _ := os.ReadFile(p + ".idx")
	bin, _ := os.ReadFile(p + ".bin")
	idx, bin = edit(idx, bin)
	os.WriteFile(p+".idx", idx, 0o644)
	os.WriteFile(p+".bin", bin, 0o644)
	c, err := Open(context.Background(), Options{}, p)
	if err == nil {
		c.Close()
	}
	return p, err
}

// TestMegatronBadInput: each damage is an error naming the file and the
// byte offset where it shows, never a corpus that reads wrong tokens.
func TestMegatronBadInput(t *testing.T) {
	const n = 100
	ptrAt := int64(idxHeader + 4*n)
	put64 := func(b []byte, at int64, v uint64) []byte { binary.LittleEndian.PutUint64(b[at:], v); return b }
	put32 := func(b []byte, at int64, v uint32) []byte { binary.LittleEndian.PutUint32(b[at:], v); return b }
	cases := []struct {
		name   string
		edit   func(idx, bin []byte) ([]byte, []byte)
		file   string // the file the error names
		offset func(idx, bin []byte) int64
		is     error
		says   string
	}{
		{"bin shorter than its index says", func(idx, bin []byte) ([]byte, []byte) { return idx, bin[:len(bin)-3] },
			".bin", func(_, bin []byte) int64 { return int64(len(bin)) - 3 }, io.ErrUnexpectedEOF, "shorter than its index says"},
		{"pointer past the end", func(idx, bin []byte) ([]byte, []byte) { return put64(idx, ptrAt+8*7, 1<<40), bin },
			".idx", func(_, _ []byte) int64 { return ptrAt + 8*7 }, ErrCorrupt, "past the end"},
		{"pointer not monotone", func(idx, bin []byte) ([]byte, []byte) { return put64(idx, ptrAt+8*9, 2), bin },
			".idx", func(_, _ []byte) int64 { return ptrAt + 8*9 }, ErrCorrupt, "not monotone"},
		{"dtype code not Megatron's", func(idx, bin []byte) ([]byte, []byte) { idx[17] = 9; return idx, bin },
			".idx", func(_, _ []byte) int64 { return 17 }, ErrCorrupt, "not Megatron's"},
		{"float dtype code", func(idx, bin []byte) ([]byte, []byte) { idx[17] = 6; return idx, bin },
			".idx", func(_, _ []byte) int64 { return 17 }, ErrUnsupported, "float64"},
		{"float32 dtype code", func(idx, bin []byte) ([]byte, []byte) { idx[17] = 7; return idx, bin },
			".idx", func(_, _ []byte) int64 { return 17 }, ErrUnsupported, "float32"},
		{"empty document", func(idx, bin []byte) ([]byte, []byte) { return put32(idx, idxHeader+4*12, 0), bin },
			".idx", func(_, _ []byte) int64 { return idxHeader + 4*12 }, ErrCorrupt, "sequence 12 is empty"},
		{"negative length", func(idx, bin []byte) ([]byte, []byte) { return put32(idx, idxHeader+4*3, 0xFFFFFFF0), bin },
			".idx", func(_, _ []byte) int64 { return idxHeader + 4*3 }, ErrCorrupt, "negative"},
		{"truncated index", func(idx, bin []byte) ([]byte, []byte) { return idx[:len(idx)-5], bin },
			".idx", func(idx, _ []byte) int64 { return int64(len(idx)) - 5 }, ErrCorrupt, "cut short"},
		{"index cut inside its header", func(idx, bin []byte) ([]byte, []byte) { return idx[:20], bin },
			".idx", func(_, _ []byte) int64 { return 20 }, ErrCorrupt, "inside its 34-byte header"},
		{"not an index", func(idx, bin []byte) ([]byte, []byte) { copy(idx, "PK\x03\x04"); return idx, bin },
			".idx", func(_, _ []byte) int64 { return 0 }, ErrCorrupt, "not a Megatron index"},
		{"version 2", func(idx, bin []byte) ([]byte, []byte) { return put64(idx, 9, 2), bin },
			".idx", func(_, _ []byte) int64 { return 9 }, ErrUnsupported, "version 2"},
		{"counts past the file", func(idx, bin []byte) ([]byte, []byte) { return put64(idx, 18, 1<<50), bin },
			".idx", func(_, _ []byte) int64 { return 18 }, ErrCorrupt, "more than its"},
		{"multimodal with an image", func(idx, bin []byte) ([]byte, []byte) {
			modes := make([]byte, n)
			modes[40] = 1
			return append(idx, modes...), bin
		}, ".idx", func(idx, _ []byte) int64 { return int64(len(idx)) + 40 }, ErrUnsupported, "sequence 40 has mode 1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var idx0, bin0 []byte
			p, err := corrupt(t, func(idx, bin []byte) ([]byte, []byte) {
				idx0, bin0 = slices.Clone(idx), slices.Clone(bin)
				return c.edit(idx, bin)
			})
			if err == nil {
				t.Fatal("opened")
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Path != p+c.file || fe.Offset != c.offset(idx0, bin0) || !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("error %v: want a FormatError of %s at %d, %v, saying %q", err, p+c.file, c.offset(idx0, bin0), c.is, c.says)
			}
		})
	}
}

func TestMegatronMultimodalText(t *testing.T) {
	p, err := corrupt(t, func(idx, bin []byte) ([]byte, []byte) { return append(idx, make([]byte, 100)...), bin })
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(context.Background(), Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !c.Info().Multimodal || c.Docs() != 100 {
		t.Fatalf("%+v", c.Info())
	}
	equalDocs(t, readAll(t, c), docsOf(100, 500))
}

// TestVocab: a token at or above the stated vocabulary is an error
// naming the .bin and the token's byte offset when it is read.
func TestVocab(t *testing.T) {
	dir := t.TempDir()
	docs := docsOf(10, 50)
	docs[6][4] = 50
	p := filepath.Join(dir, "v")
	writeMegatron(t, p, Int32, docs)
	c, err := Open(context.Background(), Options{Vocab: 50}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Read(context.Background(), 5, 0, make([]int64, c.Len(5))); err != nil {
		t.Fatal(err)
	}
	err = c.Read(context.Background(), 6, 0, make([]int64, c.Len(6)))
	var fe *FormatError
	want := 4 * (c.Start(6) + 4)
	if !errors.As(err, &fe) || !errors.Is(err, ErrVocab) || fe.Path != p+".bin" || fe.Offset != want {
		t.Fatalf("error %v: want ErrVocab at %s offset %d", err, p+".bin", want)
	}
	// A negative token of a signed dtype is refused without a vocabulary.
	docs[6][4] = -3
	writeMegatron(t, p, Int32, docs)
	c2, err := Open(context.Background(), Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := c2.Read(context.Background(), 6, 0, make([]int64, c2.Len(6))); !errors.Is(err, ErrVocab) {
		t.Fatalf("negative token: %v", err)
	}
}

func TestFlat(t *testing.T) {
	dir := t.TempDir()
	toks := []int64{5, 6, 0, 7, 8, 9, 0, 3}
	b := make([]byte, 2*len(toks))
	Uint16.put(b, toks)
	p := filepath.Join(dir, "train.bin")
	os.WriteFile(p, b, 0o644)
	if _, err := Open(context.Background(), Options{}, p); err == nil || !strings.Contains(err.Error(), "dtype") {
		t.Fatalf("a flat file without a dtype: %v", err)
	}
	c, err := Open(context.Background(), Options{Dtype: Uint16, EOD: 0, HasEOD: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Info().Format != "flat" || !c.InBand() || c.Docs() != 1 || c.Len(0) != 8 {
		t.Fatalf("%+v", c.Info())
	}
	equalDocs(t, readAll(t, c), [][]int64{toks})
	lens, err := EODLengths(context.Background(), c)
	if err != nil || !slices.Equal(lens, []int64{3, 4, 1}) {
		t.Fatalf("EOD lengths %v %v", lens, err)
	}
	// A cut token is an error naming where the whole tokens end.
	os.WriteFile(p, b[:len(b)-1], 0o644)
	_, err = Open(context.Background(), Options{Dtype: Uint16}, p)
	var fe *FormatError
	if !errors.As(err, &fe) || fe.Offset != int64(len(b)-2) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a cut token: %v", err)
	}
}

// TestArrow reads a list<int32> column written by arrow-go, in several
// record batches, and refuses other columns and nulls by name.
func TestArrow(t *testing.T) {
	dir := t.TempDir()
	docs := docsOf(300, 1000)
	sc := arrow.NewSchema([]arrow.Field{{Name: "text", Type: arrow.BinaryTypes.String}, {Name: "input_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32)}}, nil)
	p := filepath.Join(dir, "tok.arrow")
	f, _ := os.Create(p)
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(sc))
	if err != nil {
		t.Fatal(err)
	}
	for lo := 0; lo < len(docs); lo += 70 {
		bld := array.NewRecordBuilder(memory.DefaultAllocator, sc)
		for _, d := range docs[lo:min(lo+70, len(docs))] {
			bld.Field(0).(*array.StringBuilder).Append("x")
			lb := bld.Field(1).(*array.ListBuilder)
			lb.Append(true)
			for _, v := range d {
				lb.ValueBuilder().(*array.Int32Builder).Append(int32(v))
			}
		}
		rec := bld.NewRecordBatch()
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
		bld.Release()
	}
	w.Close()
	f.Close()
	opts := Options{IndexDir: t.TempDir(), IndexInDirOnly: true}
	c, err := Open(context.Background(), opts, p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dtype() != Int32 || c.Docs() != 300 || len(c.runs) != 5 {
		t.Fatalf("%+v, %d runs", c.Info(), len(c.runs))
	}
	equalDocs(t, readAll(t, c), docs)
	c.Close()
	opts.Column = "text"
	if _, err := Open(context.Background(), opts, p); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "not a list of integer") {
		t.Fatalf("a string column: %v", err)
	}

	// A null row is refused by name: no token id stands for it.
	sc = arrow.NewSchema([]arrow.Field{{Name: "input_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int64), Nullable: true}}, nil)
	rec, _, err := array.RecordFromJSON(memory.DefaultAllocator, sc, strings.NewReader(`[{"input_ids": [1, 2]}, {"input_ids": null}, {"input_ids": [3]}]`))
	if err != nil {
		t.Fatal(err)
	}
	p = filepath.Join(dir, "nulls.arrow")
	f, _ = os.Create(p)
	w, _ = ipc.NewFileWriter(f, ipc.WithSchema(sc))
	w.Write(rec)
	w.Close()
	f.Close()
	opts.Column = ""
	if _, err := Open(context.Background(), opts, p); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "nulls") {
		t.Fatalf("a null row: %v", err)
	}

	// Compressed record batches are read from their blocks unpacked.
	rec, _, err = array.RecordFromJSON(memory.DefaultAllocator, sc, strings.NewReader(`[{"input_ids": [1, 2]}, {"input_ids": [3]}]`))
	if err != nil {
		t.Fatal(err)
	}
	p = filepath.Join(dir, "lz4.arrow")
	f, _ = os.Create(p)
	w, _ = ipc.NewFileWriter(f, ipc.WithSchema(sc), ipc.WithLZ4())
	w.Write(rec)
	w.Close()
	f.Close()
	c, err = Open(context.Background(), opts, p)
	if err != nil {
		t.Fatalf("a compressed file: %v", err)
	}
	defer c.Close()
	if !c.Packed() {
		t.Fatalf("a compressed file's corpus is not packed")
	}
	equalDocs(t, readAll(t, c), [][]int64{{1, 2}, {3}})
}
