package loader_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/transform"
)

// pictures are n small JPEGs and PNGs of varied sizes.
func pictures(t testing.TB, n int) [][]byte {
	r := rand.New(rand.NewPCG(8, 8))
	out := make([][]byte, n)
	for i := range out {
		w, h := 20+r.IntN(50), 20+r.IntN(50)
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		for y := range h {
			for x := range w {
				img.Set(x, y, color.RGBA{uint8(x * 5), uint8(y * 3), uint8(r.IntN(256)), 255})
			}
		}
		var b bytes.Buffer
		var err error
		if i%5 == 4 {
			err = png.Encode(&b, img)
		} else {
			err = jpeg.Encode(&b, img, &jpeg.Options{Quality: 85})
		}
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b.Bytes()
	}
	return out
}

// imageTable is rows of pictures: a label, the picture (bytes, or a
// Hugging Face Image's struct<bytes, path>) and a text; the picture of
// row null (if not negative) is null.
func imageTable(pics [][]byte, hf bool, null int) arrow.RecordBatch {
	imgType := arrow.DataType(arrow.BinaryTypes.Binary)
	if hf {
		imgType = arrow.StructOf(arrow.Field{Name: "bytes", Type: arrow.BinaryTypes.Binary, Nullable: true},
			arrow.Field{Name: "path", Type: arrow.BinaryTypes.String, Nullable: true})
	}
	sc := arrow.NewSchema([]arrow.Field{{Name: "label", Type: arrow.PrimitiveTypes.Int64},
		{Name: "image", Type: imgType, Nullable: true}, {Name: "text", Type: arrow.BinaryTypes.String, Nullable: true}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	defer b.Release()
	for i, p := range pics {
		b.Field(0).(*array.Int64Builder).Append(int64(i % 3))
		switch f := b.Field(1).(type) {
		case *array.BinaryBuilder:
			if i == null {
				f.AppendNull()
			} else {
				f.Append(p)
			}
		case *array.StructBuilder:
			f.Append(true)
			if i == null {
				f.FieldBuilder(0).(*array.BinaryBuilder).AppendNull()
			} else {
				f.FieldBuilder(0).(*array.BinaryBuilder).Append(p)
			}
			f.FieldBuilder(1).(*array.StringBuilder).Append(fmt.Sprintf("p%d.jpg", i))
		}
		b.Field(2).(*array.StringBuilder).Append(fmt.Sprintf("row %d", i))
	}
	return b.NewRecordBatch()
}

func writeImageArrow(t testing.TB, path string, rec arrow.RecordBatch, opts ...ipc.Option) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ipc.NewFileWriter(f, append(opts, ipc.WithSchema(rec.Schema()))...)
	if err != nil {
		t.Fatal(err)
	}
	for lo := int64(0); lo < rec.NumRows(); lo += 37 {
		s := rec.NewSlice(lo, min(lo+37, rec.NumRows()))
		if err := w.Write(s); err != nil {
			t.Fatal(err)
		}
		s.Release()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func writeImageParquet(t testing.TB, path string, rec arrow.RecordBatch) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Snappy), parquet.WithMaxRowGroupLength(50),
		parquet.WithBatchSize(8), parquet.WithDataPageSize(4096))
	w, err := pqarrow.NewFileWriter(rec.Schema(), f, props, pqarrow.NewArrowWriterProperties(pqarrow.WithStoreSchema()))
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

// transformed reads every batch of l to the end: per epoch, each row's
// output (the image column's fixed-size list) and its label and text.
func transformed(t *testing.T, l *loader.Loader) []map[int]string {
	t.Helper()
	schema, _ := l.RowsOutput()
	var epochs []map[int]string
	for {
		b, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return epochs
		}
		if err != nil {
			t.Fatal(err)
		}
		rec, release, err := columnar.Record(schema, b.Data[:b.Columns.Len])
		if err != nil {
			t.Fatal(err)
		}
		for len(epochs) <= b.Epoch {
			epochs = append(epochs, map[int]string{})
		}
		col := rec.Column(1).(*array.FixedSizeList)
		vals := col.ListValues().(*array.Uint8).Uint8Values()
		size := len(vals) / int(rec.NumRows())
		for i, id := range b.IDs {
			if _, twice := epochs[b.Epoch][id]; twice {
				t.Fatalf("row %d twice in epoch %d", id, b.Epoch)
			}
			epochs[b.Epoch][id] = fmt.Sprintf("%d|%s|%x", rec.Column(0).(*array.Int64).Value(i),
				rec.Column(2).(*array.String).Value(i), vals[i*size:(i+1)*size])
		}
		release()
		b.Release()
	}
}

