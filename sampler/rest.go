package sampler

import "sort"

// Rest is the rest of Base's epoch that ranks of another topology did not
// deliver: its positions from Start on, less the positions Skip (sorted,
// each at or after Start), in Base's order. A uniform permutation's rest,
// given the records before it, is a uniform permutation of the others,
// so an opportunistic order's epoch goes on from every rank's place
// (Start: what all of them delivered; Skip: what some delivered past it,
// the ids of batches in flight) on any number of ranks, at O(log len(Skip))
// and the skips it passes per Fill, with no replay.
type Rest struct {
	Base  Sampler
	Start int
	Skip  []int
}

func (s Rest) Len() int { return max(0, s.Base.Len()-s.Start-len(s.Skip)) }

// BaseOf is the base position of position q (q = Len: the base's end).
func (s Rest) BaseOf(q int) int {
	b, _ := s.baseOf(q)
	return b
}

// baseOf is BaseOf, and the first skipped position after it.
func (s Rest) baseOf(q int) (b, next int) {
	// b is the q-th position from Start not skipped: Start+q+i, where i
	// is the number of skipped positions before it, the first i whose
	// skipped position has more than q positions not skipped before it
	// (Skip[i]-Start-i of them), found by a binary search: a walk of the
	// skips from the first made each Fill O(len(Skip)), and the rest of
	// an epoch resumed with thousands of skips quadratic.
	i := sort.Search(len(s.Skip), func(i int) bool { return s.Skip[i]-s.Start-i > q })
	return s.Start + q + i, i
}

func (s Rest) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.Len()-pos))
	b, i := s.baseOf(pos)
	for k := 0; k < n; {
		run := n - k
		if i < len(s.Skip) {
			run = min(run, s.Skip[i]-b)
		}
		s.Base.Fill(epoch, b, dst[k:k+run])
		k += run
		b += run
		for i < len(s.Skip) && s.Skip[i] == b {
			b, i = b+1, i+1
		}
	}
	return n
}

// NewRest checks that skip is sorted, distinct and within [start, the
// base's end).
func NewRest(base Sampler, start int, skip []int) (Rest, bool) {
	ok := start >= 0 && start <= base.Len() && sort.IntsAreSorted(skip)
	for i, p := range skip {
		ok = ok && p >= start && p < base.Len() && (i == 0 || skip[i-1] != p)
	}
	return Rest{Base: base, Start: start, Skip: skip}, ok
}
