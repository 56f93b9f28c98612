package sampler

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// mixOf mixes Global orders over sources of lens, seeded apart.
func mixOf(t *testing.T, lens []int, segs []Segment, cycle bool) (*Mixture, []int) {
	t.Helper()
	srcs := make([]Sampler, len(lens))
	offs := make([]int, len(lens))
	off := 0
	for i, n := range lens {
		srcs[i], offs[i] = Global{N: n, Seed: uint64(100 + i)}, off
		off += n
	}
	m, err := NewMixture(srcs, offs, segs, cycle)
	if err != nil {
		t.Fatal(err)
	}
	return m, offs
}

func sourceOf(offs []int, id int) int {
	i := 0
	for i+1 < len(offs) && offs[i+1] <= id {
		i++
	}
	return i
}

// Each source's draws are its own order: in an epoch of first_exhausted,
// source i's records are the first of its epoch's order, in that order;
// the source that ends the epoch gives all of them.
func TestMixtureFirstExhausted(t *testing.T) {
	lens := []int{300, 1000, 50, 777}
	m, offs := mixOf(t, lens, []Segment{{Weights: []float64{1, 2, 0.5, 3}}}, false)
	full := 0
	for epoch := range 3 {
		got := map[int][]int{}
		for _, id := range Order(m, epoch) {
			i := sourceOf(offs, id)
			got[i] = append(got[i], id-offs[i])
		}
		for i, n := range lens {
			want := Order(Global{N: n, Seed: uint64(100 + i)}, epoch)[:len(got[i])]
			for k := range want {
				if got[i][k] != want[k] {
					t.Fatalf("epoch %d source %d draw %d: %d, want its order's %d", epoch, i, k, got[i][k], want[k])
				}
			}
			if len(got[i]) == n {
				full++
			}
		}
	}
	if full < 3 {
		t.Fatalf("%d sources used up in 3 epochs: the epoch must end when the first is", full)
	}
}

// With cycle, every source's draws over the epochs are its own epochs one
// after another, each exactly once, and the epoch ends when all are used.
func TestMixtureCycle(t *testing.T) {
	lens := []int{300, 1000, 50, 777}
	m, offs := mixOf(t, lens, []Segment{{Weights: []float64{1, 2, 0.5, 3}}}, true)
	got := map[int][]int{}
	for epoch := range 4 {
		for _, id := range Order(m, epoch) {
			i := sourceOf(offs, id)
			got[i] = append(got[i], id-offs[i])
		}
		if epoch == 0 {
			for i, n := range lens {
				if len(got[i]) < n {
					t.Fatalf("epoch 0 drew %d of source %d's %d records: all_exhausted uses every one up", len(got[i]), i, n)
				}
			}
		}
	}
	checkOwnEpochs(t, lens, got)
}

// checkOwnEpochs checks that each source's draws are its own orders of
// epochs 0, 1, ... in turn.
func checkOwnEpochs(t *testing.T, lens []int, got map[int][]int) {
	t.Helper()
	for i, n := range lens {
		for k, id := range got[i] {
			if want := (Global{N: n, Seed: uint64(100 + i)}).At(k/n, k%n); id != want {
				t.Fatalf("source %d draw %d: %d, want its epoch %d's %d", i, k, id, k/n, want)
			}
		}
	}
}

// A weight change at an epoch carries every source on from where it had
// got: the epochs of the old weights and then the new are still each
// source's own epochs in turn.
func TestMixtureWeightsChange(t *testing.T) {
	lens := []int{300, 1000, 50}
	old := []Segment{{Weights: []float64{1, 2, 0.5}}}
	neu := append(old, Segment{From: 2, Weights: []float64{5, 1, 1}})
	a, offs := mixOf(t, lens, old, true)
	b, _ := mixOf(t, lens, neu, true)
	got := map[int][]int{}
	for epoch := range 5 {
		m := a
		if epoch >= 2 {
			m = b
		}
		for _, id := range Order(m, epoch) {
			i := sourceOf(offs, id)
			got[i] = append(got[i], id-offs[i])
		}
	}
	checkOwnEpochs(t, lens, got)
	if a.Len() == b.Len() {
		t.Fatalf("new weights, same epoch length %d", a.Len())
	}
}

