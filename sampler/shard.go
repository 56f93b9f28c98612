package sampler

import "fmt"

// Shard is rank Rank's part of a data-parallel job of World ranks, with
// torch.utils.data.DistributedSampler's semantics: the epoch's order (of
// Base) is cut to a multiple of World (DropLast) or padded to one by
// repeating its start, and rank r takes positions r, r+World, r+2*World...
// The ranks' parts are disjoint and together are the epoch's order.
type Shard struct {
	Base        Sampler
	Rank, World int
	DropLast    bool
}

// NewShard checks rank and world.
func NewShard(base Sampler, rank, world int, dropLast bool) (*Shard, error) {
	if world < 1 || rank < 0 || rank >= world {
		return nil, fmt.Errorf("rank %d of world %d: want 0 <= rank < world", rank, world)
	}
	return &Shard{Base: base, Rank: rank, World: world, DropLast: dropLast}, nil
}

// Len is the number of positions this rank gets per epoch.
func (s *Shard) Len() int {
	if s.DropLast {
		return s.Base.Len() / s.World
	}
	return (s.Base.Len() + s.World - 1) / s.World
}

func (s *Shard) Fill(epoch, pos int, dst []int) int {
	n := s.Base.Len()
	m := max(0, min(len(dst), s.Len()-pos))
	for i := range m {
		g := (s.Rank + (pos+i)*s.World) % n // padding repeats the order's start
		s.Base.Fill(epoch, g, dst[i:i+1])
	}
	return m
}
