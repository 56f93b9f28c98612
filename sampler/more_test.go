package sampler

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func fixedLocate(size, header int) func(int) (int, int64, int) {
	return func(id int) (int, int64, int) { return 0, int64(header + id*size), size }
}

func TestBlockExactlyOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 3000).Draw(t, "n")
		size := rapid.SampledFrom([]int{1, 100, 256, 1000, 4096, 5000}).Draw(t, "size")
		bounds := BlockBounds(n, fixedLocate(size, rapid.IntRange(0, 300).Draw(t, "header")), rapid.IntRange(1, 20000).Draw(t, "block"), 4096, 0)
		s, err := NewBlock(bounds, rapid.Uint64().Draw(t, "seed"), rapid.IntRange(1, 8).Draw(t, "window"))
		if err != nil {
			t.Fatal(err)
		}
		for e := range 3 {
			exactlyOnce(t, Order(s, e), n)
		}
	})
}

// With Window 1 every block's records are consecutive in the epoch, so a
// batch of whole blocks reads each block once; blocks end on page edges, so
// no page is shared by two blocks.
func TestBlocksAreContiguousAndPageAligned(t *testing.T) {
	for _, size := range []int{256, 1024, 4096, 1000} {
		loc := fixedLocate(size, 0)
		bounds := BlockBounds(10000, loc, 4096, 4096, 0)
		for k := 1; k < len(bounds)-1; k++ {
			_, off, _ := loc(bounds[k])
			if off%4096 != 0 {
				t.Fatalf("size %d: block %d starts at %d, inside a page", size, k, off)
			}
		}
		if size == 1000 && bounds[1] != 512 {
			t.Fatalf("1000-byte records: the first page-aligned record end is after record 511, block ends at %d", bounds[1])
		}
		s, _ := NewBlock(bounds, 1, 1)
		order := Order(s, 0)
		blockOf := func(id int) int { return sortSearch(bounds, id) }
		for p := 1; p < len(order); p++ {
			l := s.layout(0)
			if blockOf(order[p]) != blockOf(order[p-1]) && p != l.start(l.find(p)) {
				t.Fatalf("size %d: block changes at position %d, inside a block's run", size, p)
			}
		}
	}
}

func sortSearch(starts []int, p int) int {
	i, _ := slices.BinarySearch(starts, p+1)
	return i - 1
}

func TestBlockBoundsObjects(t *testing.T) {
	// Two files of 3 records: a block never spans files.
	loc := func(id int) (int, int64, int) { return id / 3, int64(id%3) * 10, 10 }
	b := BlockBounds(6, loc, 1000, 4096, 0)
	if !slices.Equal(b, []int{0, 3, 6}) {
		t.Fatalf("bounds %v", b)
	}
}

func TestBufferedOneIsSequential(t *testing.T) {
	s := &Buffered{N: 100, Buffer: 1, Seed: 3}
	if !slices.Equal(Order(s, 0), Order(Sequential{N: 100}, 0)) {
		t.Fatal("a buffer of one record is not the sequential order")
	}
}

// The in-memory shuffles are functions of (epoch, position): every epoch
// once each, and any position gives what a walk from the start gives.
func TestStagedSamplersExactlyOnceAndPositional(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 500).Draw(t, "n")
		k := rapid.IntRange(1, 600).Draw(t, "k")
		seed := rapid.Uint64().Draw(t, "seed")
		for _, s := range []Sampler{&Buffered{N: n, Buffer: k, Seed: seed}, &Reservoir{N: n, Size: k, Seed: seed}} {
			whole := Order(s, 1)
			exactlyOnce(t, whole, n)
			// Asking from any position gives the walk's ids.
			pos := rapid.IntRange(0, n-1).Draw(t, "pos")
			part := make([]int, n-pos)
			s.Fill(1, pos, part)
			if !slices.Equal(part, whole[pos:]) {
				t.Fatalf("%T: the order from %d differs from the walk's", s, pos)
			}
		}
	})
}

