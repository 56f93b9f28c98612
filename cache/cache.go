package cache

import (
	"container/heap"
	"fmt"
	"sync"
)

// Key names a cached item: ID within Space. A space is one version of one
// source seen through one transform, so bytes of a rewritten file or of
// another transform never answer for these.
type Key struct {
	Space uint64
	ID    int64
	// Decoded names the decoded form of record ID, kept beside its bytes
	// for jobs that cut their own draw from one decode. Its count of uses
	// is a guess (batches of jobs cross, and jobs leave), so it lives no
	// longer than the record's item: it goes when the record's last use
	// does.
	Decoded bool
}

// DecodedOf is the key of the decoded form of k's record.
func (k Key) DecodedOf() Key { k.Decoded = true; return k }

// Options configures a Cache. The zero value is a cache of nothing.
type Options struct {
	// Budget bounds the bytes of items held at once.
	Budget int64
	// Policy orders items for eviction; default RefCnt.
	Policy Policy
	// DropUnreferenced drops an item as soon as its count of uses to come
	// reaches zero (RefCnt's rule). Tiers that keep items across epochs,
	// where the count means nothing, leave it off.
	DropUnreferenced bool
}

// Cache holds items under a byte budget. It is safe for concurrent use.
type Cache struct {
	opts Options

	mu    sync.Mutex
	items map[Key]*Item
	heap  itemHeap // ready, unpinned items: the candidates for eviction
	used  int64
	clock int64
	st    Stats
}

// Stats counts a cache's work.
type Stats struct {
	Items                     int
	Bytes, Budget             int64
	Hits, Misses              int64 // lookups that found an item (ready or loading), and that did not
	Inserts, Evictions, Drops int64 // Drops: items whose last use came
	Refused                   int64 // reservations that found no room
}

// Item is one cached item. Its bytes are valid while the caller holds a
// pin: from Lookup's callback or Reserve until Done.
type Item struct {
	c       *Cache
	key     Key
	buf     []byte
	meta    Meta
	pins    int
	ready   bool
	claimed bool  // a reader has taken it on
	gone    bool  // evicted, dropped or failed: no longer in the map
	err     error // why its load failed
	waiters []func(error)
	hi      int // index in the heap, -1 when not there
	val     any // what goes with the bytes (Set), for caches of decoded values
}

// New makes a cache.
func New(opts Options) *Cache {
	if opts.Policy == nil {
		opts.Policy = RefCnt{}
	}
	return &Cache{opts: opts, items: map[Key]*Item{}, heap: itemHeap{policy: opts.Policy}}
}

// Budget is the cache's byte budget.
func (c *Cache) Budget() int64 { return c.opts.Budget }

// Key returns the item's key.
func (it *Item) Key() Key { return it.key }

// Bytes are the item's bytes: for its reader, to fill; for others, to
// read once the item is ready. Valid until Done.
func (it *Item) Bytes() []byte { return it.buf }

// SizeError says bytes did not fit an item: a copy into or out of it
// whose length is not the item's. The item was reserved for a record of
// another size, so the copy would cut the record or leave part of it
// stale; the caller fails the record instead.
type SizeError struct {
	Key        Key
	Item, Copy int
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("cache: item %d of space %x holds %d bytes, the copy has %d", e.Key.ID, e.Key.Space, e.Item, e.Copy)
}

// Put fills the item's bytes from src, for the item's reader. src must be
// exactly the item's length: whoever reserved it stated the size.
func (it *Item) Put(src []byte) error {
	if len(src) != len(it.buf) {
		return &SizeError{Key: it.key, Item: len(it.buf), Copy: len(src)}
	}
	copy(it.buf, src)
	return nil
}

// CopyTo copies a ready item's bytes into dst, which must be exactly the
// item's length.
func (it *Item) CopyTo(dst []byte) error {
	if len(dst) != len(it.buf) {
		return &SizeError{Key: it.key, Item: len(it.buf), Copy: len(dst)}
	}
	copy(dst, it.buf)
	return nil
}

// Status says what Get found.
type Status int

const (
	// Miss: no item; the caller reads for itself.
	Miss Status = iota
	// Ready: the item's bytes are there to copy.
	Ready
	// Loading: another holder is reading it; OnReady says when it lands.
	Loading
	// Claimed: the item was reserved for readers to come and nobody reads
	// it yet; the caller must fill it (Fill) and is its reader now.
	Claimed
)

