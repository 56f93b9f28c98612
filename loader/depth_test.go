package loader

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/sampler"
)

// TestDepthOption reads a real file of 4 KiB records with O_DIRECT (every
// read goes to the device's ring) and checks the depth the loader's engine
// ends at: the option's when it pins one, within the memory bound when the
// engine chooses.
func TestDepthOption(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.bin")
	const n, size = 4096, 4096
	if err := synth.WriteFixed(p, n, size, 0); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size, Direct: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	for _, tc := range []struct {
		name    string
		opts    Options
		lo, max int
	}{
		{"pinned", Options{Depth: 8}, 8, 8},
		{"memory bound", Options{MemoryBytes: 16 * size}, 1, 16},
		{"adaptive", Options{}, 1, MaxDepth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.BatchSize = 64
			l, err := New(context.Background(), ds, sampler.Global{N: n, Seed: 1}, opts)
			if err != nil {
				t.Fatal(err)
			}
			for {
				b, err := l.Next(context.Background())
				if err != nil {
					break
				}
				for i, id := range b.IDs {
					if err := synth.CheckRecord(b.Record(i), id); err != nil {
						t.Fatal(err)
					}
				}
				b.Release()
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if !l.engine.Ring() {
				t.Skip("io_uring unavailable here")
			}
			if d := l.engine.Stats().Depth; d < tc.lo || d > tc.max {
				t.Fatalf("the device's depth is %d, want within [%d, %d]", d, tc.lo, tc.max)
			}
		})
	}
}

func TestMaxDepthIsTheMemoryBound(t *testing.T) {
	ds := fakeSized{n: 1000, bytes: 1000 * 5000}
	for _, tc := range []struct {
		mem   int64
		align int
		want  int
	}{
		{512 << 20, 1, MaxDepth}, // 107,374 reads of 5,000 bytes fit: MaxDepth bounds
		{1 << 20, 1, 209},        // 1 MiB / 5,000
		{1 << 20, 4096, 128},     // reads of two 4 KiB blocks
		{100, 1, 1},              // less than a read: still one
	} {
		if got := maxDepth(ds, Options{MemoryBytes: tc.mem}, tc.align); got != tc.want {
			t.Errorf("memory %d, align %d: max depth %d, want %d", tc.mem, tc.align, got, tc.want)
		}
	}
}

// fakeSized is a dataset of n records of bytes in all, for maxDepth.
type fakeSized struct {
	dataset.Dataset
	n     int
	bytes int64
}

func (f fakeSized) Len() int           { return f.n }
func (f fakeSized) Info() dataset.Info { return dataset.Info{Bytes: f.bytes} }
