package share

import (
	"cmp"
	"math/rand/v2"
	"slices"
)

// round runs one round of dependent sampling (joader.txt §3.1, walked as
// the dependent sampling tree of §4) among parts, each with records left,
// and returns the record each gets (parts[i] gets picks[i]). It reads the
// classes as they were before the round; the caller applies the picks.
func round(c *classes, rng *rand.Rand, parts []*Member) []int {
	// The n-job case orders jobs by their remaining sets' sizes, smallest
	// first, so the conditional probabilities below are at most 1.
	order := slices.Clone(parts)
	slices.SortFunc(order, func(a, b *Member) int {
		if x := cmp.Compare(a.remaining, b.remaining); x != 0 {
			return x
		}
		return cmp.Compare(a.bit, b.bit)
	})
	for _, m := range order {
		m.picked = -1
	}
	var excl uint64 // the last level's jobs: their intersection is taken already
	x := 0          // how many records that intersection holds
	outside := func(sig uint64) bool { return excl == 0 || sig&excl != excl }
	for J := order; len(J) > 0; {
		var mask uint64
		for _, m := range J {
			mask |= m.bit
		}
		if len(J) == 1 {
			m := J[0]
			own := func(sig uint64) bool { return sig&m.bit != 0 && outside(sig) }
			m.picked = c.pick(rng, m.remaining-x, own)
			break
		}
		inter := func(sig uint64) bool { return sig&mask == mask && outside(sig) }
		in := c.count(inter)
		d := func(m *Member) int { return m.remaining - x }
		// Dependent selecting: J[0] takes the intersection with probability
		// |I|/|D0|; each next job takes it with probability |Dk-1|/|Dk| if
		// the one before did. The jobs that took it share one sample.
		k := 0
		if in > 0 && rng.IntN(max(1, d(J[0]))) < in {
			k = 1
			for k < len(J) && rng.IntN(max(1, d(J[k]))) < d(J[k-1]) {
				k++
			}
		}
		if k > 0 {
			e := c.pick(rng, in, inter)
			for _, m := range J[:k] {
				m.picked = e
			}
			J = J[k:]
		} else {
			// The smallest job takes its own leaf: its records outside the
			// intersection; the others go on without it.
			m := J[0]
			leaf := func(sig uint64) bool { return sig&m.bit != 0 && sig&mask != mask && outside(sig) }
			m.picked = c.pick(rng, c.count(leaf), leaf)
			J = J[1:]
		}
		excl = mask
		x = c.count(func(sig uint64) bool { return sig&excl == excl })
	}
	out := make([]int, len(parts))
	for i, m := range parts {
		out[i] = m.picked
		if out[i] < 0 {
			// Only ties of sizes could lead here (probability 0 events):
			// the job's pick must still be one of its records.
			own := func(sig uint64) bool { return sig&m.bit != 0 }
			out[i] = c.pick(rng, m.remaining, own)
		}
	}
	return out
}
