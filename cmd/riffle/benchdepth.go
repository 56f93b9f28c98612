package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/bench"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

func benchDepthCmd() *cobra.Command {
	var (
		df         datasetFlags
		createFlag string
		depths     []int
		rounds     int
		dur        time.Duration
		jsonOut    bool
		memory     int64
	)
	cmd := &cobra.Command{
		Use:   "depth PATH",
		Short: "Compare riffle's cold global shuffle at its default depth with fio's best over queue depths",
		Long: `depth measures, in one run on one dataset of local files, cold: fio's
random reads (O_DIRECT, libaio, block = the mean record size rounded up to
the device's logical block) at each of --depths, and riffle's global
shuffle at its default settings, where the read engine chooses the reads
in flight per device as it goes. It repeats this --rounds times, riffle's
place among the fio runs moving each round, and prints each round's
reads/s, riffle over the round's best fio, the depth riffle's engine ended
at, and CPU per 1M reads/s (CPU seconds per million reads: the cores a
1M reads/s device would take). Cold needs root: the page cache is dropped
before every run.

riffle's side is a job (the Go library's, as the daemon runs one) naming
only the dataset: what it leaves unset the job chooses, among it whether
to read past the page cache, which it does for a shuffle of files of
which the page cache, keeping half the memory riffle may use, would
answer under 1 in 8 reads (4 KiB records: files over 2.2x that half).
--memory runs the whole benchmark in a memory cgroup of that limit, so
that a file smaller than the machine's memory is larger than riffle's,
as a dataset larger than memory is.

With --create SIZE and a PATH that does not exist, a file of fixed-size
records (--record-size, default 4096) is written first.`,
		Example: "  riffle bench depth /var/tmp/riffle-bench/r4GiB.bin\n  riffle bench depth /mnt/ram/r4k.bin --create 2GiB --rounds 5 --duration 5s",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
			w := cmd.OutOrStdout()
			if memory > 0 {
				leave, err := intoMemoryCgroup(memory)
				if err != nil {
					return err
				}
				defer leave()
			}
			cfg := bench.DepthConfig{
				Open: func() (dataset.Dataset, error) { return df.open(cmd.Context(), args) },
				Spec: wire.JobSpec{Paths: args, Format: df.opts.Format, RecordSize: df.opts.RecordSize, HeaderBytes: df.opts.HeaderBytes,
					DropPartial: df.opts.DropPartialTail, Direct: df.direct(cmd)},
				Depths: depths, Rounds: rounds, Time: dur,
			}
			if !jsonOut {
				cfg.Each = func(round int, r bench.Result) {
					fmt.Fprintf(cmd.ErrOrStderr(), "round %d: %-18s %9.0f reads/s  depth %d\n", round+1, r.Name, r.IOPS(), r.Depth)
				}
			}
			rs, err := bench.Depth(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if jsonOut {
				e := json.NewEncoder(w)
				e.SetIndent("", "  ")
				return e.Encode(rs)
			}
			printDepth(w, path, rs)
			return nil
		},
	}
	df.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&createFlag, "create", "", "size (like 4GiB) of fixed-size records to write first if PATH does not exist")
	fl.IntSliceVar(&depths, "depths", []int{16, 32, 64, 128, 256}, "fio's queue depths")
	fl.IntVar(&rounds, "rounds", 3, "rounds of every run")
	fl.DurationVar(&dur, "duration", 10*time.Second, "time per run (riffle's at most an epoch)")
	fl.BoolVar(&jsonOut, "json", false, "print the rounds as JSON")
	fl.Var(sizeFlag{&memory}, "memory", "run in a memory cgroup (v1) limited to this, like 1GiB: riffle then has less memory than the file (root)")
	return cmd
}

func printDepth(w io.Writer, path string, rs []bench.DepthRound) {
	fmt.Fprintf(w, "%s: cold random reads/s\n%-6s", path, "round")
	for _, f := range rs[0].Fio {
		fmt.Fprintf(w, " %9s", fmt.Sprintf("fio qd%d", f.Depth))
	}
	fmt.Fprintf(w, " %9s %6s %12s %6s\n", "riffle", "depth", "riffle/best", "direct")
	var ratios []float64
	for i, r := range rs {
		fmt.Fprintf(w, "%-6d", i+1)
		for _, f := range r.Fio {
			fmt.Fprintf(w, " %9.0f", f.IOPS())
		}
		best := r.BestFio()
		ratios = append(ratios, r.Riffle.IOPS()/best.IOPS())
		fmt.Fprintf(w, " %9.0f %6d %12s %6v\n", r.Riffle.IOPS(), r.Riffle.Depth, ratio(r.Riffle.IOPS(), best.IOPS()), r.Riffle.Direct)
	}
	// Across rounds: each fio depth's median, riffle's median over the best
	// of those, and the spread of the per-round ratios.
	med := func(f func(r bench.DepthRound) float64) float64 {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, f(r))
		}
		slices.Sort(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	fmt.Fprintf(w, "%-6s", "median")
	bestFio, bestAt := 0.0, 0
	for i, f := range rs[0].Fio {
		m := med(func(r bench.DepthRound) float64 { return r.Fio[i].IOPS() })
		if m > bestFio {
			bestFio, bestAt = m, f.Depth
		}
		fmt.Fprintf(w, " %9.0f", m)
	}
	rf := med(func(r bench.DepthRound) float64 { return r.Riffle.IOPS() })
	fmt.Fprintf(w, " %9.0f\n", rf)
	slices.Sort(ratios)
	fmt.Fprintf(w, "riffle / fio's best (median fio qd%d): %s; per round %s (%s-%s)\n", bestAt, ratio(rf, bestFio),
		ratio(med(func(r bench.DepthRound) float64 { return r.Riffle.IOPS() / r.BestFio().IOPS() }), 1),
		ratio(ratios[0], 1), ratio(ratios[len(ratios)-1], 1))
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%.2f", r.Riffle.CoresPerMIOPS()))
	}
	fmt.Fprintf(w, "CPU per 1M reads/s (cores): riffle %s (rounds %s); fio at its best depth %.2f\n",
		fmt.Sprintf("%.2f", med(func(r bench.DepthRound) float64 { return r.Riffle.CoresPerMIOPS() })), strings.Join(parts, ", "),
		med(func(r bench.DepthRound) float64 { return r.BestFio().CoresPerMIOPS() }))
}

// intoMemoryCgroup moves this process (and what it starts after) into a
// memory cgroup (v1) of its own limited to limit bytes, and returns what
// moves it back and removes the cgroup.
func intoMemoryCgroup(limit int64) (func(), error) {
	const root = "/sys/fs/cgroup/memory"
	dir := filepath.Join(root, fmt.Sprintf("riffle-bench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--memory needs root and a v1 memory hierarchy at %s: %w", root, err)
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	leave := func() {
		os.WriteFile(filepath.Join(root, "cgroup.procs"), pid, 0)
		os.Remove(dir)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("--memory: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
		leave()
		return nil, fmt.Errorf("--memory: %w", err)
	}
	return leave, nil
}
