package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/riffle-ml/riffle/dataset"
)

// datasetFlags are the options every command that opens a dataset takes.
type datasetFlags struct {
	opts    dataset.Options
	rebuild bool
}

func (f *datasetFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.opts.Format, "format", "", "format: "+strings.Join(dataset.Formats(), ", ")+" (default: from the file name)")
	fl.IntVar(&f.opts.RecordSize, "record-size", 0, "bytes per record of a fixed-size file")
	fl.Int64Var(&f.opts.HeaderBytes, "header-bytes", 0, "bytes to skip at the start of each fixed-size file")
	fl.BoolVar(&f.opts.CSVHeader, "csv-header", false, "the first line of each CSV file names the columns")
	fl.BoolVar(&f.opts.SkipCRC, "skip-crc", false, "do not check TFRecord data CRCs on read (each frame's length CRC is still checked)")
	fl.BoolVar(&f.opts.DropPartialTail, "drop-partial", false, "drop a partial record at the end of a file instead of failing")
	fl.StringVar(&f.opts.IndexDir, "index-dir", "", "where to keep indexes that cannot be kept beside their data: read-only or untrusted directories (default $XDG_CACHE_HOME/riffle)")
	fl.BoolVar(&f.opts.Direct, "direct", false, "read with O_DIRECT, bypassing the page cache (a job's default: when it shuffles files of which the page cache would answer few reads)")
	fl.StringSliceVar(&f.opts.Columns, "columns", nil, "the columns to read of Arrow, Hugging Face and Parquet data (default all)")
	fl.StringVar(&f.opts.Split, "split", "", "the split of a Hugging Face DatasetDict directory")
	fl.StringSliceVar(&f.opts.Extensions, "extensions", nil, "the only file endings a directory dataset takes as records (default every file)")
}

func (f *datasetFlags) open(ctx context.Context, paths []string) (dataset.Dataset, error) {
	opts := f.opts
	if f.rebuild {
		opts.Index = dataset.IndexRebuild
	}
	if isTerminal() {
		var bar *progressbar.ProgressBar
		opts.Progress = func(done, total int64) {
			if bar == nil {
				bar = progressbar.DefaultBytes(total, "indexing")
			}
			bar.Set64(done)
		}
	}
	return dataset.Open(ctx, opts, paths...)
}

// direct is --direct for a job's spec: nil unless given, so that the job
// chooses (job.Plan.DirectUnset).
func (f *datasetFlags) direct(cmd *cobra.Command) *bool {
	if !cmd.Flags().Changed("direct") {
		return nil
	}
	d := f.opts.Direct
	return &d
}

func isTerminal() bool { return term.IsTerminal(int(os.Stdout.Fd())) }

// newBar returns a progress bar on a terminal and nil elsewhere.
func newBar(n int, desc string) *progressbar.ProgressBar {
	if !isTerminal() {
		return nil
	}
	return progressbar.NewOptions(n, progressbar.OptionSetDescription(desc),
		progressbar.OptionShowCount(), progressbar.OptionClearOnFinish(), progressbar.OptionSetWriter(os.Stderr))
}

func human(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}

// parseSize reads sizes like 4096, 64KiB, 4GiB, 1.5GB.
func parseSize(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit such as KiB, MiB, GiB", s)
	}
	return int64(v * mult), nil
}

// sizeFlag is a byte size flag that takes units (4096, 64KiB, 4GiB).
type sizeFlag struct{ v *int64 }

func (f sizeFlag) String() string {
	if f.v == nil || *f.v == 0 {
		return ""
	}
	return strconv.FormatInt(*f.v, 10)
}
func (f sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err == nil {
		*f.v = n
	}
	return err
}
func (f sizeFlag) Type() string { return "size" }
