package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/storage/peer"
	"github.com/riffle-ml/riffle/wire"
)

// conn is one client connection. Its reader reads frames for as long as
// the connection lives and never waits on a job: releases take effect at
// once, opens and closes run in goroutines of their own, and each job's
// next requests queue for its own worker. Replies carry their request's
// tag; a writer lock keeps frames whole.
type conn struct {
	s      *Server
	c      net.Conn
	unix   *net.UnixConn // nil over TCP: batches travel inline
	authed bool
	// from is the source address whose unauthenticated place a TCP
	// connection holds until it authenticates ("" once it gives it back);
	// slot says it holds an authenticated TCP place instead.
	from string
	slot bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // opens, closes and job workers

	wmu sync.Mutex
	w   *bufio.Writer

	mu     sync.Mutex
	jobs   map[int]*handle
	nextID int
	opens  chan struct{} // opens in flight
}

// maxOpens bounds the opens in flight on one connection, loaderMaxLocate
// the records one locate asks about.
const (
	maxOpens        = 8
	loaderMaxLocate = 1 << 16
)

func (s *Server) serveConn(parent context.Context, c net.Conn) {
	s.clients.Add(1)
	s.poke()
	defer func() {
		s.clients.Add(-1)
		s.poke()
	}()
	cn := &conn{s: s, c: c, w: bufio.NewWriter(c), jobs: map[int]*handle{}, opens: make(chan struct{}, maxOpens)}
	cn.ctx, cn.cancel = context.WithCancel(parent)
	var helloBy time.Time
	if uc, ok := c.(*net.UnixConn); ok {
		cn.unix = uc
		cn.authed = true // the socket's mode (0600, in a private directory) admits only its owner
	} else {
		cn.from = sourceOf(c) // the place Serve took for it
		wait := s.helloWait
		if wait == 0 {
			wait = helloTimeout
		}
		helloBy = time.Now().Add(wait)
		c.SetReadDeadline(helloBy)
	}
	defer func() {
		if cn.from != "" {
			s.gate.give(cn.from)
		}
		if cn.slot {
			<-s.tcpSlots
		}
	}()
	stop := context.AfterFunc(cn.ctx, func() { c.Close() })
	defer stop()
	defer cn.closeAll()
	defer cn.cancel()
	r := bufio.NewReader(c)
	if cn.unix == nil {
		// Another node's daemon opens with the peer protocol's magic,
		// which no client frame can start with (storage/peer/frame.go).
		if b, err := r.Peek(len(peer.Magic)); err == nil && string(b) == peer.Magic {
			cn.servePeer(r, helloBy)
			return
		}
	}
	for {
		limit := wire.MaxHeader
		if !cn.authed {
			limit = wire.MaxHelloHeader
		}
		n, err := wire.ReadLength(r, limit)
		if err != nil {
			cn.logEnd(err)
			return
		}
		// The rest of a frame must follow promptly; before the hello,
		// within the hello's deadline.
		if cn.authed {
			c.SetReadDeadline(time.Now().Add(frameTimeout))
		}
		m, err := wire.ReadBody(r, n)
		var fe *wire.FieldError
		if errors.As(err, &fe) && cn.authed && m.Tag != 0 {
			// A whole frame, one of whose fields is of the wrong type:
			// the request is refused, naming it, and the connection goes on.
			if cn.refuse(m.Tag, fe) != nil {
				return
			}
		} else if err != nil {
			cn.logEnd(err)
			return
		} else if !cn.dispatch(m) {
			return
		}
		if cn.authed {
			// No idle deadline for a client: its jobs may rightly wait
			// between batches for as long as a training step or an
			// evaluation takes, it holds the token, and its place is
			// bounded by MaxConns; a client whose machine vanished is
			// found by TCP keep-alive (on for accepted connections, Go's
			// default), which closes the connection under the reader.
			c.SetReadDeadline(time.Time{})
		}
	}
}

