package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/catalogue"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/peer"
	"github.com/riffle-ml/riffle/storage/tier"
)

// Server is the daemon. The zero value serves a Unix socket at
// DefaultSocket() with no path restriction. Serve reads the fields and
// never writes them: what it resolved is reported by Addr and TokenFile.
type Server struct {
	// Socket is the Unix socket path; default DefaultSocket(). Its
	// directory must be private to the daemon's user (made with mode 0700
	// when missing).
	Socket string
	// TCP, if set, also listens on this address for remote clients; a bare
	// ":port" is loopback. Every TCP client must present Token.
	TCP string
	// Token is what TCP clients present; when empty, Serve makes one and
	// writes it, mode 0600, next to the socket (TokenFile).
	Token string
	// Roots, if set, are the only directories whose files jobs may read;
	// every file is opened through them (storage.Local), so no symlink
	// leads out. Without roots the daemon reads whatever its user can, and
	// keeps indexes only in its cache directory.
	Roots []string
	// IdleExit stops the daemon after this long without clients; 0 never.
	IdleExit time.Duration
	// MaxConns bounds the connections served at once on the Unix socket,
	// and apart from them the TCP connections that have authenticated;
	// default 256 each. TCP connections that have not yet said hello are
	// bounded on their own, in all and per source address (auth.go), so
	// that no one who can reach the port crowds out the socket's owner or
	// a client holding the token.
	MaxConns int
	// CacheBytes is the record cache's budget; default a quarter of
	// MemoryBytes.
	CacheBytes int64
	// MemoryBytes is the memory the daemon may use; default its memory
	// cgroup's limit (v1 or v2), or the machine's memory if lower. The
	// record cache, a reserve for the Go heap and the jobs' shared memory
	// are carved from it (budget.go): a job's open reserves its arena, and
	// waits for room, at most MemoryWait (default 2 minutes), or is
	// refused with job.ErrMemory.
	MemoryBytes int64
	MemoryWait  time.Duration
	// PageCacheBytes is what the page cache may keep of the jobs' files:
	// a shuffle that would find few of its reads there reads the files
	// with O_DIRECT unless its spec says (job.EnvOptions.PageCacheBytes).
	// Default half the memory the process may use: the machine's, or its
	// cgroup's limit.
	PageCacheBytes int64
	// HeapLimit keeps the Go runtime's memory limit
	// (runtime/debug.SetMemoryLimit, a process-wide setting: a command
	// sets it, not a library) at what the jobs' reservations leave.
	HeapLimit bool
	// IndexDir is where indexes are kept; default $XDG_CACHE_HOME/riffle.
	IndexDir string
	// S3 configures the object store s3:// paths are read from (by default
	// from the AWS environment variables and files).
	S3 storage.S3Options
	// TierDir, if set, keeps blocks of s3:// objects on local disk, up to
	// TierBytes, evicting the block next wanted farthest in the future.
	TierDir   string
	TierBytes int64
	// Peers, if set, are the TCP addresses of every node's daemon: their
	// memory together holds the blocks of s3:// objects, each block in
	// its owner's (package peer). Node is this one's index in the list;
	// PeerBytes the memory it gives owned blocks; PeerTimeout bounds one
	// request to a peer before the object store is read instead (default
	// peer.Options' 2s). Every node needs the same Token. Nodes ask each
	// other in the peer protocol, on the TCP port clients use
	// (docs/peers.md): one address a node, and a connection's first four
	// bytes tell a peer from a client.
	Peers       []string
	Node        int
	PeerBytes   int64
	PeerTimeout time.Duration
	// Outputs is the catalogue of persisted transform outputs (riffle pack
	// --transform) a job asking for a transform reads instead of
	// transforming; default catalogue.Default().
	Outputs string
	// Metrics, if set, serves Prometheus metrics at http://Metrics/metrics
	// (a bare ":port" is loopback), and a live view of charts at
	// http://Metrics/view/ (view.go). Dataset paths in either are hashed
	// unless the request presents the token (metrics.go, showPaths).
	Metrics string
	// Version is reported to clients.
	Version string

	socket, tcpAddr, token, tokenFile string
	ready                             chan struct{}
	helloWait                         time.Duration // helloTimeout, shorter in tests
	peerIdle                          time.Duration // peer.IdleTimeout, shorter in tests
	heldWait                          time.Duration // heldGrace, shorter in tests
	metricsAddr                       string
	metricsKey                        []byte        // keys the hashes of paths in metrics
	viewEvery                         time.Duration // how often the live view samples; a second, shorter in tests

	gate     preAuth       // TCP connections not yet authenticated
	tcpSlots chan struct{} // TCP connections authenticated
	spare    spareFD       // for telling a client the daemon is out of descriptors (accept.go)

	store   *storage.Router
	env     *job.Env
	budget  *budget
	tier    atomic.Pointer[tier.Tier]
	cluster atomic.Pointer[peer.Cluster]
	// opener, if set, opens datasets in place of dataset.Open (a test
	// holds an open with it).
	opener   func(ctx context.Context, opts dataset.Options, paths ...string) (dataset.Dataset, error)
	statMu   sync.Mutex
	live     map[*handle]bool
	doneRead int64 // bytes read and served by jobs that ended
	doneServ int64
	fails    failures
	view     viewRing // the live view's recent samples (view.go)
	clients  atomic.Int64
	jobs     atomic.Int64
	idle     chan struct{}
	openOnce sync.Once
}