// Get pins the item under key and says what state it is in. Unless it
// returns Miss, the caller must call Done on the item when through.
func (c *Cache) Get(key Key) (*Item, Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	it, ok := c.items[key]
	if !ok {
		c.st.Misses++
		return nil, Miss
	}
	return c.found(it)
}

// found pins an item a lookup found and says its state, claiming it for
// the caller if it was reserved and nobody reads it yet.
func (c *Cache) found(it *Item) (*Item, Status) {
	c.st.Hits++
	c.pin(it)
	switch {
	case it.ready:
		return it, Ready
	case !it.claimed:
		it.claimed = true
		return it, Claimed
	}
	return it, Loading
}

// GetOrClaim is Get, and on a miss makes the item, claimed by the caller:
// one caller of many that miss one key claims it, the others find it
// Loading and wait (OnReady). The claimer fills it (Set, then Fill) or
// fails it (Fill with an error); an empty claimed item needs no room.
func (c *Cache) GetOrClaim(key Key) (*Item, Status) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if it, ok := c.items[key]; ok {
		return c.found(it)
	}
	c.st.Misses++
	c.clock++
	it := &Item{c: c, key: key, hi: -1, claimed: true, pins: 1,
		meta: Meta{Refs: 1, NextUse: Never, LastUse: c.clock, Seq: c.clock}}
	c.items[key] = it
	c.st.Inserts++
	return it, Claimed
}

// Set gives a claimed item its bytes, and a value that goes with them (a
// decoded page's description), before Fill: whoever holds the bytes states
// their size. It evicts others to make room; when none can be made the
// item is not kept (those waiting for it still get it), and Set says so.
func (c *Cache) Set(it *Item, b []byte, v any) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used -= int64(len(it.buf))
	it.buf = nil
	if !c.makeRoom(int64(len(b))) {
		c.remove(it)
		c.st.Refused++
		it.buf, it.val = b, v
		return false
	}
	it.buf, it.val = b, v
	c.used += int64(len(b))
	return true
}

// Uses is the item's count of uses to come (its holders' included).
func (it *Item) Uses() int {
	it.c.mu.Lock()
	defer it.c.mu.Unlock()
	return int(it.meta.Refs)
}

// Value is what Set gave with the item's bytes; valid, like them, until
// Done.
func (it *Item) Value() any { return it.val }

// OnReady calls fn once the item is filled, at once if it is, or with the
// error its load failed with.
func (it *Item) OnReady(fn func(err error)) {
	c := it.c
	c.mu.Lock()
	if it.ready {
		c.mu.Unlock()
		fn(nil)
		return
	}
	if it.gone {
		err := it.err
		c.mu.Unlock()
		fn(err)
		return
	}
	it.waiters = append(it.waiters, fn)
	c.mu.Unlock()
}

// Reserve adds an item of size bytes under key, evicting others to make
// room. refs is its number of uses to come (the caller's own included if
// it will use it); nextUse when it is next wanted (Never if unknown). With
// claim the caller is its reader: the item comes back pinned, for the
// caller to fill and then Done. Without, the item waits for the first Get
// to claim it (a group's coordinator reserves what its jobs will share)
// and Reserve returns nil. It returns nil, false if key is present already
// or no room can be made.
func (c *Cache) Reserve(key Key, size int, refs int, nextUse int64, claim bool) (*Item, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.items[key]; ok {
		return nil, false
	}
	if !c.makeRoom(int64(size)) {
		c.st.Refused++
		return nil, false
	}
	c.clock++
	it := &Item{c: c, key: key, buf: make([]byte, size), hi: -1, claimed: claim,
		meta: Meta{Refs: refs, NextUse: nextUse, LastUse: c.clock, Seq: c.clock}}
	if claim {
		it.pins = 1
	}
	c.items[key] = it
	c.used += int64(size)
	c.st.Inserts++
	if !claim {
		c.settle(it)
		return nil, true
	}
	return it, true
}

// Fill marks a claimed item loaded (err nil) or failed, and calls those
// waiting. A failed item leaves the cache: the next Get misses and its
// caller reads for itself.
func (c *Cache) Fill(it *Item, err error) {
	c.mu.Lock()
	waiters := it.waiters
	it.waiters = nil
	if err != nil {
		it.err = err
		c.remove(it)
	} else {
		it.ready = true
	}
	c.mu.Unlock()
	for _, w := range waiters {
		w(err)
	}
}