// servePeer hands a connection that opened with the peer protocol to
// package peer, under the same admission as a client's: it holds its
// unauthenticated place until its hello, which must come by helloBy,
// a wrong token is slowed with every other failed handshake, and a right
// one moves it to the authenticated room. Once in, it is closed after
// peer.IdleTimeout without a request: the asking node's pool closes
// connections idle for half of that, so one idle longer was left behind
// by a node that went away.
func (cn *conn) servePeer(r *bufio.Reader, helloBy time.Time) {
	pc := &peekedConn{Conn: cn.c, r: r}
	cl := cn.s.stack.Cluster()
	if cl == nil {
		peer.Refuse(pc, "this daemon has no peers (serve --peers)")
		return
	}
	// What is left of the hello's time, not a new one.
	hello := max(time.Until(helloBy), time.Millisecond)
	err := cl.ServeConn(cn.ctx, pc, peer.ServeOptions{HelloTimeout: hello, IdleTimeout: cn.s.peerIdle,
		WriteTimeout: writeTimeout, Refused: cn.s.fails.wait, Admit: cn.admit})
	cn.logEnd(err)
}

// peekedConn is a connection whose first bytes were peeked into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (p *peekedConn) Read(b []byte) (int, error) { return p.r.Read(b) }

// admit moves a TCP connection whose hello carried the token from the
// unauthenticated room to the authenticated one, or says why not.
func (cn *conn) admit() error {
	select {
	case cn.s.tcpSlots <- struct{}{}:
		cn.slot = true
	default:
		return fmt.Errorf("the daemon serves %d authenticated TCP connections already", cap(cn.s.tcpSlots))
	}
	cn.s.gate.give(cn.from)
	cn.from = ""
	return nil
}

func (cn *conn) logEnd(err error) {
	if !errors.Is(err, io.EOF) && cn.ctx.Err() == nil {
		slog.Debug("client read", "err", err)
	}
}

// closeAll closes the connection's jobs and waits for every goroutine.
func (cn *conn) closeAll() {
	cn.cancel()
	cn.mu.Lock()
	jobs := cn.jobs
	cn.jobs = map[int]*handle{}
	cn.mu.Unlock()
	for _, j := range jobs {
		j.close()
		cn.s.jobs.Add(-1)
	}
	cn.wg.Wait()
}

// reply writes one frame and flushes it.
func (cn *conn) reply(m *wire.Msg, payload ...[]byte) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	// A client that stops reading loses its connection instead of
	// holding a job's worker in a write for ever.
	cn.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	err := wire.Write(cn.w, m, payload...)
	if err == nil {
		err = cn.w.Flush()
	}
	if err != nil {
		// Part of a frame may have gone: nothing after it would parse.
		cn.cancel()
	}
	return err
}

func (cn *conn) fail(tag uint64, err error) error {
	m := &wire.Msg{Op: wire.OpError, Tag: tag, Message: err.Error(), Kind: job.Kind(err)}
	if outOfFDs(err) {
		m.Message += ": " + fdAdvice()
	}
	m.Path, m.Offset = job.Where(err)
	return cn.reply(m)
}

// refuse answers a request one of whose fields did not decode: a spec's
// as an invalid spec (a user's option, a Python ValueError), any other's
// as a request a client should not have sent.
func (cn *conn) refuse(tag uint64, fe *wire.FieldError) error {
	if field, ok := strings.CutPrefix(fe.Field, "spec."); ok {
		return cn.fail(tag, fmt.Errorf("%w: %s", job.ErrSpec, strings.Replace(fe.Error(), fe.Field, field, 1)))
	}
	return cn.reply(&wire.Msg{Op: wire.OpError, Tag: tag, Kind: wire.KindSpec, Message: "malformed request: " + fe.Error()})
}

