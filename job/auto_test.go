package job

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/quality"
	"github.com/riffle-ml/riffle/wire"
)

// A device model: records per second of an order, by the size of its
// reads, over 4 KiB records: a disk's rate grows with the read size, and a
// block order's window of w blocks reads w-th shares of them.
func disk(a Auto) (float64, error) {
	read := 4096.0
	if a.Sampler == "block" {
		read = float64(a.BlockSize) / float64(a.Window) * 8 // nearby reads merge, some
	}
	bw := min(2e9, 2e8*read/4096) // 4 KiB reads at a tenth of its bandwidth
	return bw / 4096, nil
}

// memoryDevice reads any pattern alike.
func memoryDevice(Auto) (float64, error) { return 5e5, nil }

func TestChooseOrder(t *testing.T) {
	const n, rec = 1 << 20, 4096 // 4 GiB of 4 KiB records
	total := int64(n * rec)
	for _, c := range []struct {
		name    string
		measure func(Auto) (float64, error)
		minRL   float64
		memory  int64
		want    string // the sampler
	}{
		{"memory: every order reads alike, the most random wins", memoryDevice, 0.5, 8 << 30, "global"},
		// RL 0.9 of 2^20 records needs windows of about 2^18 of them (RL's
		// log of the orders grows as the log of a window's records).
		{"disk, room for windows of a quarter of the data", disk, 0.9, 8 << 30, "block"},
		{"disk, too little memory to reach the level", disk, 0.9, 256 << 20, "global"},
		{"disk, a full shuffle asked for", disk, 1, 8 << 30, "global"},
		{"disk, a lower level in less memory", disk, 0.6, 256 << 20, "block"},
	} {
		cands := candidates(n, total, c.minRL, c.memory, func(size int) int { return int((total + int64(size) - 1) / int64(size)) })
		for _, a := range cands {
			if a.RL < c.minRL {
				t.Errorf("%s: candidate %+v below RL %.2f", c.name, a, c.minRL)
			}
			if a.Sampler == "block" {
				blocks := int(total / int64(a.BlockSize))
				if a.Window < min(minMix, blocks) || 3*int64(a.Window)*int64(a.BlockSize) > c.memory {
					t.Errorf("%s: window %d of %d-byte blocks: fewer than %d, or more than memory %d", c.name, a.Window, a.BlockSize, minMix, c.memory)
				}
				if rl := quality.BlockRL(n, blocks, a.Window); rl != a.RL {
					t.Errorf("%s: RL %.4f, the block order's is %.4f", c.name, a.RL, rl)
				}
			}
		}
		a, err := choose(cands, c.measure)
		if err != nil {
			t.Fatal(err)
		}
		if a.Sampler != c.want {
			t.Errorf("%s: chose %+v of %d candidates, want %s", c.name, a, len(cands), c.want)
		}
		for _, o := range cands {
			if r, _ := c.measure(o); r > a.Rate*1.01 {
				t.Errorf("%s: chose %+v, slower than %+v (%.0f/s)", c.name, a, o, r)
			}
		}
	}
}

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
