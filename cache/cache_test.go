package cache

import (
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// naiveVictim is the reference for eviction: scan every ready, unpinned
// item and take the one the policy puts first.
func naiveVictim(c *Cache) Key {
	var best *Item
	for _, it := range c.items {
		if !it.ready || it.pins > 0 {
			continue
		}
		if best == nil || c.opts.Policy.Evict(&it.meta, &best.meta) {
			best = it
		}
	}
	if best == nil {
		return Key{ID: -1}
	}
	return best.key
}

// Random operations: the budget always holds, each eviction takes the
// item a scan of all items would, a failed load leaves nothing behind and
// an item whose last use came is dropped at once (with DropUnreferenced).
func TestCacheAgainstReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		policy := rapid.SampledFrom([]Policy{RefCnt{}, Belady{}, LRU{}}).Draw(t, "policy")
		drop := rapid.Bool().Draw(t, "drop")
		c := New(Options{Budget: int64(rapid.IntRange(100, 5000).Draw(t, "budget")), Policy: policy, DropUnreferenced: drop})
		var pinned []*Item
		for range rapid.IntRange(1, 300).Draw(t, "steps") {
			key := Key{Space: 1, ID: int64(rapid.IntRange(0, 40).Draw(t, "id"))}
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1: // reserve and fill
				victim := naiveVictim(c)
				before := c.Stats().Evictions
				size := rapid.IntRange(1, 900).Draw(t, "size")
				it, ok := c.Reserve(key, size, rapid.IntRange(0, 4).Draw(t, "refs"), int64(rapid.IntRange(0, 100).Draw(t, "next")), true)
				if after := c.Stats().Evictions; after > before && victim.ID >= 0 {
					if _, still := c.items[victim]; still {
						t.Fatalf("evicted others but kept %v, the policy's first victim", victim)
					}
				}
				if !ok {
					continue
				}
				if rapid.Bool().Draw(t, "fail") {
					c.Fill(it, errors.New("boom"))
					it.Done(false)
					if _, st := c.Get(key); st != Miss {
						t.Fatal("a failed item is still there")
					}
					continue
				}
				c.Fill(it, nil)
				it.Done(false)
			case 2: // use
				it, st := c.Get(key)
				if st == Miss {
					continue
				}
				if st != Ready {
					t.Fatalf("status %v of a filled item", st)
				}
				refs := it.meta.Refs
				if rapid.Bool().Draw(t, "hold") {
					pinned = append(pinned, it)
					continue
				}
				it.Done(true)
				if kept, there := c.items[key]; drop && refs <= 1 && there && kept.pins == 0 {
					t.Fatalf("item with no use to come and no holder was kept")
				}
			case 3:
				if len(pinned) > 0 {
					pinned[0].Done(true)
					pinned = pinned[1:]
				}
			case 4:
				c.AddRefs(key, rapid.IntRange(-2, 2).Draw(t, "delta"))
			}
			if st := c.Stats(); st.Bytes > st.Budget {
				t.Fatalf("%d bytes held, budget %d", st.Bytes, st.Budget)
			}
			var sum int64
			for _, it := range c.items {
				sum += int64(len(it.buf))
			}
			if sum != c.used {
				t.Fatalf("accounting: items hold %d bytes, the cache counts %d", sum, c.used)
			}
		}
	})
}

// A pinned item is never evicted: a reader copying from it is safe.
func TestPinnedStays(t *testing.T) {
	c := New(Options{Budget: 100})
	it, _ := c.Reserve(Key{ID: 1}, 60, 1, Never, true)
	c.Fill(it, nil)
	if _, ok := c.Reserve(Key{ID: 2}, 60, 1, Never, true); ok {
		t.Fatal("made room by evicting a pinned item")
	}
	it.Done(false)
	if _, ok := c.Reserve(Key{ID: 2}, 60, 1, Never, true); !ok {
		t.Fatal("an unpinned item was not evicted for room")
	}
}

// One reader loads an item, the others wait for it; a failure reaches
// them, and an item reserved for readers who all left goes away.
func TestClaimAndWait(t *testing.T) {
	c := New(Options{Budget: 1000, DropUnreferenced: true})
	if _, ok := c.Reserve(Key{ID: 7}, 10, 2, 5, false); !ok {
		t.Fatal("reserve for readers to come")
	}
	a, st := c.Get(Key{ID: 7})
	if st != Claimed {
		t.Fatalf("first Get: %v, want Claimed", st)
	}
	b, st := c.Get(Key{ID: 7})
	if st != Loading {
		t.Fatalf("second Get: %v, want Loading", st)
	}
	var got []byte
	b.OnReady(func(err error) { got = slices.Clone(b.Bytes()) })
	copy(a.Bytes(), "0123456789")
	c.Fill(a, nil)
	a.Done(true)
	b.Done(true)
	if string(got) != "0123456789" {
		t.Fatalf("waiter saw %q", got)
	}
	if c.Stats().Items != 0 {
		t.Fatal("an item used by both its readers is still held")
	}

	c.Reserve(Key{ID: 8}, 10, 2, 5, false)
	x, _ := c.Get(Key{ID: 8})
	y, _ := c.Get(Key{ID: 8})
	var werr error
	y.OnReady(func(err error) { werr = err })
	c.Fill(x, errors.New("disk on fire"))
	x.Done(false)
	y.Done(false)
	if werr == nil || c.Stats().Items != 0 {
		t.Fatalf("failed load: waiter got %v, %d items left", werr, c.Stats().Items)
	}

	c.Reserve(Key{ID: 9}, 10, 2, 5, false)
	c.AddRefs(Key{ID: 9}, -2)
	if c.Stats().Items != 0 || c.Stats().Bytes != 0 {
		t.Fatal("an item every reader gave up on is still held")
	}
}

