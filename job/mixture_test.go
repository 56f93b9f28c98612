package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/wire"
)

// mixtureSources writes three sources of other formats whose records say
// their source and index: lines of JSON, a directory of files and a file
// of fixed-size records.
func mixtureSources(t *testing.T) (dir string, paths [][]string, lens []int) {
	t.Helper()
	dir = t.TempDir()
	var b strings.Builder
	for i := range 500 {
		fmt.Fprintf(&b, "{\"s\": 0, \"i\": %d%s}\n", i, strings.Repeat(" ", i%37))
	}
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lines := write("a.jsonl", b.String())
	for i := range 120 {
		write(fmt.Sprintf("tree/c%d/%04d.bin", i%3, i), fmt.Sprintf("s1 i%d %s", i, strings.Repeat("x", i)))
	}
	// A .npy of 900 rows of 16 bytes: the header padded to 128 bytes.
	hdr := "{'descr': '|u1', 'fortran_order': False, 'shape': (900, 16), }"
	hdr += strings.Repeat(" ", 128-10-len(hdr)-1) + "\n"
	var npy strings.Builder
	npy.WriteString("\x93NUMPY\x01\x00" + string([]byte{byte(len(hdr)), 0}) + hdr)
	for i := range 900 {
		fmt.Fprintf(&npy, "s2 %012d\n", i) // 16 bytes
	}
	rec := write("c.npy", npy.String())
	return dir, [][]string{{lines}, {filepath.Join(dir, "tree")}, {rec}}, []int{500, 120, 900}
}

// soloRecords reads every record of paths alone, in file order.
func soloRecords(t *testing.T, env *Env, paths []string) [][]byte {
	t.Helper()
	spec := &wire.JobSpec{Paths: paths, BatchSize: 64, Sampler: "sequential", Epochs: 1}
	var out [][]byte
	for _, b := range batches(t, env, spec) {
		out = append(out, b...)
	}
	return out
}

