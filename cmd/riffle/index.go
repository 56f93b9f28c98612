package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

func indexCmd() *cobra.Command {
	var (
		df     datasetFlags
		verify bool
		data   bool
		dedup  bool
		dtype  string
		eod    int64
	)
	cmd := &cobra.Command{
		Use:   "index PATH...",
		Short: "Build or verify the sidecar index of variable-length files",
		Long: `index scans newline-delimited (LIBSVM, JSONL, CSV, text) and TFRecord files
once and saves each file's offset table, 8 bytes per record, as FILE.ridx next
to it (or under --index-dir when the directory is read-only). Later opens
reuse it while the file's size and version (inode, mtime) are unchanged.
Fixed-size and .npy files need no index.

--verify checks the existing indexes instead of building them: each must be
there, undamaged (its checksum) and built for the file as it is now. It
does not read the records. --data reads every record as well, checking each
TFRecord's CRCs, and says so. --dedup also hashes every record's bytes
(xxh3, 128 bits) for dedup=True, keeps the hashes beside the indexes (16
bytes a record), and says what that cost.

--token-dtype with --eod indexes a flat token file (nanoGPT's PREFIX.bin)
instead: its tokens are read once, its documents found by the EOD token,
and PREFIX.idx written beside it, so that PREFIX is a Megatron corpus that
packing best_fit and pad can cut (docs/tokens.md).`,
		Example: "  riffle index data/train.svm\n  riffle index 'shards/*.tfrecord' --verify --data\n  riffle index train.bin --token-dtype uint16 --eod 50256",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if dtype != "" || cmd.Flags().Changed("eod") {
				if dtype == "" || !cmd.Flags().Changed("eod") {
					return fmt.Errorf("a flat token file is indexed by --token-dtype and --eod together: its tokens' type and the token that ends a document")
				}
				for _, bin := range args {
					if err := indexTokens(cmd.Context(), out, bin, dtype, eod); err != nil {
						return err
					}
				}
				return nil
			}
			if verify {
				df.opts.Index = dataset.IndexVerify
			}
			start := time.Now()
			ds, err := df.open(cmd.Context(), args)
			if err != nil {
				return err
			}
			defer ds.Close()
			el := time.Since(start)
			inf := ds.Info()
			var idxBytes int64
			for _, p := range inf.Paths {
				for _, ip := range dataset.IndexPaths(p, df.opts.IndexDir, false) {
					if st, err := os.Stat(ip); err == nil {
						idxBytes += st.Size()
						fmt.Fprintf(out, "%s -> %s\n", p, ip)
						break
					}
				}
			}
			fmt.Fprintf(out, "%s: %d files, %d records, %s of records", inf.Format, len(inf.Paths), ds.Len(), human(float64(inf.Bytes)))
			if idxBytes > 0 {
				fmt.Fprintf(out, ", index %s (%.1f bytes/record)", human(float64(idxBytes)), float64(idxBytes)/float64(ds.Len()))
			} else {
				fmt.Fprint(out, ", no index needed")
			}
			verb := "indexed"
			if verify {
				verb = "index verified (checksum, and built for the files as they are now); records not read"
			}
			fmt.Fprintf(out, ", %s in %v (%.0f MB/s)\n", verb, el.Round(time.Millisecond), float64(inf.Bytes)/el.Seconds()/1e6)
			if dedup {
				start := time.Now()
				hashes, fresh, err := dataset.RecordHashes(cmd.Context(), ds, df.opts.IndexDir)
				if err != nil {
					return err
				}
				hel := time.Since(start)
				distinct := map[[2]uint64]bool{}
				for _, h := range hashes {
					distinct[[2]uint64{h.Hi, h.Lo}] = true
				}
				how := "kept from before"
				if fresh {
					how = fmt.Sprintf("hashed in %v (%.0f MB/s)", hel.Round(time.Millisecond), float64(inf.Bytes)/hel.Seconds()/1e6)
				}
				fmt.Fprintf(out, "dedup: %d distinct of %d records; %s\n", len(distinct), len(hashes), how)
			}
			if !data {
				return nil
			}
			start = time.Now()
			n, err := readAll(cmd, ds)
			if err != nil {
				return err
			}
			what := "read"
			if _, framed := ds.(dataset.Framed); framed && !df.opts.SkipCRC && inf.Format == "tfrecord" {
				what = "read, each CRC checked"
			}
			fmt.Fprintf(out, "data verified: %d records %s in %v\n", n, what, time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	df.register(cmd)
	cmd.Flags().BoolVar(&verify, "verify", false, "fail on a missing, stale or damaged index instead of rebuilding it")
	cmd.Flags().BoolVar(&data, "data", false, "also read every record, checking TFRecord CRCs")
	cmd.Flags().BoolVar(&dedup, "dedup", false, "also hash every record's bytes for dedup, and say what it cost")
	cmd.Flags().BoolVar(&df.rebuild, "rebuild", false, "rebuild even a valid index")
	cmd.Flags().StringVar(&dtype, "token-dtype", "", "index a flat token file PREFIX.bin of this token type as a Megatron corpus (PREFIX.idx)")
	cmd.Flags().Int64Var(&eod, "eod", 0, "with --token-dtype: the token that ends each document")
	return cmd
}

// readAll reads every record of ds in file order through the loader, which
// checks what the format lets it check, and returns how many it read.
func readAll(cmd *cobra.Command, ds dataset.Dataset) (int, error) {
	l, err := loader.New(cmd.Context(), ds, sampler.Sequential{N: ds.Len()}, loader.Options{BatchSize: 1024, Ordered: true})
	if err != nil {
		return 0, err
	}
	defer l.Close()
	n := 0
	for {
		b, err := l.Next(cmd.Context())
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		n += len(b.IDs)
		b.Release()
	}
}
