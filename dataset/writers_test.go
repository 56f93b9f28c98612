package dataset_test

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/pack"
	"github.com/riffle-ml/riffle/sampler"
)

// Files as other writers than riffle's tests make them (issue 23): what
// riffle cannot read yet is refused whole, by name; what it can is read
// whichever way the writer laid it out.

// readAllRows reads every row of ds in a shuffled order, as JSON lines by
// row id.
func readAllRows(t *testing.T, ds dataset.Dataset) []string {
	t.Helper()
	l, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len(), Seed: 3}, loader.Options{BatchSize: 16, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rows := make([]string, ds.Len())
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range batchRows(t, ds.Info().Schema, b) {
			rows[b.IDs[i]] = canon(t, line)
		}
		b.Release()
	}
	return rows
}

// writeRecord writes one record batch of JSON rows as an Arrow IPC file.
func writeRecord(t *testing.T, path string, sc *arrow.Schema, rows string) {
	t.Helper()
	rec, _, err := array.RecordFromJSON(memory.DefaultAllocator, sc, strings.NewReader(rows))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(sc))
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

// A column riffle does not read (a union) is never left out unseen: with
// no columns given the dataset is refused, naming the column, its type and
// the columns that read the others (views under lists among them); with
// those columns it opens. A Parquet struct of several leaves is read.
func TestUnreadColumnsRefused(t *testing.T) {
	dir := t.TempDir()
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "id", Type: arrow.PrimitiveTypes.Int64},
		{Name: "s", Type: arrow.BinaryTypes.StringView},
		{Name: "tags", Type: arrow.ListOf(arrow.BinaryTypes.StringView)},
		{Name: "text", Type: arrow.BinaryTypes.String},
		{Name: "image", Type: arrow.StructOf(
			arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary},
			arrow.Field{Name: "path", Type: arrow.ListOf(arrow.BinaryTypes.StringView)})},
		{Name: "u", Type: arrow.SparseUnionOf([]arrow.Field{{Name: "i", Type: arrow.PrimitiveTypes.Int32, Nullable: true}}, []arrow.UnionTypeCode{0})},
	}, nil)
	arrowPath := filepath.Join(dir, "views.arrow")
	writeRecord(t, arrowPath, sc, `[{"id":1,"s":"a","tags":["x"],"text":"x","image":{"bytes":"AQI=","path":["p"]},"u":[0,1]},{"id":2,"s":"b","tags":[],"text":"y","image":{"bytes":"","path":[]},"u":[0,2]}]`)

	pqPath := filepath.Join(dir, "struct.parquet")
	psc := arrow.NewSchema([]arrow.Field{
		{Name: "label", Type: arrow.PrimitiveTypes.Int32},
		{Name: "image", Type: arrow.StructOf(
			arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary},
			arrow.Field{Name: "path", Type: arrow.BinaryTypes.String})},
		{Name: "text", Type: arrow.BinaryTypes.String},
	}, nil)
	rec, _, err := array.RecordFromJSON(memory.DefaultAllocator, psc, strings.NewReader(`[{"label":1,"image":{"bytes":"AQI=","path":"p"},"text":"x"}]`))
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(pqPath)
	if err != nil {
		t.Fatal(err)
	}
	w, err := pqarrow.NewFileWriter(psc, f, parquet.NewWriterProperties(), pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		path    string
		want    []string
		columns []string
	}{
		{arrowPath, []string{`column "u" (sparse_union<i: type=int32, nullable=0>) cannot be read yet`, `pass columns=["id", "s", "tags", "text", "image"] to read the others`}, []string{"id", "s", "tags", "text", "image"}},
	} {
		t.Run(filepath.Base(c.path), func(t *testing.T) {
			_, err := dataset.Open(context.Background(), dataset.Options{}, c.path)
			if err == nil || !errors.Is(err, dataset.ErrUnsupported) {
				t.Fatalf("opened with every column: %v", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			ds, err := dataset.Open(context.Background(), dataset.Options{Columns: c.columns}, c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			if n := len(ds.Info().Columns); n != len(c.columns) {
				t.Fatalf("%d columns", n)
			}
		})
	}
	// A Parquet struct of several leaves is read (Hugging Face's Image),
	// whole or alone.
	for _, cols := range [][]string{nil, {"image"}} {
		ds, err := dataset.Open(context.Background(), dataset.Options{Columns: cols}, pqPath)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"image":{"bytes":"AQI=","path":"p"},"label":1,"text":"x"}`
		if cols != nil {
			want = `{"image":{"bytes":"AQI=","path":"p"}}`
		}
		if got := readAllRows(t, ds); len(got) != 1 || got[0] != canon(t, want) {
			t.Errorf("columns %v: rows %q, want %s", cols, got, want)
		}
		ds.Close()
	}
}

// Arrow's view types (what Polars writes strings as) read as strings and
// binaries, alone and under lists: every row, inline (12 bytes or less) or
// in a data buffer, in a stream and a file of several batches, equals
// arrow-go's reading.
func TestArrowViewsRead(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "id", Type: arrow.PrimitiveTypes.Int64},
		{Name: "s", Type: arrow.BinaryTypes.StringView, Nullable: true},
		{Name: "b", Type: arrow.BinaryTypes.BinaryView, Nullable: true},
		{Name: "rec", Type: arrow.StructOf(arrow.Field{Name: "v", Type: arrow.BinaryTypes.StringView, Nullable: true}), Nullable: true},
		{Name: "tags", Type: arrow.ListOf(arrow.BinaryTypes.StringView), Nullable: true},
		{Name: "blobs", Type: arrow.LargeListOf(arrow.StructOf(arrow.Field{Name: "b", Type: arrow.BinaryTypes.BinaryView, Nullable: true})), Nullable: true},
	}, nil)
	dir := t.TempDir()
	for _, stream := range []bool{true, false} {
		p := filepath.Join(dir, fmt.Sprintf("views-%v.arrow", stream))
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		var w interface {
			Write(arrow.RecordBatch) error
			Close() error
		}
		if stream {
			w = ipc.NewWriter(f, ipc.WithSchema(sc))
		} else if w, err = ipc.NewFileWriter(f, ipc.WithSchema(sc)); err != nil {
			t.Fatal(err)
		}
		id := 0
		for _, n := range []int{40, 0, 75} {
			var rows []string
			for range n {
				s := strings.Repeat("ab", id%17)
				tags := []any{}
				for k := range id % 4 {
					if (id+k)%5 == 1 {
						tags = append(tags, nil)
					} else {
						tags = append(tags, strings.Repeat("t", (id*k)%23)+fmt.Sprint(k))
					}
				}
				blobs := []any{}
				for k := range id % 3 {
					blobs = append(blobs, map[string]any{"b": base64.StdEncoding.EncodeToString([]byte(strings.Repeat("b", (id+k)%19)))})
				}
				row := map[string]any{"id": id, "s": s, "b": base64.StdEncoding.EncodeToString([]byte(s + "!")), "rec": map[string]any{"v": s + "é"},
					"tags": tags, "blobs": blobs}
				if id%6 == 2 {
					row["tags"] = nil
				}
				switch id % 7 {
				case 3:
					row["s"] = nil
				case 5:
					row["b"], row["rec"] = nil, nil
				}
				b, _ := json.Marshal(row)
				rows = append(rows, string(b))
				id++
			}
			rec, _, err := array.RecordFromJSON(memory.DefaultAllocator, sc, strings.NewReader("["+strings.Join(rows, ",")+"]"))
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Write(rec); err != nil {
				t.Fatal(err)
			}
			rec.Release()
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		want := readArrowRows(t, p, stream)
		ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
		if err != nil {
			t.Fatal(err)
		}
		got := readAllRows(t, ds)
		ds.Close()
		if len(got) != len(want) || len(want) != 115 {
			t.Fatalf("%d rows, want %d", len(got), len(want))
		}
		for i := range want {
			if got[i] != canon(t, want[i]) {
				t.Fatalf("stream=%v row %d:\n got %s\nwant %s", stream, i, got[i], want[i])
			}
		}
	}
}

// An IPC file whose only schema is its footer's (Polars' write_ipc and
// Arrow JS put no schema message after the magic) reads as arrow-go's
// own reader reads it. The file is arrow-go's with its schema message
// blanked: riffle must not look there.
func TestArrowFileSchemaFromFooter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "footer.arrow")
	want := writeArrow(t, p, false, []int{30, 7}, 5)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint32(b[8:]) != 0xFFFFFFFF {
		t.Fatal("no schema message after the magic")
	}
	n := int(binary.LittleEndian.Uint32(b[12:]))
	clear(b[8 : 16+n])
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	got := readAllRows(t, ds)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != canon(t, want[i]) {
			t.Fatalf("row %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

// A TFRecord file written compressed (GZIP or ZLIB, as TFRecordOptions
// writes them) under a plain name is refused as compressed, not as a CRC
// mismatch.
func TestCompressedTFRecordRefused(t *testing.T) {
	var plain []byte
	for _, r := range []string{"one", "two", "three"} {
		plain = dataset.AppendTFRecord(plain, []byte(r))
	}
	dir := t.TempDir()
	for _, codec := range []string{"GZIP", "ZLIB"} {
		var buf bytes.Buffer
		var w io.WriteCloser = gzip.NewWriter(&buf)
		if codec == "ZLIB" {
			w = zlib.NewWriter(&buf)
		}
		w.Write(plain)
		w.Close()
		p := filepath.Join(dir, strings.ToLower(codec)+".tfrecord")
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := dataset.Open(context.Background(), dataset.Options{}, p)
		var ce *dataset.CompressedError
		if !errors.As(err, &ce) || ce.Codec != codec || !errors.Is(err, dataset.ErrUnsupported) || errors.Is(err, dataset.ErrCRC) {
			t.Fatalf("%s: %v", codec, err)
		}
		if !strings.Contains(err.Error(), codec+"-compressed TFRecord") || !strings.Contains(err.Error(), "decompress it") {
			t.Errorf("%s: %v", codec, err)
		}
	}
}

// compressTFRecords writes records as a TFRecord file compressed with
// codec ("GZIP", "ZLIB" or "" for none), as TFRecordWriter's options do.
func compressTFRecords(t *testing.T, path, codec string, recs [][]byte) {
	t.Helper()
	var plain []byte
	for _, r := range recs {
		plain = dataset.AppendTFRecord(plain, r)
	}
	var buf bytes.Buffer
	switch codec {
	case "GZIP":
		w := gzip.NewWriter(&buf)
		w.Write(plain)
		w.Close()
	case "ZLIB":
		w := zlib.NewWriter(&buf)
		w.Write(plain)
		w.Close()
	default:
		buf.Write(plain)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Compressed TFRecords pack, read as a stream: the pack holds every record
// in order, and packing again finds it whole.
func TestPackCompressedTFRecords(t *testing.T) {
	dir := t.TempDir()
	var recs [][]byte
	var paths []string
	for k, codec := range []string{"GZIP", "ZLIB", ""} {
		var part [][]byte
		for i := range 150 {
			part = append(part, bytes.Repeat([]byte{byte(k), byte(i)}, 1+(i*37)%700))
		}
		p := filepath.Join(dir, strings.ToLower(codec)+"x.tfrecord")
		compressTFRecords(t, p, codec, part)
		paths, recs = append(paths, p), append(recs, part...)
	}
	out := filepath.Join(dir, "packed")
	for pass := range 2 {
		sum, err := pack.PackTFRecordStreams(context.Background(), dataset.Options{}, paths, out, pack.Options{ShardBytes: 16 << 10})
		if err != nil {
			t.Fatal(err)
		}
		if sum.Records != len(recs) || sum.Shards < 3 || (pass == 1) != (sum.Resumed == sum.Shards) {
			t.Fatalf("pass %d: %+v", pass, sum)
		}
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{}, out)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if ds.Len() != len(recs) {
		t.Fatalf("%d records packed, want %d", ds.Len(), len(recs))
	}
	for id, want := range recs {
		if !bytes.Equal(record(t, ds, id), want) { // frames checked, as the loader reads
			t.Fatalf("record %d differs", id)
		}
	}

	// A CRC broken inside the compressed stream is an error naming it.
	var plain []byte
	for _, r := range recs[:20] {
		plain = dataset.AppendTFRecord(plain, r)
	}
	plain[len(plain)-1] ^= 1
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(plain)
	w.Close()
	bad := filepath.Join(dir, "bad.tfrecord")
	os.WriteFile(bad, buf.Bytes(), 0o644)
	_, err = pack.PackTFRecordStreams(context.Background(), dataset.Options{}, []string{bad}, filepath.Join(dir, "bad"), pack.Options{})
	if !errors.Is(err, dataset.ErrCRC) || !strings.Contains(err.Error(), bad) {
		t.Fatalf("a broken data CRC: %v", err)
	}
}

// reeArray run-end encodes vals (nil for a null), consecutive equal ones a
// run, with put appending one value to the values builder.
func reeArray(runEnds, values arrow.DataType, vals []any, put func(array.Builder, any)) arrow.Array {
	b := array.NewRunEndEncodedBuilder(memory.DefaultAllocator, runEnds, values)
	defer b.Release()
	for i := 0; i < len(vals); {
		j := i + 1
		for j < len(vals) && vals[j] == vals[i] {
			j++
		}
		if vals[i] == nil {
			b.AppendNulls(j - i)
		} else {
			b.Append(uint64(j - i))
			put(b.ValueBuilder(), vals[i])
		}
		i = j
	}
	return b.NewArray()
}

// Arrow's run-end encoded columns (run ends of 16, 32 and 64 bits; values
// of a fixed width, booleans and strings; nulls; under a struct) read as
// their values' type: every row, in batches of uneven runs, is its run's
// value.
func TestArrowRunEndsRead(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ree.arrow")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	var sc *arrow.Schema
	var w *ipc.FileWriter
	var want []string
	id := 0
	for _, n := range []int{50, 1, 130} {
		ids := make([]int64, n)
		words, nums, flags, xs := make([]any, n), make([]any, n), make([]any, n), make([]any, n)
		rows := make([]map[string]any, n)
		for i := range n {
			ids[i] = int64(id)
			if id%11 != 4 {
				words[i] = strings.Repeat("é", id/9%5) + fmt.Sprint(id/9)
			}
			if id%13 > 2 {
				nums[i] = int64(id / 4 * 1000)
			}
			flags[i] = id/6%2 == 0
			if id%17 != 0 {
				xs[i] = float64(id/3) / 8
			}
			rows[i] = map[string]any{"id": id, "s": words[i], "n": nums[i], "f": flags[i], "rec": map[string]any{"x": xs[i]}}
			id++
		}
		cols := []arrow.Array{
			array.NewInt64Builder(memory.DefaultAllocator).NewArray(),
			reeArray(arrow.PrimitiveTypes.Int32, arrow.BinaryTypes.String, words, func(b array.Builder, v any) { b.(*array.StringBuilder).Append(v.(string)) }),
			reeArray(arrow.PrimitiveTypes.Int16, arrow.PrimitiveTypes.Int64, nums, func(b array.Builder, v any) { b.(*array.Int64Builder).Append(v.(int64)) }),
			reeArray(arrow.PrimitiveTypes.Int64, arrow.FixedWidthTypes.Boolean, flags, func(b array.Builder, v any) { b.(*array.BooleanBuilder).Append(v.(bool)) }),
		}
		cols[0].Release()
		cols[0] = array.NewInt64Data(array.NewData(arrow.PrimitiveTypes.Int64, n, []*memory.Buffer{nil, memory.NewBufferBytes(arrow.Int64Traits.CastToBytes(ids))}, nil, 0, 0))
		x := reeArray(arrow.PrimitiveTypes.Int32, arrow.PrimitiveTypes.Float64, xs, func(b array.Builder, v any) { b.(*array.Float64Builder).Append(v.(float64)) })
		st, err := array.NewStructArray([]arrow.Array{x}, []string{"x"})
		if err != nil {
			t.Fatal(err)
		}
		cols = append(cols, st)
		if sc == nil {
			var fs []arrow.Field
			for i, name := range []string{"id", "s", "n", "f", "rec"} {
				fs = append(fs, arrow.Field{Name: name, Type: cols[i].DataType(), Nullable: i > 0})
			}
			sc = arrow.NewSchema(fs, nil)
			if w, err = ipc.NewFileWriter(f, ipc.WithSchema(sc)); err != nil {
				t.Fatal(err)
			}
		}
		rec := array.NewRecordBatch(sc, cols, int64(n))
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
		x.Release()
		for _, c := range cols {
			c.Release()
		}
		for _, r := range rows {
			b, _ := json.Marshal(r)
			want = append(want, canon(t, string(b)))
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	cols := ds.Info().Columns
	if len(cols) != 5 || cols[1].Type != "utf8" || cols[3].Layout != "bool" || cols[4].Children[0].Type != "float64" {
		t.Fatalf("columns %+v", cols)
	}
	got := readAllRows(t, ds)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("row %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

// listView builds a list view over child whose row i holds the elements
// ranges[i] (nil for a null row), in any order and overlapping, as Arrow
// allows.
func listView(t *testing.T, dt arrow.DataType, child arrow.Array, ranges [][2]int) arrow.Array {
	t.Helper()
	n := len(ranges)
	valid := make([]byte, (n+7)/8)
	large := dt.ID() == arrow.LARGE_LIST_VIEW
	w := 4
	if large {
		w = 8
	}
	offs, sizes := make([]byte, n*w), make([]byte, n*w)
	nulls := 0
	for i, r := range ranges {
		if r == [2]int{-1, -1} {
			nulls++
			continue
		}
		valid[i/8] |= 1 << (i % 8)
		if large {
			binary.LittleEndian.PutUint64(offs[i*8:], uint64(r[0]))
			binary.LittleEndian.PutUint64(sizes[i*8:], uint64(r[1]-r[0]))
		} else {
			binary.LittleEndian.PutUint32(offs[i*4:], uint32(r[0]))
			binary.LittleEndian.PutUint32(sizes[i*4:], uint32(r[1]-r[0]))
		}
	}
	d := array.NewData(dt, n, []*memory.Buffer{memory.NewBufferBytes(valid), memory.NewBufferBytes(offs), memory.NewBufferBytes(sizes)},
		[]arrow.ArrayData{child.Data()}, nulls, 0)
	defer d.Release()
	return array.MakeFromData(d)
}

// Arrow's list views (of numbers, booleans and strings, where no list is
// around them) read as lists: every row, its elements anywhere in the
// child, overlapping others' or null, is the list of those elements.
func TestArrowListViewsRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lv.arrow")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	ib := array.NewInt32Builder(memory.DefaultAllocator)
	bb := array.NewBooleanBuilder(memory.DefaultAllocator)
	for i := range 40 {
		if i%9 == 4 {
			ib.AppendNull()
		} else {
			ib.Append(int32(i * 3))
		}
		bb.Append(i%3 == 0)
	}
	ints, bools := ib.NewArray(), bb.NewArray()
	sb := array.NewStringBuilder(memory.DefaultAllocator)
	for k := range 40 {
		if k%7 == 2 {
			sb.AppendNull()
		} else {
			sb.Append(strings.Repeat("s", k%5) + fmt.Sprint(k))
		}
	}
	strs := sb.NewArray()
	const n = 120
	var r1, r2, r3 [][2]int
	var want []string
	for i := range n {
		a, b := [2]int{(i * 7) % 33, (i*7)%33 + i%6}, [2]int{(i * 5) % 38, (i*5)%38 + i%3}
		if i%8 == 3 {
			a = [2]int{-1, -1}
		}
		if i%10 == 7 {
			b = [2]int{-1, -1}
		}
		c := [2]int{(i * 11) % 36, (i*11)%36 + i%5}
		if i%12 == 5 {
			c = [2]int{-1, -1}
		}
		r1, r2, r3 = append(r1, a), append(r2, b), append(r3, c)
		row := map[string]any{"id": i, "v": nil, "w": nil, "x": nil}
		if c[0] >= 0 {
			v := []any{}
			for k := c[0]; k < c[1]; k++ {
				if k%7 == 2 {
					v = append(v, nil)
				} else {
					v = append(v, strings.Repeat("s", k%5)+fmt.Sprint(k))
				}
			}
			row["x"] = v
		}
		if a[0] >= 0 {
			v := []any{}
			for k := a[0]; k < a[1]; k++ {
				if k%9 == 4 {
					v = append(v, nil)
				} else {
					v = append(v, k*3)
				}
			}
			row["v"] = v
		}
		if b[0] >= 0 {
			v := []any{}
			for k := b[0]; k < b[1]; k++ {
				v = append(v, k%3 == 0)
			}
			row["w"] = v
		}
		js, _ := json.Marshal(row)
		want = append(want, canon(t, string(js)))
	}
	ib2 := array.NewInt64Builder(memory.DefaultAllocator)
	for i := range n {
		ib2.Append(int64(i))
	}
	cols := []arrow.Array{ib2.NewArray(), listView(t, arrow.ListViewOf(arrow.PrimitiveTypes.Int32), ints, r1),
		listView(t, arrow.LargeListViewOf(arrow.FixedWidthTypes.Boolean), bools, r2),
		listView(t, arrow.ListViewOf(arrow.BinaryTypes.String), strs, r3)}
	sc := arrow.NewSchema([]arrow.Field{{Name: "id", Type: cols[0].DataType()}, {Name: "v", Type: cols[1].DataType(), Nullable: true},
		{Name: "w", Type: cols[2].DataType(), Nullable: true}, {Name: "x", Type: cols[3].DataType(), Nullable: true}}, nil)
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(sc))
	if err != nil {
		t.Fatal(err)
	}
	rec := array.NewRecordBatch(sc, cols, n)
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if c := ds.Info().Columns; c[1].Type != "list<item: int32, nullable>" || c[2].Layout != "list" || c[2].Width != 8 {
		t.Fatalf("columns %+v", c)
	}
	got := readAllRows(t, ds)
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("row %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}
