package cache

import "math"

// Never is the next use of an item no reader is known to want again.
const Never = math.MaxInt64

// Meta is what a Policy may look at to order items for eviction.
type Meta struct {
	Refs    int   // uses still to come, as the item's users declared them
	NextUse int64 // when the item is next wanted, in the owner's units (a position, a tick); Never if unknown
	LastUse int64 // the cache's clock at the item's last use
	Seq     int64 // the cache's clock when the item was added
}

// Policy orders items for eviction: Evict(a, b) says a goes before b.
type Policy interface {
	Evict(a, b *Meta) bool
	Name() string
}

// RefCnt is Joader's rule (joader.txt §3.2): fewest uses still to come
// first; among equals the farthest next use (Belady), then the newest
// (with readers that consume in arrival order, the newest is needed last).
type RefCnt struct{}

func (RefCnt) Name() string { return "refcnt" }

func (RefCnt) Evict(a, b *Meta) bool {
	if a.Refs != b.Refs {
		return a.Refs < b.Refs
	}
	if a.NextUse != b.NextUse {
		return a.NextUse > b.NextUse
	}
	return a.Seq > b.Seq
}

// Belady evicts the item whose next use is farthest away (Belady's MIN),
// optimal for one known future; items never used again go first.
type Belady struct{}

func (Belady) Name() string { return "belady" }

func (Belady) Evict(a, b *Meta) bool {
	if a.NextUse != b.NextUse {
		return a.NextUse > b.NextUse
	}
	return a.Seq < b.Seq
}

// LRU evicts the least recently used item: the general-purpose baseline.
type LRU struct{}

func (LRU) Name() string { return "lru" }

func (LRU) Evict(a, b *Meta) bool {
	if a.LastUse != b.LastUse {
		return a.LastUse < b.LastUse
	}
	return a.Seq < b.Seq
}
