package server

import (
	"cmp"
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
	"github.com/riffle-ml/riffle/storage/stack"
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

	stack  *stack.Stack
	env    *job.Env
	budget *budget
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
// daemon has had no client for that long. It builds what the daemon
// carries batches from (the store stack, the memory budget, the jobs'
// environment), each from its fields and each checked before the daemon
// listens, then listens and serves.
func (s *Server) Serve(ctx context.Context) error {
	s.init()
	s.socket = cmp.Or(s.Socket, DefaultSocket())
	stk, err := stack.Open(s.stackSettings())
	if err != nil {
		return err
	}
	defer stk.Close()
	s.stack = stk
	if err := s.checkDirs(); err != nil {
		return err
	}
	s.budget = s.newBudget()
	env, err := job.NewEnv(s.envOptions())
	if err != nil {
		return err
	}
	defer env.Close()
	s.env = env
	s.live = map[*handle]bool{}
	s.idle = make(chan struct{}, 1)
	ls, err := s.listen()
	if err != nil {
		return err
	}
	defer ls.close()
	return s.serve(ctx, ls)
}

// stackSettings are the store stack's: where files may be read from,
// the object store and the tiers in front of it.
func (s *Server) stackSettings() stack.Settings {
	return stack.Settings{Roots: s.Roots, S3: s.S3, TierDir: s.TierDir, TierBytes: s.TierBytes,
		Peers: s.Peers, Node: s.Node, Token: s.Token, PeerBytes: s.PeerBytes, PeerTimeout: s.PeerTimeout}
}

// newBudget splits the daemon's memory (budget.go) and, with HeapLimit,
// keeps the Go heap's limit at what the jobs' reservations leave.
func (s *Server) newBudget() *budget {
	total := s.MemoryBytes
	if total <= 0 {
		total = job.AvailableMemory()
	}
	wait := s.MemoryWait
	if wait <= 0 {
		wait = 2 * time.Minute
	}
	b := &budget{sp: splitMemory(total, s.CacheBytes), wait: wait}
	if s.HeapLimit {
		b.changed = func(held int64) { debug.SetMemoryLimit(b.sp.heapLimit(held)) }
		b.changed(0)
	}
	return b
}

// envOptions are the jobs' environment's: the stack's store and disk
// tier, the budget's parts for the record cache, jobs and decodes, and
// the daemon's directories.
func (s *Server) envOptions() job.EnvOptions {
	sp := s.budget.sp
	// The catalogue is the daemon's own directory, outside any root: the
	// environment reads it through a store of its own.
	cat := catalogue.Default()
	if s.Outputs != "" {
		cat = catalogue.Catalogue{Dir: s.Outputs}
	}
	// A default job's memory is at most a 32nd of the jobs' budget (its
	// arena twice that): sixteen default jobs fit at once.
	return job.EnvOptions{Store: s.stack.Store(), CacheBytes: sp.cache, JobMemory: sp.jobs / 32, DecodeBytes: sp.decode,
		IndexDir: s.IndexDir, IndexInDirOnly: len(s.Roots) == 0, PageCacheBytes: s.PageCacheBytes, Catalogue: cat,
		Tier: s.futures, Open: s.opener}
}

// listeners are what the daemon serves: its Unix socket, held by the
// lock that makes it the socket's one daemon, TCP if asked, and metrics.
type listeners struct {
	lock    *os.File
	socket  string         // removed at close, once listened on
	conns   []net.Listener // the socket's, then TCP's
	metrics net.Listener   // nil without Metrics
}

// listen takes the socket (one daemon per socket: the lock decides, so
// that clients racing to start a daemon end up sharing one) and listens.
func (s *Server) listen() (*listeners, error) {
	if err := privateDir(filepath.Dir(s.socket)); err != nil {
		return nil, err
	}
	lock, err := os.OpenFile(s.socket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	ls := &listeners{lock: lock}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("%s: %w", s.socket, ErrRunning)
	}
	os.Remove(s.socket) // a dead daemon's socket
	old := unix.Umask(0o177)
	ul, err := net.Listen("unix", s.socket)
	unix.Umask(old)
	if err != nil {
		lock.Close()
		return nil, err
	}
	os.Chmod(s.socket, 0o600)
	ls.socket, ls.conns = s.socket, append(ls.conns, ul)
	s.token = s.Token
	if s.TCP != "" {
		tl, err := s.listenTCP()
		if err != nil {
			ls.close()
			return nil, err
		}
		ls.conns = append(ls.conns, tl)
	}
	if s.Metrics != "" {
		if ls.metrics, err = s.listenMetrics(); err != nil {
			ls.close()
			return nil, err
		}
	}
	return ls, nil
}

// close closes the listeners, removes the socket and lets the lock go.
func (ls *listeners) close() {
	for _, l := range ls.conns {
		l.Close()
	}
	if ls.metrics != nil {
		ls.metrics.Close()
	}
	if ls.socket != "" {
		os.Remove(ls.socket)
	}
	ls.lock.Close()
}

// serve accepts and serves connections until ctx is cancelled, a
// listener fails or the daemon has been idle for IdleExit, then waits
// for every connection's goroutine.
func (s *Server) serve(ctx context.Context, ls *listeners) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
	for _, l := range ls.conns {
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
	if ls.metrics != nil {
		g.Go(func() error { return s.serveMetrics(gctx, ls.metrics) })
		g.Go(func() error { return s.sampleView(gctx) })
	}
	sp := s.budget.sp
	slog.Info("riffle daemon serving", "socket", s.socket, "tcp", s.tcpAddr, "memory", sp.total, "cache", sp.cache, "jobs", sp.jobs,
		"descriptors", fdLimit())
	close(s.ready)
	err := g.Wait()
	cancel()
	conns.Wait()
	return err
}

// futures is the disk tier jobs tell their next reads, nil while there
// is none (never a nil *tier.Tier in a non-nil job.Futures).
func (s *Server) futures() job.Futures {
	if t := s.stack.Tier(); t != nil {
		return t
	}
	return nil
}

// checkDirs checks, before the daemon serves, the directories it was told
// to keep its own data in (indexes, persisted outputs; the disk tier's
// blocks are the store stack's to check): each is made if missing and
// must be private to the daemon's user (internal/privdir). One another
// user owns, or anyone may write, stops the daemon at start with the fix,
// rather than a job at its first read, or a warning nobody reads.
func (s *Server) checkDirs() error {
	for _, d := range []struct{ what, dir string }{
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
