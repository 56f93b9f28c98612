// Package peer is DeepIO's distributed memory tier (deepio.txt §III-B):
// the memory of every node's daemon together holds a dataset no one node
// can. An object store's objects are cut into blocks; each block has one
// owner among the nodes, chosen by rendezvous (highest random weight)
// hashing over the peer list, so a node joining or leaving moves only the
// blocks it owns or takes (1/n of them) and every node computes the same
// owner with no coordinator. The owner keeps its blocks in memory; another
// node asks it for one over the daemon's TCP protocol (the "block" op,
// behind the daemon's token), many requests in flight, and reads the
// object store itself when the owner is slow or gone: a circuit breaker
// stops asking a failed peer for a while, so a dead node costs one timeout,
// not one per block.
//
// Membership is what the launcher gives (a peer list, a node rank): the
// package builds no consensus of its own. Where DeepIO's nodes hold a fixed
// partition of the data, ownership here is per block of whatever objects
// jobs read, so jobs over different datasets share the cluster's memory.
package peer

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// Options configure a Cluster.
type Options struct {
	// Peers are the TCP addresses of every node's daemon, the same list in
	// the same order on every node.
	Peers []string
	// Self is this node's index in Peers.
	Self int
	// Token is the daemons' token (every node's is the same).
	Token string
	// Budget bounds the bytes of owned blocks kept in memory.
	Budget int64
	// Block is a block's size; default 1 MiB.
	Block int64
	// Timeout bounds one request to a peer; slower, the object store is
	// read instead. Default 2s.
	Timeout time.Duration
	// Conns is the connections kept to each peer: requests in flight to
	// it. Default 16.
	Conns int
}

// Cluster is a storage.Store in front of an object store whose blocks are
// owned by the nodes of a peer list.
type Cluster struct {
	inner storage.Store
	opts  Options
	mem   *cache.Cache
	peers []*remote

	mu   sync.Mutex
	objs map[string]storage.Reader // objects opened to serve peers

	st struct{ local, fromPeers, served, fallbacks, fetched atomic.Int64 }
}

// Stats count a cluster's work.
type Stats struct {
	Local     int64 // blocks this node owns read from its memory or fetched for it
	FromPeers int64 // blocks read from their owners
	Served    int64 // blocks served to other nodes
	Fallbacks int64 // blocks read from the object store because the owner failed
	Fetched   int64 // bytes read from the object store
	Bytes     int64 // bytes of owned blocks in memory
}

// New puts the cluster's memory tier in front of inner.
func New(inner storage.Store, opts Options) (*Cluster, error) {
	if len(opts.Peers) == 0 || opts.Self < 0 || opts.Self >= len(opts.Peers) {
		return nil, fmt.Errorf("peer: node %d of a peer list of %d", opts.Self, len(opts.Peers))
	}
	if opts.Block <= 0 {
		opts.Block = 1 << 20
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Second
	}
	if opts.Conns <= 0 {
		opts.Conns = 16
	}
	c := &Cluster{inner: inner, opts: opts, objs: map[string]storage.Reader{},
		mem: cache.New(cache.Options{Budget: opts.Budget, Policy: cache.LRU{}})}
	for i, addr := range opts.Peers {
		if i == opts.Self {
			c.peers = append(c.peers, nil)
			continue
		}
		c.peers = append(c.peers, &remote{addr: addr, token: opts.Token, timeout: opts.Timeout, pool: make(chan *pconn, opts.Conns)})
	}
	return c, nil
}

// Owner is the index in the peer list of the node that owns block index
// of object: the peer with the highest hash of (peer, object, block).
func Owner(peers []string, object string, index int64) int {
	best, owner := uint64(0), 0
	for i, p := range peers {
		h := fnv.New64a()
		io.WriteString(h, p)
		h.Write([]byte{0})
		io.WriteString(h, object)
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], uint64(index))
		h.Write(b[:])
		if w := mix(h.Sum64()); i == 0 || w > best {
			best, owner = w, i
		}
	}
	return owner
}

