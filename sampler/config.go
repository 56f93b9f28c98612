package sampler

import (
	"fmt"
	"slices"
	"strconv"
)

// Config names a sampler, its parameters and its split over ranks, so that the
// command line, the daemon's job spec and the Go API build orders one way.
// The zero value is a global shuffle of seed 0 over all records.
type Config struct {
	// Kind is "global" (the default), "sequential", "block", "buffered" or "reservoir".
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

// Kinds lists the sampler kinds Build knows.
var Kinds = []string{"global", "sequential", "block", "buffered", "reservoir"}

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

// Positional says whether an order of kind ("" is global) is a cheap
// function of (seed, epoch, position), whose rest from any position (an
// elastic resume's start) is computed, not replayed.
func Positional(kind string) bool {
	return slices.Contains([]string{"", "global", "block", "sequential", "buffered", "reservoir"}, kind)
}

func (c Config) build(n int, locate func(id int) (obj int, off int64, length int)) (Sampler, string, error) {
	switch c.Kind {
	case "", "global":
		return Global{N: n, Seed: c.Seed}, "global", nil
	case "sequential":
		return Sequential{N: n}, "sequential", nil
	case "block":
		if len(c.Bounds) > 0 {
			if c.Bounds[len(c.Bounds)-1] != n {
				return nil, "", fmt.Errorf("block bounds end at %d, not at the %d records", c.Bounds[len(c.Bounds)-1], n)
			}
			b, err := NewBlock(c.Bounds, c.Seed, c.Window)
			return b, fmt.Sprintf("block (%d of the dataset's own blocks)", len(c.Bounds)-1), err
		}
		size := c.BlockSize
		if size <= 0 {
			size = 4096
		}
		span := c.MaxSpan
		if span == 0 && c.RecordSize == 0 {
			span = 4 * size
		}
		align := c.Align
		if align <= 0 {
			align = 4096
		}
		name := "block " + strconv.Itoa(size)
		if c.Window > 1 {
			name += " window " + strconv.Itoa(c.Window)
		}
		if c.RecordSize == 0 {
			b, err := NewBlock(BlockBounds(n, locate, size, align, span), c.Seed, c.Window)
			return b, name, err
		}
		// Fixed-size records are cut by arithmetic: a regular cut is not
		// even listed.
		if r, ok := RegularCut(n, c.RecordSize, locate, size, align, span); ok {
			b, err := NewRegularBlock(r, c.Seed, c.Window)
			return b, name, err
		}
		b, err := NewBlock(FixedBlockBounds(n, c.RecordSize, locate, size, align, span), c.Seed, c.Window)
		return b, name, err
	case "buffered":
		k := c.Buffer
		if k <= 0 {
			k = 1024
		}
		return &Buffered{N: n, Buffer: k, Seed: c.Seed, Chunk: c.Chunk}, "buffered " + strconv.Itoa(k), nil
	case "reservoir":
		k := c.Reservoir
		if k <= 0 {
			k = 1024
		}
		return &Reservoir{N: n, Size: k, Seed: c.Seed}, "reservoir " + strconv.Itoa(k), nil
	}
	return nil, "", fmt.Errorf("unknown sampler %q (known: %v)", c.Kind, Kinds)
}
