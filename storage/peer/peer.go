// Package peer is DeepIO's distributed memory tier (deepio.txt §III-B):
// the memory of every node's daemon together holds a dataset no one node
// can. An object store's objects are cut into blocks; each block has one
// owner among the nodes, chosen by rendezvous (highest random weight)
// hashing over the peer list, so a node joining or leaving moves only the
// blocks it owns or takes (1/n of them) and every node computes the same
// owner with no coordinator. The owner keeps its blocks in memory; another
// node asks it for one in the peer protocol (frame.go: a hello with the
// daemons' token, then binary block requests, never the client protocol),
// served by ServeConn on the daemon's TCP port, and reads the object store
// itself when the owner is slow or gone: a circuit breaker stops asking a
// failed peer for a while, so a dead node costs one timeout, not one per
// block.
//
// Membership is what the launcher gives (a peer list, a node rank): the
// package builds no consensus of its own. Where DeepIO's nodes hold a fixed
// partition of the data, ownership here is per block of whatever objects
// jobs read, so jobs over different datasets share the cluster's memory.
package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/storage"
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
	// Block is a block's size; default 1 MiB, at most 1 GiB (an answer's
	// length is 32 bits).
	Block int64
	// Timeout bounds one request to a peer; slower, the object store is
	// read instead. Default 2s.
	Timeout time.Duration
	// Conns is the connections kept to each peer: requests in flight to
	// it. Default 16.
	Conns int
}

const maxBlock = 1 << 30

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

var _ storage.Store = (*Cluster)(nil)

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
	if opts.Block > maxBlock {
		return nil, fmt.Errorf("peer: blocks of %d bytes, at most %d", opts.Block, maxBlock)
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
		c.peers = append(c.peers, &remote{addr: addr, token: opts.Token, timeout: opts.Timeout, pool: make(chan *Conn, opts.Conns)})
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

// versionOf names the version of r's bytes its blocks are kept under:
// its own, or its size where its store cannot say.
func versionOf(r storage.Reader) string {
	if v := r.Version(); v != "" {
		return v
	}
	return fmt.Sprint(r.Size())
}

// object reads one object through the cluster. It keeps the object's
// name and size, and has a version and hints of its own; it does not
// unwrap (storage.Wrapper): its bytes come from the owners' memory, and
// reading the object under it directly would go around them.
type object struct {
	storage.Reader
	c       *Cluster
	version string
}

var _ storage.Reader = (*object)(nil)

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
		sent := time.Now()
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
			err = fmt.Errorf("%w: %d bytes for %d", ErrFrame, len(b), len(dst))
		}
		p.trip(err, sent)
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

// owned gives the bytes of a block this node keeps: from memory, or
// fetched once and kept. The first reader to miss the block claims it and
// fetches it; readers that come while it does wait for that one fetch
// (GetOrClaim finds the block missing and claims it in one step: a reader
// that missed it and then found it claimed by another used to fetch the
// whole block again for itself).
func (c *Cluster) owned(ctx context.Context, r storage.Reader, version string, index int64, use func([]byte)) error {
	key := c.key(r.Name(), version, index)
	for {
		it, st := c.mem.GetOrClaim(key)
		switch st {
		case cache.Ready:
			use(it.Bytes())
			it.Done(true)
			return nil
		case cache.Claimed:
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
				// The fetch failed (its reader's context ended, or the
				// store's read): claim the block again.
			case <-ctx.Done():
				it.Done(false)
				return ctx.Err()
			}
		}
	}
}

// fill fetches a block this reader claimed, keeps it if the budget has
// room (if not, those waiting for it still get it), and gives it to use.
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
	b := make([]byte, c.blockLen(r.Size(), index))
	err = r.ReadAt(ctx, b, index*c.opts.Block)
	if err == nil {
		c.st.fetched.Add(int64(len(b)))
		c.mem.Set(it, b, nil)
	}
	c.mem.Fill(it, err)
	filled = true
	if err == nil {
		use(b)
	}
	it.Done(err == nil)
	done = true
	return err
}