// mix is splitmix64's finalizer: FNV alone leaves weights of names that
// differ in their last bytes correlated.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Stats returns the cluster's counts.
func (c *Cluster) Stats() Stats {
	return Stats{Local: c.st.local.Load(), FromPeers: c.st.fromPeers.Load(), Served: c.st.served.Load(),
		Fallbacks: c.st.fallbacks.Load(), Fetched: c.st.fetched.Load(), Bytes: c.mem.Stats().Bytes}
}

// Unwrap is the store behind the cluster.
func (c *Cluster) Unwrap() storage.Store { return c.inner }

func (c *Cluster) Stat(ctx context.Context, name string) (storage.ObjectInfo, error) {
	return c.inner.Stat(ctx, name)
}
func (c *Cluster) Glob(ctx context.Context, p string) ([]string, error) { return c.inner.Glob(ctx, p) }
func (c *Cluster) Walk(ctx context.Context, root string, fn func(string, storage.ObjectInfo) error) error {
	return c.inner.Walk(ctx, root, fn)
}
func (c *Cluster) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return c.inner.ReadFile(ctx, name, max)
}
func (c *Cluster) WriteFile(ctx context.Context, name string, b []byte) error {
	return c.inner.WriteFile(ctx, name, b)
}
func (c *Cluster) Hints() storage.Hints { return c.inner.Hints() }

