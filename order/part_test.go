package order

import (
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
)

// A shared order's parts are dealt as DistributedSampler deals: every rank
// the same number of records (ceil, padded with at most world-1 records
// of another rank's; floor with drop_last, leaving out at most world-1),
// together the whole subset; a rank's workers within one record of each
// other, together the rank's part, whatever their number.
func TestPartDeals(t *testing.T) {
	sub := roaring.New()
	for id := uint32(0); id < 5000; id += 3 {
		sub.Add(id)
	}
	for _, c := range []struct {
		subset *roaring.Bitmap
		n      int
	}{{nil, 1000}, {nil, 7}, {nil, 2}, {sub, 5000}} {
		m := c.n
		if c.subset != nil {
			m = int(c.subset.GetCardinality())
		}
		for _, world := range []int{1, 2, 3, 8} {
			for _, drop := range []bool{false, true} {
				union, count := roaring.New(), 0
				for r := range world {
					rank := part(c.subset, c.n, r, world, 0, 1, drop)
					if world == 1 && rank == nil {
						rank = roaring.New()
						rank.AddRange(0, uint64(c.n))
					}
					want := (m + world - 1) / world
					if drop {
						want = m / world
					}
					if int(rank.GetCardinality()) != want {
						t.Fatalf("m %d, rank %d of %d (drop %v): %d records, want %d", m, r, world, drop, rank.GetCardinality(), want)
					}
					count += want
					union.Or(rank)
					for _, workers := range []int{2, 3} {
						ws := roaring.New()
						least, most := m, 0
						for w := range workers {
							p := part(c.subset, c.n, r, world, w, workers, drop)
							least, most = min(least, int(p.GetCardinality())), max(most, int(p.GetCardinality()))
							if roaring.And(ws, p).GetCardinality() > 0 {
								t.Fatalf("m %d, rank %d of %d: workers' parts overlap", m, r, world)
							}
							ws.Or(p)
						}
						if !ws.Equals(rank) || most-least > 1 {
							t.Fatalf("m %d, rank %d of %d, %d workers: their parts are not the rank's, dealt evenly (%d to %d)", m, r, world, workers, least, most)
						}
					}
				}
				all := c.subset
				if all == nil {
					all = roaring.New()
					all.AddRange(0, uint64(c.n))
				}
				if !drop && !union.Equals(all) {
					t.Fatalf("m %d, %d ranks: the parts miss %d records", m, world, roaring.AndNot(all, union).GetCardinality())
				}
				if pads := count - int(union.GetCardinality()); (!drop && pads > world-1) || (drop && (pads != 0 || m-count > world-1)) {
					t.Fatalf("m %d, %d ranks (drop %v): %d records twice, %d left out", m, world, drop, pads, m-int(union.GetCardinality()))
				}
			}
		}
	}
}
