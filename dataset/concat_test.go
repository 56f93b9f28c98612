package dataset

import (
	"math/rand/v2"
	"sort"
	"testing"
)

// runs.find is sort.SearchInts's answer (the last run starting at or
// before the value) for every value, over runs of very different
// lengths, empty runs among them.
func TestRunsFind(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ runs, most int }{{1, 10}, {3, 1 << 20}, {1000, 3000}, {1000, 5}, {50, 1 << 16}} {
		starts := []int{0}
		for range c.runs {
			n := r.IntN(c.most + 1)
			if r.IntN(10) == 0 {
				n = 0
			}
			if r.IntN(50) == 0 {
				n *= 1000 // a run much longer than the others
			}
			starts = append(starts, starts[len(starts)-1]+n)
		}
		end := starts[len(starts)-1]
		if end == 0 {
			continue
		}
		idx := newRuns(starts)
		for range 20000 {
			v := r.IntN(end)
			if got, want := idx.find(v), sort.SearchInts(starts, v+1)-1; got != want {
				t.Fatalf("%d runs: value %d in run %d, want %d", c.runs, v, got, want)
			}
		}
		for _, v := range []int{0, end - 1} {
			if got, want := idx.find(v), sort.SearchInts(starts, v+1)-1; got != want {
				t.Fatalf("%d runs: value %d in run %d, want %d", c.runs, v, got, want)
			}
		}
	}
}
