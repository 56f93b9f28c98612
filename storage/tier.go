package storage

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/riffle-ml/riffle/cache"
)

// Tier keeps blocks of a remote store's objects on local disk, under a
// byte budget, so that a second epoch reads the object store little or not
// at all (OneAccess's memory hierarchy, oneaccess.txt §3; the hot blocks
// stay in the page cache above it). It survives restarts: a block is a
// file written under a temporary name and renamed whole, holding its CRC32C,
// which every read checks, so a block torn by a crash is never served (it
// is fetched again).
//
// Eviction follows the same rules as the record cache (cache.Policy): by
// default Belady's MIN, which evicts the block whose next use is farthest
// away. No general-purpose cache knows that, but riffle does: every future
// epoch's order follows from (seed, epoch), so each job says when it next
// wants a range of an object (AddFuture); without one, the least recently
// used block goes first.
type Tier struct {
	inner  Store
	opts   TierOptions
	mu     sync.Mutex
	blocks map[tierKey]*tierBlock
	used   int64
	clock  int64
	future []*futureFn
	flight map[tierKey]*tierFetch

	hits, misses, fetched atomic.Int64
}

// TierOptions configure a Tier.
type TierOptions struct {
	// Dir holds the blocks.
	Dir string
	// Budget is the bytes of blocks kept.
	Budget int64
	// Block is a block's size; default 1 MiB.
	Block int64
	// Policy orders blocks for eviction; default Belady.
	Policy cache.Policy
}

type tierKey struct {
	obj   string // a hash of the object's name and version
	index int64
}

type tierBlock struct {
	size  int64
	meta  cache.Meta
	name  string // the object's name, for next uses
	inUse int
	ready bool // written whole
}

type tierFetch struct {
	done chan struct{}
	err  error
}

type futureFn struct {
	fn func(object string, off, n int64) int64
}

// NewTier puts a tier of opts.Dir in front of inner, taking in the blocks
// an earlier run left there.
func NewTier(inner Store, opts TierOptions) (*Tier, error) {
	if opts.Block <= 0 {
		opts.Block = 1 << 20
	}
	if opts.Policy == nil {
		opts.Policy = cache.Belady{}
	}
	t := &Tier{inner: inner, opts: opts, blocks: map[tierKey]*tierBlock{}, flight: map[tierKey]*tierFetch{}}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	err := filepath.WalkDir(opts.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(p, ".tmp") {
			os.Remove(p) // a block a crash cut short
			return nil
		}
		idx, err := strconv.ParseInt(strings.TrimSuffix(d.Name(), ".blk"), 10, 64)
		if err != nil || !strings.HasSuffix(d.Name(), ".blk") {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		k := tierKey{filepath.Base(filepath.Dir(p)), idx}
		t.clock++
		t.blocks[k] = &tierBlock{size: info.Size(), meta: cache.Meta{NextUse: cache.Never, LastUse: 0, Seq: t.clock}, ready: true}
		t.used += info.Size()
		return nil
	})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.evict(0)
	t.mu.Unlock()
	return t, nil
}

// AddFuture registers a job's oracle of next uses: fn(object, off, n) is
// when the job next reads a byte of that range (a position of its order,
// cache.Never if it will not). The returned function removes it.
func (t *Tier) AddFuture(fn func(object string, off, n int64) int64) (remove func()) {
	f := &futureFn{fn: fn}
	t.mu.Lock()
	t.future = append(t.future, f)
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		for i, g := range t.future {
			if g == f {
				t.future = append(t.future[:i], t.future[i+1:]...)
				return
			}
		}
	}
}

// TierStats count a tier's work.
type TierStats struct {
	Hits, Misses int64 // blocks read from disk, blocks fetched
	Fetched      int64 // bytes read from the store behind
	Bytes        int64 // bytes of blocks kept
	Blocks       int
}

