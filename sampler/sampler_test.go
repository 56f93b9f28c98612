package sampler

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// exactlyOnce fails unless ids is a permutation of 0..n-1.
func exactlyOnce(t interface{ Fatalf(string, ...any) }, ids []int, n int) {
	if len(ids) != n {
		t.Fatalf("epoch has %d ids, want %d", len(ids), n)
	}
	seen := make([]bool, n)
	for p, id := range ids {
		if id < 0 || id >= n {
			t.Fatalf("position %d: id %d outside [0,%d)", p, id, n)
		}
		if seen[id] {
			t.Fatalf("position %d: id %d again", p, id)
		}
		seen[id] = true
	}
}

func TestGlobalIsPermutation(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 5000).Draw(t, "n")
		g := Global{N: n, Seed: rapid.Uint64().Draw(t, "seed")}
		e := rapid.IntRange(0, 1<<20).Draw(t, "epoch")
		exactlyOnce(t, Order(g, e), n)
	})
}

func TestSequential(t *testing.T) {
	got := Order(Sequential{N: 5}, 3)
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Fatalf("sequential order %v", got)
	}
}

// Fill from any position and in any chunking gives the same order: the
// sampler is a function of (epoch, position), which is what makes resuming
// mid-epoch exact.
func TestFillFromAnyPosition(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 3000).Draw(t, "n")
		var s Sampler = Global{N: n, Seed: rapid.Uint64().Draw(t, "seed")}
		if rapid.Bool().Draw(t, "shard") {
			w := rapid.IntRange(1, 9).Draw(t, "world")
			sh, err := NewRankPart(s, rapid.IntRange(0, w-1).Draw(t, "rank"), w, rapid.Bool().Draw(t, "droplast"))
			if err != nil {
				t.Fatal(err)
			}
			s = sh
		}
		e := rapid.IntRange(0, 100).Draw(t, "epoch")
		whole := Order(s, e)
		pos := rapid.IntRange(0, s.Len()).Draw(t, "pos")
		chunk := make([]int, rapid.IntRange(1, 64).Draw(t, "chunk"))
		var got []int
		for p := pos; ; {
			k := s.Fill(e, p, chunk)
			got = append(got, chunk[:k]...)
			p += k
			if k < len(chunk) {
				break
			}
		}
		if !slices.Equal(got, whole[pos:]) {
			t.Fatalf("filling from %d in chunks of %d differs from the whole epoch", pos, len(chunk))
		}
	})
}

func TestDeterministic(t *testing.T) {
	a := Order(Global{N: 1000, Seed: 7}, 3)
	b := Order(Global{N: 1000, Seed: 7}, 3)
	if !slices.Equal(a, b) {
		t.Fatal("same (seed, epoch) gave two orders")
	}
	for _, other := range [][]int{Order(Global{N: 1000, Seed: 7}, 4), Order(Global{N: 1000, Seed: 8}, 3)} {
		same := 0
		for i := range a {
			if a[i] == other[i] {
				same++
			}
		}
		if same > 20 { // a random pair of permutations agrees at about one place
			t.Fatalf("another epoch or seed agrees at %d of 1000 positions", same)
		}
	}
}

// The first ids of (seed 1, epoch 0) are fixed forever: an order must be
// the same on every machine and in every release, or checkpoints resume
// into different data. Changing the permutation is a breaking change.
func TestOrderIsStable(t *testing.T) {
	got := Order(Global{N: 10, Seed: 1}, 0)
	exactlyOnce(t, got, 10)
	again := Order(Global{N: 10, Seed: 1}, 0)
	if !slices.Equal(got, again) {
		t.Fatal("order changed between calls")
	}
	golden := []int{0, 6, 4, 3, 9, 2, 1, 5, 8, 7}
	if !slices.Equal(got, golden) {
		t.Fatalf("order of (N=10, seed=1, epoch=0) is %v, it was %v in earlier releases", got, golden)
	}
}

