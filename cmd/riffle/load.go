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
	// Of a token corpus (--seq-len): the epoch's samples not delivered
	// (its samples are its job's count), its tokens in them (inputs that
	// are not padding) and their rate, and its rates of padding (of the
	// input positions), cut documents and dropped tokens.
	Missing   int     `json:"missing,omitempty"`
	Tokens    int64   `json:"tokens,omitempty"`
	TokensSec float64 `json:"tokens_per_sec,omitempty"`
	Padding   float64 `json:"padding,omitempty"`
	Cut       float64 `json:"cut,omitempty"`
	Dropped   float64 `json:"dropped,omitempty"`
}

type sourceCount struct {
	Samples int     `json:"samples"`
	Share   float64 `json:"share"`
	Weight  float64 `json:"weight_share"`
}

func loadCmd() *cobra.Command {
	var (
		df                      datasetFlags
		tf                      tokenFlags
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
mixture, each source's samples and share against its weight's.

With --seq-len the paths (or each mixture source) are a token corpus
(Megatron prefixes or .idx/.bin names, flat token files with
--token-dtype, 1-D .npy, an Arrow, Parquet or Hugging Face --token-column) and
the records are each epoch's samples, cut as --packing says: each epoch
also prints its tokens per second, its padding and cut rates, and the
samples of the epoch never delivered (0: each exactly once).`,
		Example: "  riffle load --mixture 'web/*.jsonl=0.7' --mixture 'code/*.jsonl=0.3' --epochs 2\n  riffle load train.npy --ids keep.npy --dedup\n  riffle load corpus.idx --seq-len 2048 --packing best_fit",
		RunE: func(cmd *cobra.Command, args []string) error {
			spec := &wire.JobSpec{Paths: args, Format: df.opts.Format, RecordSize: df.opts.RecordSize, HeaderBytes: df.opts.HeaderBytes,
				CSVHeader: df.opts.CSVHeader, SkipCRC: df.opts.SkipCRC, DropPartial: df.opts.DropPartialTail, Direct: df.direct(cmd),
				Columns: df.opts.Columns, Split: df.opts.Split, Extensions: df.opts.Extensions,
				Shuffle: sampler != "sequential", Sampler: sampler, Seed: seed, BatchSize: batch, Epochs: epochs, Epoch: epoch,
				MixtureStop: stop, Dedup: dedup, Refresh: refresh, Ordered: &ordered, MinRandomness: minRL, MemoryBytes: memory,
				BlockSize: blockSize, Window: window}
			tf.spec(cmd, spec)
			if tf.seqLen > 0 {
				return loadTokens(cmd, spec, mixture, df, jsonOut)
			}
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
			j, err := env.Open(cmd.Context(), spec, nil)
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
	tf.register(cmd)
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

// loadTokens loads spec's token corpus epoch by epoch, a job an epoch (a
// best_fit epoch's samples are its own): each epoch's samples per
// second, tokens per second (inputs that are not padding), its padding,
// cut and dropped rates as its job says, and a check that the epoch
// delivered each of its samples exactly once.
func loadTokens(cmd *cobra.Command, spec *wire.JobSpec, mixture []string, df datasetFlags, jsonOut bool) error {
	out := cmd.OutOrStdout()
	for _, m := range mixture {
		paths, w, ok := strings.Cut(m, "=")
		weight, err := strconv.ParseFloat(w, 64)
		if !ok || err != nil {
			return fmt.Errorf("--mixture %q: want PATHS=WEIGHT", m)
		}
		spec.Mixture = append(spec.Mixture, wire.MixSource{Paths: strings.Split(paths, ","), Weight: weight})
	}
	debug.SetMemoryLimit(job.AvailableMemory() * 3 / 4)
	env, err := job.NewEnv(job.EnvOptions{IndexDir: df.opts.IndexDir})
	if err != nil {
		return err
	}
	defer env.Close()
	first, epochs := spec.Epoch, spec.Epochs
	var reports []loadReport
	for e := first; e < first+max(1, epochs); e++ {
		one := *spec
		one.Epoch, one.Epochs = e, 1
		opened := time.Now()
		j, err := env.Open(cmd.Context(), &one, nil)
		if err != nil {
			return err
		}
		d := j.Describe()
		tk := d.Tokens
		if !jsonOut && e == first {
			fmt.Fprintf(out, "opened %d documents, %d %s tokens in %.3f s: %d samples of seq_len %d (%s)\n",
				tk.Documents, tk.Tokens, tk.Dtype, time.Since(opened).Seconds(), d.Samples, tk.SeqLen, tk.Packing)
		}
		rep := loadReport{Epoch: e, Padding: tk.Padding, Cut: tk.Cut, Dropped: tk.Dropped}
		seen := make([]uint8, d.Samples)
		start := time.Now()
		for {
			b, err := j.Next(cmd.Context())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				j.Close()
				return err
			}
			for _, id := range b.IDs {
				if id < 0 || id >= len(seen) {
					j.Close()
					return fmt.Errorf("epoch %d: sample %d outside the epoch's %d", e, id, len(seen))
				}
				if seen[id]++; seen[id] > 1 {
					rep.Repeats++
				}
			}
			rep.Samples += len(b.IDs)
			b.Release()
		}
		j.Close()
		rep.Seconds = time.Since(start).Seconds()
		for _, n := range seen {
			if n == 0 {
				rep.Missing++
			}
		}
		rep.SamplesSec = float64(rep.Samples) / max(rep.Seconds, 1e-9)
		rep.Tokens = int64(float64(rep.Samples*tk.SeqLen) * (1 - tk.Padding))
		rep.TokensSec = float64(rep.Tokens) / max(rep.Seconds, 1e-9)
		reports = append(reports, rep)
		if !jsonOut {
			fmt.Fprintf(out, "epoch %d: %d samples in %.3f s, %.0f samples/s, %.0f tokens/s; padding %.3f%%, documents cut %.3f%%, tokens dropped %.3f%%; %d repeated, %d missing\n",
				e, rep.Samples, rep.Seconds, rep.SamplesSec, rep.TokensSec, 100*rep.Padding, 100*rep.Cut, 100*rep.Dropped, rep.Repeats, rep.Missing)
		}
		if rep.Repeats > 0 || rep.Missing > 0 {
			return fmt.Errorf("epoch %d: %d samples delivered twice and %d never, of %d: not exactly once", e, rep.Repeats, rep.Missing, d.Samples)
		}
	}
	if jsonOut {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(reports)
	}
	return nil
}
