package order

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/wire"
)

// skippedPlace is the place of a shared job over n records that took all
// of them, its last k in an opportunistic tail its batches delivered
// (the place's skip): what a run saved, for a rest on another topology.
func skippedPlace(t testing.TB, n, k int) (wire.State, []int) {
	g := share.NewGroup(share.Options{Records: n, Seed: 3})
	m, err := g.Join(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Leave()
	order := make([]int, n)
	m.Fill(0, 0, order)
	st, err := m.SaveFrom(m.Mark(), n-k)
	if err != nil {
		t.Fatal(err)
	}
	return wire.State{Epoch: 0, Batch: 1, Sampler: st, Skip: order[n-k:]}, order
}

// restOf is a job's rest of epoch 0 from places, on n records.
func restOf(ctx context.Context, n int, places []wire.State) (*roaring.Bitmap, error) {
	r, _, err := rest(ctx, 0, places, nil, n)
	return r, err
}

// A shared rest's skips are looked up in what the place took: one it did
// not take is refused, the ones it did are delivered; and a rest whose
// job closes while it opens stops.
func TestSharedRestSkips(t *testing.T) {
	const n = 5000
	place, order := skippedPlace(t, n, 300)
	rest, err := restOf(context.Background(), n, []wire.State{place})
	if err != nil || !rest.IsEmpty() {
		t.Fatalf("every record taken, the tail's delivered: a rest of %v (%v), want none", rest, err)
	}
	half := place
	half.Skip = place.Skip[:150]
	if rest, err = restOf(context.Background(), n, []wire.State{half}); err != nil || !slices.Equal(rest.ToArray(), sortedIDs(order[n-150:])) {
		t.Fatalf("half the tail delivered: a rest of %d (%v), want the other %d", rest.GetCardinality(), err, 150)
	}
	foreign := place
	foreign.Skip = []int{order[0], n, -1}
	for _, id := range foreign.Skip[1:] {
		foreign.Skip[0] = id
		if _, err := restOf(context.Background(), n, []wire.State{foreign}); !errors.Is(err, ErrSpec) {
			t.Fatalf("a skip of record %d: %v, want a spec error", id, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := restOf(ctx, n, []wire.State{place}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a rest whose job closed: %v, want it cancelled", err)
	}
}

func sortedIDs(ids []int) []uint32 {
	out := make([]uint32, len(ids))
	for i, id := range ids {
		out[i] = uint32(id)
	}
	slices.Sort(out)
	return out
}

// BenchmarkRestSkips is a shared rest of 10^6 records from a place whose
// tail of 8,000 was delivered (its skip): "set", the rest as it is
// computed (each skip looked up in the set the place took), against
// "scan", each skip found by a scan of the place's order, as it was (3.2
// s of a core).
//
//	go test ./order -run XXX -bench RestSkips
func BenchmarkRestSkips(b *testing.B) {
	const n, k = 1_000_000, 8000
	place, _ := skippedPlace(b, n, k)
	b.Run("scan", func(b *testing.B) {
		s, err := share.Delivered(place.Sampler, n)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			// The naive reference: the place's order, its set in id
			// order then its tail, scanned for each skip.
			order := make([]int, 0, n)
			for _, id := range s.Done.ToArray() {
				order = append(order, int(id))
			}
			order = append(order, s.Tail...)
			for _, id := range place.Skip {
				if !slices.Contains(order, id) {
					b.Fatalf("skip %d not taken", id)
				}
			}
		}
	})
	b.Run("set", func(b *testing.B) {
		for b.Loop() {
			if _, err := restOf(context.Background(), n, []wire.State{place}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
