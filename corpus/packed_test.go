package corpus

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/dataset"
)

// tokenRecord is docs as a record of one list<int32> column, input_ids;
// a nil document is a null list, and a token -1 a null element.
func tokenRecord(t *testing.T, docs [][]int64) arrow.RecordBatch {
	t.Helper()
	sc := arrow.NewSchema([]arrow.Field{{Name: "input_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true}}, nil)
	bld := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer bld.Release()
	lb := bld.Field(0).(*array.ListBuilder)
	vb := lb.ValueBuilder().(*array.Int32Builder)
	for _, d := range docs {
		if d == nil {
			lb.AppendNull()
			continue
		}
		lb.Append(true)
		for _, v := range d {
			if v < 0 {
				vb.AppendNull()
			} else {
				vb.Append(int32(v))
			}
		}
	}
	return bld.NewRecordBatch()
}

// writeParquet writes docs as a zstd Parquet file of row groups of rg
// rows and pages of about page bytes.
func writeParquet(t *testing.T, p string, docs [][]int64, rg int64, page int64) {
	t.Helper()
	rec := tokenRecord(t, docs)
	defer rec.Release()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Zstd), parquet.WithMaxRowGroupLength(rg),
		parquet.WithDataPageSize(page), parquet.WithDictionaryDefault(false))
	w, err := pqarrow.NewFileWriter(rec.Schema(), f, props, pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeLZ4 writes docs as an Arrow file of lz4 record batches of n rows.
func writeLZ4(t *testing.T, p string, docs [][]int64, n int) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	var w *ipc.FileWriter
	for lo := 0; lo < len(docs); lo += n {
		rec := tokenRecord(t, docs[lo:min(lo+n, len(docs))])
		if w == nil {
			if w, err = ipc.NewFileWriter(f, ipc.WithSchema(rec.Schema()), ipc.WithLZ4()); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
	}
	w.Close()
	f.Close()
}

// A packed corpus's documents are rows of its blocks: their lengths come
// from the dataset's index, their tokens from the blocks unpacked; a
// token outside the vocabulary names its file, block and document.
func TestPackedReads(t *testing.T) {
	dir := t.TempDir()
	docs := docsOf(500, 1000)
	for _, name := range []string{"tok.parquet", "tok.arrow"} {
		p := filepath.Join(dir, name)
		if strings.HasSuffix(name, ".parquet") {
			writeParquet(t, p, docs, 120, 1024)
		} else {
			writeLZ4(t, p, docs, 90)
		}
		opts := Options{IndexDir: t.TempDir(), IndexInDirOnly: true, Vocab: 1000}
		c, err := Open(context.Background(), opts, p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !c.Packed() || c.Docs() != len(docs) || c.Dtype() != Int32 {
			t.Fatalf("%s: %+v", name, c.Info())
		}
		equalDocs(t, readAll(t, c), docs)
		// Pieces inside documents.
		dst := make([]int64, 5)
		if err := c.Read(context.Background(), 77, 3, dst); err != nil || dst[0] != docs[77][3] || dst[4] != docs[77][7] {
			t.Fatalf("%s: tokens 3..8 of document 77: %v %v", name, dst, err)
		}
		c.Close()

		opts.Vocab = 100 // token 15 of a document is 105
		c, err = Open(context.Background(), opts, p)
		if err != nil {
			t.Fatal(err)
		}
		var fe *FormatError
		err = c.Read(context.Background(), 1, 0, make([]int64, c.Len(1)))
		if !errors.Is(err, ErrVocab) || !errors.As(err, &fe) || fe.Path != p || !strings.Contains(err.Error(), "document 1 (row 1), token 15 ") {
			t.Fatalf("%s: a token outside the vocabulary: %v", name, err)
		}
		c.Close()
	}
}

// Nulls are refused by name: a null list at open (a document of no
// tokens), a null token when its block is unpacked, naming the row.
func TestPackedNulls(t *testing.T) {
	dir := t.TempDir()
	docs := docsOf(300, 1000)
	withNullList := append(append([][]int64{}, docs[:200]...), nil)
	withNullList = append(withNullList, docs[200:]...)
	withNullToken := append([][]int64{}, docs...)
	withNullToken[123] = []int64{5, -1, 6}
	for _, name := range []string{"tok.parquet", "tok.arrow"} {
		write := func(p string, docs [][]int64) {
			if strings.HasSuffix(p, ".parquet") {
				writeParquet(t, p, docs, 100, 1024)
			} else {
				writeLZ4(t, p, docs, 70)
			}
		}
		opts := Options{IndexDir: t.TempDir(), IndexInDirOnly: true}
		p := filepath.Join(dir, "list-"+name)
		write(p, withNullList)
		_, err := Open(context.Background(), opts, p)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "row 200 is an empty document") || !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: a null list: %v", name, err)
		}
		p = filepath.Join(dir, "token-"+name)
		write(p, withNullToken)
		c, err := Open(context.Background(), opts, p)
		if err != nil {
			t.Fatal(err)
		}
		err = c.Read(context.Background(), 123, 0, make([]int64, 3))
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "row 123 ") || !strings.Contains(err.Error(), "element 1 of its list") || !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: a null token: %v", name, err)
		}
		c.Close()
	}
}

// A corrupt file is an error naming it, never a wrong document: cut
// short, or a page that fails to decompress, each found when the file is
// opened (its index is built by one pass over its pages; a file changed
// under an open corpus is refused by the store on the next read).
func TestPackedCorrupt(t *testing.T) {
	dir := t.TempDir()
	docs := docsOf(400, 1000)
	p := filepath.Join(dir, "tok.parquet")
	writeParquet(t, p, docs, 100, 1024)
	b, _ := os.ReadFile(p)
	cut := filepath.Join(dir, "cut.parquet")
	os.WriteFile(cut, b[:len(b)/2], 0o644)
	_, err := Open(context.Background(), Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, cut)
	if err == nil || !strings.Contains(err.Error(), cut) {
		t.Fatalf("a Parquet file cut short: %v", err)
	}

	c, err := Open(context.Background(), Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	// Garble the zstd frame of a page of document 250's page group
	// (pages of a row group that hold whole rows), past its header.
	l := c.Locate(250, 0, c.Len(250))
	c.Close()
	copy(b[l.Off+l.Len/2:], strings.Repeat("\xff", 64))
	bad := filepath.Join(dir, "bad.parquet")
	os.WriteFile(bad, b, 0o644)
	_, err = Open(context.Background(), Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, bad)
	var fe *FormatError
	if !errors.Is(err, dataset.ErrCorrupt) || !errors.As(err, &fe) || fe.Path != bad || fe.Offset < l.Off || fe.Offset >= l.Off+l.Len {
		t.Fatalf("a garbled page: %v, want an error at a page of the group at %d..%d", err, l.Off, l.Off+l.Len)
	}
}
