package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/server"
)

const version = "0.2.0"

func serveCmd() *cobra.Command {
	var (
		s       server.Server
		verbose bool
		quiet   bool
		peers   string
		node    int
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve batches to every training job on this machine",
		Long: `serve runs the riffle daemon: it listens on a Unix socket (default
$XDG_RUNTIME_DIR/riffle.sock, else /tmp/riffle-UID/riffle.sock, mode 0600)
and loads batches for any number of clients, passing them through shared
memory. The Python client starts one by itself when none answers; run it by
hand to choose its options. The protocol is in docs/protocol.md.

--peers makes the daemons of several nodes one memory tier for s3://
objects (DeepIO): each block is kept by one owner, and a node asks it for
the blocks it does not own, reading the object store itself when the owner
is slow or gone. The launcher gives membership: the list, this node's
index (from --node or the usual variables of torchrun, Slurm and
Kubernetes), and a --token all nodes share; every daemon needs --tcp.

The daemon adds up its memory: --memory (default its memory cgroup's
limit, or the machine's memory) is split into the record cache (a quarter,
or --cache-bytes), a reserve for the Go heap, and the jobs' shared memory.
Each job's open reserves its arena from that part. Under pressure memory
bends before it refuses: an open gets fewer batches in flight (down to a
floor of two), and jobs above their share give batches back, growing again
as others close; an open whose floor does not fit waits up to
--memory-wait, then is refused with an error that says what it needs and
what holds the budget. riffle status shows the budget. Start the daemon
inside its cgroup: it reads the limit at start.

--root limits the files jobs may read to those directories: every file is
opened through them, so no symlink leads out, and an index may be kept
beside the data there when its directory is one the daemon trusts (its
user's, writable by no one else); otherwise, and without --root, indexes
are kept in the private index directory. Without --root the daemon reads
any file its user can. --tcp adds a listener for remote
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
			if err := resolvePeers(cmd.Context(), &s, peers, node); err != nil {
				return err
			}
			if err := checkServeFlags(cmd, &s); err != nil {
				return err
			}
			if err := raiseFileLimit(); err != nil {
				return err
			}
			s.Version = version
			// The daemon keeps the Go heap's limit at what its jobs' shared
			// memory leaves, unless the user set one.
			s.HeapLimit = os.Getenv("GOMEMLIMIT") == ""
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
	fl.IntVar(&s.MaxConns, "max-conns", 256, "connections served at once on the Unix socket, and as many authenticated on TCP (before their hello, TCP connections have a room of their own: 128, 32 per address)")
	fl.StringVar(&s.Metrics, "metrics", "", "serve Prometheus metrics at this address (\":9470\" is loopback), path /metrics, and a live view of charts at /view/")
	fl.StringVar(&s.IndexDir, "index-dir", "", "where to keep indexes (default $XDG_CACHE_HOME/riffle)")
	fl.StringVar(&s.TierDir, "cache-dir", "", "keep blocks of s3:// objects on this local disk, across restarts")
	fl.Var(sizeFlag{&s.TierBytes}, "cache-dir-bytes", "the disk cache's budget, like 100GiB (default 64MiB)")
	fl.Var(sizeFlag{&s.CacheBytes}, "cache-bytes", "the record cache's budget, like 8GiB (default a quarter of --memory)")
	fl.Var(sizeFlag{&s.MemoryBytes}, "memory", "the memory the daemon may use, like 16GiB: the record cache, the Go heap and every job's shared memory (default its memory cgroup's limit, or the machine's memory)")
	fl.Var(sizeFlag{&s.PageCacheBytes}, "page-cache", "what the page cache may keep of the jobs' files, like 8GiB: a shuffle that would find under 1 in 8 of its reads there (a global shuffle not shared: under 30% of its files kept) reads with O_DIRECT unless its spec says (default half the machine's memory, or of the cgroup's limit); set, it also bounds the pages a share group, or a file's steward for jobs not sharing, keeps there, by default what the cgroup's limit or the machine leaves")
	fl.DurationVar(&s.MemoryWait, "memory-wait", 2*time.Minute, "how long an open whose floor of two batches does not fit in the memory budget waits before it is refused")
	fl.StringVar(&peers, "peers", "", "every node's daemon (host:port,... in the same order on every node, or dns:NAME:PORT for a headless service; default $RIFFLE_PEERS): their memory holds s3:// blocks together")
	fl.IntVar(&node, "node", -1, "this node's index in --peers (default $RIFFLE_NODE, $NODE_RANK, $GROUP_RANK, $SLURM_NODEID, else where --tcp is in the list)")
	fl.Var(sizeFlag{&s.PeerBytes}, "peer-bytes", "memory for the blocks this node owns, like 8GiB (default 64MiB)")
	fl.DurationVar(&s.PeerTimeout, "peer-timeout", 2*time.Second, "how long a request to another node may take before this node reads those bytes from the object store itself (and stops asking that node for a while)")
	fl.BoolVarP(&verbose, "verbose", "v", false, "log every request")
	fl.BoolVar(&quiet, "quiet", false, "log only warnings; exit quietly if another daemon serves the socket")
	return cmd
}

// checkServeFlags refuses, before the daemon starts, a flag it could not
// honour: a budget for a tier not asked for, a bound that would be
// quietly replaced by the default. (The directories the flags name are
// checked by Serve, before it listens.)
func checkServeFlags(cmd *cobra.Command, s *server.Server) error {
	fl := cmd.Flags()
	for _, c := range []struct {
		bad  bool
		what string
	}{
		{fl.Changed("cache-dir-bytes") && s.TierDir == "", "--cache-dir-bytes is the budget of the disk tier --cache-dir makes: give --cache-dir too"},
		{fl.Changed("peer-bytes") && len(s.Peers) == 0, "--peer-bytes is the memory this node gives the cluster's tier: give --peers too"},
		{fl.Changed("node") && len(s.Peers) == 0, "--node is this node's index in --peers: give --peers too"},
		{s.MaxConns < 1, fmt.Sprintf("--max-conns %d: want at least 1", s.MaxConns)},
		{s.IdleExit < 0, fmt.Sprintf("--idle-exit %s: want 0 (never) or a positive duration", s.IdleExit)},
		{s.MemoryWait <= 0, fmt.Sprintf("--memory-wait %s: want a positive duration", s.MemoryWait)},
		{fl.Changed("memory") && s.MemoryBytes <= 0, "--memory: want a positive size, like 16GiB"},
		{fl.Changed("cache-bytes") && s.CacheBytes <= 0, "--cache-bytes: want a positive size, like 8GiB"},
	} {
		if c.bad {
			return errors.New(c.what)
		}
	}
	return nil
}

// raiseFileLimit raises the process's soft limit on open descriptors to
// its hard limit: each client's connection, each metrics connection and
// each file a job reads takes one, and a daemon at a low soft limit
// (1024, a shell's default) runs out with a job over a thousand files.
// (Go's runtime does this too, since 1.19, for any program that imports
// os; it is a process-wide setting, so the command says it where it
// starts the daemon.)
func raiseFileLimit() error {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("the limit on open files: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("raising the limit on open files to %d: %w", lim.Max, err)
		}
	}
	return nil
}

// resolvePeers fills the server's peer list and node index from the flags
// or the environment a launcher sets.
func resolvePeers(ctx context.Context, s *server.Server, peers string, node int) error {
	if peers == "" {
		peers = os.Getenv("RIFFLE_PEERS")
	}
	if peers == "" {
		return nil
	}
	if name, ok := strings.CutPrefix(peers, "dns:"); ok {
		// A headless service: one A record per node; every node sorts
		// the same answer the same way.
		host, port, err := net.SplitHostPort(name)
		if err != nil {
			return fmt.Errorf("--peers dns:NAME:PORT: %w", err)
		}
		addrs, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			return fmt.Errorf("--peers: resolving %s: %w", host, err)
		}
		slices.Sort(addrs)
		peers = ""
		for i, a := range addrs {
			if i > 0 {
				peers += ","
			}
			peers += net.JoinHostPort(a, port)
		}
	}
	for _, p := range strings.Split(peers, ",") {
		if p = strings.TrimSpace(p); p != "" {
			s.Peers = append(s.Peers, p)
		}
	}
	if node < 0 {
		for _, v := range []string{"RIFFLE_NODE", "NODE_RANK", "GROUP_RANK", "SLURM_NODEID"} {
			if x := os.Getenv(v); x != "" {
				n, err := strconv.Atoi(x)
				if err != nil {
					return fmt.Errorf("$%s=%q is not a node index", v, x)
				}
				node = n
				break
			}
		}
	}
	if node < 0 && s.TCP != "" {
		node = slices.Index(s.Peers, s.TCP)
	}
	if node < 0 || node >= len(s.Peers) {
		return fmt.Errorf("this node's index in --peers (%d nodes) is unknown: give --node", len(s.Peers))
	}
	if s.TCP == "" {
		return errors.New("--peers needs --tcp: the other nodes ask this one for its blocks there")
	}
	s.Node = node
	return nil
}
