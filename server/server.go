package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/wire"
)

// Server is the daemon. The zero value serves a Unix socket at
// DefaultSocket() with no path restriction.
type Server struct {
	// Socket is the Unix socket path; default DefaultSocket().
	Socket string
	// TCP, if set, also listens on this address for remote clients; a bare
	// ":port" is loopback. Any address but loopback requires Token.
	TCP string
	// Token, if set, must be presented by every TCP client.
	Token string
	// Roots, if set, are the only directories whose files jobs may read;
	// paths are resolved (symlinks too) before the check.
	Roots []string
	// IdleExit stops the daemon after this long without clients; 0 never.
	IdleExit time.Duration
	// Version is reported to clients.
	Version string

	sets    *datasets
	clients atomic.Int64
	jobs    atomic.Int64
	idle    chan struct{}
}

// DefaultSocket is $XDG_RUNTIME_DIR/riffle.sock, or /tmp/riffle-UID/riffle.sock.
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

// Serve listens and serves until ctx is cancelled or, with IdleExit, the
// daemon has had no client for that long.
func (s *Server) Serve(ctx context.Context) error {
	if s.Socket == "" {
		s.Socket = DefaultSocket()
	}
	if s.TCP != "" {
		host, port, err := net.SplitHostPort(s.TCP)
		if err != nil {
			return fmt.Errorf("tcp address %q: %w", s.TCP, err)
		}
		if host == "" {
			host = "127.0.0.1" // loopback unless an address is named
			s.TCP = net.JoinHostPort(host, port)
		}
		if ip := net.ParseIP(host); s.Token == "" && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("listening on %s beyond loopback needs a token", s.TCP)
		}
	}
	for i, r := range s.Roots {
		abs, err := filepath.Abs(r)
		if err == nil {
			abs, err = filepath.EvalSymlinks(abs)
		}
		if err != nil {
			return fmt.Errorf("root %s: %w", r, err)
		}
		s.Roots[i] = abs
	}
	s.sets = newDatasets()
	defer s.sets.closeAll()
	s.idle = make(chan struct{}, 1)

	if err := os.MkdirAll(filepath.Dir(s.Socket), 0o700); err != nil {
		return err
	}
	// One daemon per socket: the lock decides, so that clients racing to
	// start a daemon end up sharing one.
	lock, err := os.OpenFile(s.Socket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("%s: %w", s.Socket, ErrRunning)
	}
	os.Remove(s.Socket) // a dead daemon's socket
	old := unix.Umask(0o177)
	ul, err := net.Listen("unix", s.Socket)
	unix.Umask(old)
	if err != nil {
		return err
	}
	os.Chmod(s.Socket, 0o600)
	defer os.Remove(s.Socket)
	listeners := []net.Listener{ul}
	if s.TCP != "" {
		tl, err := net.Listen("tcp", s.TCP)
		if err != nil {
			ul.Close()
			return err
		}
		listeners = append(listeners, tl)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(ctx)
	var conns sync.WaitGroup
	for _, l := range listeners {
		g.Go(func() error {
			<-gctx.Done()
			return l.Close()
		})
		g.Go(func() error {
			for {
				c, err := l.Accept()
				if err != nil {
					if gctx.Err() != nil {
						return nil
					}
					return err
				}
				conns.Add(1)
				go func() {
					defer conns.Done()
					s.serveConn(gctx, c)
				}()
			}
		})
	}
	if s.IdleExit > 0 {
		g.Go(func() error { return s.watchIdle(gctx, cancel) })
	}
	slog.Info("riffle daemon serving", "socket", s.Socket, "tcp", s.TCP)
	err = g.Wait()
	cancel()
	conns.Wait()
	return err
}

// Addr returns where the daemon listens once Serve has started.
func (s *Server) Addr() string { return s.Socket }

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

