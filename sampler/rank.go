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
// With Chunk > 1 the same is done to runs of Chunk consecutive positions
// instead of single ones: rank r takes runs r, r+World, ... of the order,
// cut or padded to a multiple of World runs. A block-aware order keeps its
// blocks whole this way (with Chunk the batch size, every batch of a rank
// is a batch of the unsharded order) instead of scattering each block's
// records over the ranks.
type RankPart struct {
	Base        Sampler
	Rank, World int
	DropLast    bool
	Chunk       int

	lastEpoch, lastPos int // after the last Fill, for Mark
}

// NewRankPart checks rank and world. (A "shard" is a pack's file of
// records; a rank's split of an epoch is its part.)
func NewRankPart(base Sampler, rank, world int, dropLast bool) (*RankPart, error) {
	if world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("rank %d of world %d: want 0 <= rank < world", rank, world)
	}
	return &RankPart{Base: base, Rank: rank, World: world, DropLast: dropLast, Chunk: 1}, nil
}

func (s *RankPart) chunk() int { return max(1, s.Chunk) }

// Len is the number of positions this rank gets per epoch.
func (s *RankPart) Len() int {
	unit := s.World * s.chunk()
	if s.DropLast {
		return s.Base.Len() / unit * s.chunk()
	}
	return (s.Base.Len() + unit - 1) / unit * s.chunk()
}

func (s *RankPart) Fill(epoch, pos int, dst []int) int {
	n := s.Base.Len()
	c := s.chunk()
	m := max(0, min(len(dst), s.Len()-pos))
	for i := range m {
		p := pos + i
		g := ((p/c)*s.World+s.Rank)*c + p%c
		s.Base.Fill(epoch, g%n, dst[i:i+1]) // padding repeats the order's start
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
