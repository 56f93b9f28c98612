package job

import (
	"context"
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

	"github.com/riffle-ml/riffle/wire"
)

// writeHFDir writes a Hugging Face Dataset directory as save_to_disk
// does: Arrow IPC streams of the rows (src, i, and a column of type
// third), state.json naming them and dataset_info.json with features.
func writeHFDir(t *testing.T, root string, src, n, shards int, third arrow.DataType) {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	sc := arrow.NewSchema([]arrow.Field{{Name: "src", Type: arrow.PrimitiveTypes.Int64}, {Name: "i", Type: arrow.PrimitiveTypes.Int64},
		{Name: "label", Type: third}}, nil)
	var names []string
	for s := range shards {
		name := fmt.Sprintf("data-%05d-of-%05d.arrow", s, shards)
		names = append(names, fmt.Sprintf(`{"filename": %q}`, name))
		b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
		for i := s * n / shards; i < (s+1)*n/shards; i++ {
			b.Field(0).(*array.Int64Builder).Append(int64(src))
			b.Field(1).(*array.Int64Builder).Append(int64(i))
			switch f := b.Field(2).(type) {
			case *array.Int64Builder:
				f.Append(int64(i % 3))
			case *array.StringBuilder:
				f.Append(fmt.Sprint(i % 3))
			}
		}
		rec := b.NewRecordBatch()
		b.Release()
		f, err := os.Create(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		w := ipc.NewWriter(f, ipc.WithSchema(sc))
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"state.json": `{"_data_files": [` + strings.Join(names, ", ") + `], "_split": null}`,
		"dataset_info.json": `{"features": {"src": {"dtype": "int64", "_type": "Value"}, "i": {"dtype": "int64", "_type": "Value"}, ` +
			`"label": {"names": ["a", "b", "c"], "_type": "ClassLabel"}}}`,
	}
	for name, s := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Hugging Face directories mix as their Arrow files read as one dataset:
// with all_exhausted each source's ids are its own epochs, one after
// another, each every id once; the directories' features stay the
// mixture's. A directory of other columns is refused, naming the source
// and the columns.
func TestMixtureOfHFDirectories(t *testing.T) {
	dir := t.TempDir()
	lens := []int{300, 700, 120}
	var mix []wire.MixSource
	for k, n := range lens {
		p := filepath.Join(dir, fmt.Sprintf("hf%d", k))
		writeHFDir(t, p, k, n, 1+k%2, arrow.PrimitiveTypes.Int64)
		mix = append(mix, wire.MixSource{Paths: []string{p}, Weight: float64(k + 1)})
	}
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	ordered := true
	j := openJob(t, env, &wire.JobSpec{Mixture: mix, MixtureStop: "all_exhausted", BatchSize: 64, Shuffle: true, Seed: 3, Epochs: 2, Ordered: &ordered})
	if f := j.src.ds.Info().Features; !strings.Contains(f, `"names":["a","b","c"]`) {
		t.Errorf("the mixture's features are %q, want the directories'", f)
	}
	offs := []int{0, 300, 1000}
	var own [3][]int
	for {
		b, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range b.IDs {
			k := 0
			for k+1 < len(offs) && id >= offs[k+1] {
				k++
			}
			own[k] = append(own[k], id-offs[k])
		}
		b.Release()
	}
	j.Close()
	for k, n := range lens {
		// The schedule runs on across the mixture's epochs: the source
		// that ends one has had its last draw, or is one draw from it.
		if len(own[k]) < 2*n-1 {
			t.Fatalf("source %d: %d ids over two epochs of the mixture, want about its own two epochs of %d at least", k, len(own[k]), n)
		}
		for e := 0; (e+1)*n <= len(own[k]); e++ {
			seen := make([]bool, n)
			for _, i := range own[k][e*n : (e+1)*n] {
				if seen[i] {
					t.Fatalf("source %d: id %d twice in its epoch %d", k, i, e)
				}
				seen[i] = true
			}
		}
	}

	other := filepath.Join(dir, "other")
	writeHFDir(t, other, 1, 50, 1, arrow.BinaryTypes.String)
	plan, err := Check(&wire.JobSpec{Mixture: []wire.MixSource{mix[0], {Paths: []string{other}, Weight: 1}}, BatchSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	_, err = env.open(context.Background(), plan, nil)
	if err == nil || !strings.Contains(err.Error(), "source 1, "+other+" (hf): its columns [src int64, i int64, label utf8]") {
		t.Fatalf("a directory of other columns: %v", err)
	}
}
