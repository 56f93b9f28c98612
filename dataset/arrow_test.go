package dataset_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// arrowSchema has a column of every layout riffle reads, nulls allowed.
var arrowSchema = arrow.NewSchema([]arrow.Field{
	{Name: "id", Type: arrow.PrimitiveTypes.Int64},
	{Name: "i8", Type: arrow.PrimitiveTypes.Int8, Nullable: true},
	{Name: "u16", Type: arrow.PrimitiveTypes.Uint16, Nullable: true},
	{Name: "f32", Type: arrow.PrimitiveTypes.Float32, Nullable: true},
	{Name: "f64", Type: arrow.PrimitiveTypes.Float64},
	{Name: "flag", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	{Name: "text", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "big", Type: arrow.BinaryTypes.LargeString},
	{Name: "blob", Type: arrow.BinaryTypes.Binary, Nullable: true},
	{Name: "fsb", Type: &arrow.FixedSizeBinaryType{ByteWidth: 3}, Nullable: true},
	{Name: "day", Type: arrow.FixedWidthTypes.Date32, Nullable: true},
	{Name: "ts", Type: &arrow.TimestampType{Unit: arrow.Microsecond}},
	{Name: "dec", Type: &arrow.Decimal128Type{Precision: 20, Scale: 3}, Nullable: true},
	{Name: "ints", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
	{Name: "floats", Type: arrow.LargeListOf(arrow.PrimitiveTypes.Float64)},
	{Name: "words", Type: arrow.ListOf(arrow.BinaryTypes.String), Nullable: true},
	{Name: "nested", Type: arrow.ListOf(arrow.ListOf(arrow.PrimitiveTypes.Int64)), Nullable: true},
	{Name: "vec", Type: arrow.FixedSizeListOf(3, arrow.PrimitiveTypes.Float32), Nullable: true},
	{Name: "rec", Type: arrow.StructOf(
		arrow.Field{Name: "a", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
		arrow.Field{Name: "b", Type: arrow.BinaryTypes.String, Nullable: true},
		arrow.Field{Name: "c", Type: arrow.ListOf(arrow.FixedWidthTypes.Boolean), Nullable: true}), Nullable: true},
	{Name: "kv", Type: arrow.MapOf(arrow.BinaryTypes.String, arrow.PrimitiveTypes.Int32), Nullable: true},
	{Name: "cat", Type: &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int16, ValueType: arrow.BinaryTypes.String}, Nullable: true},
	{Name: "code", Type: &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int8, ValueType: arrow.PrimitiveTypes.Int64}, Nullable: true},
	{Name: "nothing", Type: arrow.Null, Nullable: true},
}, nil)

// arrowRow is one random row of arrowSchema as JSON.
func arrowRow(r *rand.Rand, id int) map[string]any {
	maybe := func(v any) any {
		if r.IntN(7) == 0 {
			return nil
		}
		return v
	}
	word := func() string {
		w := []string{"", "a", "riffle", "shuffle", "ünïcode", strings.Repeat("x", r.IntN(300))}
		return w[r.IntN(len(w))]
	}
	list := func(n int, f func() any) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = f()
		}
		return out
	}
	row := map[string]any{
		"id":     id,
		"i8":     maybe(r.IntN(256) - 128),
		"u16":    maybe(r.IntN(65536)),
		"f32":    maybe(float32(r.NormFloat64())),
		"f64":    r.NormFloat64(),
		"flag":   maybe(r.IntN(2) == 0),
		"text":   maybe(word()),
		"big":    word() + fmt.Sprint(id),
		"blob":   maybe([]byte(word())),
		"fsb":    maybe([]byte{byte(id), byte(id >> 8), 7}),
		"day":    maybe(r.IntN(30000)),
		"ts":     r.Int64N(1 << 50),
		"dec":    maybe(fmt.Sprintf("%d.%03d", r.IntN(1e6), r.IntN(1000))),
		"ints":   maybe(list(r.IntN(5), func() any { return maybe(r.Int32()) })),
		"floats": list(r.IntN(4), func() any { return r.Float64() }),
		"words":  maybe(list(r.IntN(4), func() any { return maybe(word()) })),
		"nested": maybe(list(r.IntN(3), func() any { return maybe(list(r.IntN(3), func() any { return r.Int64() })) })),
		"vec":    maybe(list(3, func() any { return maybe(float32(r.Float64())) })),
		"rec": maybe(map[string]any{"a": maybe(r.Int32()), "b": maybe(word()),
			"c": maybe(list(r.IntN(3), func() any { return maybe(r.IntN(2) == 0) }))}),
		"kv":      maybe(list(r.IntN(3), func() any { return map[string]any{"key": word() + "k", "value": maybe(r.Int32())} })),
		"cat":     maybe([]string{"cat", "dog", "bird", "fish"}[r.IntN(4)]),
		"code":    maybe([]int{10, 20, 30}[r.IntN(3)]),
		"nothing": nil,
	}
	return row
}

