// Command riffle indexes, inspects, benchmarks and serves datasets for
// machine-learning training with a true global shuffle every epoch.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	root := &cobra.Command{
		Use:   "riffle",
		Short: "Globally shuffled, parallel data loading for ML training",
		Long: `riffle loads training data in a fresh global shuffle every epoch at the
speed of the device: it shuffles record indices, not data, and reads each
batch's records with many parallel reads in whatever order they complete.

Start with 'riffle demo'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	// Every command reads s3:// paths; the store is named once, for all.
	var endpoint string
	root.PersistentFlags().StringVar(&endpoint, "endpoint", "", "the S3-compatible store s3:// paths are read from (default $RIFFLE_S3_ENDPOINT, $AWS_ENDPOINT_URL, else AWS)")
	root.PersistentPreRun = func(*cobra.Command, []string) {
		if endpoint != "" {
			os.Setenv("RIFFLE_S3_ENDPOINT", endpoint)
		}
	}
	root.AddCommand(demoCmd(), indexCmd(), inspectCmd(), benchCmd(), loadCmd(), serveCmd(), statusCmd(), qualityCmd(), trainCmd(), convertCmd(), packCmd(), catalogueCmd(), transformCmd())
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "riffle:", err)
		os.Exit(1)
	}
}
