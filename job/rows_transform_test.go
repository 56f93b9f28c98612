package job

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/transform"
	"github.com/riffle-ml/riffle/wire"
)

// writeHFImages writes a Hugging Face directory of n rows: an Image (a
// JPEG of row i's own colour, as struct<bytes, path>) and a ClassLabel;
// it returns the JPEGs.
func writeHFImages(t *testing.T, root string, n int) [][]byte {
	t.Helper()
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	img := arrow.StructOf(arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary, Nullable: true},
		arrow.Field{Name: "path", Type: arrow.BinaryTypes.String, Nullable: true})
	sc := arrow.NewSchema([]arrow.Field{{Name: "image", Type: img, Nullable: true}, {Name: "label", Type: arrow.PrimitiveTypes.Int64}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	var pics [][]byte
	for i := range n {
		m := image.NewRGBA(image.Rect(0, 0, 30+i%7, 20+i%5))
		for y := range m.Bounds().Dy() {
			for x := range m.Bounds().Dx() {
				m.Set(x, y, color.RGBA{uint8(i * 9), uint8(x * 8), uint8(y * 8), 255})
			}
		}
		var buf bytes.Buffer
		if err := jpeg.Encode(&buf, m, nil); err != nil {
			t.Fatal(err)
		}
		pics = append(pics, buf.Bytes())
		st := b.Field(0).(*array.StructBuilder)
		st.Append(true)
		st.FieldBuilder(0).(*array.BinaryBuilder).Append(buf.Bytes())
		st.FieldBuilder(1).(*array.StringBuilder).AppendNull()
		b.Field(1).(*array.Int64Builder).Append(int64(i % 4))
	}
	rec := b.NewRecordBatch()
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
	f.Close()
	for name, s := range map[string]string{
		"state.json":        `{"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": null}`,
		"dataset_info.json": `{"features": {"image": {"_type": "Image"}, "label": {"names": ["a", "b", "c", "d"], "_type": "ClassLabel"}}}`,
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return pics
}

// A transform of a Hugging Face directory reads its only Image column by
// default, named in the transform's canonical spelling; the job's batches
// are described with the outputs in the column's place (a fixed-size list
// typed as Arrow's fixed_shape_tensor of the transform's shape), and each
// row's output is the transform's of its picture, beside its label.
// column= naming a column that does not hold bytes, or no column, and
// column= on a dataset of records, are spec errors naming it.
func TestRowsTransformJob(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hf")
	pics := writeHFImages(t, dir, 40)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	j := openJob(t, env, &wire.JobSpec{Paths: []string{dir}, BatchSize: 16, Shuffle: true, Seed: 1, Transform: "image:size=16,crop=12"})
	d := j.Describe()
	if d.Transform != "image:column=image,crop=12,size=16@v2" {
		t.Errorf("canonical transform %q, want the column it reads in it", d.Transform)
	}
	if len(d.Columns) != 2 || d.Columns[0].Layout != "fixed_list" || d.Columns[0].Size != 12*12*3 || d.Columns[1].Name != "label" {
		t.Fatalf("columns %+v", d.Columns)
	}
	if !bytes.Contains(d.Info.Schema, []byte("arrow.fixed_shape_tensor")) || !bytes.Contains(d.Info.Schema, []byte(`{"shape":[12,12,3]}`)) {
		t.Fatalf("the schema does not type the outputs as a tensor of [12, 12, 3]")
	}
	tf, _, _ := transform.New("image:size=16,crop=12")
	want := make([]byte, tf.Size())
	seen := 0
	for {
		b, err := j.Next(context.Background())
		if err != nil {
			break
		}
		rec, release, err := columnar.Record(d.Info.Schema, b.Data[:b.Columns.Len])
		if err != nil {
			t.Fatal(err)
		}
		vals := rec.Column(0).(*array.FixedSizeList).ListValues().(*array.Uint8).Uint8Values()
		for i, id := range b.IDs {
			if err := tf.Apply(pics[id], want); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(vals[i*len(want):(i+1)*len(want)], want) || rec.Column(1).(*array.Int64).Value(i) != int64(id%4) {
				t.Fatalf("row %d: another output or label", id)
			}
			seen++
		}
		release()
		b.Release()
	}
	j.Close()
	if seen != len(pics) {
		t.Fatalf("%d rows of %d", seen, len(pics))
	}

	fixed := filepath.Join(t.TempDir(), "r.bin")
	if err := synth.WriteFixed(fixed, 10, 64, 0); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec *wire.JobSpec
		want string
	}{
		{&wire.JobSpec{Paths: []string{dir}, BatchSize: 8, Transform: "image:column=label"}, `column="label" is int64`},
		{&wire.JobSpec{Paths: []string{dir}, BatchSize: 8, Transform: "image:column=picture"}, `column="picture": no such column`},
		{&wire.JobSpec{Paths: []string{fixed}, RecordSize: 64, BatchSize: 8, Transform: "image:column=x"}, `column="x" names a column of a dataset of rows`},
	} {
		plan, err := Check(c.spec)
		if err != nil {
			t.Fatal(err)
		}
		_, err = env.open(context.Background(), plan, nil)
		if err == nil || Kind(err) != wire.KindSpec || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (kind %s), want a spec error with %q", c.spec.Transform, err, Kind(err), c.want)
		}
	}
}