// writeArrow writes rows in record batches of the given sizes, as an IPC
// file or stream, with arrow-go's writers; it returns the rows as
// arrow-go's own reader gives them back (one JSON line each).
func writeArrow(t testing.TB, path string, stream bool, sizes []int, seed uint64) []string {
	t.Helper()
	return writeArrowWith(t, path, stream, sizes, seed)
}

// writeArrowWith is writeArrow with more of the writer's options (its
// body compression).
func writeArrowWith(t testing.TB, path string, stream bool, sizes []int, seed uint64, opts ...ipc.Option) []string {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	mem := memory.NewGoAllocator()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var w interface {
		Write(arrow.RecordBatch) error
		Close() error
	}
	if stream {
		w = ipc.NewWriter(f, append([]ipc.Option{ipc.WithSchema(arrowSchema), ipc.WithAllocator(mem)}, opts...)...)
	} else {
		if w, err = ipc.NewFileWriter(f, append([]ipc.Option{ipc.WithSchema(arrowSchema), ipc.WithAllocator(mem)}, opts...)...); err != nil {
			t.Fatal(err)
		}
	}
	id := 0
	for _, n := range sizes {
		var buf bytes.Buffer
		buf.WriteByte('[')
		for i := range n {
			if i > 0 {
				buf.WriteByte(',')
			}
			b, _ := json.Marshal(arrowRow(r, id))
			buf.Write(b)
			id++
		}
		buf.WriteByte(']')
		rec, _, err := array.RecordFromJSON(mem, arrowSchema, &buf)
		if err != nil {
			t.Fatal(err)
		}
		if !stream {
			// The file format keeps one dictionary per field: encode
			// every batch with the same one. (A stream replaces its
			// dictionaries batch by batch, which riffle follows.)
			rec = fixedDicts(t, mem, rec)
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return readArrowRows(t, path, stream)
}

// fixedDicts re-encodes rec's dictionary columns against fixed dictionaries.
func fixedDicts(t testing.TB, mem memory.Allocator, rec arrow.RecordBatch) arrow.RecordBatch {
	t.Helper()
	cols := make([]arrow.Array, rec.NumCols())
	for c := range cols {
		col := rec.Column(c)
		d, ok := col.(*array.Dictionary)
		if !ok {
			cols[c] = col
			continue
		}
		dt := d.DataType().(*arrow.DictionaryType)
		var values arrow.Array
		var err error
		switch dt.ValueType.ID() {
		case arrow.STRING:
			values, _, err = array.FromJSON(mem, dt.ValueType, strings.NewReader(`["cat","dog","bird","fish"]`))
		default:
			values, _, err = array.FromJSON(mem, dt.ValueType, strings.NewReader(`[10,20,30]`))
		}
		if err != nil {
			t.Fatal(err)
		}
		ib := array.NewBuilder(mem, dt.IndexType)
		for i := range d.Len() {
			if d.IsNull(i) {
				ib.AppendNull()
				continue
			}
			v := d.Dictionary().GetOneForMarshal(d.GetValueIndex(i))
			for k := range values.Len() {
				if fmt.Sprint(values.GetOneForMarshal(k)) == fmt.Sprint(v) {
					switch b := ib.(type) {
					case *array.Int16Builder:
						b.Append(int16(k))
					case *array.Int8Builder:
						b.Append(int8(k))
					}
				}
			}
		}
		cols[c] = array.NewDictionaryArray(dt, ib.NewArray(), values)
	}
	return array.NewRecordBatch(rec.Schema(), cols, rec.NumRows())
}

// readArrowRows reads every row of a file with arrow-go, as JSON lines.
func readArrowRows(t testing.TB, path string, stream bool) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []string
	add := func(rec arrow.RecordBatch) {
		var b bytes.Buffer
		if err := array.RecordToJSON(rec, &b); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(&b)
		sc.Buffer(nil, 1<<24)
		for sc.Scan() {
			rows = append(rows, sc.Text())
		}
	}
	if stream {
		rd, err := ipc.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		defer rd.Release()
		for rd.Next() {
			add(rd.RecordBatch())
		}
		if rd.Err() != nil {
			t.Fatal(rd.Err())
		}
		return rows
	}
	rd, err := ipc.NewFileReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for i := range rd.NumRecords() {
		rec, err := rd.RecordBatch(i)
		if err != nil {
			t.Fatal(err)
		}
		add(rec)
		rec.Release()
	}
	return rows
}

// batchRows decodes a batch's IPC message with arrow-go, given the
// dataset's schema stream, as JSON lines.
func batchRows(t testing.TB, schema []byte, b *loader.Batch) []string {
	t.Helper()
	if b.Columns == nil {
		t.Fatal("a batch of rows without its columns")
	}
	var s bytes.Buffer
	s.Write(schema[:len(schema)-8]) // the schema stream without its end marker
	s.Write(b.Data[:b.Columns.Len])
	s.Write([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0})
	rd, err := ipc.NewReader(&s)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Release()
	if !rd.Next() {
		t.Fatalf("no record batch in the batch's message: %v", rd.Err())
	}
	rec := rd.RecordBatch()
	var out bytes.Buffer
	if err := array.RecordToJSON(rec, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if int(rec.NumRows()) != len(b.IDs) || len(lines) != len(b.IDs) {
		t.Fatalf("batch of %d ids holds %d rows", len(b.IDs), rec.NumRows())
	}
	return lines
}

// project keeps the named columns of a JSON row.
func project(t testing.TB, line string, cols []string) string {
	if len(cols) == 0 {
		return line
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &m); err != nil {
		t.Fatal(err)
	}
	out := map[string]json.RawMessage{}
	for _, c := range cols {
		if v, ok := m[c]; ok {
			out[c] = v
		}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func canon(t testing.TB, line string) string { return project(t, line, nil) }

// Every row of Arrow files written by arrow-go, file and stream format,
// record batches of uneven sizes (an empty one too), read in a shuffled
// order, equals what arrow-go's reader gives for that row; projections
// read only their columns.
func TestArrowRowsMatchArrowGo(t *testing.T) {
	dir := t.TempDir()
	var want []string
	var paths []string
	for i, stream := range []bool{false, true} {
		p := filepath.Join(dir, fmt.Sprintf("part%d.arrow", i))
		paths = append(paths, p)
		want = append(want, writeArrow(t, p, stream, []int{37, 0, 200, 1, 64}, uint64(i+1))...)
	}
	for _, cols := range [][]string{nil, {"text", "id"}, {"nested", "cat", "rec"}} {
		t.Run(strings.Join(cols, ","), func(t *testing.T) {
			for pass := range 2 { // the second opens the saved index
				ds, err := dataset.Open(context.Background(), dataset.Options{Columns: cols}, paths...)
				if err != nil {
					t.Fatal(err)
				}
				if ds.Len() != len(want) {
					t.Fatalf("%d rows, want %d", ds.Len(), len(want))
				}
				l, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len(), Seed: uint64(pass)}, loader.Options{BatchSize: 50, Epochs: 1})
				if err != nil {
					t.Fatal(err)
				}
				seen := 0
				for {
					b, err := l.Next(context.Background())
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					got := batchRows(t, ds.Info().Schema, b)
					for i, id := range b.IDs {
						w := project(t, want[id], cols)
						if g := canon(t, got[i]); g != w {
							t.Fatalf("row %d:\n got %s\nwant %s", id, g, w)
						}
					}
					seen += len(b.IDs)
					b.Release()
				}
				l.Close()
				ds.Close()
				if seen != len(want) {
					t.Fatalf("saw %d rows of %d", seen, len(want))
				}
			}
		})
	}
}
