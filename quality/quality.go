// Package quality measures what a cheaper shuffle costs in randomness, so a
// user can weigh it against what it saves in I/O.
//
// RL is DeepIO's randomization level (deepio.txt §III-C, equations 1-5):
// the information in a sampler's order relative to a full shuffle's. DeepIO
// writes it as a cross-entropy of per-position choice probabilities without
// pinning every term down; we read it the way its equations 2 and 3 state
// it for whole sequences: a sampler that at position i picks uniformly among
// k_i candidates has P(i) = 1/k_i, a full shuffle has Q(i) = 1/(N-i), and
//
//	RL = H / H_fully = Σ_i -log2 P(i) / Σ_i -log2 Q(i) = log2(#orders) / log2(N!)
//
// which is 100% for a full shuffle and 0% for a constant order. RL is
// computed in closed form from each sampler's parameters.
//
// The plainer measures are empirical, over generated epochs: how much more
// often than under a uniform shuffle two records that are neighbours in the
// file share a batch, and how far records move from their file position.
package quality

import (
	"fmt"
	"math"

	"github.com/riffle-ml/riffle/sampler"
)

// log2Fact is log2(n!).
func log2Fact(n int) float64 {
	v, _ := math.Lgamma(float64(n) + 1)
	return v / math.Ln2
}

// RL returns the randomization level of s's orders in [0, 1], and false for
// a sampler it has no closed form for.
func RL(s sampler.Sampler) (float64, bool) {
	n := s.Len()
	full := log2Fact(n)
	if full == 0 {
		return 1, true
	}
	var h float64
	switch s := s.(type) {
	case sampler.Global:
		h = full
	case sampler.Sequential:
		h = 0
	case *sampler.Reservoir:
		// A uniform subset, then a uniform order, round after round: the
		// product is a uniform permutation.
		h = full
	case *sampler.Buffered:
		// Windows of Buffer records at an offset drawn in [0, Buffer),
		// each in a uniform order: log2 Buffer bits of offset and, on
		// average over it, log2 of each window's length factorial. (An
		// order two offsets can both give is counted twice: of chance
		// about 1/Buffer!, it matters only for tiny windows.)
		b := max(1, s.Buffer)
		if b >= n {
			h = full
			break
		}
		h = math.Log2(float64(b))
		for off := range b {
			if off > 0 {
				h += log2Fact(off) / float64(b)
			}
			for start := off; start < n; start += b {
				h += log2Fact(min(b, n-start)) / float64(b)
			}
		}
		h = min(h, full)
	case *sampler.Block:
		// Orders of blocks, up to orders inside each window (which the
		// in-window permutation makes irrelevant), times the orders of the
		// records inside each window.
		nb := s.Blocks()
		w := max(1, s.Window)
		h = log2Fact(nb)
		if w == 1 {
			// Exact: each block's own records are permuted.
			for b := range nb {
				h += log2Fact(s.Bound(b+1) - s.Bound(b))
			}
			break
		}
		return BlockRL(n, nb, w), true
	default:
		return 0, false
	}
	return h / full, true
}

// BlockRL is the randomization level of a block order of n records in
// blocks of about equal size, window blocks to a window: the orders of the
// blocks, up to orders inside each window (which the in-window
// permutation makes irrelevant), times the orders of each window's
// records. Which blocks share a window depends on the block order; for the
// expectation over it, a window holds window blocks of the mean size. It
// is what an automatic order weighs against a device's rate.
func BlockRL(n, blocks, window int) float64 {
	full := log2Fact(n)
	if full == 0 || blocks >= n && window <= 1 {
		return 1
	}
	nb, w := max(1, blocks), max(1, window)
	h := log2Fact(nb)
	for lo := 0; lo < nb; lo += w {
		h -= log2Fact(min(w, nb-lo))
	}
	avg := float64(n) / float64(nb)
	for lo := 0; lo < nb; lo += w {
		k := float64(min(w, nb-lo)) * avg
		v, _ := math.Lgamma(k + 1)
		h += v / math.Ln2
	}
	return min(h, full) / full
}

// Measures are empirical randomness measures of a sampler over some epochs.
type Measures struct {
	// NeighbourRatio is how much more often than under a uniform shuffle
	// records i and i+1 of the file share a batch: 1 for a full shuffle,
	// up to (N-1)/(b-1) for the sequential order.
	NeighbourRatio float64
	// Displacement is the mean |position - id| over N/3, its expectation
	// under a uniform shuffle: about 1 for a full shuffle, 0 sequentially.
	Displacement float64
}

// Measure generates epochs of s and measures them with batches of batch.
func Measure(s sampler.Sampler, batch, epochs int) Measures {
	orders := make([][]int, epochs)
	for e := range orders {
		orders[e] = sampler.Order(s, e)
	}
	m, _ := MeasureOrders(orders, batch)
	return m
}

// MeasureOrders measures orders something delivered (a peer loader's, fed
// to riffle quality --ids): each a permutation of the ids 0..N-1.
func MeasureOrders(orders [][]int, batch int) (Measures, error) {
	if len(orders) == 0 {
		return Measures{}, fmt.Errorf("no order to measure")
	}
	n := len(orders[0])
	if n < 2 || batch < 2 {
		return Measures{}, nil
	}
	batchOf := make([]int, n)
	seen := make([]bool, n)
	var same, pairs, disp float64
	for e, order := range orders {
		if len(order) != n {
			return Measures{}, fmt.Errorf("order %d has %d ids, order 0 has %d", e, len(order), n)
		}
		clear(seen)
		for _, id := range order {
			if id < 0 || id >= n || seen[id] {
				return Measures{}, fmt.Errorf("order %d is not a permutation of 0..%d: id %d", e, n-1, id)
			}
			seen[id] = true
		}
		for p, id := range order {
			batchOf[id] = p / batch
			disp += math.Abs(float64(p - id))
		}
		for id := 0; id+1 < n; id++ {
			if batchOf[id] == batchOf[id+1] {
				same++
			}
			pairs++
		}
	}
	uniform := float64(batch-1) / float64(n-1)
	return Measures{
		NeighbourRatio: same / pairs / uniform,
		Displacement:   disp / float64(len(orders)*n) / (float64(n) / 3),
	}, nil
}
