package sampler

import (
	"fmt"
	"strconv"
)

// Config names a sampler and its parameters, so that the command line, the
// daemon's job spec and the Go API build samplers one way.
type Config struct {
	// Kind is "global" (the default), "sequential", "block", "buffered" or "reservoir".
	Kind string
	Seed uint64
	// BlockSize is the block sampler's bytes per block; default 4096.
	BlockSize int
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
}

// Kinds lists the sampler kinds Build knows.
var Kinds = []string{"global", "sequential", "block", "buffered", "reservoir"}

// Build makes the configured sampler over n records; locate says where
// each record is, for block boundaries. It also returns a short name.
func (c Config) Build(n int, locate func(id int) (obj int, off int64, length int)) (Sampler, string, error) {
	switch c.Kind {
	case "", "global":
		return Global{N: n, Seed: c.Seed}, "global", nil
	case "sequential":
		return Sequential{N: n}, "sequential", nil
	case "block":
		size := c.BlockSize
		if size <= 0 {
			size = 4096
		}
		span := c.MaxSpan
		if span == 0 && c.RecordSize == 0 {
			span = 4 * size
		}
		b, err := NewBlock(BlockBounds(n, locate, size, 4096, span), c.Seed, c.Window)
		name := "block " + strconv.Itoa(size)
		if c.Window > 1 {
			name += " window " + strconv.Itoa(c.Window)
		}
		return b, name, err
	case "buffered":
		k := c.Buffer
		if k <= 0 {
			k = 1024
		}
		return &Buffered{N: n, Buffer: k, Seed: c.Seed}, "buffered " + strconv.Itoa(k), nil
	case "reservoir":
		k := c.Reservoir
		if k <= 0 {
			k = 1024
		}
		return &Reservoir{N: n, Size: k, Seed: c.Seed}, "reservoir " + strconv.Itoa(k), nil
	}
	return nil, "", fmt.Errorf("unknown sampler %q (known: %v)", c.Kind, Kinds)
}