// Close closes the connections to peers and the objects opened for them.
func (c *Cluster) Close() error {
	for _, p := range c.peers {
		if p != nil {
			p.close()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.objs {
		r.Close()
	}
	c.objs = map[string]storage.Reader{}
	return nil
}

// Open opens an object whose blocks are read through the cluster.
func (c *Cluster) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := c.inner.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &object{Reader: r, c: c, version: versionOf(r)}, nil
}

func versionOf(r storage.Reader) string {
	if v, ok := r.(storage.Versioned); ok {
		return v.Version()
	}
	return fmt.Sprint(r.Size())
}

type object struct {
	storage.Reader
	c       *Cluster
	version string
}

func (o *object) Version() string { return o.version }

// Hints: the object store's, with the cluster's block as the read unit.
func (o *object) Hints() storage.Hints {
	h := storage.HintsOf(o.Reader)
	h.BlockSize = int(o.c.opts.Block)
	return h
}

// ReadAt reads the blocks the range covers, each from its owner; from a
// peer only the bytes wanted of each block travel.
func (o *object) ReadAt(ctx context.Context, p []byte, off int64) error {
	size := o.Size()
	if len(p) == 0 {
		return nil
	}
	// off > size-len, not off+len > size: an offset near 2^63 would wrap.
	if off < 0 || int64(len(p)) > size || off > size-int64(len(p)) {
		return o.Reader.ReadAt(ctx, p, off) // the store's own error
	}
	bs := o.c.opts.Block
	for i := off / bs; i*bs < off+int64(len(p)); i++ {
		lo, hi := max(off, i*bs), min(off+int64(len(p)), min((i+1)*bs, size))
		if err := o.c.block(ctx, o.Reader, o.version, i, lo-i*bs, p[lo-off:hi-off]); err != nil {
			return err
		}
	}
	return nil
}

func (c *Cluster) key(name, version string, index int64) cache.Key {
	h := fnv.New64a()
	io.WriteString(h, name)
	h.Write([]byte{0})
	io.WriteString(h, version)
	return cache.Key{Space: h.Sum64(), ID: index}
}

// block fills dst with the bytes of block index of r from at onward: from
// this node's memory if it owns the block, else from the owner, else from
// the object store.
func (c *Cluster) block(ctx context.Context, r storage.Reader, version string, index, at int64, dst []byte) error {
	owner := Owner(c.opts.Peers, r.Name(), index)
	if owner == c.opts.Self {
		c.st.local.Add(1)
		return c.owned(ctx, r, version, index, func(b []byte) { copy(dst, b[at:]) })
	}
	if p := c.peers[owner]; p.up() {
		b, err := p.get(ctx, r.Name(), version, index, at, int64(len(dst)))
		if err == nil && len(b) == len(dst) {
			c.st.fromPeers.Add(1)
			copy(dst, b)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, errChanged) {
			return &storage.Error{Op: "read", Object: r.Name(), Offset: index*c.opts.Block + at, Len: len(dst), Err: err}
		}
		if err == nil {
			err = fmt.Errorf("%w: %d bytes for %d", wire.ErrFrame, len(b), len(dst))
		}
		p.trip(err)
	}
	// The owner failed: read just these bytes from the store, keep nothing.
	c.st.fallbacks.Add(1)
	if err := r.ReadAt(ctx, dst, index*c.opts.Block+at); err != nil {
		return err
	}
	c.st.fetched.Add(int64(len(dst)))
	return nil
}

func (c *Cluster) blockLen(size, index int64) int64 {
	return min(size-index*c.opts.Block, c.opts.Block)
}

func (c *Cluster) fetch(ctx context.Context, r storage.Reader, index int64) ([]byte, error) {
	b := make([]byte, c.blockLen(r.Size(), index))
	if err := r.ReadAt(ctx, b, index*c.opts.Block); err != nil {
		return nil, err
	}
	c.st.fetched.Add(int64(len(b)))
	return b, nil
}

// owned gives the bytes of a block this node keeps: from memory, or
// fetched once (concurrent readers wait for the one fetch) and kept.
func (c *Cluster) owned(ctx context.Context, r storage.Reader, version string, index int64, use func([]byte)) error {
	key := c.key(r.Name(), version, index)
	for {
		it, st := c.mem.Get(key)
		switch st {
		case cache.Ready:
			use(it.Bytes())
			it.Done(true)
			return nil
		case cache.Claimed: // reserved with no reader yet: this one fills it
			return c.fill(ctx, r, index, it, use)
		case cache.Loading:
			done := make(chan error, 1)
			it.OnReady(func(err error) { done <- err })
			select {
			case err := <-done:
				if err == nil {
					use(it.Bytes())
					it.Done(true)
					return nil
				}
				it.Done(false)
				// The fetch failed: try again (a Miss now).
			case <-ctx.Done():
				it.Done(false)
				return ctx.Err()
			}
		case cache.Miss:
			it, ok := c.mem.Reserve(key, int(c.blockLen(r.Size(), index)), 0, cache.Never, true)
			if !ok {
				if c.mem.Contains(key) {
					continue
				}
				// No room (the budget is spoken for by blocks being read):
				// read it for this reader alone.
				b, err := c.fetch(ctx, r, index)
				if err != nil {
					return err
				}
				use(b)
				return nil
			}
			return c.fill(ctx, r, index, it, use)
		}
	}
}

func (c *Cluster) fill(ctx context.Context, r storage.Reader, index int64, it *cache.Item, use func([]byte)) (err error) {
	filled, done := false, false
	defer func() {
		// A panic below (Serve recovers it) must not leave the item
		// claimed and pinned: readers waiting on it would wait for ever.
		if !filled {
			c.mem.Fill(it, fmt.Errorf("peer: reading block %d of %s failed", index, r.Name()))
		}
		if !done {
			it.Done(false)
		}
	}()
	err = r.ReadAt(ctx, it.Bytes(), index*c.opts.Block)
	if err == nil {
		c.st.fetched.Add(int64(len(it.Bytes())))
	}
	c.mem.Fill(it, err)
	filled = true
	if err == nil {
		use(it.Bytes())
	}
	it.Done(err == nil)
	done = true
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

// remote is one peer: a pool of authenticated connections, and a
// breaker that stops asking it after a failure, for longer each time.
type remote struct {
	addr, token string
	timeout     time.Duration
	pool        chan *pconn
	open        atomic.Int32

	mu      sync.Mutex
	downTil time.Time
	backoff time.Duration
	tag     atomic.Uint64
}

type pconn struct {
	c    net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	idle time.Time // when it went back to the pool
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

// trip opens the breaker: 500ms after a first failure, doubling to 30s.
func (p *remote) trip(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if time.Now().After(p.downTil) {
		slog.Warn("peer failed: reading its blocks from the object store", "peer", p.addr, "for", min(max(p.backoff*2, 500*time.Millisecond), 30*time.Second), "err", err)
	}
	p.backoff = min(max(p.backoff*2, 500*time.Millisecond), 30*time.Second)
	p.downTil = time.Now().Add(p.backoff)
	for {
		select {
		case pc := <-p.pool:
			pc.c.Close()
			p.open.Add(-1)
			continue
		default:
		}
		return
	}
}

func (p *remote) healthy() {
	p.mu.Lock()
	p.backoff = 0
	p.mu.Unlock()
}

func (p *remote) close() {
	for {
		select {
		case pc := <-p.pool:
			pc.c.Close()
		default:
			return
		}
	}
}

// conn takes a pooled connection, or dials one if fewer than the pool's
// size are open, or waits for one.
func (p *remote) conn(ctx context.Context) (*pconn, error) {
	for {
		var pc *pconn
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
		pc.c.Close()
		p.open.Add(-1)
	}
	if int(p.open.Add(1)) <= cap(p.pool) {
		pc, err := p.dial(ctx)
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

func (p *remote) dial(ctx context.Context) (*pconn, error) {
	d := net.Dialer{Timeout: p.timeout}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	pc := &pconn{c: c, r: bufio.NewReader(c), w: bufio.NewWriter(c)}
	c.SetDeadline(time.Now().Add(p.timeout))
	if err := wire.Write(pc.w, &wire.Msg{Op: wire.OpHello, Version: wire.Version, Token: p.token}); err == nil {
		err = pc.w.Flush()
	}
	m, err := wire.Read(pc.r)
	if err == nil && m.Op != wire.OpHello {
		err = fmt.Errorf("peer %s: %s", p.addr, m.Message)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return pc, nil
}

// get asks the peer for n bytes from at of a block, within the timeout.
func (p *remote) get(ctx context.Context, object, version string, index, at, n int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	pc, err := p.conn(ctx)
	if err != nil {
		return nil, err
	}
	b, err := pc.ask(ctx, p.tag.Add(1), object, version, index, at, n)
	if err != nil {
		pc.c.Close()
		p.open.Add(-1)
		return nil, err
	}
	pc.idle = time.Now()
	p.pool <- pc
	p.healthy()
	return b, nil
}

func (pc *pconn) ask(ctx context.Context, tag uint64, object, version string, index, at, n int64) ([]byte, error) {
	if dl, ok := ctx.Deadline(); ok {
		pc.c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { pc.c.SetDeadline(time.Now()) })
	defer stop()
	if err := wire.Write(pc.w, &wire.Msg{Op: wire.OpBlock, Tag: tag, Object: object, ObjectVersion: version, Block: index,
		Offset: at, Length: n}); err != nil {
		return nil, err
	}
	if err := pc.w.Flush(); err != nil {
		return nil, err
	}
	m, err := wire.Read(pc.r)
	if err != nil {
		return nil, err
	}
	if m.Op == wire.OpError {
		if m.Changed {
			return nil, fmt.Errorf("%w: %s", errChanged, m.Message)
		}
		return nil, errors.New(m.Message)
	}
	if m.Op != wire.OpBlock || m.Tag != tag || m.Payload != n {
		return nil, fmt.Errorf("%w: a block answer of %q, tag %d, %d bytes", wire.ErrFrame, m.Op, m.Tag, m.Payload)
	}
	b := make([]byte, m.Payload)
	if _, err := io.ReadFull(pc.r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// IsChanged says a Serve error is a version mismatch (the peer's answer
// carries it so the asking node fails instead of reading another version).
func IsChanged(err error) bool { return errors.Is(err, errChanged) }
