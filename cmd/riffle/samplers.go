package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
)

// samplerFlags choose an order; the same flags serve demo, quality and train.
type samplerFlags struct {
	kind      string
	seed      uint64
	blockSize int
	window    int
	buffer    int
	reservoir int
	// maxSpan bounds how far a block may grow waiting for a page-aligned
	// record end; 0 is BlockBounds' default, right for fixed-size records.
	maxSpan int
}

func (f *samplerFlags) register(cmd *cobra.Command, kinds string) {
	fl := cmd.Flags()
	fl.StringVar(&f.kind, "sampler", kinds, "order: global, block, buffered, reservoir, sequential (a comma list where several are compared)")
	fl.Uint64Var(&f.seed, "seed", 0, "shuffle seed")
	fl.IntVar(&f.blockSize, "block-size", 4096, "block sampler: bytes per block (records are grouped up to it, ending on page edges)")
	fl.IntVar(&f.window, "window", 1, "block sampler: spread the records of this many consecutive blocks over as many batches")
	fl.IntVar(&f.buffer, "buffer", 1024, "buffered sampler: records in the shuffle buffer")
	fl.IntVar(&f.reservoir, "reservoir", 1024, "reservoir sampler: records per reservoir round")
}

func (f *samplerFlags) kinds() []string { return strings.Split(f.kind, ",") }

// build makes the sampler kind for n records located by locate.
func (f *samplerFlags) build(kind string, n int, locate func(int) (int, int64, int)) (sampler.Sampler, string, error) {
	switch kind {
	case "global":
		return sampler.Global{N: n, Seed: f.seed}, "global", nil
	case "sequential":
		return sampler.Sequential{N: n}, "sequential", nil
	case "block":
		b, err := sampler.NewBlock(sampler.BlockBounds(n, locate, f.blockSize, 4096, f.maxSpan), f.seed, f.window)
		name := "block " + human(float64(f.blockSize))
		if f.window > 1 {
			name += " window " + strconv.Itoa(f.window)
		}
		return b, name, err
	case "buffered":
		return &sampler.Buffered{N: n, Buffer: f.buffer, Seed: f.seed}, "buffered " + strconv.Itoa(f.buffer), nil
	case "reservoir":
		return &sampler.Reservoir{N: n, Size: f.reservoir, Seed: f.seed}, "reservoir " + strconv.Itoa(f.reservoir), nil
	}
	return nil, "", fmt.Errorf("unknown sampler %q (global, block, buffered, reservoir, sequential)", kind)
}

// locator adapts a dataset to BlockBounds.
func locator(ds dataset.Dataset) func(int) (int, int64, int) {
	return func(id int) (int, int64, int) {
		l := ds.Locate(id)
		return l.Object, l.Off, l.Len
	}
}
