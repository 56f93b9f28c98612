package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/columnar"
)

func convertCmd() *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "convert SRC --out DST",
		Short: "Rewrite an Arrow IPC stream (or a compressed IPC file) as an uncompressed IPC file",
		Long: `convert rewrites an Arrow IPC stream or file as an uncompressed Arrow IPC
file, as Rinas does to make Hugging Face's stream files indexable. riffle
reads streams in place (it indexes them once), and files whose buffers are
LZ4- or ZSTD-compressed a record batch at a time (each read whole and
decompressed once); rewritten uncompressed, such a file's rows are read
as the byte ranges that hold them, with no batch decompressed whole.`,
		Example: "  riffle convert data-00000-of-00001.arrow --out train.arrow",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			rows, err := columnar.ConvertFile(args[0], out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d rows\n", out, rows)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the IPC file to write")
	return cmd
}