// Any position starts where a walk from 0 would be: the mixture is a
// function of (epoch, position), whether Fill goes on, skips ahead a
// little or seeks.
func TestMixturePositional(t *testing.T) {
	for _, cycle := range []bool{false, true} {
		m, _ := mixOf(t, []int{300, 1000, 50, 777}, []Segment{{Weights: []float64{1, 2, 0.5, 3}}}, cycle)
		for epoch := range 2 {
			whole := Order(m, epoch)
			r := rand.New(rand.NewPCG(1, uint64(epoch)))
			for range 200 {
				pos := r.IntN(len(whole))
				n := min(len(whole)-pos, 1+r.IntN(70))
				dst := make([]int, n)
				m.Fill(epoch, pos, dst)
				for k := range dst {
					if dst[k] != whole[pos+k] {
						t.Fatalf("cycle %v epoch %d: Fill at %d gave %d at %d, a walk %d", cycle, epoch, pos, dst[k], pos+k, whole[pos+k])
					}
				}
			}
		}
	}
}

// Over every window, each source's share is its weight's to within two
// draws; after every prefix, to within one.
func TestMixtureProportions(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	const k = 1000
	w := make([]float64, k)
	lens := make([]int, k)
	for i := range w {
		w[i], lens[i] = 1+9*r.Float64(), 1<<20
	}
	m, offs := mixOf(t, lens, []Segment{{Weights: w}}, false)
	const n, window = 400_000, 100_000
	ids := make([]int, n)
	m.Fill(0, 0, ids)
	cnt := make([]int, k)
	at := make([][]int, 0, n/window+1) // counts at every window's start
	worstPrefix := 0.0
	for p, id := range ids {
		if p%window == 0 {
			at = append(at, append([]int(nil), cnt...))
		}
		i := sourceOf(offs, id)
		cnt[i]++
		worstPrefix = max(worstPrefix, math.Abs(float64(cnt[i])-float64(p+1)*m.Share(i)))
	}
	at = append(at, cnt)
	if worstPrefix >= 1 {
		t.Fatalf("a prefix is %.3f draws off a source's quota, want under 1", worstPrefix)
	}
	for x := 1; x < len(at); x++ {
		for i := range k {
			if d := math.Abs(float64(at[x][i]-at[x-1][i]) - window*m.Share(i)); d >= 2 {
				t.Fatalf("window %d: source %d is %.3f draws off its share", x, i, d)
			}
		}
	}
}