// Done unpins an item. used says the holder consumed one of the item's
// uses to come.
func (it *Item) Done(used bool) {
	c := it.c
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clock++
	if used {
		it.meta.Refs--
		it.meta.LastUse = c.clock
	}
	it.pins--
	c.settle(it)
}

// AddRefs changes the uses to come of the item under key by delta
// (negative when a job that was to read it has left) and reports whether
// the item is there.
func (c *Cache) AddRefs(key Key, delta int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	it, ok := c.items[key]
	if !ok {
		return false
	}
	it.meta.Refs += delta
	c.settle(it)
	return true
}

// SetNextUse says when the item under key is next wanted.
func (c *Cache) SetNextUse(key Key, t int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if it, ok := c.items[key]; ok {
		it.meta.NextUse = t
		if it.hi >= 0 {
			heap.Fix(&c.heap, it.hi)
		}
	}
}

// Contains reports whether key is cached and ready, without pinning it.
func (c *Cache) Contains(key Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	it, ok := c.items[key]
	return ok && it.ready
}

// Stats returns the cache's counts.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.st
	s.Items, s.Bytes, s.Budget = len(c.items), c.used, c.opts.Budget
	return s
}

// DropSpace removes every unpinned item of a space (a dataset that
// changed, a transform no job uses any more).
func (c *Cache) DropSpace(space uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, it := range c.items {
		if k.Space == space && it.pins == 0 {
			c.remove(it)
		}
	}
}

func (c *Cache) pin(it *Item) {
	it.pins++
	if it.hi >= 0 {
		heap.Remove(&c.heap, it.hi)
	}
}

// settle puts an item where its state says: dropped when its last use
// came, a candidate for eviction when unpinned, nowhere while pinned.
func (c *Cache) settle(it *Item) {
	if it.gone {
		return
	}
	if !it.claimed && it.meta.Refs <= 0 {
		c.remove(it) // reserved for readers who all left before reading it
		c.dropDecoded(it)
		return
	}
	// Loaded items wait for readers; so do items reserved for readers to
	// come and not claimed yet, which hold no bytes anyone waits for: both
	// may go when room is short. Items being loaded stay.
	if it.pins > 0 || (!it.ready && it.claimed) {
		return
	}
	if c.opts.DropUnreferenced && it.meta.Refs <= 0 {
		c.st.Drops++
		c.remove(it)
		c.dropDecoded(it)
		return
	}
	if it.hi >= 0 {
		heap.Fix(&c.heap, it.hi)
	} else {
		heap.Push(&c.heap, it)
	}
}

// dropDecoded drops the decoded form of a record whose uses have all
// come: at once if no one holds it, else when its holders are done.
func (c *Cache) dropDecoded(it *Item) {
	if it.key.Decoded || !c.opts.DropUnreferenced {
		return
	}
	if d, ok := c.items[it.key.DecodedOf()]; ok {
		d.meta.Refs = 0
		c.settle(d)
	}
}

func (c *Cache) remove(it *Item) {
	if it.gone {
		return
	}
	it.gone = true
	if it.hi >= 0 {
		heap.Remove(&c.heap, it.hi)
	}
	delete(c.items, it.key)
	c.used -= int64(len(it.buf))
}

// makeRoom evicts until size more bytes fit the budget.
func (c *Cache) makeRoom(size int64) bool {
	if size > c.opts.Budget {
		return false
	}
	for c.used+size > c.opts.Budget {
		if c.heap.Len() == 0 {
			return false
		}
		it := heap.Pop(&c.heap).(*Item)
		c.st.Evictions++
		c.remove(it)
	}
	return true
}

type itemHeap struct {
	items  []*Item
	policy Policy
}

func (h itemHeap) Len() int           { return len(h.items) }
func (h itemHeap) Less(i, j int) bool { return h.policy.Evict(&h.items[i].meta, &h.items[j].meta) }
func (h itemHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].hi, h.items[j].hi = i, j
}
func (h *itemHeap) Push(x any) {
	it := x.(*Item)
	it.hi = len(h.items)
	h.items = append(h.items, it)
}
func (h *itemHeap) Pop() any {
	n := len(h.items) - 1
	it := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	it.hi = -1
	return it
}