// dispatch handles one request; false ends the connection.
func (cn *conn) dispatch(m *wire.Msg) bool {
	if !cn.authed && m.Op != wire.OpHello {
		cn.fail(m.Tag, errors.New("say hello with the daemon's token first"))
		return false
	}
	switch m.Op {
	case wire.OpHello:
		if m.Version != wire.Version {
			cn.fail(m.Tag, fmt.Errorf("protocol version %d, the daemon speaks %d", m.Version, wire.Version))
			return cn.authed
		}
		if !cn.authed && !tokenOK(m.Token, cn.s.token) {
			cn.s.fails.wait()
			cn.fail(m.Tag, errors.New("wrong token"))
			return false
		}
		if !cn.authed {
			if err := cn.admit(); err != nil {
				cn.fail(m.Tag, err)
				return false
			}
		}
		cn.authed = true
		cn.c.SetReadDeadline(time.Time{})
		return cn.reply(&wire.Msg{Op: wire.OpHello, Tag: m.Tag, Version: wire.Version, Server: cn.s.Version}) == nil
	case wire.OpCheck, wire.OpOpen:
		// A check is an open that reads nothing and keeps no job: both
		// may build an index, so both run beside the reader, a few at once.
		select {
		case cn.opens <- struct{}{}:
		default:
			return cn.fail(m.Tag, fmt.Errorf("%d opens already in flight on this connection", maxOpens)) == nil
		}
		cn.wg.Add(1)
		go func() {
			defer cn.wg.Done()
			defer func() { <-cn.opens }()
			if m.Op == wire.OpCheck {
				cn.check(m)
			} else {
				cn.open(m)
			}
		}()
	case wire.OpNext:
		cn.mu.Lock()
		j, ok := cn.jobs[m.Job]
		cn.mu.Unlock()
		if !ok {
			return cn.fail(m.Tag, fmt.Errorf("no job %d", m.Job)) == nil
		}
		select {
		case j.reqs <- m.Tag:
		default:
			return cn.fail(m.Tag, fmt.Errorf("job %d has %d requests waiting already", m.Job, maxQueued)) == nil
		}
	case wire.OpRelease:
		cn.mu.Lock()
		j, ok := cn.jobs[m.Job]
		cn.mu.Unlock()
		if ok {
			j.release(m.Seqs)
		}
		// No reply: releases ride ahead of the next request.
	case wire.OpClose:
		cn.mu.Lock()
		j, ok := cn.jobs[m.Job]
		delete(cn.jobs, m.Job)
		cn.mu.Unlock()
		cn.wg.Add(1)
		go func() {
			defer cn.wg.Done()
			if ok {
				j.close()
				cn.s.jobs.Add(-1)
			}
			cn.reply(&wire.Msg{Op: wire.OpClosed, Tag: m.Tag, Job: m.Job})
		}()
	case wire.OpLocate:
		cn.mu.Lock()
		j, ok := cn.jobs[m.Job]
		cn.mu.Unlock()
		if !ok {
			return cn.fail(m.Tag, fmt.Errorf("no job %d", m.Job)) == nil
		}
		if len(m.IDs) > loaderMaxLocate {
			return cn.fail(m.Tag, fmt.Errorf("locate: %d records, at most %d", len(m.IDs), loaderMaxLocate)) == nil
		}
		r, err := j.locate(m.IDs)
		if err != nil {
			return cn.fail(m.Tag, err) == nil
		}
		r.Tag = m.Tag
		return cn.reply(r) == nil
	case wire.OpState:
		cn.mu.Lock()
		j, ok := cn.jobs[m.Job]
		cn.mu.Unlock()
		if !ok {
			return cn.fail(m.Tag, fmt.Errorf("no job %d", m.Job)) == nil
		}
		st, err := j.j.StateAt(m.Epoch, m.Index)
		if err != nil {
			return cn.fail(m.Tag, err) == nil
		}
		return cn.reply(&wire.Msg{Op: wire.OpState, Tag: m.Tag, Job: m.Job,
			State: &wire.State{Epoch: st.Epoch, Batch: st.Batch, Sampler: st.Sampler, Skip: st.Skip}}) == nil
	case wire.OpStats:
		return cn.reply(&wire.Msg{Op: wire.OpStats, Tag: m.Tag, Jobs: int(cn.s.jobs.Load()), Clients: int(cn.s.clients.Load())}) == nil
	case wire.OpStatus:
		return cn.reply(&wire.Msg{Op: wire.OpStatus, Tag: m.Tag, Status: cn.s.status()}) == nil
	default:
		return cn.fail(m.Tag, fmt.Errorf("unknown op %q", m.Op)) == nil
	}
	return true
}

