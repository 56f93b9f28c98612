package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/dataset"
)

func indexCmd() *cobra.Command {
	var (
		df     datasetFlags
		verify bool
	)
	cmd := &cobra.Command{
		Use:   "index PATH...",
		Short: "Build or verify the sidecar index of variable-length files",
		Long: `index scans newline-delimited (LIBSVM, JSONL, CSV, text) and TFRecord files
once and saves each file's offset table, 8 bytes per record, as FILE.ridx next
to it (or under --index-dir when the directory is read-only). Later opens
reuse it while the file's size and mtime are unchanged. Fixed-size and .npy
files need no index. --verify checks existing indexes without rebuilding.`,
		Example: "  riffle index data/train.svm\n  riffle index 'shards/*.tfrecord' --verify",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
				for _, ip := range dataset.IndexPaths(p, df.opts.IndexDir) {
					if st, err := os.Stat(ip); err == nil {
						idxBytes += st.Size()
						fmt.Printf("%s -> %s\n", p, ip)
						break
					}
				}
			}
			fmt.Printf("%s: %d files, %d records, %s of records", inf.Format, len(inf.Paths), ds.Len(), human(float64(inf.Bytes)))
			if idxBytes > 0 {
				fmt.Printf(", index %s (%.1f bytes/record)", human(float64(idxBytes)), float64(idxBytes)/float64(ds.Len()))
			} else {
				fmt.Print(", no index needed")
			}
			verb := "indexed"
			if verify {
				verb = "verified"
			}
			fmt.Printf(", %s in %v (%.0f MB/s)\n", verb, el.Round(time.Millisecond), float64(inf.Bytes)/el.Seconds()/1e6)
			return nil
		},
	}
	df.register(cmd)
	cmd.Flags().BoolVar(&verify, "verify", false, "fail on a missing, stale or damaged index instead of rebuilding it")
	cmd.Flags().BoolVar(&df.rebuild, "rebuild", false, "rebuild even a valid index")
	return cmd
}
