package job

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/wire"
)

// writeTokens writes n documents of varied lengths as a Megatron uint16
// corpus (token j of document d is (d*131+j) % 50000) and returns its
// prefix.
func writeTokens(t testing.TB, dir string, n int) string {
	t.Helper()
	prefix := filepath.Join(dir, "corpus")
	var bin bytes.Buffer
	lens := make([]int64, n)
	for d := range lens {
		lens[d] = 1 + int64(d*37%97) + int64(d%7)*20
		for j := range lens[d] {
			binary.Write(&bin, binary.LittleEndian, uint16((int64(d)*131+j)%50000))
		}
	}
	var idx bytes.Buffer
	if err := corpus.WriteIndex(&idx, corpus.Uint16, lens); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prefix+".bin", bin.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prefix+".idx", idx.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return prefix
}

// sampleArrays are one sample's arrays as a batch holds them.
type sampleArrays struct {
	ids, labels, pos []int64
	mask             []float32
}

// rows cuts a batch of samples into its samples' arrays.
func rows(t testing.TB, b *loader.Batch, S int) []sampleArrays {
	t.Helper()
	if len(b.Arrays) != 6 {
		t.Fatalf("batch arrays %+v", b.Arrays)
	}
	n := len(b.IDs)
	at := func(k int) unsafe.Pointer { return unsafe.Pointer(&b.Data[b.Arrays[k].Off]) }
	ids := unsafe.Slice((*int64)(at(0)), n*S)
	lab := unsafe.Slice((*int64)(at(1)), n*S)
	pos := unsafe.Slice((*int64)(at(2)), n*S)
	mask := unsafe.Slice((*float32)(at(3)), n*S)
	out := make([]sampleArrays, n)
	for i := range out {
		r := i * S
		out[i] = sampleArrays{slices.Clone(ids[r : r+S]), slices.Clone(lab[r : r+S]), slices.Clone(pos[r : r+S]), slices.Clone(mask[r : r+S])}
	}
	return out
}

