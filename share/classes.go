package share

import "math/rand/v2"

// classes groups the records 0..n-1 by signature: the set of jobs (one bit
// each) that still need them this epoch. Each class keeps its records in a
// dense list, and each record its class and place in the list, so a
// record moves between classes, or is drawn uniformly from a class, in
// O(1).
type classes struct {
	cls   []int32 // record -> its class
	pos   []int32 // record -> its place in its class's list
	list  []class
	bySig map[uint64]int32
}

type class struct {
	sig uint64
	ids []int32
}

func newClasses(n int) *classes {
	c := &classes{cls: make([]int32, n), pos: make([]int32, n), bySig: map[uint64]int32{0: 0}}
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32(i)
		c.pos[i] = int32(i)
	}
	c.list = []class{{sig: 0, ids: ids}}
	return c
}

// sig returns record e's signature.
func (c *classes) sig(e int) uint64 { return c.list[c.cls[e]].sig }

// class returns the index of the class of sig, making it if need be.
func (c *classes) class(sig uint64) int32 {
	if k, ok := c.bySig[sig]; ok {
		return k
	}
	c.list = append(c.list, class{sig: sig})
	k := int32(len(c.list) - 1)
	c.bySig[sig] = k
	return k
}

// move gives record e the signature sig.
func (c *classes) move(e int, sig uint64) {
	old := c.cls[e]
	if c.list[old].sig == sig {
		return
	}
	// Swap e out of its old list.
	ids := c.list[old].ids
	p := c.pos[e]
	last := ids[len(ids)-1]
	ids[p] = last
	c.pos[last] = p
	c.list[old].ids = ids[:len(ids)-1]
	k := c.class(sig)
	c.cls[e] = k
	c.pos[e] = int32(len(c.list[k].ids))
	c.list[k].ids = append(c.list[k].ids, int32(e))
}

// count returns how many records have signatures that pass keep.
func (c *classes) count(keep func(sig uint64) bool) int {
	n := 0
	for i := range c.list {
		if len(c.list[i].ids) > 0 && keep(c.list[i].sig) {
			n += len(c.list[i].ids)
		}
	}
	return n
}

// pick draws a record uniformly among those whose signatures pass keep;
// total is their count. It returns -1 if there are none.
func (c *classes) pick(rng *rand.Rand, total int, keep func(sig uint64) bool) int {
	if total <= 0 {
		return -1
	}
	r := rng.IntN(total)
	for i := range c.list {
		ids := c.list[i].ids
		if len(ids) == 0 || !keep(c.list[i].sig) {
			continue
		}
		if r < len(ids) {
			return int(ids[r])
		}
		r -= len(ids)
	}
	return -1
}

// clearBit takes bit b out of every record's signature.
func (c *classes) clearBit(b uint64) {
	for i := 0; i < len(c.list); i++ {
		if c.list[i].sig&b == 0 {
			continue
		}
		for len(c.list[i].ids) > 0 {
			ids := c.list[i].ids
			c.move(int(ids[len(ids)-1]), c.list[i].sig&^b)
		}
	}
	c.compact()
}

// compact forgets empty classes once they are most of the list, so that
// signatures of departed jobs do not slow every round.
func (c *classes) compact() {
	empty := 0
	for i := range c.list {
		if len(c.list[i].ids) == 0 && c.list[i].sig != 0 {
			empty++
		}
	}
	if empty < 16 || empty < len(c.list)/2 {
		return
	}
	var keep []class
	c.bySig = map[uint64]int32{}
	for _, cl := range c.list {
		if len(cl.ids) == 0 && cl.sig != 0 {
			continue
		}
		k := int32(len(keep))
		keep = append(keep, cl)
		c.bySig[cl.sig] = k
		for _, e := range cl.ids {
			c.cls[e] = k
		}
	}
	c.list = keep
}