func TestMixtureRefuses(t *testing.T) {
	g := []Sampler{Global{N: 3}, Global{N: 4}}
	for name, segs := range map[string][]Segment{
		"zero weight":  {{Weights: []float64{0, 1}}},
		"NaN weight":   {{Weights: []float64{math.NaN(), 1}}},
		"few weights":  {{Weights: []float64{1}}},
		"late first":   {{From: 1, Weights: []float64{1, 1}}},
		"not in order": {{Weights: []float64{1, 1}}, {From: 3, Weights: []float64{1, 2}}, {From: 2, Weights: []float64{1, 3}}},
	} {
		if _, err := NewMixture(g, []int{0, 3}, segs, false); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// BenchmarkMixture fills 64 ids at a time from one global shuffle of 3M
// records, a mixture of 3 of 1M and one of 1,000 of 1,000.
//
//	go test ./sampler -run XXX -bench Mixture
func BenchmarkMixture(b *testing.B) {
	mix := func(k, n int) Sampler {
		srcs, offs, w := make([]Sampler, k), make([]int, k), make([]float64, k)
		for i := range srcs {
			srcs[i], offs[i], w[i] = Global{N: n, Seed: uint64(i)}, i*n, float64(1+i%7)
		}
		m, err := NewMixture(srcs, offs, []Segment{{Weights: w}}, true)
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	for _, c := range []struct {
		name string
		s    Sampler
	}{
		{"unmixed", Global{N: 3 << 20, Seed: 1}},
		{"3 sources", mix(3, 1<<20)},
		{"1000 sources", mix(1000, 1000)},
	} {
		b.Run(c.name, func(b *testing.B) {
			dst := make([]int, 64)
			for i := range b.N {
				c.s.Fill(0, (i*64)%(c.s.Len()-64), dst)
			}
			b.ReportMetric(float64(b.N*64)/b.Elapsed().Seconds(), "ids/s")
		})
	}
}

// The cursor's walk, a window of draws at a time, is the schedule's
// order as its definition gives it (naive, one position at a time: the
// source whose count grows from the first p positions to the first p+1),
// from any position, over weights with ties, of very different sizes and
// of 1,000 sources.
func TestMixtureCursorIsTheSchedule(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 3))
	many := make([]float64, 1000)
	for i := range many {
		many[i] = 1 + 9*r.Float64()
	}
	for _, w := range [][]float64{{1}, {1, 1, 2, 0.5, 3, 1}, {1e-6, 1, 1e6}, {0.1, 0.2, 0.3}, many} {
		s := schedule{w: w}
		for _, q := range []int{0, 1, 17, 4099, 1 << 20} {
			c := s.seek(q)
			cnt, after := make([]int, len(w)), make([]int, len(w))
			s.counts(q, cnt)
			for p := q; p < q+3000; p++ {
				src, k := c.next()
				s.counts(p+1, after)
				grew := -1
				for i := range w {
					if after[i] != cnt[i] {
						grew = i
					}
				}
				if src != grew || k != cnt[grew] {
					t.Fatalf("%d weights, at %d: the cursor drew source %d's draw %d, the schedule source %d's %d", len(w), p, src, k, grew, cnt[grew])
				}
				cnt, after = after, cnt
			}
		}
	}
}

// Weights at the edges of a float64 are refused, naming the source and
// the bound, or scaled to the order their ratios make: [1e308, 1e308]
// (whose sum overflows, and whose window of priorities was empty: an
// index out of range) is [1, 1]'s order; [1, 1e308] (whose counts
// overflowed an int: a Fill that never returned) is refused, as is an
// all_exhausted epoch longer than the schedule counts; an epoch past
// those positions fills nothing.
func TestMixtureHostileWeights(t *testing.T) {
	g := []Sampler{Global{N: 10, Seed: 1}, Global{N: 7, Seed: 2}}
	offs := []int{0, 10}
	for _, w := range [][]float64{{1, 1e308}, {5e-324, 1}, {1, math.Inf(1)}, {math.NaN(), 1}, {-1, 1}, {0, 1}, {1, 0x1p-51}} {
		for _, cycle := range []bool{false, true} {
			_, err := NewMixture(g, offs, []Segment{{Weights: w}}, cycle)
			if err == nil {
				t.Fatalf("weights %v (cycle %v) accepted", w, cycle)
			}
			if !strings.Contains(err.Error(), "source ") {
				t.Fatalf("weights %v: %v does not name the source", w, err)
			}
			if CheckWeights(w) == nil {
				t.Fatalf("CheckWeights(%v) accepts what NewMixture refuses", w)
			}
		}
	}
	for _, cycle := range []bool{false, true} {
		want, _ := mixOf(t, []int{10, 7}, []Segment{{Weights: []float64{1, 1}}}, cycle)
		for _, w := range [][]float64{{1e308, 1e308}, {5e-324, 5e-324}, {math.MaxFloat64, math.MaxFloat64}} {
			m, err := NewMixture([]Sampler{Global{N: 10, Seed: 100}, Global{N: 7, Seed: 101}}, offs, []Segment{{Weights: w}}, cycle)
			if err != nil {
				t.Fatalf("weights %v: %v", w, err)
			}
			for e := range 3 {
				if got, wanted := Order(m, e), Order(want, e); !slices.Equal(got, wanted) {
					t.Fatalf("weights %v (cycle %v) epoch %d: %v, want [1, 1]'s %v", w, cycle, e, got, wanted)
				}
			}
		}
	}
	// A ratio within the bound: first_exhausted ends with the heavy
	// source; all_exhausted would wait 2^49 positions a record of the
	// light one, more than the schedule counts.
	m, err := NewMixture(g, offs, []Segment{{Weights: []float64{1, 0x1p-49}}}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := Order(m, 0); len(got) != 10 || slices.Max(got) >= 10 {
		t.Fatalf("an epoch of weights [1, 2^-49]: %v, want source 0's 10 records", got)
	}
	if _, err := NewMixture(g, offs, []Segment{{Weights: []float64{1, 0x1p-49}}}, true); err == nil || !strings.Contains(err.Error(), "2^50") {
		t.Fatalf("an all_exhausted epoch of 2^52 positions: %v", err)
	}
	m, _ = mixOf(t, []int{10, 7}, []Segment{{Weights: []float64{1, 1}}}, true)
	far := MaxPositions / m.Len()
	if n := m.Fill(far+1, 0, make([]int, 4)); n != 0 {
		t.Fatalf("epoch %d, past 2^50 positions: filled %d ids", far+1, n)
	}
	if _, err := m.Draws(far+1, 0); err == nil {
		t.Fatalf("draws of epoch %d, past 2^50 positions: no error", far+1)
	}
	if n := m.Fill(far-1, 0, make([]int, 4)); n != 4 {
		t.Fatalf("epoch %d, within 2^50 positions: filled %d ids", far-1, n)
	}
}

// Weights changed inside an epoch (issue 48: at the next step) restart
// the schedule there: before the change the order is the old weights',
// from it on every source is within Webster's bound of its share of the
// positions since the change (under one draw for up to three sources),
// and each source's records are still its own order's, each at most once
// in the epoch.
func TestMixtureChangeInsideAnEpoch(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := rapid.IntRange(2, 4).Draw(t, "sources")
		lens := make([]int, k)
		srcs, offs := make([]Sampler, k), make([]int, k)
		off := 0
		for i := range lens {
			lens[i] = rapid.IntRange(20, 300).Draw(t, "len")
			srcs[i], offs[i] = Global{N: lens[i], Seed: uint64(7 + i)}, off
			off += lens[i]
		}
		weights := func(name string) []float64 {
			ws := make([]float64, k)
			for i := range ws {
				ws[i] = rapid.Float64Range(0.1, 5).Draw(t, name)
			}
			return ws
		}
		w0, w1 := weights("w0"), weights("w1")
		epoch := rapid.IntRange(0, 3).Draw(t, "epoch")
		old, err := NewMixtureAt(srcs, offs, []Segment{{Weights: w0}}, false, epoch)
		if err != nil {
			t.Fatal(err)
		}
		at := rapid.IntRange(1, old.Len()).Draw(t, "at")
		segs := []Segment{{Weights: w0}, {From: epoch, At: at, Weights: w1}}
		m, err := NewMixtureAt(srcs, offs, segs, false, epoch)
		if err != nil {
			t.Fatal(err)
		}
		if m.Through() != epoch {
			t.Fatalf("a change inside epoch %d: the sampler serves through %d", epoch, m.Through())
		}
		got, was := Order(m, epoch), Order(old, epoch)
		if !slices.Equal(got[:at], was[:at]) {
			t.Fatalf("before the change at %d the order is not the old weights'", at)
		}
		var sum float64
		for _, w := range w1 {
			sum += w
		}
		cnt := make([]int, k)
		drawn := map[int][]int{}
		for p, id := range got {
			i := sourceOf(offs, id)
			drawn[i] = append(drawn[i], id-offs[i])
			if p < at {
				continue
			}
			cnt[i]++
			for j := range k {
				share := w1[j] / sum
				bound := (1 + share*float64(k-2)) / 2 // 1 at most for 3 sources, 1/2 for 2
				if quota := float64(p+1-at) * share; math.Abs(float64(cnt[j])-quota) > bound+1e-9 {
					t.Fatalf("%d positions after the change source %d drew %d, its quota %.2f: off by more than %.3f", p+1-at, j, cnt[j], quota, bound)
				}
			}
		}
		for i, ids := range drawn {
			want := Order(Global{N: lens[i], Seed: uint64(7 + i)}, epoch)
			if !slices.Equal(ids, want[:len(ids)]) {
				t.Fatalf("source %d's draws are not its epoch's order", i)
			}
		}
		// The epoch ends at the first draw of a used-up source: one more
		// position would name one.
		if d, err := m.Draws(epoch, m.Len()); err != nil || !slices.ContainsFunc(lensLeft(lens, d), func(l int) bool { return l == 0 }) {
			t.Fatalf("the epoch ends at %d with draws %v of %v (%v)", m.Len(), d, lens, err)
		}
	})
}

