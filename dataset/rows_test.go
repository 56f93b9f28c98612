package dataset_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/parquet/compress"
	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// Opportunistic windows of rows (uncompressed and compressed Arrow, whose
// batches are claimed and decompressed once, and Parquet, whose pages are)
// deliver every row once per epoch, equal to arrow-go's reading of it:
// windows of several sizes, a last window short, two loaders at once on
// one dataset (one cache of unpacked pages), and a resume from a window's
// middle leaving out what it delivered.
func TestOpportunisticRows(t *testing.T) {
	arrowPaths, arrowWant := compressedArrow(t)
	pq := filepath.Join(t.TempDir(), "t.parquet")
	pqWant := writeParquet(t, pq, 600, compress.Codecs.Snappy, false)
	for _, c := range []struct {
		name  string
		paths []string
		want  []string
	}{{"arrow", arrowPaths, arrowWant}, {"parquet", []string{pq}, pqWant}} {
		for _, window := range []int{2, 5} {
			t.Run(fmt.Sprintf("%s window=%d", c.name, window), func(t *testing.T) {
				ds, err := dataset.Open(context.Background(), dataset.Options{}, c.paths...)
				if err != nil {
					t.Fatal(err)
				}
				defer ds.Close()
				var g errgroup.Group
				for seed := range 2 {
					g.Go(func() error {
						return readEpochWith(t, ds, sampler.Global{N: ds.Len(), Seed: uint64(seed)},
							loader.Options{BatchSize: 23, Epochs: 1, Opportunistic: window}, c.want, nil)
					})
				}
				if err := g.Wait(); err != nil {
					t.Fatal(err)
				}
				resumeRows(t, ds, window, c.want)
			})
		}
	}
}

// resumeRows stops an opportunistic epoch after a few batches, inside a
// window, and resumes it from the loader's state: the two read every row
// once, each equal to want.
func resumeRows(t *testing.T, ds dataset.Dataset, window int, want []string) {
	smp := sampler.Global{N: ds.Len(), Seed: 9}
	opts := loader.Options{BatchSize: 23, Epochs: 1, Opportunistic: window}
	seen := map[int]int{}
	read := func(l *loader.Loader, stop int) {
		defer l.Close()
		for k := 0; stop < 0 || k < stop; k++ {
			b, err := l.Next(context.Background())
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := batchRows(t, ds.Info().Schema, b)
			for i, id := range b.IDs {
				if g, w := canon(t, got[i]), canon(t, want[id]); g != w {
					t.Fatalf("row %d:\n got %s\nwant %s", id, g, w)
				}
				seen[id]++
			}
			b.Release()
		}
	}
	l, err := loader.New(context.Background(), ds, smp, opts)
	if err != nil {
		t.Fatal(err)
	}
	read(l, window+1) // one window, and the first batch of the next
	st := l.State()
	l.Close()
	if len(st.Skip) == 0 {
		t.Fatalf("stopped inside a window, the state %+v skips nothing", st)
	}
	opts.Epoch, opts.Batch, opts.Skip = st.Epoch, st.Batch, st.Skip
	if l, err = loader.New(context.Background(), ds, smp, opts); err != nil {
		t.Fatal(err)
	}
	read(l, -1)
	for id := range ds.Len() {
		if seen[id] != 1 {
			t.Fatalf("row %d came %d times across the resume", id, seen[id])
		}
	}
}