// Each record's position is uniform over epochs: a chi-square test over a
// records x positions table. With n=8 there are 64 cells and 63 degrees of
// freedom (the rows and columns each sum to the number of epochs, so
// (n-1)^2 = 49 in truth); the bound is far out in the tail (p < 1e-6).
func TestPositionUniform(t *testing.T) {
	for _, n := range []int{2, 3, 8, 13, 64} {
		epochs := 400 * n
		counts := make([]int, n*n)
		g := Global{N: n, Seed: 42}
		for e := range epochs {
			for p, id := range Order(g, e) {
				counts[id*n+p]++
			}
		}
		exp := float64(epochs) / float64(n)
		chi := 0.0
		for _, c := range counts {
			chi += (float64(c) - exp) * (float64(c) - exp) / exp
		}
		df := float64((n - 1) * (n - 1))
		// Wilson-Hilferty: chi2/df is about normal with mean 1-2/(9df) and sd sqrt(2/(9df)).
		z := (math.Cbrt(chi/df) - (1 - 2/(9*df))) / math.Sqrt(2/(9*df))
		if z > 5 {
			t.Errorf("n=%d: chi-square %.1f over %v degrees of freedom (z=%.1f): positions are not uniform", n, chi, df, z)
		}
	}
}

// The pairs (id at position 0, id at position 1) are uniform over ordered
// pairs too: a permutation family that only rotated would pass the position
// test and fail this one.
func TestAdjacentPairsUniform(t *testing.T) {
	n, epochs := 6, 30000
	counts := map[[2]int]int{}
	g := Global{N: n, Seed: 9}
	buf := make([]int, 2)
	for e := range epochs {
		g.Fill(e, 0, buf)
		counts[[2]int{buf[0], buf[1]}]++
	}
	cells := n * (n - 1)
	exp := float64(epochs) / float64(cells)
	chi := 0.0
	for a := range n {
		for b := range n {
			if a != b {
				c := float64(counts[[2]int{a, b}])
				chi += (c - exp) * (c - exp) / exp
			}
		}
	}
	df := float64(cells - 1)
	z := (math.Cbrt(chi/df) - (1 - 2/(9*df))) / math.Sqrt(2/(9*df))
	if z > 5 {
		t.Fatalf("chi-square %.1f over %v degrees of freedom: adjacent pairs are not uniform", chi, df)
	}
}

// Against the naive reference: a Fisher-Yates shuffle's mean displacement
// |position - id| is about n/3; ours must be too.
func TestDisplacementLikeFisherYates(t *testing.T) {
	n := 10000
	mean := func(order []int) float64 {
		s := 0.0
		for p, id := range order {
			s += math.Abs(float64(p - id))
		}
		return s / float64(n)
	}
	ref := make([]int, n)
	for i := range ref {
		ref[i] = i
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(n, func(i, j int) { ref[i], ref[j] = ref[j], ref[i] })
	got, want := mean(Order(Global{N: n, Seed: 3}, 0)), mean(ref)
	if math.Abs(got-want) > 0.03*float64(n) {
		t.Fatalf("mean displacement %.0f, Fisher-Yates gives %.0f", got, want)
	}
}

func TestRankPartExactlyOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 2000).Draw(t, "n")
		w := rapid.IntRange(1, 16).Draw(t, "world")
		dropLast := rapid.Bool().Draw(t, "droplast")
		seed := rapid.Uint64().Draw(t, "seed")
		base, _, err := Config{Kind: rapid.SampledFrom(Kinds).Draw(t, "kind"), Seed: seed, BlockSize: 512,
			Window: rapid.IntRange(1, 4).Draw(t, "window"), Buffer: 16, Reservoir: 32}.Build(n,
			func(id int) (int, int64, int) { return 0, int64(id) * 100, 100 })
		if err != nil {
			t.Fatal(err)
		}
		e := rapid.IntRange(0, 50).Draw(t, "epoch")
		epoch := Order(base, e)
		var all []int
		for r := range w {
			s, err := NewRankPart(base, r, w, dropLast)
			if err != nil {
				t.Fatal(err)
			}
			part := Order(s, e)
			// DistributedSampler: rank r holds positions r, r+w, ... of the padded or cut order.
			for i, id := range part {
				if want := epoch[(r+i*w)%n]; id != want {
					t.Fatalf("rank %d position %d: id %d, DistributedSampler gives %d", r, i, id, want)
				}
			}
			all = append(all, part...)
		}
		if dropLast {
			if len(all) != n/w*w {
				t.Fatalf("drop_last: %d ids in all, want %d", len(all), n/w*w)
			}
			seen := map[int]bool{}
			for _, id := range all {
				if seen[id] {
					t.Fatalf("id %d on two ranks", id)
				}
				seen[id] = true
			}
			return
		}
		if len(all) != (n+w-1)/w*w {
			t.Fatalf("padded: %d ids in all, want %d", len(all), (n+w-1)/w*w)
		}
		// Every record at least once; the only repeats are the padding.
		counts := make([]int, n)
		for _, id := range all {
			counts[id]++
		}
		extra := 0
		for id, c := range counts {
			if c == 0 {
				t.Fatalf("id %d on no rank", id)
			}
			extra += c - 1
		}
		if extra != len(all)-n {
			t.Fatalf("%d repeats, padding is %d", extra, len(all)-n)
		}
	})
}

