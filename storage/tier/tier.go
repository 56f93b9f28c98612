// Package tier is the disk tier in front of an object store: blocks of
// remote objects kept on local disk, evicted by each job's next use
// (Belady's MIN), fetched once however many readers miss them. It wraps a
// storage.Store and is one; it is a package under storage, not part of
// it, so that storage (where the bytes live) imports no cache.
// storage/stack puts it in front of the object store.
package tier

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/storage"
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
//
// Its directory is private to the daemon's user (internal/privdir): made
// 0700, refused if another user owns it or anyone else may write it, since
// a block planted there with a valid CRC would be served; blocks are files
// of mode 0600, opened relative to the checked directory with O_NOFOLLOW.
// The directory stays open for as long as the tier is used.
//
// Two readers that miss one block fetch it once: the first claims it in
// flight (a cache.Cache used only for blocks being fetched, the claim /
// fill / wait of every other layer that waits for bytes another reader is
// fetching) and the second waits for its fill.
type Tier struct {
	inner  storage.Store
	opts   Options
	dir    *privdir.Dir
	mu     sync.Mutex
	blocks map[tierKey]*tierBlock
	used   int64
	clock  int64
	future []*futureFn
	// flight holds blocks being fetched from the store, from the claim
	// until their fetcher has kept them on disk and every waiter has
	// copied them; then they leave it (DropUnreferenced).
	flight *cache.Cache

	hits, misses, shared, fetched atomic.Int64
}

var _ storage.Store = (*Tier)(nil)

// tierFlightBlocks bounds the blocks in flight at once, in blocks: a reader
// that finds no room fetches for itself alone, as if no other reader
// wanted the block.
const tierFlightBlocks = 256

// Options configure a Tier.
type Options struct {
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

type futureFn struct {
	fn func(object string, off, n int64) int64
}

// NewTier puts a tier of opts.Dir in front of inner, taking in the blocks
// an earlier run left there.
func New(inner storage.Store, opts Options) (*Tier, error) {
	if opts.Block <= 0 {
		opts.Block = 1 << 20
	}
	if opts.Policy == nil {
		opts.Policy = cache.Belady{}
	}
	dir, err := privdir.Open(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("tier: %w", err)
	}
	t := &Tier{inner: inner, opts: opts, dir: dir, blocks: map[tierKey]*tierBlock{},
		flight: cache.New(cache.Options{Budget: tierFlightBlocks * opts.Block, Policy: cache.LRU{}, DropUnreferenced: true})}
	if err := t.load(); err != nil {
		dir.Close()
		return nil, err
	}
	t.mu.Lock()
	t.evict(0)
	t.mu.Unlock()
	return t, nil
}

// load takes in the blocks an earlier run left: regular files named
// INDEX.blk in one directory per object. Anything else a block's place
// holds (a symlink, a FIFO) is removed, never followed, and so are the
// temporary files of blocks a crash cut short.
func (t *Tier) load() error {
	objs, err := t.dir.ReadDir()
	if err != nil {
		return err
	}
	for _, o := range objs {
		if !o.IsDir() {
			continue
		}
		sub, err := t.dir.OpenDir(o.Name())
		if err != nil {
			slog.Warn("tier: skipping a directory that is not private", "err", err)
			continue
		}
		ents, err := sub.ReadDir()
		for _, e := range ents {
			name := e.Name()
			if strings.HasSuffix(name, ".tmp") || (strings.HasSuffix(name, ".blk") && !e.Type().IsRegular()) {
				sub.Remove(name)
				continue
			}
			idx, perr := strconv.ParseInt(strings.TrimSuffix(name, ".blk"), 10, 64)
			if perr != nil || idx < 0 || !strings.HasSuffix(name, ".blk") {
				continue
			}
			info, ierr := e.Info()
			if ierr != nil {
				continue
			}
			t.clock++
			t.blocks[tierKey{o.Name(), idx}] = &tierBlock{size: info.Size(),
				meta: cache.Meta{NextUse: cache.Never, LastUse: 0, Seq: t.clock}, ready: true}
			t.used += info.Size()
		}
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
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

// Stats count a tier's work.
type Stats struct {
	Hits, Misses int64 // blocks read from disk, blocks fetched
	// Shared counts blocks a reader found in flight, fetched by another
	// reader, and took from that fetch instead of fetching them again.
	Shared  int64
	Fetched int64 // bytes read from the store behind
	Bytes   int64 // bytes of blocks kept
	Blocks  int
}

func (t *Tier) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Stats{Hits: t.hits.Load(), Misses: t.misses.Load(), Shared: t.shared.Load(), Fetched: t.fetched.Load(),
		Bytes: t.used, Blocks: len(t.blocks)}
}

func (t *Tier) Stat(ctx context.Context, name string) (storage.ObjectInfo, error) {
	return t.inner.Stat(ctx, name)
}
func (t *Tier) Glob(ctx context.Context, p string) ([]string, error) { return t.inner.Glob(ctx, p) }
func (t *Tier) Walk(ctx context.Context, root string, fn func(string, storage.ObjectInfo) error) error {
	return t.inner.Walk(ctx, root, fn)
}
func (t *Tier) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return t.inner.ReadFile(ctx, name, max)
}
func (t *Tier) WriteFile(ctx context.Context, name string, b []byte) error {
	return t.inner.WriteFile(ctx, name, b)
}
func (t *Tier) Hints() storage.Hints { return t.inner.Hints() }

// Open opens name through the tier: blocks of this version of it.
func (t *Tier) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := t.inner.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	// A local file's version has its ctime, which utime cannot set back:
	// an edit in place that restores size and mtime is a new version.
	h := sha256.Sum256([]byte(name + "\x00" + r.Version()))
	o := &tierObject{Reader: r, t: t, name: name, id: hex.EncodeToString(h[:10])}
	copy(o.idSum[:], h[:])
	return o, nil
}

