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
// With Chunk c > 1 the order is cut into global batches of World*c
// positions, and rank r takes the r-th run of c positions of each: a
// block-aware order keeps its blocks whole this way (with c the batch
// size, a rank's batch is a run of the order) instead of scattering each
// block's records over the ranks. The last, partial global batch is split
// as DistributedSampler splits an epoch, in runs: each rank takes an equal
// run of it, padded from the order's start (or cut, with DropLast). So
// each rank gets as many positions as with c = 1, at most World-1 repeat,
// and after k batches of every rank the ranks together have taken
// exactly the order's first k*World*c positions, as with c = 1. (Padding
// to whole global batches instead repeated up to World*c-1 records: 168
// of 600 rows for 3 ranks of batch 64.)
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

// split is the epoch's shape for the ranks: k whole global batches, of
// which each rank takes c positions, then a tail of which each takes t.
func (s *RankPart) split() (c, k, t int) {
	n := s.Base.Len()
	c = max(1, s.Chunk)
	k = n / (s.World * c)
	rest := n - k*s.World*c
	if s.DropLast {
		return c, k, rest / s.World
	}
	return c, k, (rest + s.World - 1) / s.World
}

// Len is the number of positions this rank gets per epoch: the epoch cut
// or padded to a multiple of World, divided by World.
func (s *RankPart) Len() int {
	c, k, t := s.split()
	return k*c + t
}

func (s *RankPart) Fill(epoch, pos int, dst []int) int {
	n := s.Base.Len()
	c, k, t := s.split()
	m := max(0, min(len(dst), k*c+t-pos))
	for i := 0; i < m; {
		p := pos + i
		var g, run int
		if p < k*c {
			g, run = (p/c)*s.World*c+s.Rank*c+p%c, c-p%c
		} else {
			g = k*s.World*c + s.Rank*t + (p - k*c)
			run = k*c + t - p
		}
		if g >= n {
			g, run = g%n, 1 // padding repeats the order's start
		}
		run = min(run, m-i, n-g)
		s.Base.Fill(epoch, g, dst[i:i+run])
		i += run
	}
	s.lastEpoch, s.lastPos = epoch, pos+m
	return m
}

// partMark is a rank part of a stream sampler: the part's position
// and its base's state there.
type partMark struct {
	epoch, pos int
	base       any
}

// Mark, Save and Restore make a rank's part of a Stateful sampler Stateful too.
func (s *RankPart) Mark() any {
	st, ok := s.Base.(Stateful)
	if !ok {
		return nil
	}
	return &partMark{epoch: s.lastEpoch, pos: s.lastPos, base: st.Mark()}
}

func (s *RankPart) Save(mark any) ([]byte, error) {
	m, ok := mark.(*partMark)
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
		return 0, 0, fmt.Errorf("rank part of a sampler: %w", ErrState)
	}
	r := state[7:]
	e, n := binary.Uvarint(r)
	if n <= 0 {
		return 0, 0, fmt.Errorf("rank part of a sampler: %w (truncated)", ErrState)
	}
	r = r[n:]
	pos, n := binary.Uvarint(r)
	if n <= 0 || pos > uint64(s.Len()) || e > MaxEpoch {
		return 0, 0, fmt.Errorf("rank part of a sampler: %w (bad position)", ErrState)
	}
	if _, _, err := st.Restore(r[n:]); err != nil {
		return 0, 0, err
	}
	s.lastEpoch, s.lastPos = int(e), int(pos)
	return int(e), int(pos), nil
}

// place is the position in this rank's part of its base's position q,
// and false if another rank takes q (or a tail cut by DropLast). The
// padding repeats of the order's start are not counted: a rank reads
// those records again, which ahead does not say.
func (s *RankPart) place(q int) (int, bool) {
	c, k, t := s.split()
	if whole := k * s.World * c; q < whole {
		b, w := q/(s.World*c), q%(s.World*c)
		return b*c + w%c, w/c == s.Rank
	} else if off := q - whole; t > 0 && off/t == s.Rank && off < s.Base.Len()-whole {
		return k*c + off%t, true
	}
	return 0, false
}

// ahead is Ahead for a rank's part of an order with an inverse, from
// epoch e's position pos of the part.
func (s *RankPart) ahead(base Positioner, e, pos int) func(id int) (int64, bool) {
	n, l := s.Base.Len(), s.Len()
	return func(id int) (int64, bool) {
		if id < 0 || id >= n {
			return 0, false
		}
		if p, ok := s.place(base.Position(e, id)); ok && p >= pos {
			return int64(p - pos), true
		}
		if p, ok := s.place(base.Position(e+1, id)); ok {
			return int64(l - pos + p), true
		}
		return int64(2*l - pos), true
	}
}
