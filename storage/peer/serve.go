package peer

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"github.com/riffle-ml/riffle/storage"
)

// ServeOptions are the serving daemon's admission rules for one peer
// connection; the zero value admits every peer holding the token.
type ServeOptions struct {
	// HelloTimeout bounds the wait for the hello; default 10s.
	HelloTimeout time.Duration
	// IdleTimeout bounds the wait for each request after the last;
	// default IdleTimeout. A request must also be whole by then.
	IdleTimeout time.Duration
	// WriteTimeout bounds writing one answer, so a peer that stops
	// reading loses its connection; default 60s.
	WriteTimeout time.Duration
	// InFlight bounds the requests of one connection served at once; one
	// beyond it is answered with an error. Default 64.
	InFlight int
	// Refused, if set, is called after a wrong token and before the
	// answer: the daemon slows failed handshakes down, all of them
	// together, whatever protocol they came in.
	Refused func()
	// Admit, if set, is called once the token is right; an error refuses
	// the connection with its message (the daemon's room for
	// authenticated connections is full).
	Admit func() error
}

// ServeConn serves one connection that opened with Magic: a hello with
// the daemons' token (compared in constant time), then block requests,
// each answered by Serve, several at once, until the peer closes the
// connection, sends something that is not a request, is idle past
// IdleTimeout, or ctx is cancelled. It returns when every request it
// started has been answered or abandoned; the caller closes conn.
func (c *Cluster) ServeConn(ctx context.Context, conn net.Conn, o ServeOptions) error {
	if o.HelloTimeout <= 0 {
		o.HelloTimeout = 10 * time.Second
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = IdleTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 60 * time.Second
	}
	if o.InFlight <= 0 {
		o.InFlight = 64
	}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel below: requests stop promptly
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Cancelled (by ctx, a failed write, or the return below), the
	// connection's reads and writes stop at once.
	context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	r := bufio.NewReader(conn)
	w := &answers{c: conn, w: bufio.NewWriter(conn), timeout: o.WriteTimeout, cancel: cancel}

	conn.SetReadDeadline(time.Now().Add(o.HelloTimeout))
	token, err := ReadHello(r)
	if err != nil {
		if errors.Is(err, ErrFrame) {
			w.answer(0, StatusError, []byte(err.Error()))
		}
		return err
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(c.opts.Token)) != 1 {
		if o.Refused != nil {
			o.Refused()
		}
		w.answer(0, StatusError, []byte("wrong token"))
		return errors.New("peer: wrong token")
	}
	if o.Admit != nil {
		if err := o.Admit(); err != nil {
			w.answer(0, StatusError, []byte(err.Error()))
			return err
		}
	}
	if err := w.answer(0, StatusOK, nil); err != nil {
		return err
	}
	sem := make(chan struct{}, o.InFlight)
	for {
		conn.SetReadDeadline(time.Now().Add(o.IdleTimeout))
		q, err := ReadRequest(r)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				w.answer(0, StatusError, []byte(err.Error()))
			}
			return err
		}
		select {
		case sem <- struct{}{}:
		default:
			w.answer(q.Tag, StatusError, fmt.Appendf(nil, "%d block requests already in flight on this connection", o.InFlight))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			b, err := c.Serve(ctx, q.Object, q.Version, q.Block, q.Offset, q.Length)
			switch {
			case IsChanged(err):
				w.answer(q.Tag, StatusChanged, []byte(err.Error()))
			case err != nil:
				w.answer(q.Tag, StatusError, []byte(err.Error()))
			default:
				w.answer(q.Tag, StatusOK, b)
			}
		}()
	}
}

// Refuse reads a peer's hello (within the connection's read deadline)
// and answers it with msg, whatever it holds: a daemon that has no
// cluster tier says so, and its answer is not lost to a reset for bytes
// left unread.
func Refuse(conn net.Conn, msg string) error {
	if _, err := ReadHello(conn); err != nil && !errors.Is(err, ErrFrame) {
		return err
	}
	conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := conn.Write(AppendAnswer(nil, 0, StatusError, []byte(msg)))
	return err
}