// Chunked sharding gives rank r the r-th run of Chunk positions of each
// global batch (World*Chunk positions) and an equal run of the last,
// partial one: each rank as many positions as DistributedSampler gives
// it, at most World-1 repeats, and after k runs of every rank the ranks
// together hold exactly the order's first k*World*Chunk positions.
func TestRankPartChunks(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 2000).Draw(t, "n")
		w := rapid.IntRange(1, 8).Draw(t, "world")
		c := rapid.IntRange(1, 64).Draw(t, "chunk")
		dropLast := rapid.Bool().Draw(t, "droplast")
		base, _, err := Config{Kind: rapid.SampledFrom(Kinds).Draw(t, "kind"), Seed: rapid.Uint64().Draw(t, "seed"),
			BlockSize: 1000, Buffer: 8, Reservoir: 50}.Build(n, func(id int) (int, int64, int) { return 0, int64(id) * 64, 64 })
		if err != nil {
			t.Fatal(err)
		}
		epoch := Order(base, 3)
		want := (n + w - 1) / w
		if dropLast {
			want = n / w
		}
		parts := make([][]int, w)
		for r := range w {
			s := &RankPart{Base: base, Rank: r, World: w, DropLast: dropLast, Chunk: c}
			parts[r] = Order(s, 3)
			if len(parts[r]) != want || s.Len() != want {
				t.Fatalf("rank %d: %d positions (Len %d), want %d", r, len(parts[r]), s.Len(), want)
			}
			// Piecewise fills agree with one fill of the epoch.
			if cut := rapid.IntRange(0, want).Draw(t, "cut"); cut > 0 {
				dst := make([]int, want-cut)
				s.Fill(3, cut, dst)
				if !slices.Equal(dst, parts[r][cut:]) {
					t.Fatalf("rank %d: fill from %d differs", r, cut)
				}
			}
		}
		// Global batch by global batch, the ranks' runs are the order's prefix.
		var all []int
		for k := 0; k*c < want; k++ {
			for r := range w {
				all = append(all, parts[r][k*c:min(want, (k+1)*c)]...)
			}
			if full := (k + 1) * c * w; full <= n && (k+1)*c <= want && !slices.Equal(all, epoch[:full]) {
				t.Fatalf("after %d runs of every rank: not the order's first %d positions", k+1, full)
			}
		}
		counts := make([]int, n)
		for _, id := range all {
			counts[id]++
		}
		repeats := 0
		for id, k := range counts {
			if k == 0 && !dropLast {
				t.Fatalf("id %d on no rank", id)
			}
			repeats += max(0, k-1)
		}
		if dropLast && repeats > 0 || repeats > w-1 {
			t.Fatalf("%d repeats for %d ranks (drop_last %v)", repeats, w, dropLast)
		}
	})
}

func TestRankPartRejectsBadRank(t *testing.T) {
	for _, c := range [][2]int{{-1, 2}, {2, 2}, {0, 0}} {
		if _, err := NewRankPart(Sequential{N: 4}, c[0], c[1], false); err == nil {
			t.Errorf("rank %d of world %d accepted", c[0], c[1])
		}
	}
}