// tierObject reads one object through the tier. It keeps the object's
// name, size and version, and has hints of its own; it does not unwrap
// (storage.Wrapper): its bytes come from the tier's blocks, and reading
// the object under it through io_uring, or dropping that file's pages,
// would go around them.
type tierObject struct {
	storage.Reader
	t     *Tier
	name  string
	id    string  // its blocks' directory: a hash of its name and version
	idSum [8]byte // the hash's first bytes, its blocks' space in flight
}

var _ storage.Reader = (*tierObject)(nil)

func (o *tierObject) Hints() storage.Hints {
	h := storage.HintsOf(o.Reader)
	h.BlockSize = int(o.t.opts.Block)
	return h
}

// blockName is a block's file name in its object's directory (k.obj).
func blockName(k tierKey) string { return strconv.FormatInt(k.index, 10) + ".blk" }

// ReadAt reads the blocks the range covers: from disk those kept (their
// CRC checked), from the store the others, consecutive ones in one read.
func (o *tierObject) ReadAt(ctx context.Context, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	size := o.Size()
	// off > size-len, not off+len > size: an offset near 2^63 would wrap.
	if off < 0 || int64(len(p)) > size || off > size-int64(len(p)) {
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
		n, err := o.miss(ctx, i, last, p, off)
		if err != nil {
			return err
		}
		i += n
	}
	return nil
}

func (o *tierObject) flightKey(i int64) cache.Key {
	return cache.Key{Space: binary.LittleEndian.Uint64(o.idSum[:]), ID: i}
}

func (o *tierObject) blockLen(i int64) int64 {
	return min((i+1)*o.t.opts.Block, o.Size()) - i*o.t.opts.Block
}

// miss reads block i, which is not on disk, into what p wants, and says
// how many blocks from i it has read (more than one when it fetched a run
// of missing blocks, up to 8 and not past last, in one read). A block
// another reader is fetching is waited for, not fetched again.
func (o *tierObject) miss(ctx context.Context, i, last int64, p []byte, off int64) (int64, error) {
	t := o.t
	key := o.flightKey(i)
	for {
		it, st := t.flight.Get(key)
		if st == cache.Miss {
			var ok bool
			if it, ok = t.flight.Reserve(key, int(o.blockLen(i)), 1, cache.Never, true); ok {
				st = cache.Claimed
			} else if it, st = t.flight.Get(key); st == cache.Miss {
				// No room in flight: fetch it for this reader alone.
				return 1, o.fetch(ctx, i, nil, p, off)
			}
		}
		switch st {
		case cache.Ready:
			t.shared.Add(1)
			err := o.copyItem(it, i, p, off)
			it.Done(false)
			return 1, err
		case cache.Loading:
			t.shared.Add(1)
			done := make(chan error, 1)
			it.OnReady(func(err error) { done <- err })
			select {
			case err := <-done:
				if err == nil {
					err = o.copyItem(it, i, p, off)
					it.Done(false)
					return 1, err
				}
				it.Done(false)
				// The fetch failed: this reader tries again itself (the
				// block is a Miss now) rather than take the error, which
				// may be the fetcher's own (its context cancelled); if the
				// store is failing, its own fetch will say so.
			case <-ctx.Done():
				it.Done(false)
				return 0, ctx.Err()
			}
		case cache.Claimed:
			// This reader fetches the block. It may have reached the disk
			// between the miss and the claim (its fetcher kept it and left
			// flight): then it is read from there.
			if b, err := t.readBlock(tierKey{o.id, i}, o.blockLen(i), o.name, i*t.opts.Block); err == nil {
				t.hits.Add(1)
				copyRange(p, off, b, i*t.opts.Block)
				err = it.Put(b)
				t.flight.Fill(it, err)
				it.Done(err == nil)
				return 1, nil
			}
			// Claim the missing blocks after it too, to fetch in one read;
			// a run stops at a block on disk or in another reader's flight.
			items := []*cache.Item{it}
			for j := i + 1; j <= last && j < i+8 && !t.has(tierKey{o.id, j}); j++ {
				jt, ok := t.flight.Reserve(o.flightKey(j), int(o.blockLen(j)), 1, cache.Never, true)
				if !ok {
					break
				}
				items = append(items, jt)
			}
			return int64(len(items)), o.fetch(ctx, i, items, p, off)
		}
	}
}