// A transform of a column of rows (image:size=,crop=, and the random
// crop) gives, for every row of Arrow files (uncompressed and LZ4) and
// Parquet, its column as binary or as a Hugging Face Image, the bytes the
// transform gives for that row's picture, in a fixed-size list column of
// the outputs, beside the row's other columns as they are; through whole
// batches and opportunistic windows, each row once an epoch.
func TestRowsTransform(t *testing.T) {
	pics := pictures(t, 130)
	dir := t.TempDir()
	center, _, err := transform.New("image:size=24,crop=16")
	if err != nil {
		t.Fatal(err)
	}
	random, _, err := transform.New("random_resized_crop:size=16")
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, c := range []struct {
		name string
		hf   bool
		opts []ipc.Option
	}{{"bin.arrow", false, nil}, {"hf.arrow", true, nil}, {"lz4.arrow", true, []ipc.Option{ipc.WithLZ4()}}, {"hf.parquet", true, nil}} {
		p := filepath.Join(dir, c.name)
		rec := imageTable(pics, c.hf, -1)
		if strings.HasSuffix(p, ".parquet") {
			writeImageParquet(t, p, rec)
		} else {
			writeImageArrow(t, p, rec, c.opts...)
		}
		rec.Release()
		files = append(files, p)
	}
	const seed = 5
	for _, p := range files {
		for _, tc := range []struct {
			name   string
			tf     transform.Transform
			window int
		}{{"center", center, 1}, {"center window", center, 3}, {"random", random, 1}} {
			t.Run(filepath.Base(p)+" "+tc.name, func(t *testing.T) {
				ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
				if err != nil {
					t.Fatal(err)
				}
				defer ds.Close()
				l, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len(), Seed: 2},
					loader.Options{BatchSize: 9, Epochs: 2, Seed: seed, Transform: tc.tf, Opportunistic: tc.window})
				if err != nil {
					t.Fatal(err)
				}
				got := transformed(t, l)
				l.Close()
				if _, cols := l.RowsOutput(); len(cols) != 3 || cols[1].Layout != "fixed_list" || cols[1].Size != tc.tf.Size() {
					t.Fatalf("columns %+v: want the image column a fixed_list of %d", cols, tc.tf.Size())
				}
				out := make([]byte, tc.tf.Size())
				for e, rows := range got {
					if len(rows) != len(pics) {
						t.Fatalf("epoch %d: %d rows of %d", e, len(rows), len(pics))
					}
					for id, row := range rows {
						if r, ok := tc.tf.(transform.Random); ok {
							err = r.ApplyRandom(pics[id], out, transform.Draw(seed, e, id))
						} else {
							err = tc.tf.Apply(pics[id], out)
						}
						if err != nil {
							t.Fatal(err)
						}
						if want := fmt.Sprintf("%d|row %d|%x", id%3, id, out); row != want {
							t.Fatalf("epoch %d row %d: the batch holds another output (or other columns)", e, id)
						}
					}
				}
			})
		}
	}
}