func lensLeft(lens, draws []int) []int {
	out := make([]int, len(lens))
	for i := range lens {
		out[i] = lens[i] - draws[i]
	}
	return out
}

// Which epochs a mixture serves, and what is refused: a change past its
// epoch's end, a change inside an all_exhausted epoch, places that do not
// increase.
func TestMixtureSegmentsPlaces(t *testing.T) {
	g := []Sampler{Global{N: 100, Seed: 1}, Global{N: 60, Seed: 2}}
	offs := []int{0, 100}
	w := []float64{1, 1}
	for _, c := range []struct {
		segs           []Segment
		epoch, through int
	}{
		{[]Segment{{Weights: w}, {From: 3, Weights: w}}, 1, 2},
		{[]Segment{{Weights: w}, {From: 3, Weights: w}}, 3, -1},
		{[]Segment{{Weights: w}, {From: 2, At: 5, Weights: w}}, 0, 1},
		{[]Segment{{Weights: w}, {From: 2, At: 5, Weights: w}}, 2, 2},
		{[]Segment{{Weights: w}, {From: 2, At: 5, Weights: w}}, 3, -1},
	} {
		m, err := NewMixtureAt(g, offs, c.segs, false, c.epoch)
		if err != nil {
			t.Fatal(err)
		}
		if m.Through() != c.through {
			t.Errorf("%v at epoch %d: through %d, want %d", c.segs, c.epoch, m.Through(), c.through)
		}
		if dst := make([]int, 4); m.Fill(c.epoch+10, 0, dst) != 0 && c.through >= 0 {
			t.Errorf("%v: filled an epoch past %d", c.segs, c.through)
		}
	}
	for name, c := range map[string]struct {
		segs  []Segment
		cycle bool
		says  string
	}{
		"past the end":       {[]Segment{{Weights: w}, {From: 0, At: 1000, Weights: w}}, false, "ends at position"},
		"inside all_exh.":    {[]Segment{{Weights: w}, {From: 1, At: 3, Weights: w}}, true, "epoch's start"},
		"not increasing":     {[]Segment{{Weights: w}, {From: 2, At: 5, Weights: w}, {From: 2, At: 5, Weights: w}}, false, "increasing"},
		"not from 0's start": {[]Segment{{At: 4, Weights: w}}, false, "epoch 0's start"},
	} {
		if _, err := NewMixtureAt(g, offs, c.segs, c.cycle, 0); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.says)
		}
	}
}