// openJob checks spec and opens its job in env; close it before env.
func openJob(t testing.TB, env *Env, spec *wire.JobSpec) *Job {
	t.Helper()
	plan, err := Check(spec)
	if err != nil {
		t.Fatal(err)
	}
	j, err := env.open(context.Background(), plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// inTurn reads jobs to their end, a batch of each in turn (as trainers
// at one pace), giving each batch to take before its release.
func inTurn(t *testing.T, jobs []*Job, take func(k int, b *loader.Batch)) {
	t.Helper()
	for done := 0; done < len(jobs); {
		done = 0
		for k, j := range jobs {
			b, err := j.Next(context.Background())
			if errors.Is(err, io.EOF) {
				done++
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			take(k, b)
			b.Release()
		}
	}
}

// batches loads spec's batches, each as its records' bytes.
func batches(t *testing.T, env *Env, spec *wire.JobSpec) [][][]byte {
	t.Helper()
	j := openJob(t, env, spec)
	defer j.Close()
	var out [][][]byte
	for {
		b, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		var recs [][]byte
		for i := range b.IDs {
			recs = append(recs, append([]byte(nil), b.Record(i)...))
		}
		b.Release()
		out = append(out, recs)
	}
}

// A mixture of three formats: every record's bytes are a solo read's,
// each source is in its own share of every epoch, the source that ends
// the epoch is there whole and the others at most once, and DDP ranks
// split each epoch into disjoint parts.
func TestMixtureOfFormats(t *testing.T) {
	_, paths, lens := mixtureSources(t)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	solo := map[string][2]int{} // bytes -> source, index
	for k, p := range paths {
		for i, r := range soloRecords(t, env, p) {
			solo[string(r)] = [2]int{k, i}
		}
	}
	if len(solo) != 500+120+900 {
		t.Fatalf("%d distinct records read alone", len(solo))
	}
	weights := []float64{2, 1, 3}
	var mix []wire.MixSource
	for k, p := range paths {
		mix = append(mix, wire.MixSource{Paths: p, Weight: weights[k]})
	}
	const epochs, world = 3, 3
	// The ranks' batches, epoch by epoch: each rank is a job of its own.
	perRank := make([][][][]byte, world)
	for r := range world {
		perRank[r] = batches(t, env, &wire.JobSpec{Mixture: mix, BatchSize: 50, Shuffle: true, Seed: 9, Epochs: epochs, Rank: r, World: world})
	}
	whole := batches(t, env, &wire.JobSpec{Mixture: mix, BatchSize: 50, Shuffle: true, Seed: 9, Epochs: epochs})
	var all [][]byte
	for _, b := range whole {
		all = append(all, b...)
	}
	n := len(all) / epochs
	if n*epochs != len(all) {
		t.Fatalf("%d records over %d epochs", len(all), epochs)
	}
	// The first-exhausted source: the directory's 120 records at a sixth
	// of the weight. The draw past them has the priority 120.5/1, after
	// 241 of the lines' (k+0.5)/2 and 361 of the array's (k+0.5)/3.
	if n != 722 {
		t.Fatalf("an epoch of %d positions, want 722", n)
	}
	for e := range epochs {
		seen := map[string]bool{}
		cnt := make([]int, 3)
		for _, r := range all[e*n : (e+1)*n] {
			at, ok := solo[string(r)]
			if !ok {
				t.Fatalf("epoch %d: record %q is no source's record as read alone", e, r)
			}
			if seen[string(r)] {
				t.Fatalf("epoch %d: record %q twice", e, r)
			}
			seen[string(r)] = true
			cnt[at[0]]++
		}
		for k, w := range weights {
			if d := math.Abs(float64(cnt[k]) - float64(n)*w/6); d >= 1 {
				t.Fatalf("epoch %d: source %d has %d records, want %.1f", e, k, cnt[k], float64(n)*w/6)
			}
		}
		if cnt[1] != lens[1] {
			t.Fatalf("epoch %d: the directory gave %d of its %d records", e, cnt[1], lens[1])
		}
		// The ranks' parts of the epoch are disjoint and make it whole.
		ranks := map[string]int{}
		for r := range world {
			per := len(perRank[r]) / epochs
			for _, b := range perRank[r][e*per : (e+1)*per] {
				for _, rec := range b {
					ranks[string(rec)]++
				}
			}
		}
		if len(ranks) != n {
			t.Fatalf("epoch %d: the ranks hold %d records, the epoch %d", e, len(ranks), n)
		}
		repeats := 0
		for rec, c := range ranks {
			if !seen[rec] {
				t.Fatalf("epoch %d: the ranks hold %q, which the epoch does not", e, rec)
			}
			repeats += c - 1
		}
		// 722 positions over 3 ranks: padded as DistributedSampler pads.
		if repeats != (world-n%world)%world {
			t.Fatalf("epoch %d: %d repeats over the ranks, want DistributedSampler's padding, %d", e, repeats, (world-n%world)%world)
		}
	}
}

// Sources a mixture cannot put together are refused, naming the source.
func TestMixtureRefusals(t *testing.T) {
	dir, paths, _ := mixtureSources(t)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	open := func(spec *wire.JobSpec) error {
		plan, err := Check(spec)
		if err != nil {
			return err
		}
		j, err := env.open(context.Background(), plan, nil)
		if err == nil {
			j.Close()
		}
		return err
	}
	mix := []wire.MixSource{{Paths: paths[0], Weight: 1}, {Paths: []string{filepath.Join(dir, "nothing.jsonl")}, Weight: 1}}
	if err := open(&wire.JobSpec{Mixture: mix, BatchSize: 8}); err == nil || !strings.Contains(err.Error(), "mixture source 1") {
		t.Fatalf("a missing source: %v", err)
	}
	mix[1].Paths = paths[2]
	for name, spec := range map[string]*wire.JobSpec{
		"paths too":      {Paths: paths[0], Mixture: mix, BatchSize: 8},
		"zero weight":    {Mixture: []wire.MixSource{{Paths: paths[0], Weight: 0}}, BatchSize: 8},
		"stop":           {Mixture: mix, MixtureStop: "never", BatchSize: 8},
		"bogus sampler":  {Mixture: mix, Sampler: "bogus", BatchSize: 8},
		"history length": {Mixture: mix, MixtureHistory: []wire.MixWeights{{Until: 2, Weights: []float64{1}}}, Epoch: 3, BatchSize: 8},
		"stop alone":     {Paths: paths[0], MixtureStop: "all_exhausted", BatchSize: 8},
	} {
		if err := open(spec); !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v, want a spec error", name, err)
		}
	}
	// An epoch before the current weights is read with the weights it
	// had (the history holds them), to their end: a job of its own after.
	early := &wire.JobSpec{Mixture: mix, MixtureHistory: []wire.MixWeights{{Until: 2, Weights: []float64{1, 1}}}, Epoch: 1, Epochs: -1, BatchSize: 8}
	if j, err := env.Open(context.Background(), early, nil); err != nil || j.Describe().Epochs != 1 {
		t.Fatalf("an epoch of the history's weights: %v, want a job of its one epoch", err)
	} else {
		j.Close()
	}
	// Weights a float64 cannot schedule are a spec error naming the
	// source and the bound (they panicked, or filled for ever); weights
	// that only overflow a sum are their ratios' order.
	for name, ws := range map[string][]float64{
		"ratio past 2^-50":  {1, 1e308},
		"a denormal ratio":  {5e-324, 1},
		"infinite":          {1, math.Inf(1)},
		"negative":          {1, -1},
		"history's ratio":   nil,
		"all_exhausted too": {1, 0x1p-49},
	} {
		spec := &wire.JobSpec{Mixture: []wire.MixSource{{Paths: paths[0], Weight: 1}, {Paths: paths[2], Weight: 1}}, BatchSize: 8}
		switch name {
		case "history's ratio":
			spec.MixtureHistory = []wire.MixWeights{{Until: 1, Weights: []float64{1e-300, 1}}}
			spec.Epoch = 1
		case "all_exhausted too":
			spec.MixtureStop = "all_exhausted"
			fallthrough
		default:
			spec.Mixture[0].Weight, spec.Mixture[1].Weight = ws[0], ws[1]
		}
		err := open(spec)
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "source ") && !strings.Contains(err.Error(), "2^50") {
			t.Errorf("weights %s: %v, want a spec error naming the source or the bound", name, err)
		}
	}
	one := &wire.JobSpec{Mixture: []wire.MixSource{{Paths: paths[0], Weight: 1}, {Paths: paths[2], Weight: 1}}, BatchSize: 8, Epochs: 2}
	huge := &wire.JobSpec{Mixture: []wire.MixSource{{Paths: paths[0], Weight: 1e308}, {Paths: paths[2], Weight: 1e308}}, BatchSize: 8, Epochs: 2}
	if got, want := batches(t, env, huge), batches(t, env, one); !reflect.DeepEqual(got, want) {
		t.Fatalf("weights [1e308, 1e308]: %d batches, not [1, 1]'s %d", len(got), len(want))
	}
}

// Two mixtures over an overlapping source, sharing: each job's source s1
// is a member of s1's share group, so the reads of s1 the two have in
// common are made once; each still takes every source's epochs whole,
// each record once, its bytes those of the file.
func TestSharedMixtures(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	lens := []int{600, 800, 400}
	for k, n := range lens {
		p := filepath.Join(dir, fmt.Sprintf("s%d.bin", k))
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "s%d %028d\n", k, i) // 32 bytes
		}
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), CacheBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	yes := true
	mixes := [][]wire.MixSource{
		{{Paths: []string{paths[0]}, Weight: 1}, {Paths: []string{paths[1]}, Weight: 1}},
		{{Paths: []string{paths[1]}, Weight: 2}, {Paths: []string{paths[2]}, Weight: 1}},
	}
	var jobs []*Job
	for k, mix := range mixes {
		j := openJob(t, env, &wire.JobSpec{Mixture: mix, MixtureStop: "all_exhausted", RecordSize: 32, BatchSize: 40,
			Shuffle: true, Seed: uint64(k), Share: &yes, Epochs: 3})
		defer j.Close()
		if !j.Describe().Shared {
			t.Fatalf("mixture %d is not shared", k)
		}
		jobs = append(jobs, j)
	}
	if n := len(env.Groups()); n != 3 {
		t.Fatalf("%d share groups, want one per source (3)", n)
	}
	// The two jobs take turns, a batch each, as two trainers at one pace.
	got := make([][]string, 2)
	inTurn(t, jobs, func(k int, b *loader.Batch) {
		for i := range b.IDs {
			got[k] = append(got[k], string(b.Record(i)))
		}
	})
	for k, recs := range got {
		// Each source's records, in the order taken: its own epochs in
		// turn, each every record once.
		per := map[string][]string{}
		for _, r := range recs {
			if len(r) != 32 || r[0] != 's' {
				t.Fatalf("job %d: record %q is no record of the files", k, r)
			}
			per[r[:2]] = append(per[r[:2]], r)
		}
		for src, rs := range per {
			n := lens[src[1]-'0']
			for e := 0; (e+1)*n <= len(rs); e++ {
				seen := map[string]bool{}
				for _, r := range rs[e*n : (e+1)*n] {
					if seen[r] {
						t.Fatalf("job %d: source %s's epoch %d has %q twice", k, src, e, r)
					}
					seen[r] = true
				}
			}
		}
	}
	saved := int64(0)
	for _, g := range env.Groups() {
		if strings.Contains(g.Source, "s1.bin") {
			saved = g.Stats.Saved
		}
	}
	if saved == 0 {
		t.Fatal("the two mixtures read none of s1 once for both")
	}
	t.Logf("reads of s1 saved by sharing: %d", saved)
}

// An Env closed with a job still open closes the job first: its reads end
// with an error, not a panic in a goroutine, and no job opens after.
func TestEnvClosesItsJobs(t *testing.T) {
	_, paths, _ := mixtureSources(t)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	j := openJob(t, env, &wire.JobSpec{Paths: paths[0], BatchSize: 8, Shuffle: true, Epochs: -1})
	b, err := j.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.Release()
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := j.Next(context.Background()); err == nil {
		t.Fatal("a job of a closed Env gave a batch")
	}
	plan, _ := Check(&wire.JobSpec{Paths: paths[0], BatchSize: 8})
	if _, err := env.open(context.Background(), plan, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("an open after Close: %v", err)
	}
}