func (t *Tier) Stats() TierStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return TierStats{Hits: t.hits.Load(), Misses: t.misses.Load(), Fetched: t.fetched.Load(), Bytes: t.used, Blocks: len(t.blocks)}
}

// Unwrap is the store behind the tier.
func (t *Tier) Unwrap() Store { return t.inner }

func (t *Tier) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	return t.inner.Stat(ctx, name)
}
func (t *Tier) Glob(ctx context.Context, p string) ([]string, error) { return t.inner.Glob(ctx, p) }
func (t *Tier) Walk(ctx context.Context, root string, fn func(string, ObjectInfo) error) error {
	return t.inner.Walk(ctx, root, fn)
}
func (t *Tier) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return t.inner.ReadFile(ctx, name, max)
}
func (t *Tier) WriteFile(ctx context.Context, name string, b []byte) error {
	return t.inner.WriteFile(ctx, name, b)
}
func (t *Tier) Hints() Hints { return t.inner.Hints() }

// Open opens name through the tier: blocks of this version of it.
func (t *Tier) Open(ctx context.Context, name string) (Reader, error) {
	r, err := t.inner.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	v := ""
	if vr, ok := r.(Versioned); ok {
		v = vr.Version()
	}
	h := sha256.Sum256([]byte(name + "\x00" + v))
	return &tierObject{Reader: r, t: t, name: name, id: hex.EncodeToString(h[:10])}, nil
}

// tierObject reads one object through the tier.
type tierObject struct {
	Reader
	t    *Tier
	name string
	id   string
}

func (o *tierObject) Hints() Hints {
	h := HintsOf(o.Reader)
	h.BlockSize = int(o.t.opts.Block)
	return h
}

func (o *tierObject) Version() string {
	if v, ok := o.Reader.(Versioned); ok {
		return v.Version()
	}
	return ""
}

func (t *Tier) blockPath(k tierKey) string {
	return filepath.Join(t.opts.Dir, k.obj, strconv.FormatInt(k.index, 10)+".blk")
}

// ReadAt reads the blocks the range covers: from disk those kept (their
// CRC checked), from the store the others, consecutive ones in one read.
func (o *tierObject) ReadAt(ctx context.Context, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	size := o.Size()
	if off < 0 || off+int64(len(p)) > size {
		return o.Reader.ReadAt(ctx, p, off) // the store's own error
	}
	t := o.t
	bs := t.opts.Block
	first, last := off/bs, (off+int64(len(p))-1)/bs
	for i := first; i <= last; {
		k := tierKey{o.id, i}
		lo, hi := i*bs, min((i+1)*bs, size)
		if b, err := t.readBlock(k, hi-lo, o.name, lo); err == nil {
			copyRange(p, off, b, lo)
			t.hits.Add(1)
			i++
			continue
		}
		// Fetch this block and the missing ones after it, up to 8, in one read.
		j := i + 1
		for j <= last && j < i+8 && !t.has(tierKey{o.id, j}) {
			j++
		}
		if err := o.fetch(ctx, i, j, p, off); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// copyRange copies the overlap of block b (at offset at) into p (at off).
func copyRange(p []byte, off int64, b []byte, at int64) {
	lo, hi := max(off, at), min(off+int64(len(p)), at+int64(len(b)))
	if lo < hi {
		copy(p[lo-off:hi-off], b[lo-at:hi-at])
	}
}

func (t *Tier) has(k tierKey) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	b, ok := t.blocks[k]
	return ok && b.ready
}

// readBlock reads a kept block, checking its length and CRC; a block
// that fails either is dropped.
func (t *Tier) readBlock(k tierKey, n int64, name string, off int64) ([]byte, error) {
	t.mu.Lock()
	b, ok := t.blocks[k]
	if !ok || !b.ready {
		t.mu.Unlock()
		return nil, fs.ErrNotExist
	}
	b.inUse++
	t.touch(b, name, off, n)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		b.inUse--
		t.mu.Unlock()
	}()
	raw, err := os.ReadFile(t.blockPath(k))
	if err == nil && (int64(len(raw)) != 4+n || binary.LittleEndian.Uint32(raw) != crc32.Checksum(raw[4:], castagnoliTab)) {
		err = errors.New("torn or damaged block")
	}
	if err != nil {
		t.mu.Lock()
		if cur, ok := t.blocks[k]; ok && cur == b {
			delete(t.blocks, k)
			t.used -= b.size
		}
		t.mu.Unlock()
		os.Remove(t.blockPath(k))
		return nil, err
	}
	return raw[4:], nil
}

