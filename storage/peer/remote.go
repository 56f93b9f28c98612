package peer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is one authenticated connection to another node's daemon, in the
// peer protocol (frame.go). It asks one request at a time: Get is not
// safe for concurrent use.
type Conn struct {
	addr string
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	buf  []byte // the frame being written, reused
	tag  uint64
	idle time.Time // when it went back to its pool
}

// Dial connects to the daemon at addr and says hello with token; ctx's
// deadline bounds both. A refused hello (a wrong token, a daemon with no
// peers, a full room) is an error carrying the daemon's message.
func Dial(ctx context.Context, addr, token string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	pc := &Conn{addr: addr, c: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	pc.buf = AppendHello(pc.buf[:0], token)
	_, err = pc.w.Write(pc.buf)
	if err == nil {
		err = pc.w.Flush()
	}
	var a Answer
	if err == nil {
		a, err = ReadAnswer(pc.r, 0)
	}
	if err == nil && a.Status != StatusOK {
		err = fmt.Errorf("peer %s refused the hello: %s", addr, a.Message)
	}
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return pc, nil
}

// Close closes the connection.
func (pc *Conn) Close() error { return pc.c.Close() }

// Get asks for q's bytes (q.Tag is chosen here) and returns them, exactly
// q.Length of them, in a buffer of their own; ctx bounds the wait. An
// answer that the request failed is an error carrying the daemon's
// message (IsChanged if the object is at another version), and the
// connection stays usable; any other error leaves it out of step, to be
// closed.
func (pc *Conn) Get(ctx context.Context, q Request) ([]byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		pc.c.SetDeadline(dl)
	} else {
		pc.c.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { pc.c.SetDeadline(time.Now()) })
	defer stop()
	pc.tag++
	q.Tag = pc.tag
	pc.buf = q.Append(pc.buf[:0])
	if _, err := pc.w.Write(pc.buf); err != nil {
		return nil, pc.ioErr(ctx, err)
	}
	if err := pc.w.Flush(); err != nil {
		return nil, pc.ioErr(ctx, err)
	}
	a, err := ReadAnswer(pc.r, int(min(max(q.Length, 0), 1<<31)))
	if err != nil {
		return nil, pc.ioErr(ctx, err)
	}
	if a.Tag != q.Tag {
		return nil, fmt.Errorf("%w: the answer to request %d carries tag %d", ErrFrame, q.Tag, a.Tag)
	}
	switch a.Status {
	case StatusChanged:
		return nil, fmt.Errorf("%w: %s", errChanged, a.Message)
	case StatusError:
		return nil, &AnswerError{Peer: pc.addr, Message: a.Message}
	}
	return a.Data, nil
}

func (pc *Conn) ioErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("peer %s: %w", pc.addr, err)
}

// AnswerError is a peer's answer that a request failed.
type AnswerError struct {
	Peer    string
	Message string
}

func (e *AnswerError) Error() string { return fmt.Sprintf("peer %s: %s", e.Peer, e.Message) }

// remote is one peer: a pool of authenticated connections, and a
// breaker that stops asking it after a failure, for longer each time.
type remote struct {
	addr, token string
	timeout     time.Duration
	pool        chan *Conn
	open        atomic.Int32

	mu      sync.Mutex
	opened  time.Time // when the breaker last opened
	downTil time.Time
	backoff time.Duration
}

// IdleTimeout bounds how long an authenticated peer connection may sit
// with no request. Each one holds a socket and a reader goroutine on the
// serving daemon, and one whose asking node went away without closing it
// (killed, partitioned) would hold them for ever; two minutes is far
// longer than the gap between a training job's reads, so a busy pool never
// notices. The asking side (remote.conn) closes pooled connections idle
// for half of it rather than reuse them, so a serving side that closes
// connections idle for IdleTimeout never has a request written into one
// it is closing.
const IdleTimeout = 2 * time.Minute

func (p *remote) up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().After(p.downTil)
}

// trip opens the breaker after a request sent at sent failed: for 500ms
// the first time, twice as long each time it opens again, up to 30s. A
// request sent before the breaker last opened failed with the rest of that
// outage (the requests in flight when a peer fails, a pool's worth, all
// fail): it leaves the breaker as it is. Counted per request, one outage
// of a second would shun the peer for 30s.
func (p *remote) trip(err error, sent time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.opened.Before(sent) {
		return
	}
	p.backoff = min(max(p.backoff*2, 500*time.Millisecond), 30*time.Second)
	p.opened = time.Now()
	p.downTil = p.opened.Add(p.backoff)
	slog.Warn("peer failed: reading its blocks from the object store", "peer", p.addr, "for", p.backoff, "err", err)
	for {
		select {
		case pc := <-p.pool:
			pc.Close()
			p.open.Add(-1)
			continue
		default:
		}
		return
	}
}

// healthy says a request sent at sent came back: if it was sent after the
// breaker last opened, the peer is well again and the next failure opens
// it for 500ms. One sent before came back from the outage that opened it.
func (p *remote) healthy(sent time.Time) {
	p.mu.Lock()
	if p.opened.Before(sent) {
		p.backoff = 0
	}
	p.mu.Unlock()
}

func (p *remote) close() {
	for {
		select {
		case pc := <-p.pool:
			pc.Close()
		default:
			return
		}
	}
}

// conn takes a pooled connection, or dials one if fewer than the pool's
// size are open, or waits for one.
func (p *remote) conn(ctx context.Context) (*Conn, error) {
	for {
		var pc *Conn
		select {
		case pc = <-p.pool:
		default:
		}
		if pc == nil {
			break
		}
		if time.Since(pc.idle) < IdleTimeout/2 {
			return pc, nil
		}
		pc.Close()
		p.open.Add(-1)
	}
	if int(p.open.Add(1)) <= cap(p.pool) {
		pc, err := Dial(ctx, p.addr, p.token)
		if err != nil {
			p.open.Add(-1)
		}
		return pc, err
	}
	p.open.Add(-1)
	select {
	case pc := <-p.pool:
		return pc, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// get asks the peer for n bytes from at of a block, within the timeout.
func (p *remote) get(ctx context.Context, object, version string, index, at, n int64) ([]byte, error) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	pc, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	b, err := pc.Get(ctx, Request{Object: object, Version: version, Block: index, Offset: at, Length: n})
	if err != nil {
		// Even an answered error closes the connection: the next request
		// starts afresh rather than trust a peer that failed.
		pc.Close()
		p.open.Add(-1)
		return nil, err
	}
	pc.idle = time.Now()
	p.pool <- pc
	p.healthy(sent)
	return b, nil
}

// IsChanged says an error (Serve's, or a peer's answer) is a version
// mismatch: the asking node fails instead of reading another version.
func IsChanged(err error) bool { return errors.Is(err, errChanged) }
