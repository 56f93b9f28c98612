package sampler

import (
	"encoding/binary"
	"fmt"
)

// RankPart is rank Rank's part of a data-parallel job of World ranks, with
// torch.utils.data.DistributedSampler's semantics: the epoch's order (of
// Base) is cut to a multiple of World (DropLast) or padded to one by
// repeating its start, and rank r takes positions r, r+World, r+2*World...
// The ranks' parts are disjoint and together are the epoch's order.
//
// With Contiguous, rank r takes the r-th of World equal runs of the order
// instead: positions [r*Len, (r+1)*Len) of the padded (or cut) order. A
// block-aware order keeps its blocks whole this way, but for the at most
// World-1 blocks a run boundary cuts, instead of scattering each block's
// records over the ranks. Each rank gets as many positions as with
// striding, and the padding is the same at most World-1 repeats: taking
// whole batch-sized runs by stride instead padded an epoch to a multiple
// of World batches (168 repeats of 600 rows for 3 ranks of batch 64).
type RankPart struct {
	Base        Sampler
	Rank, World int
	DropLast    bool
	Contiguous  bool

	lastEpoch, lastPos int // after the last Fill, for Mark
}

// NewRankPart checks rank and world. (A "shard" is a pack's file of
// records; a rank's split of an epoch is its part.)
func NewRankPart(base Sampler, rank, world int, dropLast bool) (*RankPart, error) {
	if world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("rank %d of world %d: want 0 <= rank < world", rank, world)
	}
	return &RankPart{Base: base, Rank: rank, World: world, DropLast: dropLast}, nil
}

// Len is the number of positions this rank gets per epoch: the epoch cut
// or padded to a multiple of World, divided by World.
func (s *RankPart) Len() int {
	if s.DropLast {
		return s.Base.Len() / s.World
	}
	return (s.Base.Len() + s.World - 1) / s.World
}

func (s *RankPart) Fill(epoch, pos int, dst []int) int {
	n := s.Base.Len()
	m := max(0, min(len(dst), s.Len()-pos))
	if s.Contiguous {
		// One run of the order: fill it in one call, split where the
		// padding wraps to the order's start.
		g := s.Rank*s.Len() + pos
		k := min(m, max(0, n-g))
		if k > 0 {
			s.Base.Fill(epoch, g, dst[:k])
		}
		for i := k; i < m; i++ {
			s.Base.Fill(epoch, (g+i)%n, dst[i:i+1])
		}
	} else {
		for i := range m {
			g := (pos+i)*s.World + s.Rank
			s.Base.Fill(epoch, g%n, dst[i:i+1]) // padding repeats the order's start
		}
	}
	s.lastEpoch, s.lastPos = epoch, pos+m
	return m
}

// shardMark is a sharded stream sampler's state: the shard's position
// and its base's state there.
type shardMark struct {
	epoch, pos int
	base       any
}

// Mark, Save and Restore make a shard of a Stateful sampler Stateful too.
func (s *RankPart) Mark() any {
	st, ok := s.Base.(Stateful)
	if !ok {
		return nil
	}
	return &shardMark{epoch: s.lastEpoch, pos: s.lastPos, base: st.Mark()}
}

func (s *RankPart) Save(mark any) ([]byte, error) {
	m, ok := mark.(*shardMark)
	st, stateful := s.Base.(Stateful)
	if !ok || !stateful {
		return nil, nil
	}
	b, err := st.Save(m.base)
	if err != nil || b == nil {
		return nil, err
	}
	out := binary.AppendUvarint([]byte("RFSHD1\x00"), uint64(m.epoch))
	out = binary.AppendUvarint(out, uint64(m.pos))
	return append(out, b...), nil
}

func (s *RankPart) Restore(state []byte) (int, int, error) {
	st, ok := s.Base.(Stateful)
	if !ok || len(state) < 7 || string(state[:7]) != "RFSHD1\x00" {
		return 0, 0, fmt.Errorf("sharded sampler: %w", ErrState)
	}
	r := state[7:]
	e, n := binary.Uvarint(r)
	if n <= 0 {
		return 0, 0, fmt.Errorf("sharded sampler: %w (truncated)", ErrState)
	}
	r = r[n:]
	pos, n := binary.Uvarint(r)
	if n <= 0 || pos > uint64(s.Len()) {
		return 0, 0, fmt.Errorf("sharded sampler: %w (bad position)", ErrState)
	}
	if _, _, err := st.Restore(r[n:]); err != nil {
		return 0, 0, err
	}
	s.lastEpoch, s.lastPos = int(e), int(pos)
	return int(e), int(pos), nil
}