// check answers what an open of m's spec would: the job is made, lazy so
// that it reads and allocates nothing (no arena), described and closed.
func (cn *conn) check(m *wire.Msg) {
	d, err := cn.s.env.Check(cn.ctx, m.Spec)
	if err != nil {
		if cn.ctx.Err() == nil {
			cn.fail(m.Tag, err)
		}
		return
	}
	r := openedMsg(d)
	r.Tag = m.Tag
	cn.reply(r)
}

// open opens a job, starts its worker and replies.
func (cn *conn) open(m *wire.Msg) {
	j, err := cn.s.openHandle(cn.ctx, m.Spec, cn.unix != nil)
	if err != nil {
		if cn.ctx.Err() == nil {
			cn.fail(m.Tag, err)
		}
		return
	}
	// The worker starts first: a handle's close waits for it, and the
	// connection may have ended while the job was made (its client gone
	// mid-open), in which case the job closes here and now.
	cn.mu.Lock()
	cn.nextID++
	j.id = cn.nextID
	cn.wg.Add(1)
	go func() {
		defer cn.wg.Done()
		cn.work(j)
	}()
	if cn.ctx.Err() != nil {
		cn.mu.Unlock()
		j.close()
		return
	}
	cn.jobs[j.id] = j
	cn.s.jobs.Add(1)
	cn.s.track(j)
	cn.mu.Unlock()
	r := j.opened()
	r.Tag = m.Tag
	if cn.unix == nil {
		cn.reply(r)
		return
	}
	cn.replyRights(r, j.arena.Fd())
}

// replyRights writes one frame with descriptors passed along its first
// byte. A sendmsg on a stream socket takes what the socket's buffer has
// room for (about 200 KiB), not the whole frame: the rest follows in
// plain writes, as many as it takes, so a frame of any size arrives whole
// (an "opened" listing 8,000 paths is half a MiB).
func (cn *conn) replyRights(m *wire.Msg, fds ...int) error {
	b, err := wire.Encode(m)
	if err != nil {
		return err
	}
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	cn.c.SetWriteDeadline(time.Now().Add(writeTimeout))
	if err := cn.w.Flush(); err != nil {
		return err
	}
	n, _, err := cn.unix.WriteMsgUnix(b, unix.UnixRights(fds...), nil)
	if err == nil && n < len(b) {
		_, err = cn.c.Write(b[n:])
	}
	if err != nil {
		cn.cancel()
	}
	return err
}

// work serves a job's next requests in order until the job closes; the
// requests still queued then are answered with an error.
func (cn *conn) work(j *handle) {
	defer close(j.done)
	for {
		select {
		case tag := <-j.reqs:
			r, payload, err := j.next(j.ctx)
			if err != nil {
				if j.ctx.Err() != nil {
					cn.fail(tag, fmt.Errorf("job %d: %w", j.id, job.ErrClosed))
					continue
				}
				cn.fail(tag, err)
				continue
			}
			r.Tag = tag
			err = cn.reply(r, payload...)
			if j.inline && r.Op == wire.OpBatch {
				j.release([]uint64{r.Seq})
			}
			if err != nil {
				cn.cancel()
			}
		case <-j.ctx.Done():
			for {
				select {
				case tag := <-j.reqs:
					cn.fail(tag, fmt.Errorf("job %d: %w", j.id, job.ErrClosed))
				default:
					return
				}
			}
		}
	}
}
