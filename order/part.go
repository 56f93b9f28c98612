package order

import (
	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/sampler"
)

// dealSeed keys the permutation that deals a shared order's records among
// ranks and workers. It is fixed: a part must be the same set in every
// epoch (a member of a share group keeps its records), and the rest of an
// epoch resumed on another topology computes the parts of the run before
// from whose they were alone.
const dealSeed = 0x5eed_dea1

// part is the part of subset (every record of n, if nil) that a shared
// order's rank of world, and of the rank's, worker of workers, reads. A
// shared order is no function of position to cut, so its records are
// dealt as DistributedSampler deals an epoch's positions, from a fixed
// permutation of them: rank r takes positions r, r+world, ..., equal
// parts of ceil(m/world), the last padded from the permutation's start
// (at most world-1 records twice an epoch, as DistributedSampler pads),
// or of floor(m/world) with dropLast. Equal parts give the ranks equal
// numbers of batches, which DDP's collectives need. Of the rank's
// positions q = 0, 1, ..., worker w takes q ≡ w (mod workers), so a
// rank's records do not depend on its workers.
func part(subset *roaring.Bitmap, n, rank, world, worker, workers int, dropLast bool) *roaring.Bitmap {
	if world*workers <= 1 {
		return subset
	}
	m := n
	var ids []uint32
	if subset != nil {
		ids = subset.ToArray()
		m = len(ids)
	}
	out := roaring.New()
	if m == 0 {
		return out
	}
	per := (m + world - 1) / world
	if dropLast {
		per = m / world
	}
	// Positions p in [0, per*world): the rank's are p ≡ rank (mod world),
	// q = p / world its own; the record at p is the permutation's at p
	// mod m (a pad wraps to the start).
	perm := sampler.Global{N: m, Seed: dealSeed}
	buf := make([]int, 4096)
	for lo := 0; lo < per*world; lo += len(buf) {
		k := min(len(buf), per*world-lo)
		got := 0
		for got < k {
			// Fill stops at m: positions past it wrap.
			at := (lo + got) % m
			got += perm.Fill(0, at, buf[got:k][:min(k-got, m-at)])
		}
		for i, pos := range buf[:k] {
			p := lo + i
			if p%world != rank || (p/world)%workers != worker {
				continue
			}
			if ids != nil {
				out.Add(ids[pos])
			} else {
				out.Add(uint32(pos))
			}
		}
	}
	return out
}
