package dataset_test

import (
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
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// parquetSchema is arrowSchema's columns the Parquet writer takes as they
// are, structs and maps among them, and a list of structs.
func parquetSchema() *arrow.Schema {
	var fs []arrow.Field
	for _, f := range arrowSchema.Fields() {
		switch f.Name {
		case "nothing", "cat", "code", "vec":
			continue // types the writer takes otherwise
		}
		fs = append(fs, f)
	}
	fs = append(fs, arrow.Field{Name: "people", Type: arrow.ListOf(arrow.StructOf(
		arrow.Field{Name: "name", Type: arrow.BinaryTypes.String, Nullable: true},
		arrow.Field{Name: "tags", Type: arrow.ListOf(arrow.BinaryTypes.String), Nullable: true},
		arrow.Field{Name: "age", Type: arrow.PrimitiveTypes.Int32, Nullable: true})), Nullable: true})
	return arrow.NewSchema(fs, nil)
}

// people is a random value of parquetSchema's list of structs, with nulls
// at each level.
func people(r *rand.Rand) any {
	maybe := func(v any) any {
		if r.IntN(6) == 0 {
			return nil
		}
		return v
	}
	if r.IntN(6) == 0 {
		return nil
	}
	out := make([]any, r.IntN(4))
	for i := range out {
		tags := make([]any, r.IntN(3))
		for k := range tags {
			tags[k] = maybe(fmt.Sprint("t", r.IntN(100)))
		}
		out[i] = maybe(map[string]any{"name": maybe(fmt.Sprint("p", r.IntN(1000))), "tags": maybe(tags), "age": maybe(r.Int32N(99))})
	}
	return out
}

// writeParquet writes n random rows with arrow-go's Parquet writer and
// returns them as its reader gives them back.
func writeParquet(t testing.TB, path string, n int, codec compress.Compression, v2 bool) []string {
	t.Helper()
	sc := parquetSchema()
	r := rand.New(rand.NewPCG(9, 9))
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i := range n {
		if i > 0 {
			buf.WriteByte(',')
		}
		row := arrowRow(r, i)
		for _, k := range []string{"nothing", "cat", "code", "vec"} {
			delete(row, k)
		}
		row["people"] = people(r)
		b, _ := json.Marshal(row)
		buf.Write(b)
	}
	buf.WriteByte(']')
	rec, _, err := array.RecordFromJSON(memory.DefaultAllocator, sc, &buf)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	ver := parquet.DataPageV1
	if v2 {
		ver = parquet.DataPageV2
	}
	props := parquet.NewWriterProperties(parquet.WithCompression(codec), parquet.WithDataPageSize(1024),
		parquet.WithMaxRowGroupLength(170), parquet.WithDataPageVersion(ver))
	w, err := pqarrow.NewFileWriter(sc, f, props, pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := file.OpenParquetFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	fr, err := pqarrow.NewFileReader(rd, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Release()
	tr := array.NewTableReader(tab, 1<<20)
	defer tr.Release()
	var rows []string
	for tr.Next() {
		var out bytes.Buffer
		if err := array.RecordToJSON(tr.RecordBatch(), &out); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, strings.Split(strings.TrimSpace(out.String()), "\n")...)
	}
	return rows
}

// Every row of Parquet files written by arrow-go (each codec, data pages
// v1 and v2, row groups and pages of uneven rows), read in a global and a
// page-block order, equals arrow-go's own reading of it.
func TestParquetRowsMatchArrowGo(t *testing.T) {
	for _, c := range []struct {
		codec compress.Compression
		v2    bool
	}{{compress.Codecs.Snappy, false}, {compress.Codecs.Zstd, true}, {compress.Codecs.Gzip, false}, {compress.Codecs.Uncompressed, true}} {
		t.Run(fmt.Sprintf("%v v2=%v", c.codec, c.v2), func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "t.parquet")
			want := writeParquet(t, p, 600, c.codec, c.v2)
			ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			if n, w := len(ds.Info().Columns), parquetSchema().NumFields(); n != w {
				t.Fatalf("%d columns read, of %d", n, w)
			}
			blocks := ds.(dataset.Blocker).Blocks()
			if len(blocks) < 4 || blocks[len(blocks)-1] != 600 {
				t.Fatalf("page blocks %v", blocks)
			}
			bl, err := sampler.NewBlock(blocks, 3, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, smp := range []sampler.Sampler{sampler.Global{N: ds.Len(), Seed: 1}, bl} {
				l, err := loader.New(context.Background(), ds, smp, loader.Options{BatchSize: 64, Epochs: 1})
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
						if g, w := canon(t, got[i]), canon(t, want[id]); g != w {
							t.Fatalf("row %d:\n got %s\nwant %s", id, g, w)
						}
					}
					seen += len(b.IDs)
					b.Release()
				}
				l.Close()
				if seen != 600 {
					t.Fatalf("%d rows of 600", seen)
				}
			}
		})
	}
}
