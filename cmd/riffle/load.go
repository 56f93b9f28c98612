package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// loadReport is one epoch of riffle load.
type loadReport struct {
	Epoch      int     `json:"epoch"`
	Samples    int     `json:"samples"`
	Seconds    float64 `json:"seconds"`
	SamplesSec float64 `json:"samples_per_sec"`
	Repeats    int     `json:"repeats"`
	// Sources, for a mixture, are each source's samples and share.
	Sources []sourceCount `json:"sources,omitempty"`
	// The source's page steward's counts so far (job.Status), where it
	// has one: pages kept in the page cache, dropped, and records read
	// past it.
	PagesKept     int64 `json:"pages_kept,omitempty"`
	PagesDropped  int64 `json:"pages_dropped,omitempty"`
	RecordsPassed int64 `json:"records_passed,omitempty"`
}

type sourceCount struct {
	Samples int     `json:"samples"`
	Share   float64 `json:"share"`
	Weight  float64 `json:"weight_share"`
}

func loadCmd() *cobra.Command {
	var (
		df                      datasetFlags
		mixture                 []string
		stop, sampler, ids      string
		glob, refresh           string
		labels                  []int
		minSize, maxSize        int
		dedup, jsonOut, ordered bool
		epochs, batch, epoch    int
		blockSize, window       int
		seed                    uint64
		minRL                   float64
		memory                  int64
	)
	cmd := &cobra.Command{
		Use:   "load [PATH...]",
		Short: "Load epochs of a dataset, a subset or a weighted mixture in this process, and report them",
		Long: `load runs a job in this process, as the daemon would (no daemon is
needed): the dataset of PATHs, or with --mixture a weighted mixture of
sources, each --mixture PATHS=WEIGHT (PATHS: files or globs, comma-
separated), over a subset (--ids, --label, --min-size, --max-size, --glob,
--dedup). For each epoch it prints the samples, the samples per second,
the records delivered twice (0 unless the order repeats) and, for a
mixture, each source's samples and share against its weight's.`,
		Example: "  riffle load --mixture 'web/*.jsonl=0.7' --mixture 'code/*.jsonl=0.3' --epochs 2\n  riffle load train.npy --ids keep.npy --dedup",
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := &wire.JobSpec{Paths: args, Format: df.opts.Format, RecordSize: df.opts.RecordSize, HeaderBytes: df.opts.HeaderBytes,
				CSVHeader: df.opts.CSVHeader, SkipCRC: df.opts.SkipCRC, DropPartial: df.opts.DropPartialTail, Direct: df.direct(cmd),
				Columns: df.opts.Columns, Split: df.opts.Split, Extensions: df.opts.Extensions,
				Shuffle: sampler != "sequential", Sampler: sampler, Seed: seed, BatchSize: batch, Epochs: epochs, Epoch: epoch,
				MixtureStop: stop, Dedup: dedup, Refresh: refresh, Ordered: &ordered, MinRandomness: minRL, MemoryBytes: memory,
				BlockSize: blockSize, Window: window}
			var weights []float64
			for _, m := range mixture {
				paths, w, ok := strings.Cut(m, "=")
				weight, err := strconv.ParseFloat(w, 64)
				if !ok || err != nil {
					return fmt.Errorf("--mixture %q: want PATHS=WEIGHT", m)
				}
				spec.Mixture = append(spec.Mixture, wire.MixSource{Paths: strings.Split(paths, ","), Weight: weight})
				weights = append(weights, weight)
			}
			if ids != "" {
				spec.Subset = &wire.Subset{IDsFile: ids}
			}
			if len(labels) > 0 || minSize > 0 || maxSize > 0 || glob != "" {
				spec.Filter = &wire.Filter{Labels: labels, MinSize: minSize, MaxSize: maxSize, Glob: glob}
			}
			// Batches are this process's heap here (the daemon's are
			// shared memory): keep the Go runtime within what the process
			// may use (its cgroup's limit), collecting sooner than that.
			debug.SetMemoryLimit(job.AvailableMemory() * 3 / 4)
			env, err := job.NewEnv(job.EnvOptions{IndexDir: df.opts.IndexDir})
			if err != nil {
				return err
			}
			defer env.Close()
			opened := time.Now()
			j, err := env.OpenSpec(cmd.Context(), spec, nil)
			if err != nil {
				return err
			}
			defer j.Close()
			d := j.Describe()
			offsets := d.Offsets
			if !jsonOut {
				// The open indexes what needs it (a growing dataset's new files only).
				fmt.Fprintf(cmd.OutOrStdout(), "opened %d records in %.3f s", d.Records, time.Since(opened).Seconds())
				if d.Generations > 0 {
					fmt.Fprintf(cmd.OutOrStdout(), " (%d generations of files)", d.Generations)
				}
				if d.Direct {
					fmt.Fprint(cmd.OutOrStdout(), "; reading past the page cache (O_DIRECT)")
				}
				if a := d.Auto; a != nil {
					fmt.Fprintf(cmd.OutOrStdout(), "; auto chose %s (block_size %d, window %d): RL %.3f, expected %.0f records/s, a sequential read %.0f",
						a.Sampler, a.BlockSize, a.Window, a.RL, a.Rate, a.Sequential)
				}
				fmt.Fprintln(cmd.OutOrStdout())
			}
			var sum float64
			for _, w := range weights {
				sum += w
			}
			var reports []loadReport
			seen := map[int]int{}
			var cur *loadReport
			start := time.Now()
			end := func() {
				if cur == nil {
					return
				}
				cur.Seconds = time.Since(start).Seconds()
				cur.SamplesSec = float64(cur.Samples) / max(cur.Seconds, 1e-9)
				st := j.Status(0)
				cur.PagesKept, cur.PagesDropped, cur.RecordsPassed = st.PagesKept, st.PagesDropped, st.RecordsPassed
				for k := range cur.Sources {
					cur.Sources[k].Share = float64(cur.Sources[k].Samples) / float64(max(cur.Samples, 1))
					cur.Sources[k].Weight = weights[k] / sum
				}
				reports = append(reports, *cur)
				if !jsonOut {
					fmt.Fprintf(cmd.OutOrStdout(), "epoch %d: %d samples in %.3f s, %.0f samples/s, %d repeated",
						cur.Epoch, cur.Samples, cur.Seconds, cur.SamplesSec, cur.Repeats)
					if cur.PagesKept > 0 || cur.PagesDropped > 0 || cur.RecordsPassed > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "; the page cache keeps %d pages, %d dropped, %d records read past it",
							cur.PagesKept, cur.PagesDropped, cur.RecordsPassed)
					}
					fmt.Fprintln(cmd.OutOrStdout())
					for k, s := range cur.Sources {
						fmt.Fprintf(cmd.OutOrStdout(), "  source %d: %d samples, share %.5f (weight %.5f)\n", k, s.Samples, s.Share, s.Weight)
					}
				}
			}
			for {
				b, err := j.Next(cmd.Context())
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				if cur == nil || b.Epoch != cur.Epoch {
					end()
					cur, start = &loadReport{Epoch: b.Epoch, Sources: make([]sourceCount, len(offsets))}, time.Now()
					clear(seen)
				}
				for _, id := range b.IDs {
					if seen[id]++; seen[id] > 1 {
						cur.Repeats++
					}
					if len(offsets) > 0 {
						cur.Sources[sort.SearchInts(offsets, id+1)-1].Samples++
					}
				}
				cur.Samples += len(b.IDs)
				b.Release()
			}
			end()
			if jsonOut {
				e := json.NewEncoder(cmd.OutOrStdout())
				e.SetIndent("", "  ")
				return e.Encode(reports)
			}
			return nil
		},
	}
	df.register(cmd)
	fl := cmd.Flags()
	fl.StringArrayVar(&mixture, "mixture", nil, "a source of a weighted mixture, PATHS=WEIGHT (repeat it; instead of PATH)")
	fl.StringVar(&stop, "mixture-stop", "", "first_exhausted (default) or all_exhausted")
	fl.StringVar(&sampler, "sampler", "", "the order: global (default), sequential, block, buffered, reservoir, or auto")
	fl.IntVar(&blockSize, "block-size", 0, "sampler block: bytes per block (default the device's block)")
	fl.IntVar(&window, "window", 0, "sampler block: blocks whose records are shuffled together")
	fl.Float64Var(&minRL, "min-randomness", 0, "sampler auto: the least randomization level of the order it picks (default 0.9)")
	fl.StringVar(&ids, "ids", "", "a file of the ids to read (an integer .npy, or one id per line)")
	fl.IntSliceVar(&labels, "label", nil, "keep the records of these labels")
	fl.IntVar(&minSize, "min-size", 0, "keep the records of at least this many bytes")
	fl.IntVar(&maxSize, "max-size", 0, "keep the records of at most this many bytes")
	fl.StringVar(&glob, "glob", "", "keep the records whose file matches (\"*.jpg\", \"cats/*\")")
	fl.BoolVar(&dedup, "dedup", false, "count records of equal bytes once")
	fl.StringVar(&refresh, "refresh", "", "epoch: read files added to a glob or directory from the next epoch")
	fl.IntVar(&epochs, "epochs", 1, "epochs to load")
	fl.IntVar(&epoch, "epoch", 0, "the epoch to start at")
	fl.IntVar(&batch, "batch-size", job.DefaultBatchSize, "records per batch")
	fl.Int64Var(&memory, "memory", 0, "the job's memory_bytes (0: the daemon's choice); sampler auto's window fits in it")
	fl.Uint64Var(&seed, "seed", 0, "the order's seed")
	fl.BoolVar(&ordered, "ordered", false, "keep the order inside batches")
	fl.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	return cmd
}
