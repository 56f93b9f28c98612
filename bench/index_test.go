package bench_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/bench"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
)

// BenchmarkIndexBuild compares building a LIBSVM file's sidecar index with
// reading the file sequentially, warm, in the same run.
func BenchmarkIndexBuild(b *testing.B) {
	path := filepath.Join(b.TempDir(), "d.svm")
	if err := synth.WriteSortedLIBSVM(path, 400000, 40, 1); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var ix, sq bench.Result
	var err error
	for b.Loop() {
		if sq, err = bench.Sequential(ctx, []string{path}, 1, bench.Limit{}); err != nil {
			b.Fatal(err)
		}
		if ix, err = bench.Index(ctx, dataset.Options{}, path); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(ix.Bytes)
	b.ReportMetric(ix.MBPerSec(), "index-MB/s")
	b.ReportMetric(ix.MBPerSec()/sq.MBPerSec(), "x-sequential")
}
