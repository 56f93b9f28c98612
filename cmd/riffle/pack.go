package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/catalogue"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/pack"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/transform"
)

func packCmd() *cobra.Command {
	var (
		df         datasetFlags
		out, tf    string
		shardBytes string
	)
	cmd := &cobra.Command{
		Use:   "pack SRC... [--out DIR] [--transform NAME[:PARAMS]]",
		Short: "Rewrite a dataset into riffle's shards, or persist a transform's outputs",
		Long: `pack rewrites any record dataset riffle reads (fixed, npy, LIBSVM, JSONL,
CSV, text, TFRecord, directories, WebDataset tars) into riffle's own shards
(docs/format.md): records packed into pages so that none straddles a page
it need not, a CRC32C and the label of each record, shards of about
--shard-bytes. Packed shards open as any dataset (riffle inspect DIR).
TFRecord files compressed with GZIP or ZLIB, which do not open as a
dataset (no random access), are packed read start to end, checking both
CRCs of every record. A dataset of rows (Arrow, Hugging Face, Parquet) is
packed as uncompressed Arrow IPC files of its columns (docs/format.md),
which riffle reads row by row in place, with no page to decode.

With --transform, the shards hold the transform's outputs (the daemon's
transforms: image decode-resize-crop, libsvm_dense), and without --out
they go to the cache of persisted outputs, where the daemon finds them: a
job asking for that transform over that source then reads them instead of
transforming again. An output whose source has changed is never served.
riffle catalogue lists and removes them.

A pack killed half way leaves no shard that looks whole; packing again
resumes after the last whole shard.`,
		Example: "  riffle pack data/*.tfrecord --out packed/\n  riffle pack images/ --transform image:size=256,crop=224",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := parseSize(shardBytes)
			if err != nil {
				return err
			}
			ds, err := df.open(cmd.Context(), args)
			var compressed *dataset.CompressedError
			if errors.As(err, &compressed) {
				// A GZIP or ZLIB TFRecord file does not open as a dataset
				// (no random access): it is packed read start to end.
				return packStreams(cmd, df.opts, args, out, pack.Options{ShardBytes: size, Transform: tf})
			}
			if err != nil {
				return err
			}
			defer ds.Close()
			if out == "" {
				if tf == "" {
					return fmt.Errorf("--out is required (or --transform, to persist its outputs in the cache)")
				}
				_, canon, err := transformName(tf)
				if err != nil {
					return err
				}
				out = catalogue.Default().Path(catalogue.Key(ds.Info().Paths, canon))
			}
			bar := newBar(ds.Len(), "packing")
			start := time.Now()
			sum, err := pack.Pack(cmd.Context(), ds, out, pack.Options{ShardBytes: size, Transform: tf, Progress: func(done, total int) {
				if bar != nil {
					bar.Set(done)
				}
			}})
			if err != nil {
				return err
			}
			printPacked(cmd, out, sum, start)
			return nil
		},
	}
	df.register(cmd)
	fl := cmd.Flags()
	fl.StringVar(&out, "out", "", "the directory to pack into (default with --transform: the cache of outputs)")
	fl.StringVar(&tf, "transform", "", "persist this transform's outputs (image:size=256,crop=224, libsvm_dense:n_features=N)")
	fl.StringVar(&shardBytes, "shard-bytes", "256MiB", "cut shards at about this size")
	return cmd
}

// packStreams packs TFRecord files read start to end (compressed ones).
func packStreams(cmd *cobra.Command, opts dataset.Options, args []string, out string, po pack.Options) error {
	if out == "" {
		return fmt.Errorf("--out is required to pack compressed TFRecord files")
	}
	store := opts.Store
	if store == nil {
		local, err := storage.NewLocal(opts.Direct, nil)
		if err != nil {
			return err
		}
		store = storage.NewRouter(local, storage.S3Options{}, nil)
	}
	names, err := dataset.ExpandPaths(cmd.Context(), store, args)
	if err != nil {
		return err
	}
	opts.Store = store
	start := time.Now()
	sum, err := pack.PackTFRecordStreams(cmd.Context(), opts, names, out, po)
	if err != nil {
		return err
	}
	printPacked(cmd, out, sum, start)
	return nil
}

func printPacked(cmd *cobra.Command, out string, sum pack.Summary, start time.Time) {
	el := time.Since(start).Seconds()
	fmt.Fprintf(cmd.OutOrStdout(), "%s: %d records, %s in %d shards (%d found whole from an earlier run), %.1fs, %s/s\n",
		out, sum.Records, human(float64(sum.Bytes)), sum.Shards, sum.Resumed, el, human(float64(sum.Bytes)/max(el, 1e-9)))
}

func catalogueCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "catalogue",
		Short: "List and remove persisted transform outputs (riffle pack --transform)",
		// One noun, one idea: the record cache is the daemon's memory; the
		// persisted outputs are the catalogue. "cache" stays an alias, so
		// scripts written for the old name still run.
		Aliases: []string{"cache"},
	}
	versions := func(p string) string {
		local, _ := storage.NewLocal(false, nil)
		st, err := local.Stat(cmd.Context(), p)
		if err != nil {
			return ""
		}
		return st.Version
	}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the outputs: key, size, last use, stale or not, what they are",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c := catalogue.Default()
			es, err := c.List(versions)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n%-20s %10s %-20s %-6s %s\n", c.Dir, "key", "bytes", "used", "stale", "output")
			for _, e := range es {
				what := "(no manifest)"
				if e.Manifest != nil {
					what = pack.Describe(e.Manifest)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%-20s %10s %-20s %-6v %s\n", e.Key, human(float64(e.Bytes)), e.Used.Format("2006-01-02 15:04:05"), e.Stale, what)
			}
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm KEY...",
		Short: "Remove outputs by key (or a unique prefix)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := catalogue.Default()
			for _, k := range args {
				if err := c.Remove(k); err != nil {
					return err
				}
			}
			return nil
		},
	}
	var budget string
	gc := &cobra.Command{
		Use:   "gc [--max-bytes SIZE]",
		Short: "Remove stale outputs, then the least recently used beyond --max-bytes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			max := int64(-1)
			if budget != "" {
				var err error
				if max, err = parseSize(budget); err != nil {
					return err
				}
			}
			removed, err := catalogue.Default().GC(max, versions)
			for _, e := range removed {
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s (%s, stale %v)\n", e.Key, human(float64(e.Bytes)), e.Stale)
			}
			return err
		},
	}
	gc.Flags().StringVar(&budget, "max-bytes", "", "keep at most this many bytes of outputs")
	cmd.AddCommand(ls, rm, gc)
	return cmd
}

// transformName checks a transform's spelling and returns its canonical
// name with its version.
func transformName(s string) (transform.Transform, string, error) {
	return transform.New(s)
}