// A transform names its column, which must hold bytes: another column, a
// column the data has not, or a null value, is an error naming the column
// (and for the null, its row).
func TestRowsTransformRefusals(t *testing.T) {
	pics := pictures(t, 20)
	dir := t.TempDir()
	tf, _, _ := transform.New("image:size=24,crop=16")
	p := filepath.Join(dir, "n.arrow")
	rec := imageTable(pics, true, 11)
	writeImageArrow(t, p, rec)
	rec.Release()
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	for col, want := range map[string]string{"label": `column="label" is int64, not binary`, "nope": `column="nope": no such column`,
		"text": `column="text" is utf8, not binary`} {
		_, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len()}, loader.Options{Transform: tf, Column: col})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("column %q: %v, want %q", col, err, want)
		}
	}
	if c, err := loader.RowsColumn(ds.(dataset.Rows), ""); c != "image" || err != nil {
		t.Fatalf("the default column: %q, %v", c, err)
	}
	l, err := loader.New(context.Background(), ds, sampler.Sequential{N: ds.Len()}, loader.Options{BatchSize: 8, Transform: tf})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for {
		b, err := l.Next(context.Background())
		var re *loader.RecordError
		if errors.As(err, &re) {
			if re.ID != 11 || !strings.Contains(err.Error(), `column "image" is null`) {
				t.Fatalf("the null picture's error: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%v, want the null picture's error", err)
		}
		b.Release()
	}
}

// Jobs sharing a dataset of rows and a transform of its pictures (one
// group, whose cache keeps an output for each row it gives several jobs)
// transform each shared row once: at one pace, three jobs over two epochs
// run the transform about once per row per epoch, not three times, each
// row's output still the transform's of its picture, each row once per
// epoch per job; the cache is empty once they end.
func TestSharedRowsTransformOnce(t *testing.T) {
	pics := pictures(t, 240)
	dir := t.TempDir()
	tf, _, _ := transform.New("image:size=24,crop=16")
	for _, name := range []string{"hf.arrow", "hf.parquet"} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, name)
			rec := imageTable(pics, true, -1)
			if strings.HasSuffix(name, ".parquet") {
				writeImageParquet(t, p, rec)
			} else {
				writeImageArrow(t, p, rec)
			}
			rec.Release()
			ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
			if err != nil {
				t.Fatal(err)
			}
			defer ds.Close()
			n := ds.Len()
			ct := &counting{Transform: tf}
			c := cache.New(cache.Options{Budget: 64 << 20, DropUnreferenced: true})
			key := func(id int) cache.Key { return cache.Key{Space: 9, ID: int64(id)} }
			g := share.NewGroup(share.Options{Records: n, Cache: c, Key: key, Size: func(int) int { return tf.Size() }, Seed: 3})
			const jobs, epochs = 3, 2
			want := make([][]byte, n)
			for id := range want {
				want[id] = make([]byte, tf.Size())
				if err := tf.Apply(pics[id], want[id]); err != nil {
					t.Fatal(err)
				}
			}
			pace := newBarrier(jobs)
			var eg errgroup.Group
			var hits atomic.Int64
			for k := range jobs {
				m, err := g.Join(nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				eg.Go(func() error {
					defer m.Leave()
					defer pace.leave()
					l, err := loader.New(context.Background(), ds, m, loader.Options{BatchSize: 16, Cache: c, CacheSpace: 9,
						Transform: ct, Epochs: epochs, Prefetch: 2, Lazy: true})
					if err != nil {
						return err
					}
					defer l.Close()
					schema, _ := l.RowsOutput()
					seen := map[[2]int]bool{}
					for {
						b, err := l.Next(context.Background())
						if errors.Is(err, io.EOF) {
							break
						}
						if err != nil {
							return err
						}
						rec, release, err := columnar.Record(schema, b.Data[:b.Columns.Len])
						if err != nil {
							return err
						}
						vals := rec.Column(1).(*array.FixedSizeList).ListValues().(*array.Uint8).Uint8Values()
						for i, id := range b.IDs {
							if !bytes.Equal(vals[i*tf.Size():(i+1)*tf.Size()], want[id]) {
								return fmt.Errorf("job %d row %d: another output", k, id)
							}
							if seen[[2]int{b.Epoch, id}] {
								return fmt.Errorf("job %d row %d twice in epoch %d", k, id, b.Epoch)
							}
							seen[[2]int{b.Epoch, id}] = true
						}
						release()
						b.Release()
						pace.wait()
					}
					if len(seen) != epochs*n {
						return fmt.Errorf("job %d: %d rows over %d epochs of %d", k, len(seen), epochs, n)
					}
					hits.Add(l.Stats().CacheHits)
					return nil
				})
			}
			if err := eg.Wait(); err != nil {
				t.Fatal(err)
			}
			// A row given to k jobs in one round is transformed once for
			// them: Given less Saved (k-1 for each) is what the jobs make.
			// At one pace that is about once a row an epoch.
			st := g.Stats()
			runs := ct.runs.Load()
			t.Logf("%s: %d transforms for %d jobs x %d epochs x %d rows (%d given, %d saved by sharing, %d copies from the cache)",
				name, runs, jobs, epochs, n, st.Given, st.Saved, hits.Load())
			if runs > st.Given-st.Saved+10 || st.Saved < st.Given/3 {
				t.Fatalf("the transform ran %d times for %d rows given (%d of them to another job too) over %d epochs shared by %d jobs",
					runs, st.Given, st.Saved, epochs, jobs)
			}
			if cs := c.Stats(); cs.Items != 0 {
				t.Fatalf("%d items (%d bytes) left in the cache", cs.Items, cs.Bytes)
			}
		})
	}
}