// A record's chance to be in the first round's reservoir is Size/N for
// every record (Vitter's Algorithm R): chi-square over many seeds.
func TestReservoirUniform(t *testing.T) {
	n, k, trials := 50, 10, 4000
	counts := make([]float64, n)
	for seed := range trials {
		s := &Reservoir{N: n, Size: k, Seed: uint64(seed)}
		first := make([]int, k)
		s.Fill(0, 0, first)
		for _, id := range first {
			counts[id]++
		}
	}
	exp := float64(trials*k) / float64(n)
	chi := 0.0
	for _, c := range counts {
		chi += (c - exp) * (c - exp) / exp
	}
	df := float64(n - 1)
	z := (math.Cbrt(chi/df) - (1 - 2/(9*df))) / math.Sqrt(2/(9*df))
	if z > 5 {
		t.Fatalf("chi-square %.1f over %v degrees of freedom: reservoir membership is not uniform", chi, df)
	}
}

func BenchmarkBlockFill(b *testing.B) {
	bounds := BlockBounds(1<<20, fixedLocate(256, 0), 65536, 4096, 0)
	s, _ := NewBlock(bounds, 1, 4)
	buf := make([]int, 256)
	pos := 0
	for b.Loop() {
		s.Fill(0, pos, buf)
		pos = (pos + 256) % (1 << 20)
	}
	b.ReportMetric(float64(b.N*256)/b.Elapsed().Seconds(), "ids/s")
}

// Position inverts the global order: every id's position holds that id,
// for small and large domains and several epochs.
func TestGlobalPosition(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 100, 1000, 65537} {
		g := Global{N: n, Seed: 11}
		for e := range 3 {
			for id := range n {
				if p := g.Position(e, id); g.At(e, p) != id {
					t.Fatalf("n=%d epoch %d: id %d at position %d holds %d", n, e, id, p, g.At(e, p))
				}
			}
		}
	}
}

// NextUse is the first position after now at which an id comes, in this
// epoch or the next.
func TestNextUse(t *testing.T) {
	g := Global{N: 500, Seed: 3}
	now := 500*4 + 200 // epoch 4, position 200
	for id := range 500 {
		got, ok := NextUse(g, now, id)
		want := 0
		for t := now; ; t++ {
			if g.At(t/500, t%500) == id {
				want = t
				break
			}
		}
		if !ok || got != int64(want) {
			t.Fatalf("id %d: next use %d, want %d", id, got, want)
		}
	}
	// Ahead says the same, less now, for the global shuffle (its own
	// permutations) and an order it asks Position of.
	for _, s := range []Sampler{g, Sequential{N: 500}} {
		ahead := Ahead(s, now)
		for id := range 500 {
			want, _ := NextUse(s, now, id)
			if got, ok := ahead(id); !ok || got != want-int64(now) {
				t.Fatalf("%T id %d: %d positions ahead, want %d", s, id, got, want-int64(now))
			}
		}
	}
	if _, ok := Ahead(&Buffered{N: 500, Buffer: 10, Seed: 1}, now)(3); ok {
		t.Fatal("Ahead of an order with no inverse says when")
	}
}