// conn is one client connection.
type conn struct {
	s      *Server
	c      net.Conn
	unix   *net.UnixConn // nil over TCP: batches travel inline
	w      *bufio.Writer
	jobs   map[int]*job
	nextID int
	authed bool
}

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	s.clients.Add(1)
	s.poke()
	defer func() {
		s.clients.Add(-1)
		s.poke()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cn := &conn{s: s, c: c, w: bufio.NewWriter(c), jobs: map[int]*job{}}
	if uc, ok := c.(*net.UnixConn); ok {
		cn.unix = uc
		cn.authed = true // the socket's mode already admits only its owner
	}
	defer cn.closeAll()
	// The reader goroutine notices a vanished client at once, even while
	// the handler is blocked loading a batch, and cancels everything; the
	// connection is closed when the context ends, which ends the reader.
	reqs := make(chan *wire.Msg)
	var g errgroup.Group
	defer g.Wait()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer cancel()
	g.Go(func() error {
		defer cancel()
		defer close(reqs)
		r := bufio.NewReader(c)
		for {
			m, err := wire.Read(r)
			if err != nil {
				if !errors.Is(err, io.EOF) && ctx.Err() == nil {
					slog.Debug("client read", "err", err)
				}
				return nil
			}
			select {
			case reqs <- m:
			case <-ctx.Done():
				return nil
			}
		}
	})
	for m := range reqs {
		if err := cn.handle(ctx, m); err != nil {
			if ctx.Err() == nil {
				slog.Debug("client write", "err", err)
			}
			return
		}
	}
}

func (cn *conn) closeAll() {
	for id, j := range cn.jobs {
		j.close()
		delete(cn.jobs, id)
		cn.s.jobs.Add(-1)
	}
}

// reply writes one frame and flushes it.
func (cn *conn) reply(m *wire.Msg, payload ...[]byte) error {
	if err := wire.Write(cn.w, m, payload...); err != nil {
		return err
	}
	return cn.w.Flush()
}

func (cn *conn) fail(err error) error {
	m := &wire.Msg{Op: wire.OpError, Message: err.Error()}
	where(err, m)
	return cn.reply(m)
}

func (cn *conn) handle(ctx context.Context, m *wire.Msg) error {
	if !cn.authed && m.Op != wire.OpHello {
		return cn.fail(errors.New("say hello with the daemon's token first"))
	}
	switch m.Op {
	case wire.OpHello:
		if m.Version != wire.Version {
			return cn.fail(fmt.Errorf("protocol version %d, the daemon speaks %d", m.Version, wire.Version))
		}
		if cn.s.Token != "" && m.Token != cn.s.Token {
			return cn.fail(errors.New("wrong token"))
		}
		cn.authed = true
		return cn.reply(&wire.Msg{Op: wire.OpHello, Version: wire.Version, Server: cn.s.Version})
	case wire.OpOpen:
		if m.Spec == nil {
			return cn.fail(errors.New("open without a spec"))
		}
		j, err := cn.s.openJob(ctx, m.Spec, cn.unix != nil)
		if err != nil {
			return cn.fail(err)
		}
		cn.nextID++
		cn.jobs[cn.nextID] = j
		cn.s.jobs.Add(1)
		r := j.opened()
		r.Job = cn.nextID
		if cn.unix == nil {
			return cn.reply(r)
		}
		b, err := wire.Encode(r)
		if err != nil {
			return err
		}
		if err := cn.w.Flush(); err != nil {
			return err
		}
		_, _, err = cn.unix.WriteMsgUnix(b, unix.UnixRights(j.arena.Fd()), nil)
		return err
	case wire.OpNext:
		j, ok := cn.jobs[m.Job]
		if !ok {
			return cn.fail(fmt.Errorf("no job %d", m.Job))
		}
		r, payload, err := j.next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return cn.fail(err)
		}
		err = cn.reply(r, payload...)
		if j.inline && r.Op == wire.OpBatch {
			j.release([]uint64{r.Seq})
		}
		return err
	case wire.OpRelease:
		if j, ok := cn.jobs[m.Job]; ok {
			j.release(m.Seqs)
		}
		return nil // no reply: releases ride ahead of the next request
	case wire.OpClose:
		if j, ok := cn.jobs[m.Job]; ok {
			j.close()
			delete(cn.jobs, m.Job)
			cn.s.jobs.Add(-1)
		}
		return cn.reply(&wire.Msg{Op: wire.OpClosed, Job: m.Job})
	case wire.OpStats:
		return cn.reply(&wire.Msg{Op: wire.OpStats, Jobs: int(cn.s.jobs.Load()), Clients: int(cn.s.clients.Load())})
	}
	return cn.fail(fmt.Errorf("unknown op %q", m.Op))
}

// checkPath refuses paths outside the configured roots.
func (s *Server) checkPath(p string) error {
	if len(s.Roots) == 0 {
		return nil
	}
	abs, err := filepath.Abs(p)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return err
	}
	for _, r := range s.Roots {
		if abs == r || strings.HasPrefix(abs, r+string(filepath.Separator)) {
			return nil
		}
	}
	return fmt.Errorf("%s is outside the daemon's roots (%s): %w", p, strings.Join(s.Roots, ", "), os.ErrPermission)
}