// A transform whose outputs are float32s (libsvm_dense, of a binary column
// of LIBSVM lines) gives a fixed-size list of float32s, each row's the
// transform's bytes.
func TestRowsTransformFloats(t *testing.T) {
	sc := arrow.NewSchema([]arrow.Field{{Name: "line", Type: arrow.BinaryTypes.Binary}, {Name: "k", Type: arrow.PrimitiveTypes.Int64}}, nil)
	b := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	var lines [][]byte
	for i := range 50 {
		l := []byte(fmt.Sprintf("%d 1:%d %d:0.5", i%2, i, 2+i%4))
		lines = append(lines, l)
		b.Field(0).(*array.BinaryBuilder).Append(l)
		b.Field(1).(*array.Int64Builder).Append(int64(i))
	}
	rec := b.NewRecordBatch()
	b.Release()
	p := filepath.Join(t.TempDir(), "lines.arrow")
	writeImageArrow(t, p, rec)
	rec.Release()
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	tf, _, err := transform.New("libsvm_dense:n_features=5")
	if err != nil {
		t.Fatal(err)
	}
	l, err := loader.New(context.Background(), ds, sampler.Global{N: ds.Len(), Seed: 1}, loader.Options{BatchSize: 8, Transform: tf})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	schema, cols := l.RowsOutput()
	if cols[0].Layout != "fixed_list" || cols[0].Size != 6 || cols[0].Children[0].Dtype != "<f4" {
		t.Fatalf("the outputs' column %+v, want a fixed_list of 6 float32s", cols[0])
	}
	want := make([]byte, tf.Size())
	seen := 0
	for {
		bt, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rec, release, err := columnar.Record(schema, bt.Data[:bt.Columns.Len])
		if err != nil {
			t.Fatal(err)
		}
		vals := rec.Column(0).(*array.FixedSizeList).ListValues().(*array.Float32)
		for i, id := range bt.IDs {
			if err := tf.Apply(lines[id], want); err != nil {
				t.Fatal(err)
			}
			for k := range 6 {
				if got := vals.Value(6*i + k); math.Float32bits(got) != binary.LittleEndian.Uint32(want[4*k:]) {
					t.Fatalf("row %d: element %d is %v", id, k, got)
				}
			}
			seen++
		}
		release()
		bt.Release()
	}
	if seen != 50 {
		t.Fatalf("%d rows of 50", seen)
	}
}