var castagnoliTab = crc32.MakeTable(crc32.Castagnoli)

// touch updates a block's use: now, and when its range is next wanted.
// Called with t.mu held.
func (t *Tier) touch(b *tierBlock, name string, off, n int64) {
	t.clock++
	b.meta.LastUse = t.clock
	b.name = name
	b.meta.NextUse = cache.Never
	for _, f := range t.future {
		b.meta.NextUse = min(b.meta.NextUse, f.fn(name, off, n))
	}
}

// fetch reads blocks [i, j) from the store in one read, keeps them, and
// copies what p wants.
func (o *tierObject) fetch(ctx context.Context, i, j int64, p []byte, off int64) error {
	t := o.t
	bs := t.opts.Block
	size := o.Size()
	lo, hi := i*bs, min(j*bs, size)
	buf := make([]byte, hi-lo)
	if err := o.Reader.ReadAt(ctx, buf, lo); err != nil {
		return err
	}
	t.fetched.Add(hi - lo)
	copyRange(p, off, buf, lo)
	for k := i; k < j; k++ {
		t.misses.Add(1)
		blo, bhi := k*bs-lo, min((k+1)*bs, size)-lo
		t.keep(tierKey{o.id, k}, buf[blo:bhi], o.name, k*bs)
	}
	return nil
}

// keep writes a block to disk (under a temporary name, renamed whole) if
// the budget makes room for it.
func (t *Tier) keep(k tierKey, data []byte, name string, off int64) {
	size := int64(len(data)) + 4
	t.mu.Lock()
	if _, ok := t.blocks[k]; ok || size > t.opts.Budget {
		t.mu.Unlock()
		return
	}
	b := &tierBlock{size: size, name: name}
	t.touch(b, name, off, int64(len(data)))
	if !t.evict(size) {
		t.mu.Unlock()
		return
	}
	t.clock++
	b.meta.Seq = t.clock
	b.inUse = 1
	t.blocks[k] = b
	t.used += size
	t.mu.Unlock()
	err := t.write(k, data)
	t.mu.Lock()
	b.inUse = 0
	if err != nil {
		delete(t.blocks, k)
		t.used -= size
	} else {
		b.ready = true
	}
	t.mu.Unlock()
}

func (t *Tier) write(k tierKey, data []byte) error {
	path := t.blockPath(k)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	var crc [4]byte
	binary.LittleEndian.PutUint32(crc[:], crc32.Checksum(data, castagnoliTab))
	_, err = f.Write(crc[:])
	if err == nil {
		_, err = f.Write(data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("tier: keeping a block: %w", err)
	}
	return nil
}

// evict makes room for size more bytes, evicting by the policy blocks not
// being read; false if it cannot. Called with t.mu held.
func (t *Tier) evict(size int64) bool {
	for t.used+size > t.opts.Budget {
		var victim *tierBlock
		var vk tierKey
		for k, b := range t.blocks {
			if b.inUse > 0 {
				continue
			}
			if victim == nil || t.opts.Policy.Evict(&b.meta, &victim.meta) {
				victim, vk = b, k
			}
		}
		if victim == nil {
			return false
		}
		delete(t.blocks, vk)
		t.used -= victim.size
		os.Remove(t.blockPath(vk))
	}
	return true
}