// RefCnt evicts the item fewest readers still want; among equals, the
// one wanted last.
func TestRefCntOrder(t *testing.T) {
	c := New(Options{Budget: 30, Policy: RefCnt{}})
	for _, x := range []struct {
		id, refs int
		next     int64
	}{{1, 3, 10}, {2, 1, 50}, {3, 1, 20}} {
		it, _ := c.Reserve(Key{ID: int64(x.id)}, 10, x.refs, x.next, true)
		c.Fill(it, nil)
		it.Done(false)
	}
	it, _ := c.Reserve(Key{ID: 4}, 10, 1, 0, true)
	c.Fill(it, nil)
	it.Done(false)
	if c.Contains(Key{ID: 2}) || !c.Contains(Key{ID: 3}) || !c.Contains(Key{ID: 1}) {
		t.Fatal("RefCnt should evict record 2: one reader left, its next use the farthest")
	}
}

// Of readers that miss one key, one claims it and the others wait for its
// fill: a value and its bytes, whose size the filler states.
func TestGetOrClaimFillsOnce(t *testing.T) {
	c := New(Options{Budget: 1 << 10, Policy: LRU{}})
	key := Key{Space: 1, ID: 2}
	first, st := c.GetOrClaim(key)
	if st != Claimed {
		t.Fatalf("first reader: %v, want Claimed", st)
	}
	var got []any
	waiters := 0
	for range 3 {
		it, st := c.GetOrClaim(key)
		if st != Loading {
			t.Fatalf("a later reader: %v, want Loading", st)
		}
		waiters++
		it.OnReady(func(err error) {
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			got = append(got, it.Value())
			it.Done(false)
		})
	}
	if !c.Set(first, make([]byte, 100), "page") {
		t.Fatal("100 bytes did not fit a 1 KiB cache")
	}
	c.Fill(first, nil)
	first.Done(false)
	if len(got) != waiters || got[0] != "page" {
		t.Fatalf("waiters got %v", got)
	}
	if st := c.Stats(); st.Bytes != 100 || st.Items != 1 {
		t.Fatalf("after the fill: %+v", st)
	}
	if it, st := c.GetOrClaim(key); st != Ready || it.Value() != "page" {
		t.Fatalf("a reader after the fill: %v", st)
	} else {
		it.Done(false)
	}
	// Bytes larger than the budget are handed to whoever waits, not kept.
	big, _ := c.GetOrClaim(Key{Space: 1, ID: 3})
	w, st := c.GetOrClaim(Key{Space: 1, ID: 3})
	if st != Loading {
		t.Fatalf("%v", st)
	}
	var v any
	w.OnReady(func(error) { v = w.Value() })
	if c.Set(big, make([]byte, 2<<10), "big") {
		t.Fatal("2 KiB kept in a 1 KiB cache")
	}
	c.Fill(big, nil)
	if v != "big" {
		t.Fatalf("the waiter got %v", v)
	}
	big.Done(false)
	w.Done(false)
	if _, st := c.GetOrClaim(Key{Space: 1, ID: 3}); st != Claimed {
		t.Fatalf("an item not kept is claimed anew, got %v", st)
	}
}

// A record's decoded form goes when the record's last use comes, whatever
// uses its own count still guesses: at once if unpinned, else when its
// holder is done.
func TestDecodedGoesWithItsRecord(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		c := New(Options{Budget: 1 << 20, DropUnreferenced: true})
		rec := Key{Space: 1, ID: 7}
		c.Reserve(rec, 4, 2, Never, false)
		r, st := c.Get(rec)
		if st != Claimed {
			t.Fatalf("record: %v, want Claimed", st)
		}
		r.Put([]byte("abcd"))
		c.Fill(r, nil)
		d, st := c.GetOrClaim(rec.DecodedOf())
		if st != Claimed {
			t.Fatalf("decode: %v, want Claimed", st)
		}
		c.Set(d, []byte("decoded"), nil)
		c.AddRefs(rec.DecodedOf(), 5) // uses that will never come
		c.Fill(d, nil)
		if !pinned {
			d.Done(true)
		}
		r.Done(true)
		c.AddRefs(rec, -1) // the other job leaves
		if c.Contains(rec) {
			t.Fatal("the record outlived its last use")
		}
		if got := c.Contains(rec.DecodedOf()); got != pinned {
			t.Fatalf("pinned %v: decode cached %v after its record's last use", pinned, got)
		}
		if pinned {
			d.Done(true)
		}
		if st := c.Stats(); st.Items != 0 || st.Bytes != 0 {
			t.Fatalf("pinned %v: %d items, %d bytes left", pinned, st.Items, st.Bytes)
		}
	}
}
