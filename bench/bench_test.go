package bench_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/bench"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// BenchmarkShuffle compares, in one run on one warm file, riffle's global
// shuffle against the same permutation read one record at a time and
// against a sequential read, and reports the ratios. Cold runs, fio and
// larger files are `riffle bench`'s job (see BENCHMARKS.md).
func BenchmarkShuffle(b *testing.B) {
	for _, size := range []int{4096, 128 << 10} {
		b.Run(byteSize(size), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "d.bin")
			n := (256 << 20) / size
			if err := synth.WriteFixed(path, n, size, 0); err != nil {
				b.Fatal(err)
			}
			ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size}, path)
			if err != nil {
				b.Fatal(err)
			}
			defer ds.Close()
			ctx := context.Background()
			// Several epochs, so buffers are reused and the figure is steady state.
			lim := bench.Limit{Records: 8 * n, Duration: 3 * time.Second}
			bench.Sequential(ctx, []string{path}, size, bench.Limit{}) // warm the cache
			var rf, pr, sq bench.Result
			for b.Loop() {
				if rf, err = bench.Riffle(ctx, ds, sampler.Global{N: ds.Len(), Seed: 1}, loader.Options{}, lim); err != nil {
					b.Fatal(err)
				}
				if pr, err = bench.Pread(ctx, ds, 1, lim); err != nil {
					b.Fatal(err)
				}
				if sq, err = bench.Sequential(ctx, []string{path}, size, bench.Limit{Duration: time.Minute}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(rf.SamplesPerSec(), "samples/s")
			b.ReportMetric(rf.SamplesPerSec()/pr.SamplesPerSec(), "x-pread")
			b.ReportMetric(rf.MBPerSec()/sq.MBPerSec(), "x-sequential")
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<10 {
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

func TestDeviceOf(t *testing.T) {
	// The device holding a temporary file reports a byte count that only grows.
	p := filepath.Join(t.TempDir(), "x")
	synth.WriteFixed(p, 1, 8, 0)
	d := bench.DeviceOf(p)
	if d == "" {
		t.Skip("no block device behind the temporary directory (tmpfs)")
	}
	a := d.ReadBytes()
	if a < 0 || d.Since(a) < 0 {
		t.Fatalf("device %s: %d bytes read", d, a)
	}
}
