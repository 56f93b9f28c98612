package loader_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// BenchmarkNext is the steady state of a warm global shuffle: one op is one
// batch of 256 records of 4 KiB; allocs/op should stay near zero.
func BenchmarkNext(b *testing.B) {
	p := filepath.Join(b.TempDir(), "d.bin")
	const n, size = 1 << 15, 4096
	if err := synth.WriteFixed(p, n, size, 0); err != nil {
		b.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size}, p)
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	l, err := loader.New(context.Background(), ds, sampler.Global{N: n, Seed: 1}, loader.Options{Epochs: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	for range 64 { // warm the pools
		bt, _ := l.Next(context.Background())
		bt.Release()
	}
	b.ReportAllocs()
	b.SetBytes(256 * size)
	for b.Loop() {
		bt, err := l.Next(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		bt.Release()
	}
	b.ReportMetric(float64(b.N*256)/b.Elapsed().Seconds(), "samples/s")
}