// answers writes a connection's answers whole, one at a time; a failed
// write ends the connection.
type answers struct {
	mu      sync.Mutex
	c       net.Conn
	w       *bufio.Writer
	head    []byte
	timeout time.Duration
	cancel  context.CancelFunc
}

func (a *answers) answer(tag uint64, st Status, data []byte) error {
	if st != StatusOK && len(data) > MaxMessage {
		data = data[:MaxMessage]
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.c.SetWriteDeadline(time.Now().Add(a.timeout))
	a.head = appendAnswerHead(a.head[:0], tag, st, len(data))
	_, err := a.w.Write(a.head)
	if err == nil {
		_, err = a.w.Write(data)
	}
	if err == nil {
		err = a.w.Flush()
	}
	if err != nil {
		a.cancel()
	}
	return err
}

// errChanged is a peer's answer that the object is not the version asked for.
var errChanged = errors.New("the object changed")

// Serve answers a peer's request for n bytes from at of block index of
// object at version (n 0: the rest of the block): from memory, or fetched
// (and kept, if this node owns the block). Only s3:// objects are served:
// a peer never reads this node's files.
//
// Every number of the request is checked against the object before any
// arithmetic on it, in forms that cannot overflow (a block index near 2^62
// would wrap index*Block to another block, an offset near 2^63 would wrap
// at+n past the check). A panic while serving (a bug, not the request's
// fault) ends this request with an error wrapping ErrPanic and is logged;
// it never takes the daemon down.
func (c *Cluster) Serve(ctx context.Context, object, version string, index, at, n int64) (out []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			slog.Error("peer: serving a block request panicked", "object", object, "block", index, "offset", at, "length", n,
				"panic", p, "stack", string(debug.Stack()))
			out, err = nil, fmt.Errorf("%w: block %d of %s: %v", ErrPanic, index, object, p)
		}
	}()
	if !storage.IsS3(object) {
		return nil, fmt.Errorf("peer: %q is not an object-store name", object)
	}
	r, err := c.opened(ctx, object, version)
	if err != nil {
		return nil, err
	}
	size, bs := r.Size(), c.opts.Block
	if index < 0 || index >= blocks(size, bs) {
		return nil, fmt.Errorf("peer: block %d of %s (%d bytes, %d blocks) is past its end", index, object, size, blocks(size, bs))
	}
	blen := c.blockLen(size, index) // index*bs < size: no overflow
	if at < 0 || at >= blen {
		return nil, fmt.Errorf("peer: offset %d in block %d of %s, which has %d bytes", at, index, object, blen)
	}
	if n == 0 {
		n = blen - at
	}
	if n < 0 || n > blen-at {
		return nil, fmt.Errorf("peer: %d bytes from %d of block %d of %s, which has %d", n, at, index, object, blen)
	}
	out = make([]byte, n)
	if Owner(c.opts.Peers, object, index) == c.opts.Self {
		err = c.owned(ctx, r, version, index, func(b []byte) { copy(out, b[at:]) })
	} else {
		err = r.ReadAt(ctx, out, index*c.opts.Block+at)
		if err == nil {
			c.st.fetched.Add(n)
		}
	}
	if err == nil {
		c.st.served.Add(1)
	}
	return out, err
}

// blocks is the number of blocks of an object of size bytes, computed
// without overflow for any size.
func blocks(size, block int64) int64 {
	nb := size / block
	if size%block != 0 {
		nb++
	}
	return nb
}

// ErrPanic says serving a request panicked: the request failed, the
// daemon lives on.
var ErrPanic = errors.New("peer: internal error while serving a request")

// opened is object at version, opened once for all peers' requests.
func (c *Cluster) opened(ctx context.Context, object, version string) (storage.Reader, error) {
	c.mu.Lock()
	r, ok := c.objs[object]
	c.mu.Unlock()
	if ok && versionOf(r) == version {
		return r, nil
	}
	r, err := c.inner.Open(ctx, object)
	if err != nil {
		return nil, err
	}
	if v := versionOf(r); v != version {
		r.Close()
		return nil, fmt.Errorf("%w: %s is at version %s, asked for %s", errChanged, object, v, version)
	}
	c.mu.Lock()
	if old, ok := c.objs[object]; ok {
		old.Close()
	}
	c.objs[object] = r
	c.mu.Unlock()
	return r, nil
}
