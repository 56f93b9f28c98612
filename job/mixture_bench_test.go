package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

// BenchmarkMixture loads one epoch of sources files mixed by weight
// against the same files read as one dataset and against their records in
// one file, warm, in this process: the mixture's cost (its schedule, the
// sources one after another) beside the reads. Reading many files costs
// the kernel more per read than reading one.
//
//	go test ./job -run XXX -bench Mixture -count 5
func BenchmarkMixture(b *testing.B) {
	for _, sources := range []int{3, 1000} {
		b.Run(fmt.Sprint(sources), func(b *testing.B) { benchMixture(b, sources) })
	}
}

func benchMixture(b *testing.B, sources int) {
	dir := b.TempDir()
	const total, size = 600_000, 128
	n := total / sources
	var mix []wire.MixSource
	var files []string
	for k := range sources {
		p := filepath.Join(dir, fmt.Sprintf("s%04d.bin", k))
		if err := synth.WriteFixed(p, n, size, 0); err != nil {
			b.Fatal(err)
		}
		mix = append(mix, wire.MixSource{Paths: []string{p}, Weight: 1})
		files = append(files, p)
	}
	all := filepath.Join(dir, "all.bin")
	if err := synth.WriteFixed(all, sources*n, size, 0); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		spec wire.JobSpec
	}{
		{"one file", wire.JobSpec{Paths: []string{all}}},
		{"same files", wire.JobSpec{Paths: files}},
		{"mixed", wire.JobSpec{Mixture: mix, MixtureStop: "all_exhausted"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			env, err := NewEnv(EnvOptions{IndexDir: dir})
			if err != nil {
				b.Fatal(err)
			}
			defer env.Close()
			samples := 0
			for i := range b.N {
				spec := c.spec
				spec.RecordSize, spec.BatchSize, spec.Shuffle, spec.Seed, spec.Epochs = size, 256, true, uint64(i), 1
				plan, err := Check(&spec)
				if err != nil {
					b.Fatal(err)
				}
				j, err := env.open(context.Background(), plan, nil)
				if err != nil {
					b.Fatal(err)
				}
				for {
					bt, err := j.Next(context.Background())
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
					samples += len(bt.IDs)
					bt.Release()
				}
				j.Close()
			}
			b.ReportMetric(float64(samples)/b.Elapsed().Seconds(), "samples/s")
		})
	}
}
