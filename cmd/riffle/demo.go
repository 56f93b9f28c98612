package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

func demoCmd() *cobra.Command {
	var (
		df                           datasetFlags
		records, size, epochs, batch int
		depth                        int
		seed                         uint64
		keep                         bool
	)
	cmd := &cobra.Command{
		Use:   "demo [PATH...]",
		Short: "Load a few globally shuffled epochs and check every record came exactly once",
		Long: `demo is riffle's main job in miniature. Without a path it writes a sample
dataset of fixed-size records into a temporary directory (each record carries
its own id); with paths it opens them (see --format). It then loads --epochs
epochs, each in a fresh global shuffle of --seed, with many parallel reads per
batch, checks that every record came exactly once per epoch (and, for the
sample data, that each record's bytes are the file's bytes for its id), and
prints samples/s and MB/s.`,
		Example: "  riffle demo\n  riffle demo --records 1000000 --size 4096\n  riffle demo data/train.jsonl --epochs 2",
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			synthetic := len(args) == 0
			if synthetic {
				dir, err := os.MkdirTemp("", "riffle-demo-")
				if err != nil {
					return err
				}
				if !keep {
					defer os.RemoveAll(dir)
				}
				path := filepath.Join(dir, "records.bin")
				fmt.Fprintf(cmd.OutOrStdout(), "writing %d records of %d bytes (%s) to %s\n", records, size, human(float64(records*size)), path)
				if err := synth.WriteFixed(path, records, size, 0); err != nil {
					return err
				}
				args = []string{path}
				df.opts.Format, df.opts.RecordSize = "fixed", size
			}
			ds, err := df.open(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer ds.Close()
			inf := ds.Info()
			fmt.Fprintf(cmd.OutOrStdout(), "dataset: %s, %d records, %s\n", inf.Format, ds.Len(), human(float64(inf.Bytes)))
			smp := sampler.Global{N: ds.Len(), Seed: seed}
			for e := range epochs {
				seen := make([]bool, ds.Len())
				l, err := loader.New(ctx, ds, smp, loader.Options{BatchSize: batch, Depth: depth, Epoch: e})
				if err != nil {
					return err
				}
				bar := newBar(l.Batches().Count(), fmt.Sprintf("epoch %d", e))
				start := time.Now()
				var n, bytes int
				for {
					b, err := l.Next(ctx)
					if err != nil {
						l.Close()
						if errors.Is(err, io.EOF) {
							break
						}
						return err
					}
					for i, id := range b.IDs {
						if seen[id] {
							b.Release()
							l.Close()
							return fmt.Errorf("epoch %d: record %d came twice", e, id)
						}
						seen[id] = true
						if synthetic && (i == 0 || id%97 == 0) {
							if err := synth.CheckRecord(b.Record(i), id); err != nil {
								b.Release()
								l.Close()
								return fmt.Errorf("epoch %d batch %d: %w", e, b.Index, err)
							}
						} else if synthetic && synth.IDOf(b.Record(i)) != id {
							b.Release()
							l.Close()
							return fmt.Errorf("epoch %d batch %d: bytes of record %d carry id %d", e, b.Index, id, synth.IDOf(b.Record(i)))
						}
						bytes += b.Len[i]
					}
					n += len(b.IDs)
					b.Release()
					if bar != nil {
						bar.Add(1)
					}
				}
				el := time.Since(start).Seconds()
				for id, ok := range seen {
					if !ok {
						return fmt.Errorf("epoch %d: record %d never came", e, id)
					}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "epoch %d: %d records, each exactly once: %.0f samples/s, %.1f MB/s\n", e, n, float64(n)/el, float64(bytes)/el/1e6)
			}
			return nil
		},
	}
	df.register(cmd)
	fl := cmd.Flags()
	fl.IntVar(&records, "records", 32768, "records in the sample dataset")
	fl.IntVar(&size, "size", 4096, "bytes per record in the sample dataset")
	fl.IntVar(&epochs, "epochs", 3, "epochs to load")
	fl.IntVar(&batch, "batch-size", loader.DefaultBatchSize, "records per batch")
	fl.IntVar(&depth, "depth", 64, "reads in flight")
	fl.Uint64Var(&seed, "seed", 0, "shuffle seed")
	fl.BoolVar(&keep, "keep", false, "keep the sample dataset")
	return cmd
}
