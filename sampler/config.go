package sampler

import (
	"fmt"
)

// Config names a sampler, its parameters and its split over ranks, so that the
// command line, the daemon's job spec and the Go API build orders one way.
// The zero value is a global shuffle of seed 0 over all records.
type Config struct {
	// Kind names a row of the kinds table (kinds.go): "global" (the
	// default), "sequential", "block", "buffered" or "reservoir".
	Kind string
	Seed uint64
	// BlockSize is the block sampler's bytes per block; default 4096.
	BlockSize int
	// Bounds, if set, are the block sampler's blocks (the first record
	// of each, and N at the end): a dataset's own, such as the pages of
	// a Parquet column (dataset.Blocker), instead of BlockSize bytes.
	Bounds []int
	// Align is where blocks may end: the storage's page or block size;
	// default 4096.
	Align int
	// RecordSize is the dataset's record size, 0 when records vary in
	// length. Lines rarely end on a page edge, so for them a block grows to
	// at most 4 blocks waiting for one; fixed-size records use
	// BlockBounds' default, which finds the aligned ends they have.
	RecordSize int
	// MaxSpan, if set, bounds how far a block grows waiting for a
	// page-aligned record end (BlockBounds), overriding the above.
	MaxSpan int
	// Window spreads the records of this many blocks over as many batches.
	Window int
	// Buffer is the buffered sampler's buffer, Reservoir the reservoir
	// sampler's sample; default 1024 each.
	Buffer, Reservoir int
	// Chunk is how many records of file order a buffered sampler's stage
	// loads; default 1024.
	Chunk int

	// Rank and World split each epoch as torch's DistributedSampler does;
	// World 0 or 1 is no split.
	Rank, World int
	// RankDropLast is DistributedSampler's drop_last: drop the epoch's
	// tail so ranks get equal shares, instead of padding it.
	RankDropLast bool
	// Start drops the first Start positions of each epoch's order before
	// the ranks split it: the rest of an epoch that ranks of another
	// topology began, resumed (elastic resume; only orders that are
	// functions of position, whose rest is cheap to compute).
	Start int
	// BatchSize lets a block order be split over ranks in runs of a batch,
	// so its blocks stay whole on each rank.
	BatchSize int
}

// Build makes the configured sampler over n records, split over ranks if World > 1;
// locate says where each record is, for block boundaries. It also returns
// a short name.
func (c Config) Build(n int, locate func(id int) (obj int, off int64, length int)) (Sampler, string, error) {
	s, name, err := c.build(n, locate)
	if err != nil {
		return nil, "", err
	}
	return c.Split(s, name)
}

// Split is the configured part of s: from Start, this rank's. Build
// splits the order it makes; a mixture of orders is split the same way.
func (c Config) Split(s Sampler, name string) (Sampler, string, error) {
	n := s.Len()
	_, block := s.(*Block)
	if c.Start > 0 {
		if !Positional(c.Kind) || c.Start >= n {
			return nil, "", fmt.Errorf("start %d: want an order that is a function of position and a start below its %d positions", c.Start, n)
		}
		s, name = From{Base: s, Start: c.Start}, fmt.Sprintf("%s from %d", name, c.Start)
	}
	world := max(1, c.World)
	if world == 1 && c.Rank == 0 {
		return s, name, nil
	}
	sh, err := NewRankPart(s, c.Rank, world, c.RankDropLast)
	if err != nil {
		return nil, "", err
	}
	if block && c.BatchSize > 0 {
		sh.Chunk = c.BatchSize // ranks take runs of the order (or of its rest), so blocks stay whole
	}
	return sh, fmt.Sprintf("%s rank %d of %d", name, c.Rank, world), nil
}
