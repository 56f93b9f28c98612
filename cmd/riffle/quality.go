package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/quality"
)

func qualityCmd() *cobra.Command {
	var (
		sf                  samplerFlags
		df                  datasetFlags
		records, batch, eps int
		svg, ids            string
	)
	cmd := &cobra.Command{
		Use:   "quality [PATH...]",
		Short: "Show what cheaper shuffles cost in randomness",
		Long: `quality reports, for each sampler, DeepIO's randomization level (RL: 100%
is a full shuffle, 0% a constant order) and two plainer measures over
--epochs generated epochs: how much more often than under a full shuffle
neighbouring records of the file share a batch, and the mean distance
records move from their file position (1 is a full shuffle's). --svg draws
each sampler's order, position against record id, over the whole epoch and
over its first 1%.

Given a dataset (PATH, with the options every command takes), the orders
are the loader's over it: its records, their places in its files, its
own blocks (Parquet's pages); without one, --records records of
--record-size bytes.`,
		Example: "  riffle quality --records 100000 --record-size 256 --svg orders.svg\n  riffle quality --sampler block,global --block-size 65536 --window 8\n  riffle quality data/imgs --sampler global,block",
		RunE: func(cmd *cobra.Command, args []string) error {
			if ids != "" {
				return measureIDs(cmd, ids, batch)
			}
			size := max(1, df.opts.RecordSize)
			if df.opts.RecordSize == 0 {
				size = 256
			}
			locate := func(id int) (int, int64, int) { return 0, int64(id) * int64(size), size }
			what := fmt.Sprintf("%d records of %d bytes", records, size)
			if len(args) > 0 {
				ds, err := df.open(cmd.Context(), args)
				if err != nil {
					return err
				}
				defer ds.Close()
				inf := ds.Info()
				records, locate = ds.Len(), dataset.Locator(ds)
				size = int(inf.Bytes / int64(max(1, ds.Len())))
				what = fmt.Sprintf("%s: %d records (%s, mean %d bytes)", strings.Join(args, " "), records, inf.Format, size)
				if b, ok := ds.(dataset.Blocker); ok && sf.BlockSize == 0 {
					sf.Bounds = b.Blocks() // the dataset's own blocks, as the loader's block order takes them
				}
			}
			sf.RecordSize = size
			var panels []quality.Panel
			fmt.Fprintf(cmd.OutOrStdout(), "%s, batches of %d, %d epochs\n\n%-28s %8s %16s %14s\n", what, batch, eps, "sampler", "RL", "neighbours/full", "displacement")
			for _, k := range sf.list() {
				s, name, err := sf.build(k, records, locate)
				if err != nil {
					return err
				}
				rl, _ := quality.RL(s)
				m := quality.Measure(s, batch, eps)
				fmt.Fprintf(cmd.OutOrStdout(), "%-28s %7.1f%% %15.1fx %14.2f\n", name, 100*rl, m.NeighbourRatio, m.Displacement)
				panels = append(panels, quality.Panel{Name: name, Sampler: s},
					quality.Panel{Name: name + ": positions 0-" + fmt.Sprint(records/100), Sampler: s, To: records / 100})
			}
			if svg != "" {
				f, err := os.Create(svg)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := quality.SVG(f, panels, 0, 1500); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "\nwrote", svg)
			}
			return nil
		},
	}
	sf.register(cmd, "global,block,buffered,reservoir,sequential")
	df.register(cmd)
	fl := cmd.Flags()
	fl.IntVar(&records, "records", 100000, "records in a generated dataset (without PATH)")
	fl.IntVar(&batch, "batch-size", loader.DefaultBatchSize, "records per batch")
	fl.IntVar(&eps, "epochs", 5, "epochs to measure")
	fl.StringVar(&svg, "svg", "", "write a plot of each sampler's order to this SVG file")
	fl.StringVar(&ids, "ids", "", "measure the orders in this file instead (what a loader delivered): one epoch per line, record ids separated by spaces")
	return cmd
}

// measureIDs measures delivered orders read from a file: one epoch per
// line.
func measureIDs(cmd *cobra.Command, path string, batch int) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var orders [][]int
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var order []int
		for _, f := range strings.Fields(line) {
			v, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("%s line %d: %q is not an id", path, i+1, f)
			}
			order = append(order, v)
		}
		if len(order) > 0 {
			orders = append(orders, order)
		}
	}
	m, err := quality.MeasureOrders(orders, batch)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%d epochs of %d records, batches of %d\nneighbours/full %.2fx\ndisplacement %.3f\n",
		len(orders), len(orders[0]), batch, m.NeighbourRatio, m.Displacement)
	return nil
}