// A buffered epoch is windows of Buffer records at an offset, each in a
// uniform order of its own: over many epochs every offset comes about
// equally often, and every order of a window too (chi-square).
func TestBufferedWindowsUniform(t *testing.T) {
	const n, b, epochs = 10, 3, 30000
	s := &Buffered{N: n, Buffer: b, Seed: 9}
	offsets := make([]float64, b)
	orders := map[string]float64{} // the order of the first window, {0,1,2}, at offset 0
	for e := range epochs {
		// The first window starts at 0 and ends at the offset (or b).
		first, fw := s.window(e, 0)
		if first != 0 {
			t.Fatalf("epoch %d: the first window starts at %d", e, first)
		}
		offsets[fw%b]++
		if fw == b {
			o := Order(s, e)[:b]
			orders[fmt.Sprint(o)]++
		}
	}
	chi := func(obs []float64) float64 {
		sum := 0.0
		for _, o := range obs {
			sum += o
		}
		exp := sum / float64(len(obs))
		x := 0.0
		for _, o := range obs {
			x += (o - exp) * (o - exp) / exp
		}
		return x
	}
	if x := chi(offsets); x > 13.8 { // 2 degrees of freedom, p = 0.001
		t.Fatalf("offsets %v: chi-square %.1f", offsets, x)
	}
	var obs []float64
	for _, c := range orders {
		obs = append(obs, c)
	}
	if len(obs) != 6 {
		t.Fatalf("%d orders of a window of 3, want all 6", len(obs))
	}
	if x := chi(obs); x > 20.5 { // 5 degrees of freedom, p = 0.001
		t.Fatalf("window orders %v: chi-square %.1f", orders, x)
	}
}

// FixedBlockBounds cuts fixed-size records where BlockBounds does, without
// locating every record.
func TestFixedBlockBoundsAreBlockBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5000).Draw(t, "n")
		rs := rapid.SampledFrom([]int{1, 8, 100, 256, 1000, 4096, 5000}).Draw(t, "rs")
		header := rapid.IntRange(0, 300).Draw(t, "header")
		perObj := rapid.IntRange(1, 6000).Draw(t, "per object")
		size := rapid.IntRange(1, 20000).Draw(t, "size")
		span := rapid.SampledFrom([]int{0, 8192, 100000}).Draw(t, "span")
		loc := func(id int) (int, int64, int) { return id / perObj, int64(header + (id%perObj)*rs), rs }
		want := BlockBounds(n, loc, size, 4096, span)
		if got := FixedBlockBounds(n, rs, loc, size, 4096, span); !slices.Equal(got, want) {
			t.Fatalf("fixed %v, located one by one %v", got, want)
		}
	})
}

// A regular cut worked out gives the orders the listed cut of the same
// records gives: the same blocks, the same epochs, any window.
func TestRegularCutIsTheListedCut(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 20000).Draw(t, "n")
		rs := rapid.SampledFrom([]int{1, 8, 64, 100, 256, 1000, 4096, 5000}).Draw(t, "rs")
		header := rapid.SampledFrom([]int{0, 128, 80, 4096}).Draw(t, "header")
		size := rapid.IntRange(1, 20000).Draw(t, "size")
		window := rapid.IntRange(1, 8).Draw(t, "window")
		seed := rapid.Uint64().Draw(t, "seed")
		loc := func(id int) (int, int64, int) { return 0, int64(header + id*rs), rs }
		r, ok := RegularCut(n, rs, loc, size, 4096, 0)
		bounds := FixedBlockBounds(n, rs, loc, size, 4096, 0)
		if _, empty := RegularCut(0, rs, loc, size, 4096, 0); empty {
			t.Fatal("a regular cut of no records")
		}
		if !ok {
			return
		}
		reg, err := NewRegularBlock(r, seed, window)
		if err != nil {
			t.Fatal(err)
		}
		if reg.Blocks() != len(bounds)-1 {
			t.Fatalf("%+v: %d blocks, the listed cut %d", r, reg.Blocks(), len(bounds)-1)
		}
		for b := range bounds {
			if reg.Bound(b) != bounds[b] {
				t.Fatalf("%+v: block %d starts at %d, listed %d", r, b, reg.Bound(b), bounds[b])
			}
		}
		lst, _ := NewBlock(bounds, seed, window)
		for e := range 2 {
			if got, want := Order(reg, e), Order(lst, e); !slices.Equal(got, want) {
				t.Fatalf("%+v epoch %d: the computed layout's order differs from the listed one's", r, e)
			}
		}
	})
}