// Jobs sharing a transform of rows keep each shared row's output in the
// cache for the others (their group reserves an item of the output's size
// a row): between them they copy outputs instead of transforming each row
// for each job, every output still the transform's of its picture, and
// the cache is empty once they end.
func TestSharedRowsTransformJob(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hf")
	pics := writeHFImages(t, dir, 300)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	yes := true
	var jobs []*Job
	for k := range 2 {
		jobs = append(jobs, openJob(t, env, &wire.JobSpec{Paths: []string{dir}, BatchSize: 16, Shuffle: true, Seed: uint64(k + 1),
			Share: &yes, Transform: "image:size=16,crop=12,column=image"}))
	}
	tf, _, _ := transform.New("image:size=16,crop=12")
	var g errgroup.Group
	for k, j := range jobs {
		g.Go(func() error {
			defer j.Close()
			schema := j.Describe().Info.Schema
			out := make([]byte, tf.Size())
			for {
				b, err := j.Next(context.Background())
				if errors.Is(err, io.EOF) {
					return nil
				}
				if err != nil {
					return err
				}
				rec, release, err := columnar.Record(schema, b.Data[:b.Columns.Len])
				if err != nil {
					return err
				}
				vals := rec.Column(0).(*array.FixedSizeList).ListValues().(*array.Uint8).Uint8Values()
				for i, id := range b.IDs {
					if err := tf.Apply(pics[id], out); err != nil {
						return err
					}
					if !bytes.Equal(vals[i*len(out):(i+1)*len(out)], out) {
						return fmt.Errorf("job %d row %d: another output", k, id)
					}
				}
				release()
				b.Release()
			}
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	var hits int64
	for _, j := range jobs {
		hits += j.Stats().CacheHits
	}
	if hits == 0 {
		t.Fatal("no output was copied from the cache: each job transformed every row")
	}
	if st := env.Cache().Stats(); st.Items != 0 {
		t.Fatalf("%d items left in the cache", st.Items)
	}
}

// A job sharing a transform of rows that stops mid-epoch (its loader has
// taken rows ahead, in batches it never transforms) gives back its uses of
// their outputs: once the other job ends too, the cache is empty.
func TestSharedRowsTransformStopped(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hf")
	writeHFImages(t, dir, 200)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	yes := true
	var jobs []*Job
	for k := range 2 {
		jobs = append(jobs, openJob(t, env, &wire.JobSpec{Paths: []string{dir}, BatchSize: 8, Shuffle: true, Seed: uint64(k + 1),
			Share: &yes, Transform: "image:size=16,crop=12", Epochs: -1}))
	}
	// Both at one pace for a few batches; then the first stops.
	for range 4 {
		for _, j := range jobs {
			b, err := j.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			b.Release()
		}
	}
	jobs[0].Close()
	for range 30 {
		b, err := jobs[1].Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	}
	jobs[1].Close()
	if st := env.Cache().Stats(); st.Items != 0 {
		t.Fatalf("%d items (%d bytes) left in the cache", st.Items, st.Bytes)
	}
}
