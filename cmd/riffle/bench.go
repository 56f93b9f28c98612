package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/bench"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/storage"
)

func benchCmd() *cobra.Command {
	var (
		df             datasetFlags
		createFlag     string
		modes          []string
		dur            time.Duration
		batch, depth   int
		fioDepth       int
		noFio, jsonOut bool
		sf             samplerFlags
		opportunistic  int
	)
	cmd := &cobra.Command{
		Use:   "bench PATH",
		Short: "Compare riffle's global shuffle with per-record pread, a sequential read and fio, cold and warm",
		Long: `bench measures, in one run on one dataset of any format inspect opens:
(a) riffle's global shuffle with --depth reads in flight; (b) the same
permutation read one record at a time with pread, as a map-style PyTorch
Dataset does; (c) a sequential read of the dataset's files (a directory
tree's images, a pack's shards, a Hugging Face directory's Arrow files);
(d) fio random reads over those files at the mean record size rounded up
to the device's logical block (4 KiB at least), O_DIRECT, queue depth
--fio-depth. Cold runs drop the page cache before each measurement (root
only); warm runs read the files into the cache first. Each reports
samples/s, MB/s read (riffle's: every byte its loader read), reads/s and
the bytes the measurement fetched from storage (this process's read_bytes,
which other processes' I/O does not touch; fio's own), and the ratios that
matter.

With --create SIZE and a PATH that does not exist, a file of fixed-size
records (--record-size, default 4096) is written first.`,
		Example: "  riffle bench /data/bench.bin --create 4GiB --record-size 4096\n  riffle bench train.tfrecord --mode warm",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			path := args[0]
			create, err := parseSize(createFlag)
			if err != nil {
				return err
			}
			if df.opts.RecordSize == 0 && (create > 0 || df.opts.Format == "fixed" || dataset.DetectFormat(path) == "fixed") {
				df.opts.RecordSize = 4096
			}
			if _, err := os.Stat(path); os.IsNotExist(err) && create > 0 {
				n := int(create / int64(df.opts.RecordSize))
				fmt.Fprintf(cmd.ErrOrStderr(), "writing %d records of %d bytes to %s\n", n, df.opts.RecordSize, path)
				if err := synth.WriteFixed(path, n, df.opts.RecordSize, 0); err != nil {
					return err
				}
			}
			df.opts.Store = bench.Store() // so that its counters see every GET
			ds, err := df.open(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer ds.Close()
			inf := ds.Info()
			if ds.Len() == 0 {
				return fmt.Errorf("%s: %w", path, dataset.ErrEmpty)
			}
			objs := bench.Objects(ds) // what the baselines read: the files, not a directory
			recSize := inf.RecordSize
			if recSize == 0 {
				recSize = int(inf.Bytes / int64(ds.Len()))
			}
			if !jsonOut {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s, %d records of %d bytes (mean), %s; %s per measurement\n",
					path, inf.Format, ds.Len(), recSize, human(float64(inf.Bytes)), dur)
			}
			lim := bench.Limit{Duration: dur}
			var report []modeReport
			for _, mode := range modes {
				lim := lim
				if mode == "cold" {
					// At most one epoch: a second would find the file cached.
					lim.Records = ds.Len()
				}
				var rs []bench.Result
				prep := func() error {
					if mode == "cold" {
						return bench.DropCaches()
					}
					_, err := bench.Sequential(ctx, objs, recSize, bench.Limit{})
					return err
				}
				run := func(f func() (bench.Result, error)) error {
					if err := prep(); err != nil {
						return err
					}
					r, err := f()
					if err != nil {
						return err
					}
					rs = append(rs, r)
					return nil
				}
				// runOpen runs f on the dataset opened afresh, so that no
				// cache of an earlier measurement (a Parquet file's unpacked
				// pages) serves it.
				runOpen := func(f func(ds dataset.Dataset) (bench.Result, error)) error {
					d, err := df.open(ctx, args)
					if err != nil {
						return err
					}
					defer d.Close()
					return run(func() (bench.Result, error) { return f(d) })
				}
				if inf.Indexed() {
					if err := run(func() (bench.Result, error) { return bench.Index(ctx, df.opts, args...) }); err != nil {
						return err
					}
				}
				opts := loader.Options{BatchSize: batch, Depth: depth, Opportunistic: opportunistic}
				sf.RecordSize = inf.RecordSize
				if b, ok := ds.(dataset.Blocker); ok && !cmd.Flags().Changed("block-size") {
					sf.Bounds = b.Blocks() // the dataset's own blocks (Parquet pages, compressed Arrow record batches), as a job's block order takes them
				}
				// seed is the next run's: cold, each run reads an order
				// of its own, since a virtual disk's host keeps in its
				// memory what an earlier run read (Fio).
				seed := func() uint64 {
					if mode == "cold" {
						return sf.Seed + uint64(len(rs))
					}
					return sf.Seed
				}
				for _, k := range sf.list() {
					c := sf
					c.Seed = seed()
					s, name, err := c.build(k, ds.Len(), dataset.Locator(ds))
					if err != nil {
						return err
					}
					if err := runOpen(func(ds dataset.Dataset) (bench.Result, error) {
						r, err := bench.Riffle(ctx, ds, s, opts, lim)
						if k != "global" {
							r.Name = "riffle " + name
						}
						return r, err
					}); err != nil {
						return err
					}
				}
				if err := runOpen(func(ds dataset.Dataset) (bench.Result, error) { return bench.Pread(ctx, ds, seed(), lim) }); err != nil {
					return err
				}
				if err := run(func() (bench.Result, error) { return bench.Sequential(ctx, objs, recSize, lim) }); err != nil {
					return err
				}
				if mode == "cold" && !noFio && !storage.IsS3(path) {
					bs := bench.FioBlockSize(objs[0], recSize)
					if err := run(func() (bench.Result, error) { return bench.Fio(ctx, objs, bs, fioDepth, dur) }); err != nil {
						fmt.Fprintln(cmd.ErrOrStderr(), "riffle bench: skipping fio:", err)
					}
				}
				report = append(report, modeReport{Mode: mode, Results: rs})
				if !jsonOut {
					printMode(cmd.OutOrStdout(), mode, rs)
				}
			}
			if jsonOut {
				e := json.NewEncoder(cmd.OutOrStdout())
				e.SetIndent("", "  ")
				return e.Encode(report)
			}
			return nil
		},
	}
	cmd.AddCommand(benchDepthCmd())
	df.register(cmd)
	sf.register(cmd, "global")
	fl := cmd.Flags()
	fl.StringVar(&createFlag, "create", "", "size (like 4GiB) of fixed-size records to write first if PATH does not exist")
	fl.StringSliceVar(&modes, "mode", []string{"cold", "warm"}, "cold, warm or both")
	fl.DurationVar(&dur, "duration", 10*time.Second, "time per measurement")
	fl.IntVar(&batch, "batch-size", loader.DefaultBatchSize, "records per batch")
	fl.IntVar(&depth, "depth", 0, "riffle's reads in flight (default: chosen per device as it reads)")
	fl.IntVar(&fioDepth, "fio-depth", 64, "fio's queue depth")
	fl.IntVar(&opportunistic, "opportunistic", 0, "make batches of whichever records of this many batches arrive first")
	fl.BoolVar(&noFio, "no-fio", false, "do not run fio")
	fl.BoolVar(&jsonOut, "json", false, "print results as JSON")
	return cmd
}

