package sampler

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// A mixture's (and a rank's part of one's) state of any bytes is an error
// wrapping ErrState, or a place within the order: an epoch within
// MaxEpoch and a position within the epoch, where a Fill goes on.
func FuzzMixtureRestore(f *testing.F) {
	mk := func() (*Mixture, *RankPart) {
		m, err := NewMixture([]Sampler{Global{N: 30, Seed: 1}, Sequential{N: 20}}, []int{0, 30}, []Segment{{Weights: []float64{1, 2}}}, true)
		if err != nil {
			f.Fatal(err)
		}
		rp, _ := NewRankPart(m, 1, 3, false)
		return m, rp
	}
	m, rp := mk()
	rp.Fill(2, 3, make([]int, 5))
	st, err := rp.Save(rp.Mark())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(st)
	ms, _ := m.Save(m.Mark())
	f.Add(ms)
	f.Add(append([]byte("RFSHD1\x00"), binary.AppendUvarint(binary.AppendUvarint(nil, math.MaxUint64), 1)...))
	f.Add([]byte(mixMagic + "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00\x02\x00\x00"))
	f.Fuzz(func(t *testing.T, state []byte) {
		m, rp := mk()
		for _, s := range []Stateful{m, rp} {
			e, pos, err := s.Restore(state)
			if err != nil {
				if !errors.Is(err, ErrState) {
					t.Fatalf("%T: error %v is not ErrState", s, err)
				}
				continue
			}
			if e < 0 || e > MaxEpoch || pos < 0 || pos > s.Len() {
				t.Fatalf("%T: restored to epoch %d position %d of %d", s, e, pos, s.Len())
			}
			s.Fill(e, pos, make([]int, 8))
		}
	})
}

// A mixture of any weights (float64 bits), lengths and stopping rule is
// an error, or an order whose epoch is within MaxPositions and whose
// every Fill ends and names records of its sources; its cursor walks the
// schedule the counts define.
func FuzzMixtureSchedule(f *testing.F) {
	f.Add(math.Float64bits(1), math.Float64bits(2), math.Float64bits(0.5), uint8(7), uint8(30), uint8(3), false)
	f.Add(math.Float64bits(1e308), math.Float64bits(1e308), math.Float64bits(1e308), uint8(1), uint8(1), uint8(1), true)
	f.Add(math.Float64bits(1), math.Float64bits(1e308), math.Float64bits(1), uint8(4), uint8(4), uint8(4), false)
	f.Add(math.Float64bits(5e-324), math.Float64bits(5e-324), math.Float64bits(1e-300), uint8(9), uint8(2), uint8(200), true)
	f.Add(math.Float64bits(1), math.Float64bits(0x1p-49), math.Float64bits(0x1p-20), uint8(9), uint8(2), uint8(200), false)
	f.Fuzz(func(t *testing.T, w0, w1, w2 uint64, l0, l1, l2 uint8, cycle bool) {
		ws := []float64{math.Float64frombits(w0), math.Float64frombits(w1), math.Float64frombits(w2)}
		lens := []int{int(l0) + 1, int(l1) + 1, int(l2) + 1}
		srcs := []Sampler{Global{N: lens[0], Seed: 1}, Sequential{N: lens[1]}, Global{N: lens[2], Seed: 3}}
		offs := []int{0, lens[0], lens[0] + lens[1]}
		m, err := NewMixture(srcs, offs, []Segment{{Weights: ws}}, cycle)
		if err != nil {
			if CheckWeights(ws) == nil && !cycle {
				t.Fatalf("weights %v CheckWeights accepts refused without cycle: %v", ws, err)
			}
			return
		}
		n := m.Len()
		if n <= 0 || n > MaxPositions {
			t.Fatalf("weights %v: an epoch of %d positions", ws, n)
		}
		total := lens[0] + lens[1] + lens[2]
		for _, e := range []int{0, 1, 5} {
			if cycle && e*n+n > MaxPositions {
				continue // past the positions the schedule counts: it fills nothing
			}
			for _, pos := range []int{0, n / 2, max(0, n-16)} {
				dst := make([]int, 16)
				k := m.Fill(e, pos, dst)
				if k != min(16, n-pos) {
					t.Fatalf("weights %v: Fill at %d of %d gave %d", ws, pos, n, k)
				}
				for _, id := range dst[:k] {
					if id < 0 || id >= total {
						t.Fatalf("weights %v: id %d of %d records", ws, id, total)
					}
				}
			}
		}
		if !cycle {
			// Each source at most once an epoch (its own epoch's order).
			seen := map[int]bool{}
			for pos := 0; pos < n; pos += 64 {
				dst := make([]int, 64)
				for _, id := range dst[:m.Fill(0, pos, dst)] {
					if seen[id] {
						t.Fatalf("weights %v: record %d twice in an epoch", ws, id)
					}
					seen[id] = true
				}
			}
		}
		// The cursor is the schedule, from a few places.
		s := m.pieces[0].plan
		for _, q := range []int{0, n / 3} {
			c := s.seek(q)
			cnt, after := make([]int, 3), make([]int, 3)
			s.counts(q, cnt)
			for p := q; p < q+40; p++ {
				src, k := c.next()
				s.counts(p+1, after)
				if after[src] != cnt[src]+1 || k != cnt[src] {
					t.Fatalf("weights %v at %d: the cursor drew source %d's draw %d, the counts %v then %v", ws, p, src, k, cnt, after)
				}
				cnt, after = after, cnt
			}
		}
	})
}