// A block order's window holds the records of its blocks and no others,
// and BlockOf finds a record's block, for listed and regular cuts alike.
func TestBlockWindowsAndBlocks(t *testing.T) {
	listed, err := NewBlock([]int{0, 3, 10, 11, 20, 26, 40}, 9, 2)
	if err != nil {
		t.Fatal(err)
	}
	regular, err := NewRegularBlock(Regular{N: 47, First: 3, Every: 5}, 9, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Block{listed, regular} {
		for id := range s.Len() {
			b := s.BlockOf(id)
			if id < s.Bound(b) || id >= s.Bound(b+1) {
				t.Fatalf("BlockOf(%d) = %d, which holds [%d, %d)", id, b, s.Bound(b), s.Bound(b+1))
			}
		}
		for e := range 3 {
			order := Order(s, e)
			for pos := 0; pos < s.Len(); {
				lo, hi := s.WindowOf(e, pos)
				if lo > pos || hi <= pos {
					t.Fatalf("epoch %d: WindowOf(%d) = [%d, %d)", e, pos, lo, hi)
				}
				blocks := map[int]bool{}
				for _, id := range order[lo:hi] {
					blocks[s.BlockOf(id)] = true
				}
				n := 0
				for b := range blocks {
					n += s.Bound(b+1) - s.Bound(b)
				}
				if n != hi-lo || len(blocks) > s.Window {
					t.Fatalf("epoch %d: window [%d, %d) holds %d blocks of %d records", e, lo, hi, len(blocks), n)
				}
				pos = hi
			}
		}
	}
}

// Ahead of a rank's part is when the rank itself next reads an id: the
// first position, from now, of the part's Fill in this epoch or the next,
// and two epochs away for an id the part reads in neither; for chunked
// parts with a tail, padded or cut.
func TestAheadOfARankPart(t *testing.T) {
	for _, c := range []struct {
		n, world, chunk int
		dropLast        bool
	}{{500, 3, 1, false}, {500, 3, 7, false}, {500, 4, 7, true}, {64, 2, 32, false}} {
		for rank := range c.world {
			rp, err := NewRankPart(Global{N: c.n, Seed: 5}, rank, c.world, c.dropLast)
			if err != nil {
				t.Fatal(err)
			}
			rp.Chunk = c.chunk
			l := rp.Len()
			orders := make([][]int, 3)
			for e := range orders {
				orders[e] = make([]int, l)
				rp.Fill(e, 0, orders[e])
			}
			now := l + l/3 // epoch 1
			ahead := Ahead(rp, now)
			for id := range c.n {
				want := int64(2*l - l/3)
				for p := now; p < 3*l; p++ {
					if orders[p/l][p%l] == id {
						want = int64(p - now)
						break
					}
				}
				if want >= int64(2*l-l/3) {
					want = int64(2*l - l/3) // neither this epoch's part nor the next's
				}
				if got, ok := ahead(id); !ok || got != want {
					// A padded tail repeats the order's start: the
					// rank reads such an id twice, which Ahead does
					// not count.
					if !c.dropLast && padded(rp, 1, id) {
						continue
					}
					t.Fatalf("%+v rank %d: id %d is %d positions ahead, want %d", c, rank, id, got, want)
				}
			}
		}
	}
}

// padded says rank part rp's epoch e reads id in its padding.
func padded(rp *RankPart, e, id int) bool {
	n := rp.Base.Len()
	c, k, t := rp.split()
	for p := k * c; p < k*c+t; p++ {
		if g := k*rp.World*c + rp.Rank*t + (p - k*c); g >= n && rp.Base.(Global).At(e, g%n) == id {
			return true
		}
	}
	for p := k * c; p < k*c+t; p++ {
		if g := k*rp.World*c + rp.Rank*t + (p - k*c); g >= n && rp.Base.(Global).At(e+1, g%n) == id {
			return true
		}
	}
	return false
}
