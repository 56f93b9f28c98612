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

// BenchmarkMixture loads one epoch of three files mixed by weight against
// the same records in one file, warm, in this process: the mixture's cost
// (its schedule, the sources one after another) beside the reads.
//
//	go test ./job -run XXX -bench Mixture -count 5
func BenchmarkMixture(b *testing.B) {
	dir := b.TempDir()
	const n, size = 200_000, 64
	var mix []wire.MixSource
	for k := range 3 {
		p := filepath.Join(dir, fmt.Sprintf("s%d.bin", k))
		if err := synth.WriteFixed(p, n, size, 0); err != nil {
			b.Fatal(err)
		}
		mix = append(mix, wire.MixSource{Paths: []string{p}, Weight: 1})
	}
	all := filepath.Join(dir, "all.bin")
	if err := synth.WriteFixed(all, 3*n, size, 0); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		spec wire.JobSpec
	}{
		{"unmixed", wire.JobSpec{Paths: []string{all}}},
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
				j, err := env.Open(context.Background(), plan, nil)
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
