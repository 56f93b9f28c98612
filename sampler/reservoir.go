package sampler

import "slices"

// Reservoir is OneAccess's reservoir sampling (oneaccess.txt §3, after
// Vitter): each round draws a uniform random sample of Size of the records
// not used yet this epoch, the loader reads the sample in one forward pass
// (ascending offsets, coalesced), and batches are drawn from it in memory
// in a uniform order. Rounds repeat until every record was used once.
//
// Successive uniform samples without replacement, each emitted in uniform
// order, are a uniform permutation cut into runs of Size; so round r is
// positions [r*Size, (r+1)*Size) of Global's permutation, and its sample
// is those positions' ids, sorted. That makes the sampler a pure function
// of (epoch, position) like Global, resumable anywhere with no state, and
// an epoch O(N log Size) instead of a scan of all N ids per round: what
// one forward pass of storage per round costs is the round's own records.
type Reservoir struct {
	N, Size int
	Seed    uint64
}

func (s *Reservoir) Len() int { return s.N }

func (s *Reservoir) size() int { return max(1, s.Size) }

func (s *Reservoir) Fill(epoch, pos int, dst []int) int {
	return Global{N: s.N, Seed: s.Seed}.Fill(epoch, pos, dst)
}

// Stage returns round s's sample in ascending order.
func (s *Reservoir) Stage(epoch, r int) ([]int, bool) {
	k := s.size()
	if r < 0 || r*k >= s.N {
		return nil, false
	}
	ids := make([]int, min(k, s.N-r*k))
	s.Fill(epoch, r*k, ids)
	slices.Sort(ids)
	return ids, true
}

func (s *Reservoir) StageOf(epoch, pos int) int { return pos / s.size() }