type modeReport struct {
	Mode    string         `json:"mode"`
	Results []bench.Result `json:"results"`
}

func printMode(w io.Writer, mode string, rs []bench.Result) {
	fmt.Fprintf(w, "\n%s\n%-20s %12s %10s %12s %12s %10s\n", strings.ToUpper(mode), "", "samples/s", "MB/s", "reads/s", "read MB", "read/data")
	by := map[string]bench.Result{}
	var meters []string
	for _, r := range rs {
		if strings.HasPrefix(r.Name, "fio") {
			by["fio"] = r
		} else {
			by[r.Name] = r
		}
		if r.Meter != "" && !slices.Contains(meters, r.Meter) {
			meters = append(meters, r.Meter)
		}
		dev := "?"
		if r.DevBytes >= 0 {
			dev = fmt.Sprintf("%.1f", float64(r.DevBytes)/1e6)
		}
		fmt.Fprintf(w, "%-20s %12.0f %10.1f %12.0f %12s %10s\n", r.Name, r.SamplesPerSec(), r.MBPerSec(), r.IOPS(), dev, amplification(r))
	}
	fmt.Fprintf(w, "read MB: %s\n", strings.Join(meters, "; "))
	rf := by["riffle"]
	if p, ok := by["pread"]; ok {
		fmt.Fprintf(w, "riffle / pread samples/s:      %s\n", ratio(rf.SamplesPerSec(), p.SamplesPerSec()))
	}
	if s, ok := by["sequential"]; ok {
		fmt.Fprintf(w, "riffle / sequential MB/s:      %s\n", ratio(rf.MBPerSec(), s.MBPerSec()))
	}
	if f, ok := by["fio"]; ok {
		fmt.Fprintf(w, "riffle / fio reads/s:          %s\n", ratio(rf.IOPS(), f.IOPS()))
	}
	if ix, ok := by["index build"]; ok {
		if s, ok := by["sequential"]; ok {
			fmt.Fprintf(w, "index build / sequential MB/s: %s\n", ratio(ix.MBPerSec(), s.MBPerSec()))
		}
	}
	for _, r := range rs {
		if strings.HasPrefix(r.Name, "riffle ") {
			if s, ok := by["sequential"]; ok {
				fmt.Fprintf(w, "%s / sequential MB/s: %s, read / data %s\n", r.Name, ratio(r.MBPerSec(), s.MBPerSec()), amplification(r))
			}
		}
	}
}

// ratio prints a/b with three significant digits (a small ratio is not
// rounded to 0.00x), or "-" when b is zero.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3gx", a/b)
}

// amplification is the bytes a measurement fetched from storage over the
// bytes it read, "-" when either is unknown or zero.
func amplification(r bench.Result) string {
	if r.DevBytes < 0 || r.Bytes <= 0 {
		return "-"
	}
	return ratio(float64(r.DevBytes), float64(r.Bytes))
}
