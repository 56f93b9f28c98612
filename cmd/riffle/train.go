package main

import (
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/train"
	"github.com/riffle-ml/riffle/wire"
)

func trainCmd() *cobra.Command {
	var (
		sf        samplerFlags
		df        datasetFlags
		cfg       train.Config
		synthetic int
		margin    float64
		minRL     float64
		memory    int64
		pageCache int64
	)
	cmd := &cobra.Command{
		Use:   "train [PATH]",
		Short: "Train logistic regression through each sampler and compare epochs to a target loss",
		Long: `train fits logistic regression by mini-batch SGD on a LIBSVM dataset, once
per sampler, and prints the epochs and the wall time each needs to reach a
target training loss. Without --target the target is the loss a global
shuffle reaches in --max-epochs, plus --margin. With --synthetic N a
dataset of N examples sorted by label (the common worst case) is written to
a temporary directory and used.`,
		Example: "  riffle train --synthetic 20000\n  riffle train data/heart_scale.sorted.svm --sampler global,block,buffered,sequential --buffer 32\n" +
			"  riffle train --synthetic 200000 --sampler global,auto,sequential --min-randomness 0.9",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if synthetic > 0 {
				dir := cmd.Flags().Lookup("synthetic-dir").Value.String()
				path := filepath.Join(dir, fmt.Sprintf("sorted-%d.svm", synthetic))
				if err := synth.WriteSortedLIBSVM(path, synthetic, 20, 1); err != nil {
					return err
				}
				args = []string{path}
			}
			if len(args) == 0 {
				return fmt.Errorf("give a LIBSVM file or --synthetic N")
			}
			if df.opts.Format == "" {
				df.opts.Format = "libsvm"
			}
			ds, err := df.open(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer ds.Close()
			data, err := train.Load(ctx, ds)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d examples, %d features, batches of %d, lr %g\n", args[0], len(data.Rows), data.Dim, cfg.BatchSize, cfg.LR)
			locate := dataset.Locator(ds)
			sf.RecordSize = ds.Info().RecordSize
			if cfg.Target == 0 {
				g, _, _ := sf.build("global", ds.Len(), locate)
				r, err := train.Run(ctx, ds, data, g, cfg)
				if err != nil {
					return err
				}
				best := r.Losses[0]
				for _, l := range r.Losses {
					best = min(best, l)
				}
				cfg.Target = best + margin
				fmt.Fprintf(cmd.OutOrStdout(), "target loss %.4f (global shuffle's best in %d epochs + %.3f)\n", cfg.Target, len(r.Losses), margin)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\n%-40s %18s %12s %12s %10s\n", "sampler", "epochs to target", "seconds", "final loss", "accuracy")
			for _, k := range sf.list() {
				c := sf.Config
				c.Kind = k
				var auto *wire.AutoOrder
				if k == "auto" {
					a, err := order.ChooseOrder(ctx, ds, minRL, memory, cfg.BatchSize, pageCache)
					if err != nil {
						return err
					}
					auto = &a
					c.Kind, c.BlockSize, c.Window = a.Sampler, a.BlockSize, a.Window
				}
				s, name, err := c.Build(ds.Len(), locate)
				if err != nil {
					return err
				}
				if auto != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "auto (min RL %g, memory %d): %s, RL %.3f, expected %.0f records/s (a sequential read %.0f)\n",
						minRL, memory, name, auto.RL, auto.Rate, auto.Sequential)
					name = "auto: " + name
				}
				r, err := train.Run(ctx, ds, data, s, cfg)
				if err != nil {
					return err
				}
				eps := fmt.Sprint(r.Epochs)
				if r.Epochs == 0 {
					eps = fmt.Sprintf("not in %d", len(r.Losses))
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%-40s %18s %12.3f %12.4f %10.4f\n", name, eps, r.Seconds, r.Losses[len(r.Losses)-1], r.Accuracy)
			}
			return nil
		},
	}
	sf.register(cmd, "global,block,buffered,sequential")
	df.register(cmd)
	fl := cmd.Flags()
	fl.Float64Var(&cfg.LR, "lr", 0.5, "learning rate")
	fl.Float64Var(&cfg.L2, "l2", 1e-4, "L2 penalty")
	fl.IntVar(&cfg.BatchSize, "batch-size", loader.DefaultBatchSize, "examples per batch")
	fl.IntVar(&cfg.MaxEpochs, "max-epochs", 20, "epochs at most")
	fl.Float64Var(&cfg.Target, "target", 0, "target training loss (default: the global shuffle's best + --margin)")
	fl.Float64Var(&margin, "margin", 0.01, "added to the global shuffle's best loss to make the default target")
	fl.IntVar(&synthetic, "synthetic", 0, "write and use N synthetic examples sorted by label")
	fl.String("synthetic-dir", "/tmp", "where --synthetic writes its file")
	fl.Float64Var(&minRL, "min-randomness", 0.9, "sampler auto: the least randomization level of the order it picks")
	fl.Int64Var(&memory, "memory", 256<<20, "sampler auto: bytes a block order's window may take")
	fl.Int64Var(&pageCache, "page-cache", job.AvailableMemory()/2, "sampler auto: data up to this many bytes counts as kept by the page cache (read in the global shuffle); 0: as if larger than memory")
	return cmd
}
