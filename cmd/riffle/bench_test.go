package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/internal/synth"
)

// bench runs on every format inspect opens, reading the dataset's own
// objects for its baselines: a directory tree, a JSONL file, a pack
// directory, a Hugging Face save_to_disk directory and a Parquet file
// (both rows) each report a riffle rate above zero and a sequential
// baseline.
func TestBenchEveryFormat(t *testing.T) {
	for _, tc := range []struct {
		name string
		make func(t *testing.T, dir string) string
	}{
		{"imagefolder", func(t *testing.T, dir string) string {
			root := filepath.Join(dir, "big")
			if err := synth.WriteTree(root, []string{"cat", "dog", "eel"}, 50); err != nil {
				t.Fatal(err)
			}
			return root
		}},
		{"jsonl", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "d.jsonl")
			if err := synth.WriteLines(p, "jsonl", 2000, false); err != nil {
				t.Fatal(err)
			}
			return p
		}},
		{"pack", func(t *testing.T, dir string) string {
			src := filepath.Join(dir, "d.tfrecord")
			if err := synth.WriteTFRecord(src, 1000); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "rshard")
			if _, err := run(t, packCmd(), src, "--out", out, "--shard-bytes", "16KiB"); err != nil {
				t.Fatal(err)
			}
			return out
		}},
		{"hf", func(t *testing.T, dir string) string {
			root := filepath.Join(dir, "hf")
			writeHF(t, root, 500)
			return root
		}},
		{"parquet", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "d.parquet")
			sc, rec := hfRows(500)
			defer rec.Release()
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(parquet.WithMaxRowGroupLength(100)), pqarrow.DefaultWriterProps())
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Write(rec); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil { // closes f
				t.Fatal(err)
			}
			return p
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.make(t, t.TempDir())
			out, err := run(t, benchCmd(), path, "--mode", "warm", "--duration", "100ms", "--batch-size", "32")
			if err != nil {
				t.Fatalf("bench %s: %v\n%s", tc.name, err, out)
			}
			t.Log("\n" + out)
			for _, bad := range []string{"is a directory", "not a directory"} {
				if strings.Contains(out, bad) {
					t.Fatalf("bench %s printed %q:\n%s", tc.name, bad, out)
				}
			}
			for _, row := range []string{"riffle", "pread", "sequential"} {
				if rate := column(t, out, row, 2); rate <= 0 {
					t.Fatalf("bench %s: %s MB/s %v:\n%s", tc.name, row, rate, out)
				}
			}
			for _, want := range []string{"riffle / sequential MB/s", "read MB:"} {
				if !strings.Contains(out, want) {
					t.Fatalf("bench %s lacks %q:\n%s", tc.name, want, out)
				}
			}
		})
	}
}

// column returns field k (from 0, the name being field 0) of the table row
// named name.
func column(t *testing.T, out, name string, k int) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(.*)$`)
	m := re.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no row %q in:\n%s", name, out)
	}
	f := strings.Fields(m[1])
	if len(f) < k {
		t.Fatalf("row %q has %d fields: %q", name, len(f), m[0])
	}
	v, err := strconv.ParseFloat(f[k-1], 64)
	if err != nil {
		t.Fatalf("row %q field %d: %v", name, k, err)
	}
	return v
}

// writeHF writes a Hugging Face Dataset directory as save_to_disk does:
// an Arrow IPC stream of n rows (an int label and a text), state.json
// naming it and dataset_info.json with the features.
func writeHF(t *testing.T, root string, n int) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sc, rec := hfRows(n)
	defer rec.Release()
	f, err := os.Create(filepath.Join(root, "data-00000-of-00001.arrow"))
	if err != nil {
		t.Fatal(err)
	}
	w := ipc.NewWriter(f, ipc.WithSchema(sc))
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"state.json":        `{"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": null}`,
		"dataset_info.json": `{"features": {"label": {"dtype": "int64", "_type": "Value"}, "text": {"dtype": "string", "_type": "Value"}}}`,
	}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// hfRows is n rows of an int label and a text of varying length.
func hfRows(n int) (*arrow.Schema, arrow.RecordBatch) {
	sc := arrow.NewSchema([]arrow.Field{{Name: "label", Type: arrow.PrimitiveTypes.Int64}, {Name: "text", Type: arrow.BinaryTypes.String}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	for i := range n {
		b.Field(0).(*array.Int64Builder).Append(int64(i % 3))
		b.Field(1).(*array.StringBuilder).Append(strings.Repeat(fmt.Sprint(i), 1+i%40))
	}
	return sc, b.NewRecordBatch()
}
