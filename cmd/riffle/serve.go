package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/pprof"

	"github.com/spf13/cobra"

	"github.com/riffle-ml/riffle/server"
)

const version = "0.2.0"

func serveCmd() *cobra.Command {
	var (
		s       server.Server
		verbose bool
		quiet   bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve batches to every training job on this machine",
		Long: `serve runs the riffle daemon: it listens on a Unix socket (default
$XDG_RUNTIME_DIR/riffle.sock, else /tmp/riffle-UID/riffle.sock, mode 0600)
and loads batches for any number of clients, passing them through shared
memory. The Python client starts one by itself when none answers; run it by
hand to choose its options. The protocol is in docs/protocol.md.

--root limits the files jobs may read to those directories: every file is
opened through them, so no symlink leads out, and indexes are written beside
the data there. Without --root the daemon reads any file its user can, and
keeps indexes only in its cache directory. --tcp adds a listener for remote
clients (batches then travel over the socket); every TCP client needs the
token (--token, $RIFFLE_TOKEN, or one the daemon makes and writes next to
the socket, mode 0600). The socket's directory must belong to you with mode
0700.`,
		Example: "  riffle serve\n  riffle serve --root /data --tcp 127.0.0.1:7470",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if verbose {
				slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
			} else if !quiet {
				slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
			}
			if s.Token == "" {
				s.Token = os.Getenv("RIFFLE_TOKEN")
			}
			s.Version = version
			if lim := server.GoMemoryLimit(); lim > 0 && os.Getenv("GOMEMLIMIT") == "" {
				debug.SetMemoryLimit(lim)
			}
			if path := os.Getenv("RIFFLE_CPUPROFILE"); path != "" {
				// For finding where the daemon spends its time.
				f, err := os.Create(path)
				if err != nil {
					return err
				}
				pprof.StartCPUProfile(f)
				defer pprof.StopCPUProfile()
			}
			err := s.Serve(cmd.Context())
			if errors.Is(err, server.ErrRunning) && quiet {
				return nil // started by a client that lost the race: the other daemon serves
			}
			if err != nil {
				return fmt.Errorf("serve: %w", err)
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&s.Socket, "socket", "", "Unix socket path (default $RIFFLE_SOCKET, $XDG_RUNTIME_DIR/riffle.sock or /tmp/riffle-UID/riffle.sock)")
	fl.StringVar(&s.TCP, "tcp", "", "also listen on this TCP address for remote clients (\":7470\" is loopback)")
	fl.StringVar(&s.Token, "token", "", "token TCP clients must present (default $RIFFLE_TOKEN)")
	fl.StringSliceVar(&s.Roots, "root", nil, "only serve files under this directory (repeatable)")
	fl.StringVar(&s.Outputs, "outputs", "", "the catalogue of persisted transform outputs (default $RIFFLE_CACHE_DIR/outputs or ~/.cache/riffle/outputs)")
	fl.DurationVar(&s.IdleExit, "idle-exit", 0, "exit after this long without clients (0: never)")
	fl.IntVar(&s.MaxConns, "max-conns", 256, "connections served at once")
	fl.StringVar(&s.Metrics, "metrics", "", "serve Prometheus metrics at this address (\":9470\" is loopback), path /metrics")
	fl.StringVar(&s.IndexDir, "index-dir", "", "where to keep indexes (default $XDG_CACHE_HOME/riffle)")
	fl.StringVar(&s.TierDir, "cache-dir", "", "keep blocks of s3:// objects on this local disk, across restarts")
	fl.Var(sizeFlag{&s.TierBytes}, "cache-dir-bytes", "the disk cache's budget, like 100GiB (default 64MiB)")
	fl.Var(sizeFlag{&s.CacheBytes}, "cache-bytes", "the record cache's budget, like 8GiB (default a quarter of the memory the daemon may use)")
	fl.BoolVarP(&verbose, "verbose", "v", false, "log every request")
	fl.BoolVar(&quiet, "quiet", false, "log only warnings; exit quietly if another daemon serves the socket")
	return cmd
}