// DefaultSocket is $RIFFLE_SOCKET, $XDG_RUNTIME_DIR/riffle.sock, or
// /tmp/riffle-UID/riffle.sock.
func DefaultSocket() string {
	if d := os.Getenv("RIFFLE_SOCKET"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "riffle.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("riffle-%d", os.Getuid()), "riffle.sock")
}

// ErrRunning says another daemon already serves the socket.
var ErrRunning = errors.New("a riffle daemon already serves this socket")

// Handshake and frame deadlines: a peer that says nothing, or sends half a
// frame, does not hold its connection.
const (
	helloTimeout = 10 * time.Second
	frameTimeout = 30 * time.Second
	writeTimeout = 60 * time.Second
)

func (s *Server) init() {
	s.openOnce.Do(func() { s.ready = make(chan struct{}) })
}

// Ready is closed once Serve listens.
func (s *Server) Ready() <-chan struct{} {
	s.init()
	return s.ready
}

// Addr is the Unix socket Serve listens on, TCPAddr its TCP address and
// TokenFile where it wrote a token it made; valid once Ready is closed.
func (s *Server) Addr() string      { return s.socket }
func (s *Server) TCPAddr() string   { return s.tcpAddr }
func (s *Server) TokenFile() string { return s.tokenFile }

// MetricsAddr is where Serve serves metrics, once it does.
func (s *Server) MetricsAddr() string { return s.metricsAddr }

// Serve listens and serves until ctx is cancelled or, with IdleExit, the
// daemon has had no client for that long.
func (s *Server) Serve(ctx context.Context) error {
	s.init()
	s.socket = s.Socket
	if s.socket == "" {
		s.socket = DefaultSocket()
	}
	var err error
	local, err := storage.NewLocal(false, s.Roots)
	if err != nil {
		return err
	}
	if len(s.Peers) > 0 && s.Token == "" {
		return errors.New("--peers needs --token (or $RIFFLE_TOKEN): every node's daemon must share one")
	}
	if len(s.Peers) > 0 && (s.Node < 0 || s.Node >= len(s.Peers)) {
		return fmt.Errorf("node %d is not in a peer list of %d", s.Node, len(s.Peers))
	}
	if err := s.checkDirs(); err != nil {
		return err
	}
	// What stands in front of the object store: the nodes' memory, then
	// this node's disk. They are made with the store, at its first use;
	// with peers, below, before the daemon serves.
	var tierErr error
	wrap := func(inner storage.Store) storage.Store {
		st := inner
		if len(s.Peers) > 0 {
			c, err := peer.New(st, peer.Options{Peers: s.Peers, Self: s.Node, Token: s.Token,
				Budget: max(s.PeerBytes, 1<<26), Timeout: s.PeerTimeout})
			if err != nil {
				tierErr = fmt.Errorf("the cluster's memory tier (--peers): %w", err)
				slog.Warn("no cluster tier", "err", err)
			} else {
				s.cluster.Store(c)
				st = c
			}
		}
		if s.TierDir != "" {
			t, err := tier.New(st, tier.Options{Dir: s.TierDir, Budget: max(s.TierBytes, 1<<26)})
			if err != nil {
				tierErr = fmt.Errorf("the disk tier (--cache-dir): %w", err)
				slog.Warn("no disk tier", "dir", s.TierDir, "err", err)
			} else {
				s.tier.Store(t)
				st = t
			}
		}
		return st
	}
	s.store = storage.NewRouter(local, s.S3, wrap)
	if len(s.Peers) > 0 {
		// Peers ask for blocks before this node reads any: the cluster
		// tier must be there from the start.
		if _, err := s.store.Remote(); err != nil {
			return fmt.Errorf("--peers: the object store: %w", err)
		}
		if tierErr != nil {
			return tierErr
		}
	}
	defer func() {
		if c := s.cluster.Load(); c != nil {
			c.Close()
		}
	}()
	defer s.store.Close()
	total := s.MemoryBytes
	if total <= 0 {
		total = job.AvailableMemory()
	}
	sp := splitMemory(total, s.CacheBytes)
	wait := s.MemoryWait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	s.budget = &budget{sp: sp, wait: wait}
	if s.HeapLimit {
		s.budget.changed = func(held int64) { debug.SetMemoryLimit(sp.heapLimit(held)) }
		s.budget.changed(0)
	}
	// The catalogue is the daemon's own directory, outside any root.
	cat := catalogue.Default()
	if s.Outputs != "" {
		cat = catalogue.Catalogue{Dir: s.Outputs}
	}
	own, err := storage.NewLocal(false, nil)
	if err != nil {
		return err
	}
	defer own.Close()
	// A default job's memory is at most a 32nd of the jobs' budget (its
	// arena twice that): sixteen default jobs fit at once.
	env, err := job.NewEnv(job.EnvOptions{Store: s.store, CacheBytes: sp.cache, JobMemory: sp.jobs / 32, DecodeBytes: sp.decode, IndexDir: s.IndexDir,
		PageCacheBytes: s.PageCacheBytes, IndexInDirOnly: len(s.Roots) == 0, Catalogue: cat, Outputs: own, Tier: s.futures, Open: s.opener})
	if err != nil {
		return err
	}
	s.env = env
	defer env.Close()
	s.live = map[*handle]bool{}
	s.idle = make(chan struct{}, 1)
	if err := privateDir(filepath.Dir(s.socket)); err != nil {
		return err
	}
	// One daemon per socket: the lock decides, so that clients racing to
	// start a daemon end up sharing one.
	lock, err := os.OpenFile(s.socket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("%s: %w", s.socket, ErrRunning)
	}
	os.Remove(s.socket) // a dead daemon's socket
	old := unix.Umask(0o177)
	ul, err := net.Listen("unix", s.socket)
	unix.Umask(old)
	if err != nil {
		return err
	}
	os.Chmod(s.socket, 0o600)
	defer os.Remove(s.socket)
	listeners := []net.Listener{ul}
	s.token = s.Token
	if s.TCP != "" {
		tl, err := s.listenTCP()
		if err != nil {
			ul.Close()
			return err
		}
		listeners = append(listeners, tl)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var ml net.Listener
	if s.Metrics != "" {
		if ml, err = s.listenMetrics(); err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return err
		}
	}
	s.spare.keep()
	defer s.spare.give()
	g, gctx := errgroup.WithContext(ctx)
	var conns sync.WaitGroup
	maxConns := s.MaxConns
	if maxConns <= 0 {
		maxConns = 256
	}
	// The Unix socket and TCP have separate rooms: no TCP connection,
	// authenticated or not, takes the owner's place on the socket.
	unixSlots := make(chan struct{}, maxConns)
	s.tcpSlots = make(chan struct{}, maxConns)
	s.gate = preAuth{max: maxPreAuth, perAddr: maxPreAuthAddr}
	for _, l := range listeners {
		_, isUnix := l.(*net.UnixListener)
		g.Go(func() error {
			<-gctx.Done()
			return l.Close()
		})
		g.Go(func() error {
			for {
				c, err := s.accept(gctx, l, isUnix)
				if err != nil {
					if gctx.Err() != nil {
						return nil
					}
					return err
				}
				if isUnix {
					select {
					case unixSlots <- struct{}{}:
					default:
						slog.Warn("too many connections on the socket; refusing one", "max", cap(unixSlots))
						c.Close()
						continue
					}
				} else if !s.gate.take(sourceOf(c)) {
					// Debug, not Warn: a flood would fill the log.
					slog.Debug("too many unauthenticated TCP connections; refusing one", "from", sourceOf(c))
					c.Close()
					continue
				}
				conns.Add(1)
				go func() {
					defer conns.Done()
					if isUnix {
						defer func() { <-unixSlots }()
					}
					s.serveConn(gctx, c)
				}()
			}
		})
	}
	if s.IdleExit > 0 {
		g.Go(func() error { return s.watchIdle(gctx, cancel) })
	}
	if ml != nil {
		g.Go(func() error { return s.serveMetrics(gctx, ml) })
		g.Go(func() error { return s.sampleView(gctx) })
	}
	slog.Info("riffle daemon serving", "socket", s.socket, "tcp", s.tcpAddr, "memory", sp.total, "cache", sp.cache, "jobs", sp.jobs,
		"descriptors", fdLimit())
	close(s.ready)
	err = g.Wait()
	cancel()
	conns.Wait()
	return err
}

// futures is the disk tier jobs tell their next reads, nil while there
// is none (never a nil *tier.Tier in a non-nil job.Futures).
func (s *Server) futures() job.Futures {
	if t := s.tier.Load(); t != nil {
		return t
	}
	return nil
}

// checkDirs checks, before the daemon serves, the directories it was told
// to keep its own data in (the disk tier's blocks, indexes, persisted
// outputs): each is made if missing and must be private to the daemon's
// user (internal/privdir). One another user owns, or anyone may write,
// stops the daemon at start with the fix, rather than a job at its first
// read, or a warning nobody reads and a tier that is quietly not there.
func (s *Server) checkDirs() error {
	for _, d := range []struct{ what, dir string }{
		{"the disk tier's directory (--cache-dir)", s.TierDir},
		{"the index directory (--index-dir)", s.IndexDir},
		{"the catalogue of outputs (--outputs)", s.Outputs},
	} {
		if d.dir == "" {
			continue
		}
		pd, err := privdir.Open(d.dir)
		if err != nil {
			return fmt.Errorf("%s: %w", d.what, err)
		}
		pd.Close()
	}
	return nil
}

// listenTCP listens on the TCP address (loopback for a bare port) and
// makes a token if none was given.
func (s *Server) listenTCP() (net.Listener, error) {
	host, port, err := net.SplitHostPort(s.TCP)
	if err != nil {
		return nil, fmt.Errorf("tcp address %q: %w", s.TCP, err)
	}
	if host == "" {
		host = "127.0.0.1" // loopback unless an address is named
	}
	s.token = s.Token
	if s.token == "" {
		if s.token, err = newToken(); err != nil {
			return nil, err
		}
		s.tokenFile = tokenPath(s.socket)
		if err := writeToken(s.tokenFile, s.token); err != nil {
			return nil, fmt.Errorf("writing the TCP token: %w", err)
		}
		slog.Info("TCP clients need the token in", "file", s.tokenFile)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, err
	}
	s.tcpAddr = l.Addr().String()
	return l, nil
}

func (s *Server) watchIdle(ctx context.Context, stop context.CancelFunc) error {
	t := time.NewTimer(s.IdleExit)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.idle:
			t.Reset(s.IdleExit)
		case <-t.C:
			if s.clients.Load() == 0 {
				slog.Info("no clients, exiting", "idle", s.IdleExit)
				stop()
				return nil
			}
			t.Reset(s.IdleExit)
		}
	}
}

func (s *Server) poke() {
	select {
	case s.idle <- struct{}{}:
	default:
	}
}
