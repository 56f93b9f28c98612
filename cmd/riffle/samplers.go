package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/sampler"
)

// samplerFlags choose an order; the same flags serve bench, quality and train.
type samplerFlags struct {
	sampler.Config
	kinds string
}

func (f *samplerFlags) register(cmd *cobra.Command, kinds string) {
	fl := cmd.Flags()
	fl.StringVar(&f.kinds, "sampler", kinds, "order: "+strings.Join(sampler.Kinds, ", ")+" (a comma list where several are compared)")
	fl.Uint64Var(&f.Seed, "seed", 0, "shuffle seed")
	fl.IntVar(&f.BlockSize, "block-size", 4096, "block sampler: bytes per block (records are grouped up to it, ending on page edges)")
	fl.IntVar(&f.Window, "window", 1, "block sampler: spread the records of this many consecutive blocks over as many batches")
	fl.IntVar(&f.Buffer, "buffer", 1024, "buffered sampler: records in each window it shuffles")
	fl.IntVar(&f.Reservoir, "reservoir", 1024, "reservoir sampler: records per reservoir round")
}

func (f *samplerFlags) list() []string { return strings.Split(f.kinds, ",") }

// build makes the sampler kind for n records located by locate.
func (f *samplerFlags) build(kind string, n int, locate func(int) (int, int64, int)) (sampler.Sampler, string, error) {
	c := f.Config
	c.Kind = kind
	return c.Build(n, locate)
}
