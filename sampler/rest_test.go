package sampler

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// A rest is its base's order from Start, less the skipped positions, as
// the obvious filter gives it, from any position and in any pieces.
func TestRestIsTheBaseLessItsSkips(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for range 200 {
		n := 1 + r.IntN(500)
		g := Global{N: n, Seed: r.Uint64()}
		start := r.IntN(n + 1)
		var skip []int
		for p := start; p < n; p++ {
			if r.IntN(4) == 0 {
				skip = append(skip, p)
			}
		}
		s, ok := NewRest(g, start, skip)
		if !ok {
			t.Fatalf("NewRest refused a good rest")
		}
		var want []int
		for p, id := range Order(g, 3)[start:] {
			if !slices.Contains(skip, start+p) {
				want = append(want, id)
			}
		}
		if s.Len() != len(want) {
			t.Fatalf("len %d, want %d", s.Len(), len(want))
		}
		got := make([]int, 0, len(want))
		for pos := 0; pos < s.Len(); {
			dst := make([]int, 1+r.IntN(40))
			k := s.Fill(3, pos, dst)
			got = append(got, dst[:k]...)
			pos += k
		}
		if !slices.Equal(got, want) {
			t.Fatalf("n %d start %d, %d skipped: %v, want %v", n, start, len(skip), got, want)
		}
		for q := range want {
			if b := s.BaseOf(q); g.At(3, b) != want[q] || slices.Contains(skip, b) {
				t.Fatalf("BaseOf(%d) = %d", q, b)
			}
		}
	}
	for _, c := range []struct {
		start, n int
		skip     []int
	}{{-1, 5, nil}, {6, 5, nil}, {1, 5, []int{0}}, {1, 5, []int{3, 2}}, {1, 5, []int{2, 2}}, {1, 5, []int{5}}} {
		if _, ok := NewRest(Global{N: c.n}, c.start, c.skip); ok {
			t.Errorf("NewRest(%d, %v) of %d: accepted", c.start, c.skip, c.n)
		}
	}
}