func TestBatches(t *testing.T) {
	for _, c := range []struct {
		n, size   int
		dropLast  bool
		count     int
		lastStart int
		lastLen   int
	}{
		{10, 3, false, 4, 9, 1},
		{10, 3, true, 3, 6, 3},
		{9, 3, false, 3, 6, 3},
		{2, 3, true, 0, 0, 0},
		{2, 3, false, 1, 0, 2},
	} {
		b := Batches{Len: c.n, Size: c.size, DropLast: c.dropLast}
		if b.Count() != c.count {
			t.Errorf("%+v: %d batches, want %d", c, b.Count(), c.count)
			continue
		}
		if c.count > 0 {
			if p, n := b.Span(c.count - 1); p != c.lastStart || n != c.lastLen {
				t.Errorf("%+v: last batch at %d of %d, want %d of %d", c, p, n, c.lastStart, c.lastLen)
			}
		}
	}
}

func BenchmarkGlobalFill(b *testing.B) {
	g := Global{N: 1 << 20, Seed: 1}
	buf := make([]int, 256)
	pos := 0
	for b.Loop() {
		g.Fill(0, pos, buf)
		pos = (pos + 256) % (1 << 20)
	}
	b.ReportMetric(float64(b.N*256)/b.Elapsed().Seconds(), "ids/s")
}

// An elastic resume: the epoch's first Start positions were delivered by
// some topology; ranks of any other take the rest between them, each
// position once (and at most World-1 repeats of the rest's start).
func TestStartResumesTheRestOnAnyTopology(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(2, 3000).Draw(t, "n")
		kind := rapid.SampledFrom([]string{"global", "block", "sequential", "buffered", "reservoir"}).Draw(t, "kind")
		cfg := Config{Kind: kind, Seed: rapid.Uint64().Draw(t, "seed"), BlockSize: 1000, Buffer: rapid.IntRange(1, 300).Draw(t, "buffer"),
			Reservoir: rapid.IntRange(1, 300).Draw(t, "reservoir")}
		locate := func(id int) (int, int64, int) { return 0, int64(id) * 64, 64 }
		base, _, err := cfg.Build(n, locate)
		if err != nil {
			t.Fatal(err)
		}
		epoch := Order(base, 5)
		cfg.Start = rapid.IntRange(1, n-1).Draw(t, "start")
		cfg.World = rapid.IntRange(1, 8).Draw(t, "world")
		cfg.BatchSize = rapid.IntRange(1, 64).Draw(t, "batch")
		counts := map[int]int{}
		for r := range cfg.World {
			cfg.Rank = r
			s, _, err := cfg.Build(n, locate)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range Order(s, 5) {
				counts[id]++
			}
		}
		extra := 0
		for _, id := range epoch[cfg.Start:] {
			if counts[id] == 0 {
				t.Fatalf("id %d of the rest on no rank", id)
			}
			extra += counts[id] - 1
			delete(counts, id)
		}
		if len(counts) > 0 || extra > cfg.World-1 {
			t.Fatalf("%d ids delivered before the start came again, %d repeats", len(counts), extra)
		}
	})
	if _, _, err := (Config{Kind: "global", Start: 10}).Build(10, nil); err == nil {
		t.Fatal("a start past the epoch was accepted")
	}
}

// The rest of a block order is split over ranks in runs of a batch too,
// as the whole epoch is: blocks stay whole on a resumed rank.
func TestStartKeepsBlockRuns(t *testing.T) {
	cfg := Config{Kind: "block", Seed: 3, BlockSize: 4096, Start: 100, World: 2, Rank: 1, BatchSize: 16}
	s, _, err := cfg.Build(1000, func(id int) (int, int64, int) { return 0, int64(id) * 64, 64 })
	if err != nil {
		t.Fatal(err)
	}
	if rp, ok := s.(*RankPart); !ok || rp.Chunk != 16 {
		t.Fatalf("%T %+v: want a rank part in runs of 16 over the rest", s, s)
	}
}