// copyItem copies what p wants of block i from its item in flight.
func (o *tierObject) copyItem(it *cache.Item, i int64, p []byte, off int64) error {
	b := it.Bytes()
	if int64(len(b)) != o.blockLen(i) {
		return fmt.Errorf("tier: block %d of %s in flight holds %d bytes, want %d", i, o.name, len(b), o.blockLen(i))
	}
	copyRange(p, off, b, i*o.t.opts.Block)
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
	raw, err := t.readFile(k, 4+n)
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
		t.remove(k)
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

// fetch reads blocks from i in one read, one per item claimed in flight
// (or block i alone, with none), copies what p wants, fills the items (the
// waiters go on at once), keeps the blocks on disk, and only then releases
// the items, so that a reader who finds a block gone from flight finds it
// on disk (or fetches it, if the budget kept it out). Whatever happens,
// every item is filled (with the error, if the read failed) and released:
// a waiter never waits for ever.
func (o *tierObject) fetch(ctx context.Context, i int64, items []*cache.Item, p []byte, off int64) (err error) {
	t := o.t
	filled, released := false, false
	defer func() {
		ferr := err
		if ferr == nil {
			ferr = fmt.Errorf("tier: fetching block %d of %s failed", i, o.name)
		}
		for _, it := range items {
			if !filled {
				t.flight.Fill(it, ferr)
			}
			if !released {
				it.Done(false)
			}
		}
	}()
	n := max(int64(len(items)), 1)
	bs := t.opts.Block
	lo, hi := i*bs, min((i+n)*bs, o.Size())
	var buf []byte
	if len(items) == 1 {
		buf = items[0].Bytes() // one block: read into its item, no copy
	} else {
		buf = make([]byte, hi-lo)
	}
	if int64(len(buf)) != hi-lo {
		return fmt.Errorf("tier: block %d of %s in flight holds %d bytes, want %d", i, o.name, len(buf), hi-lo)
	}
	if err := o.Reader.ReadAt(ctx, buf, lo); err != nil {
		return err
	}
	t.fetched.Add(hi - lo)
	copyRange(p, off, buf, lo)
	for k, it := range items {
		var err error
		if len(items) > 1 {
			blo, bhi := int64(k)*bs, min(int64(k+1)*bs, hi-lo)
			err = it.Put(buf[blo:bhi])
		}
		t.flight.Fill(it, err)
	}
	filled = true
	for k := range n {
		t.misses.Add(1)
		blo, bhi := k*bs, min((k+1)*bs, hi-lo)
		t.keep(tierKey{o.id, i + k}, buf[blo:bhi], o.name, (i+k)*bs)
	}
	for _, it := range items {
		it.Done(true)
	}
	released = true
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
	sub, err := t.dir.Mkdir(k.obj)
	if err != nil {
		return fmt.Errorf("tier: keeping a block: %w", err)
	}
	defer sub.Close()
	f, tmp, err := sub.CreateTemp(blockName(k))
	if err != nil {
		return fmt.Errorf("tier: keeping a block: %w", err)
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
		err = sub.Rename(tmp, blockName(k))
	}
	if err != nil {
		sub.Remove(tmp)
		return fmt.Errorf("tier: keeping a block: %w", err)
	}
	return nil
}

// readFile reads a block's file, of at most max bytes, never through a
// symlink.
func (t *Tier) readFile(k tierKey, max int64) ([]byte, error) {
	sub, err := t.dir.OpenDir(k.obj)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	return sub.ReadFile(blockName(k), max)
}

// remove removes a block's file.
func (t *Tier) remove(k tierKey) {
	if sub, err := t.dir.OpenDir(k.obj); err == nil {
		sub.Remove(blockName(k))
		sub.Close()
	}
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
		t.remove(vk)
	}
	return true
}
