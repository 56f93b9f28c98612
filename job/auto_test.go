package job

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/wire"
)

// A job of sampler auto measures the device, says what it chose, reads
// each record once an epoch in that order, and one naming the choice reads
// the same order: what a resumed job does with its state's order.
func TestAutoJob(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.bin")
	const n, rec = 8192, 512
	if err := synth.WriteFixed(p, n, rec, 0); err != nil {
		t.Fatal(err)
	}
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	spec := &wire.JobSpec{Paths: []string{p}, RecordSize: rec, BatchSize: 64, Shuffle: true, Sampler: "auto", MinRandomness: 0.5, Seed: 3, Epochs: 2}
	j := openJob(t, env, spec)
	a := j.Describe().Auto
	j.Close()
	if a == nil || a.RL < 0.5 || a.Rate <= 0 || a.Sequential <= 0 || (a.Sampler != "global" && a.Sampler != "block") {
		t.Fatalf("auto chose %+v", a)
	}
	var got [][]byte
	for _, b := range batches(t, env, spec) {
		got = append(got, b...)
	}
	if len(got) != 2*n {
		t.Fatalf("%d records in 2 epochs of %d", len(got), n)
	}
	for e := range 2 {
		ids := make([]int, n)
		for i, r := range got[e*n : (e+1)*n] {
			ids[i] = synth.IDOf(r)
		}
		slices.Sort(ids)
		for i := range ids {
			if ids[i] != i {
				t.Fatalf("epoch %d: record %d missing or repeated", e, i)
			}
		}
	}
	// Read again, as a resume does (auto_order), and named outright: the
	// same order both ways, and the job still says what auto chose.
	again := *spec
	again.AutoOrder = &wire.AutoOrder{Sampler: a.Sampler, BlockSize: a.BlockSize, Window: a.Window}
	named := *spec
	named.Sampler, named.BlockSize, named.Window, named.MinRandomness = a.Sampler, a.BlockSize, a.Window, 0
	for _, s := range []*wire.JobSpec{&again, &named} {
		var recs [][]byte
		for _, b := range batches(t, env, s) {
			recs = append(recs, b...)
		}
		if !slices.EqualFunc(got, recs, func(x, y []byte) bool { return string(x) == string(y) }) {
			t.Fatalf("%+v read another order than auto's choice", s)
		}
	}
	j = openJob(t, env, &again)
	if b := j.Describe().Auto; b == nil || *b != *a {
		t.Errorf("read again, the job says auto chose %+v, not %+v", b, a)
	}
	j.Close()
}

func TestAutoSpecs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d.bin")
	os.WriteFile(p, make([]byte, 4096), 0o644)
	for _, s := range []*wire.JobSpec{
		{Paths: []string{p}, BatchSize: 8, Sampler: "auto", MinRandomness: 1.5},
		{Paths: []string{p}, BatchSize: 8, Sampler: "global", MinRandomness: 0.5},
		{Paths: []string{p}, BatchSize: 8, Sampler: "auto", BlockSize: 65536},
		{Paths: []string{p}, BatchSize: 8, Sampler: "auto", Window: loader.MaxWindow},
		{Paths: []string{p}, BatchSize: 8, Sampler: "global", AutoOrder: &wire.AutoOrder{Sampler: "global"}},
		{Paths: []string{p}, BatchSize: 8, Sampler: "auto", AutoOrder: &wire.AutoOrder{Sampler: "buffered"}},
		{Paths: []string{p}, BatchSize: 8, Sampler: "auto", AutoOrder: &wire.AutoOrder{Sampler: "block", BlockSize: 4096, Window: loader.MaxWindow + 1}},
	} {
		if _, err := Check(s); err == nil {
			t.Errorf("%+v accepted", s)
		}
	}
}
