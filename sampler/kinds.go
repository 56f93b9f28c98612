package sampler

import (
	"fmt"
	"strconv"
)

// Kind is one kind of order a Config names: the one table of them, from
// which Kinds, Positional, Packed and Build are read. A new kind is a row
// here (and its sampler's file); the spec's option docs, the daemon's
// checks and the order it reports follow from the row.
type Kind struct {
	// Name is what Config.Kind, a spec's sampler and the CLI's --sampler say.
	Name string
	// Positional says the order is a cheap function of (seed, epoch,
	// position), whose rest from any position (an elastic resume's start)
	// is computed, not replayed.
	Positional bool
	// Packed says the loader reads every record of a batch itself, so a
	// batch's layout in memory is a function of the order as its records
	// are (the daemon then delivers them as they lie: loader.Batch's
	// PackedOrder). The buffered and reservoir orders take theirs from
	// stages in the cache as they arrive: not packed.
	Packed bool
	// Uniform says each epoch is a uniform random permutation of the
	// records: a share group's dependent sampling may stand in for it
	// (Joader's is of uniform orders), the rest of an epoch is a uniform
	// order of what is left, and its reads fall anywhere in the files, so
	// the page cache answers few of them (a job reads them past it).
	Uniform bool
	// Windows says the loader may read the order's windows whole, each
	// as large as the memory bound lets (loader's gathered loads): a job
	// of it needs that memory, which cannot bend to two batches.
	Windows bool
	// build makes the order over n records (Config.build).
	build func(c Config, n int, locate func(id int) (obj int, off int64, length int)) (Sampler, string, error)
}

// kinds is the table, in the order the docs list them; the first is the
// default ("" is it).
var kinds = []Kind{
	{Name: "global", Positional: true, Packed: true, Uniform: true, build: func(c Config, n int, _ func(int) (int, int64, int)) (Sampler, string, error) {
		return Global{N: n, Seed: c.Seed}, "global", nil
	}},
	{Name: "sequential", Positional: true, Packed: true, build: func(_ Config, n int, _ func(int) (int, int64, int)) (Sampler, string, error) {
		return Sequential{N: n}, "sequential", nil
	}},
	{Name: "block", Positional: true, Packed: true, Windows: true, build: buildBlock},
	{Name: "buffered", Positional: true, build: func(c Config, n int, _ func(int) (int, int64, int)) (Sampler, string, error) {
		k := c.Buffer
		if k <= 0 {
			k = 1024
		}
		return &Buffered{N: n, Buffer: k, Seed: c.Seed, Chunk: c.Chunk}, "buffered " + strconv.Itoa(k), nil
	}},
	{Name: "reservoir", Positional: true, build: func(c Config, n int, _ func(int) (int, int64, int)) (Sampler, string, error) {
		k := c.Reservoir
		if k <= 0 {
			k = 1024
		}
		return &Reservoir{N: n, Size: k, Seed: c.Seed}, "reservoir " + strconv.Itoa(k), nil
	}},
}

// Kinds lists the sampler kinds Build knows.
var Kinds = func() []string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.Name
	}
	return names
}()

// KindOf is the row of kind ("" is the default, global); false if no
// kind has that name.
func KindOf(kind string) (Kind, bool) {
	if kind == "" {
		return kinds[0], true
	}
	for _, k := range kinds {
		if k.Name == kind {
			return k, true
		}
	}
	return Kind{}, false
}

// Positional says whether an order of kind ("" is global) is a cheap
// function of (seed, epoch, position), whose rest from any position (an
// elastic resume's start) is computed, not replayed.
func Positional(kind string) bool {
	k, ok := KindOf(kind)
	return ok && k.Positional
}

// Packed says whether the loader reads every record of an order of kind
// ("" is global) itself, so that a batch's layout in memory is a function
// of the order (Kind.Packed).
func Packed(kind string) bool {
	k, ok := KindOf(kind)
	return ok && k.Packed
}

// Uniform says whether an order of kind ("" is global) is a uniform
// random permutation of the records each epoch (Kind.Uniform).
func Uniform(kind string) bool {
	k, ok := KindOf(kind)
	return ok && k.Uniform
}

// Windows says whether the loader may read an order of kind's windows
// whole (Kind.Windows).
func Windows(kind string) bool {
	k, ok := KindOf(kind)
	return ok && k.Windows
}

func (c Config) build(n int, locate func(id int) (obj int, off int64, length int)) (Sampler, string, error) {
	k, ok := KindOf(c.Kind)
	if !ok {
		return nil, "", fmt.Errorf("unknown sampler %q (known: %v)", c.Kind, Kinds)
	}
	return k.build(c, n, locate)
}

// buildBlock is the block order: over a dataset's own blocks (Bounds), or
// blocks of BlockSize bytes cut at page-aligned record ends.
func buildBlock(c Config, n int, locate func(id int) (obj int, off int64, length int)) (Sampler, string, error) {
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
}