// reference is sample id of epoch filled alone, from the corpus opened
// apart from the job.
func reference(t testing.TB, prefix string, opts sequence.Options, epoch, id int) sampleArrays {
	t.Helper()
	c, err := corpus.Open(context.Background(), corpus.Options{}, prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := sequence.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Sample(epoch, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	toks, err := sequence.Read(context.Background(), c, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := sequence.NewArrays(opts.SeqLen)
	if err := sequence.Fill(a, p, toks, 0, -1); err != nil {
		t.Fatal(err)
	}
	return sampleArrays{a.InputIDs, a.Labels, a.PositionIDs, a.LossMask}
}

// drain reads a job to its end: the samples of each batch by id.
func drain(t testing.TB, j *Job, S int) (ids []int, arrays map[int]sampleArrays) {
	t.Helper()
	arrays = map[int]sampleArrays{}
	for {
		b, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return ids, arrays
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range rows(t, b, S) {
			ids = append(ids, b.IDs[i])
			arrays[b.IDs[i]] = a
		}
		b.Release()
	}
}

// takeSteps reads n batches of j, counting each sample in seen and checking
// it against want (the uninterrupted run's samples by id).
func takeSteps(t testing.TB, j *Job, n, S int, want map[int]sampleArrays, seen map[int]int) {
	t.Helper()
	for range n {
		b, err := j.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for i, a := range rows(t, b, S) {
			seen[b.IDs[i]]++
			if !slices.Equal(a.ids, want[b.IDs[i]].ids) {
				t.Fatalf("sample %d differs from the uninterrupted run's", b.IDs[i])
			}
		}
		b.Release()
	}
}

// takeRest reads a resumed job to its end, counting each sample in seen
// and checking its ids and labels against want.
func takeRest(t testing.TB, j *Job, S int, want map[int]sampleArrays, seen map[int]int) {
	t.Helper()
	ids, arrays := drain(t, j, S)
	for _, id := range ids {
		seen[id]++
		if !slices.Equal(arrays[id].ids, want[id].ids) || !slices.Equal(arrays[id].labels, want[id].labels) {
			t.Fatalf("resumed sample %d differs from the uninterrupted run's", id)
		}
	}
}

// Every sample of the epoch comes once over 2 ranks of 2 DataLoader
// workers each, in every packing, and holds the tokens the sample's
// definition (package sequence) says, filled as Fill fills it alone.
func TestTokensEachSampleOnceAcrossRanksAndWorkers(t *testing.T) {
	prefix := writeTokens(t, t.TempDir(), 300)
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const S, B = 64, 4
	for _, c := range []struct{ packing, sampler string }{{"concat", ""}, {"best_fit", ""}, {"pad", ""}, {"best_fit", "block"}} {
		packing := c.packing
		seen := map[int]int{}
		var samples int
		for rank := range 2 {
			for worker := range 2 {
				spec := &wire.JobSpec{Paths: []string{prefix}, SeqLen: S, Packing: packing, BatchSize: B, Shuffle: true, Seed: 5,
					Rank: rank, World: 2, RankDropLast: true, BatchStride: 2, BatchOffset: worker, Epoch: 3, Epochs: 1, Sampler: c.sampler}
				j, err := env.Open(context.Background(), spec, nil)
				if err != nil {
					t.Fatalf("%s: %v", packing, err)
				}
				d := j.Describe()
				if d.Tokens == nil || d.Tokens.SeqLen != S || d.Tokens.Packing != packing {
					t.Fatalf("%s: described %+v", packing, d.Tokens)
				}
				samples = d.Samples
				ids, arrays := drain(t, j, S)
				j.Close()
				for _, id := range ids {
					seen[id]++
					want := reference(t, prefix, sequence.Options{SeqLen: S, Mode: sequence.Mode(packing), Seed: documentSeed(5)}, 3, id)
					if got := arrays[id]; !slices.Equal(got.ids, want.ids) || !slices.Equal(got.labels, want.labels) ||
						!slices.Equal(got.pos, want.pos) || !slices.Equal(got.mask, want.mask) {
						t.Fatalf("%s: sample %d differs from its definition", packing, id)
					}
				}
			}
		}
		// rank_drop_last: the epoch cut to a multiple of the 2 ranks.
		if len(seen) != samples/2*2 {
			t.Fatalf("%s: %d distinct samples, the epoch has %d", packing, len(seen), samples)
		}
		for id, n := range seen {
			if n != 1 || id < 0 || id >= samples {
				t.Fatalf("%s: sample %d delivered %d times", packing, id, n)
			}
		}
	}
}

// A run stopped mid-epoch on 2 ranks resumes from its position on 3: the
// two runs' samples are the epoch's, each once, and each sample's tokens
// are those of the uninterrupted run; in the global shuffle of best_fit's
// samples and in the block order over its windows.
func TestTokensResumeOnAnotherTopology(t *testing.T) {
	prefix := writeTokens(t, t.TempDir(), 200)
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, kind := range []string{"global", "block"} {
		t.Run(kind, func(t *testing.T) { resumeOnAnotherTopology(t, env, prefix, kind) })
	}
}

func resumeOnAnotherTopology(t *testing.T, env *Env, prefix, kind string) {
	const S, B = 32, 3
	open := func(rank, world, start int) *Job {
		spec := &wire.JobSpec{Paths: []string{prefix}, SeqLen: S, Packing: "best_fit", BatchSize: B, Shuffle: true, Seed: 9,
			Rank: rank, World: world, Start: start, Epoch: 1, Epochs: 1, Sampler: kind, PackWindow: 16}
		j, err := env.Open(context.Background(), spec, nil)
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	whole := open(0, 1, 0)
	_, want := drain(t, whole, S)
	whole.Close()
	seen := map[int]int{}
	const steps = 4
	for rank := range 2 {
		j := open(rank, 2, 0)
		takeSteps(t, j, steps, S, want, seen)
		j.Close()
	}
	for rank := range 3 {
		j := open(rank, 3, steps*2*B)
		takeRest(t, j, S, want, seen)
		j.Close()
	}
	extra := 0
	for id := range want {
		if seen[id] == 0 {
			t.Fatalf("sample %d never delivered", id)
		}
		extra += seen[id] - 1
	}
	if extra > 2 { // the resumed ranks' padding: DistributedSampler's, at most world-1
		t.Fatalf("%d samples delivered twice", extra)
	}
}

// The token options are checked at the boundary: each absurd or
// meaningless value is an InvalidSpec naming the option.
func TestTokensCheck(t *testing.T) {
	eod := int64(1 << 41)
	for name, c := range map[string]struct {
		spec wire.JobSpec
		says string
	}{
		"packing without seq_len":  {wire.JobSpec{Packing: "concat"}, "packing without seq_len"},
		"vocab without seq_len":    {wire.JobSpec{VocabSize: 5}, "vocab_size without seq_len"},
		"unknown packing":          {wire.JobSpec{SeqLen: 8, Packing: "greedy"}, "packing"},
		"pad_last of best_fit":     {wire.JobSpec{SeqLen: 8, Packing: "best_fit", PadLast: true, Epochs: 1}, "pad_last"},
		"pack_window of concat":    {wire.JobSpec{SeqLen: 8, PackWindow: 10}, "pack_window"},
		"best_fit of many epochs":  {wire.JobSpec{SeqLen: 8, Packing: "best_fit", Epochs: 3}, "epochs"},
		"pad_id outside the vocab": {wire.JobSpec{SeqLen: 8, VocabSize: 100, PadID: 100}, "pad_id"},
		"eod past its bound":       {wire.JobSpec{SeqLen: 8, EOD: &eod}, "eod"},
		"seq_len past its bound":   {wire.JobSpec{SeqLen: 1 << 21}, "seq_len"},
		"a huge batch":             {wire.JobSpec{SeqLen: 1 << 20, BatchSize: 1 << 14}, "batch_size"},
		"a bad dtype":              {wire.JobSpec{SeqLen: 8, TokenDtype: "float32"}, "token_dtype"},
		"a record format":          {wire.JobSpec{SeqLen: 8, Format: "csv"}, "format"},
		"a subset of samples":      {wire.JobSpec{SeqLen: 8, Subset: &wire.Subset{IDs: []int{1}}}, "subset"},
		"a transform":              {wire.JobSpec{SeqLen: 8, Transform: "image"}, "transform"},
		"a block order of concat":  {wire.JobSpec{SeqLen: 8, Sampler: "block"}, "sampler block"},
		"a block window too wide":  {wire.JobSpec{SeqLen: 8, Packing: "best_fit", Epochs: 1, Sampler: "block", Window: 9}, "window"},
		"opportunistic":            {wire.JobSpec{SeqLen: 8, Opportunistic: 4}, "opportunistic"},
	} {
		s := c.spec
		s.Paths, s.Shuffle = []string{"/x"}, true
		if s.BatchSize == 0 {
			s.BatchSize = 8
		}
		_, err := Check(&s)
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want a spec error naming %s", name, err, c.says)
		}
	}
	ok := wire.JobSpec{Paths: []string{"/x"}, BatchSize: 8, SeqLen: 2048, Packing: "best_fit", Epochs: 1, PackWindow: 64,
		VocabSize: 50304, PadID: 0, TokenDtype: "uint16"}
	if _, err := Check(&ok); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
}

// A Megatron corpus without seq_len is refused with the fix, not read as
// records; a token outside vocab_size is an error naming the .bin and the
// token's offset.
func TestTokensRefusals(t *testing.T) {
	prefix := writeTokens(t, t.TempDir(), 50)
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	for _, p := range []string{prefix, prefix + ".idx", prefix + ".bin"} {
		_, err := env.Open(context.Background(), &wire.JobSpec{Paths: []string{p}, BatchSize: 4, Shuffle: true}, nil)
		if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "give seq_len") {
			t.Errorf("%s without seq_len: %v, want a spec error saying to give seq_len", p, err)
		}
	}
	j, err := env.Open(context.Background(), &wire.JobSpec{Paths: []string{prefix}, BatchSize: 4, Shuffle: true,
		SeqLen: 16, VocabSize: 1000, Epochs: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for {
		b, err := j.Next(context.Background())
		if err == nil {
			b.Release()
			continue
		}
		var fe *corpus.FormatError
		if !errors.As(err, &fe) || !errors.Is(err, corpus.ErrVocab) || !strings.HasSuffix(fe.Path, ".bin") || fe.Offset%2 != 0 {
			t.Fatalf("error %v: want a FormatError of the .bin at a token's offset, wrapping ErrVocab", err)
		}
		return
	}
}

// A mixture of two corpora whose weights change at a step inside the
// epoch: from the change each source is within Webster's rounding of its
// share of the samples since (for two sources, half a sample), and a run
// stopped past the change and resumed on 3 ranks from its position, with
// the change as its history, delivers the uninterrupted run's samples,
// each once, each of the same tokens.
func TestTokensMixtureWeightsChangeAtAStep(t *testing.T) {
	dir := t.TempDir()
	a := writeTokens(t, filepath.Join(dir), 150)
	bdir := filepath.Join(dir, "b")
	os.Mkdir(bdir, 0o755)
	b := writeTokens(t, bdir, 400)
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	// The change at position 40: global step 10 of one rank's batches of
	// 4, step 5 of two ranks'; a state keeps the position (history).
	const S, B, at = 16, 4, 40
	spec := func(rank, world, start int, history bool) *wire.JobSpec {
		s := &wire.JobSpec{Mixture: []wire.MixSource{{Paths: []string{a}, Weight: 1}, {Paths: []string{b}, Weight: 1}},
			SeqLen: S, BatchSize: B, Shuffle: true, Seed: 2, Rank: rank, World: world, Start: start, Epochs: 1}
		if history {
			s.Mixture[0].Weight = 3
			s.MixtureHistory = []wire.MixWeights{{Until: 0, Position: at, Weights: []float64{1, 1}}}
		} else {
			s.MixtureSchedule = []wire.MixChange{{Epoch: 0, Step: at / (B * world), Weights: []float64{3, 1}}}
		}
		return s
	}
	ordered := spec(0, 1, 0, false)
	yes := true
	ordered.Ordered = &yes
	j, err := env.Open(context.Background(), ordered, nil)
	if err != nil {
		t.Fatal(err)
	}
	offs := j.Describe().Offsets
	if len(offs) != 2 {
		t.Fatalf("offsets %v", offs)
	}
	order, want := drain(t, j, S)
	j.Close()
	// The mixed order from the change on: source 0's share is 3/4.
	n0 := 0
	for p, id := range order[at:] {
		if id < offs[1] {
			n0++
		}
		if d := float64(n0) - 0.75*float64(p+1); d > 0.5+1e-9 || d < -0.5-1e-9 {
			t.Fatalf("%d samples after the change source 0 has %d, its share %.2f", p+1, n0, 0.75*float64(p+1))
		}
	}
	seen := map[int]int{}
	for rank := range 2 {
		j, err := env.Open(context.Background(), spec(rank, 2, 0, false), nil)
		if err != nil {
			t.Fatal(err)
		}
		takeSteps(t, j, 7, S, want, seen)
		j.Close()
	}
	for rank := range 3 {
		j, err := env.Open(context.Background(), spec(rank, 3, 7*2*B, true), nil)
		if err != nil {
			t.Fatal(err)
		}
		takeRest(t, j, S, want, seen)
		j.Close()
	}
	extra := 0
	for _, id := range order {
		if seen[id] == 0 {
			t.Fatalf("sample %d never delivered", id)
		}
		extra += seen[id] - 1
	}
	if extra > 2 || len(seen) != len(order) {
		t.Fatalf("%d repeats, %d samples of %d", extra, len(seen), len(order))
	}
}

// Two jobs of one corpus cut alike share a group at different paces (one
// takes two batches for each of the other's): each takes every sample of
// the epoch once, the group gives samples to both in one round, and a
// third job cut otherwise (another seed: other documents in each sample)
// is in a group of its own.
func TestTokensShareAtDifferentPaces(t *testing.T) {
	prefix := writeTokens(t, t.TempDir(), 300)
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	const S, B = 32, 4
	yes := true
	open := func(seed uint64) *Job {
		j, err := env.Open(context.Background(), &wire.JobSpec{Paths: []string{prefix}, SeqLen: S, Packing: "best_fit", BatchSize: B,
			Shuffle: true, Seed: seed, Share: &yes, Epochs: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !j.Describe().Shared {
			t.Fatal("not shared")
		}
		return j
	}
	fast, slow, other := open(1), open(1), open(2)
	defer fast.Close()
	defer slow.Close()
	defer other.Close()
	samples := fast.Describe().Samples
	got := map[*Job]map[int]int{fast: {}, slow: {}}
	done := map[*Job]bool{}
	take := func(j *Job) {
		if done[j] {
			return
		}
		b, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			done[j] = true
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, r := range rows(t, b, S) {
			got[j][b.IDs[i]]++
			if want := reference(t, prefix, sequence.Options{SeqLen: S, Mode: sequence.BestFit, Seed: documentSeed(1), Window: sequence.DefaultWindow}, 0, b.IDs[i]); !slices.Equal(r.ids, want.ids) {
				t.Fatalf("shared sample %d is not the sample's tokens", b.IDs[i])
			}
		}
		b.Release()
	}
	for !done[fast] || !done[slow] {
		take(fast)
		take(fast)
		take(slow)
	}
	for _, j := range []*Job{fast, slow} {
		if len(got[j]) != samples {
			t.Fatalf("%d samples of %d", len(got[j]), samples)
		}
		for id, n := range got[j] {
			if n != 1 {
				t.Fatalf("sample %d taken %d times", id, n)
			}
		}
	}
	groups := env.Groups()
	if len(groups) != 2 {
		t.Fatalf("%d share groups, want the two seeds'", len(groups))
	}
	for _, g := range groups {
		if len(g.Jobs) == 2 && g.Stats.Shared == 0 {
			t.Fatalf("the pair's group gave no sample to both in one round: %+v", g.Stats)
		}
	}
}

// The jobs reading a corpus alike (the same sequence options) share its
// samples, so an epoch's table (a pass over every document) is made once
// for them all, not at each check and open; a job cutting them otherwise
// (another seed) has its own.
func TestTokensJobsShareTheirSamples(t *testing.T) {
	prefix := writeTokens(t, t.TempDir(), 300)
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	open := func(seed uint64, rank int) *Job {
		j, err := env.Open(context.Background(), &wire.JobSpec{Paths: []string{prefix}, SeqLen: 64, Packing: "best_fit", BatchSize: 4,
			Shuffle: true, Seed: seed, Rank: rank, World: 2}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(j.Close)
		return j
	}
	a, b, c := open(5, 0), open(5, 1), open(6, 0)
	if a.samples[0] != b.samples[0] {
		t.Error("two jobs cutting the corpus alike made its samples twice")
	}
	if a.samples[0] == c.samples[0] {
		t.Error("a job of another seed reads the samples of the first")
	}
}
