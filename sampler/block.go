package sampler

import (
	"fmt"
	"math"
	"sort"
	"sync"
)

// Block is the block-aware global shuffle: LIRS's page-aware random
// shuffling (lirs.txt §4.1) and FFCV's quasi-random order. Records smaller
// than a block are grouped into blocks of consecutive records; each epoch
// shuffles the blocks (a keyed permutation, as Global does for records) and
// the records inside each block, so a batch holds whole blocks and each
// block costs one read.
//
// LIRS groups records by page and leaves one waste: a record that straddles
// a page edge puts that page in two groups, read twice (§5.2.3). Here a block
// ends only where a record ends on an alignment boundary (BlockBounds), so
// no page belongs to two blocks and none is read twice.
//
// With Window > 1 the records of Window consecutive blocks of the shuffled
// order are permuted among themselves, spreading each block over Window
// batches to win back randomness; the Window batches are read close together
// in time (Prefetch >= Window), so the page cache serves the shared pages.
type Block struct {
	// Bounds are the first record id of each block, and N at the end;
	// nil when Regular says where the blocks are.
	Bounds []int
	// Regular, if set instead of Bounds, is a cut worked out rather than
	// listed: a fixed-size file's, whose epoch's layout is then computed
	// per position, so a resume into a 10^9-record file lists nothing.
	Regular *Regular
	Seed    uint64
	Window  int

	mu    sync.Mutex
	epoch int
	lay   epochLayout
}

// Regular cuts N records into a first block of First records (those
// before the first page edge), then blocks of Every, the last holding
// what is left.
type Regular struct{ N, First, Every int }

func (r Regular) blocks() int {
	if r.N <= r.First {
		return 1
	}
	return 1 + (r.N-r.First+r.Every-1)/r.Every
}

func (r Regular) bound(b int) int {
	if b == 0 {
		return 0
	}
	return min(r.N, r.First+(b-1)*r.Every)
}

// NewBlock checks bounds: strictly increasing from 0.
func NewBlock(bounds []int, seed uint64, window int) (*Block, error) {
	if len(bounds) < 2 || bounds[0] != 0 {
		return nil, fmt.Errorf("block bounds must start at 0 and hold at least one block")
	}
	for i := 1; i < len(bounds); i++ {
		if bounds[i] <= bounds[i-1] {
			return nil, fmt.Errorf("block bounds not increasing at %d", i)
		}
	}
	return &Block{Bounds: bounds, Seed: seed, Window: max(1, window), epoch: -1}, nil
}

// NewRegularBlock is NewBlock over a regular cut.
func NewRegularBlock(r Regular, seed uint64, window int) (*Block, error) {
	if r.N < 1 || r.First < 1 || r.Every < 1 {
		return nil, fmt.Errorf("a regular cut of %d records into a first block of %d and blocks of %d", r.N, r.First, r.Every)
	}
	return &Block{Regular: &r, Seed: seed, Window: max(1, window), epoch: -1}, nil
}

// Blocks is the number of blocks.
func (s *Block) Blocks() int {
	if s.Regular != nil {
		return s.Regular.blocks()
	}
	return len(s.Bounds) - 1
}

// Bound is block b's first record (b = Blocks(): N).
func (s *Block) Bound(b int) int {
	if s.Regular != nil {
		return s.Regular.bound(b)
	}
	return s.Bounds[b]
}

func (s *Block) Len() int { return s.Bound(s.Blocks()) }

// WindowOf is the window of blocks holding position pos of epoch: its
// first position, and the position after its last. Its records are
// permuted among themselves and no others.
func (s *Block) WindowOf(epoch, pos int) (lo, hi int) {
	l := s.layout(epoch)
	k := l.find(pos)
	wlo := k / s.Window * s.Window
	return l.start(wlo), l.start(min(wlo+s.Window, s.Blocks()))
}

// BlockOf is the block record id is in.
func (s *Block) BlockOf(id int) int {
	if r := s.Regular; r != nil {
		if id < r.First {
			return 0
		}
		return min(r.blocks()-1, 1+(id-r.First)/r.Every)
	}
	return sort.SearchInts(s.Bounds, id+1) - 1
}

// epochLayout is an epoch's blocks in order: which block is at order
// index i, the epoch position it starts at (start(Blocks()) = N), and
// the order index holding a position.
type epochLayout interface {
	at(i int) int
	start(i int) int
	find(p int) int
}

// listed is a layout of listed bounds: O(blocks) memory, made once per
// epoch.
type listed struct {
	order []int32
	pos   []int
}

func (l *listed) at(i int) int    { return int(l.order[i]) }
func (l *listed) start(i int) int { return l.pos[i] }
func (l *listed) find(p int) int  { return sort.SearchInts(l.pos, p+1) - 1 }

// computed is a regular cut's layout: every block has Every records but
// the first and the last, so a block's start is its order index times
// Every, less what the odd blocks before it lack.
type computed struct {
	r        Regular
	p        perm
	nb       int
	firstAt  int // order index of block 0
	lastAt   int // order index of the last block
	firstLag int // Every less block 0's records
	lastLag  int // Every less the last block's
}

func (l *computed) at(i int) int { return int(l.p.at(uint64(i))) }

func (l *computed) start(i int) int {
	if i >= l.nb {
		return l.r.N
	}
	v := i * l.r.Every
	if i > l.firstAt {
		v -= l.firstLag
	}
	if i > l.lastAt {
		v -= l.lastLag
	}
	return v
}

func (l *computed) find(p int) int {
	// The last order index starting at or before p.
	return sort.Search(l.nb, func(i int) bool { return l.start(i) > p }) - 1
}

// layout returns the epoch's layout, made once per epoch.
func (s *Block) layout(epoch int) epochLayout {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch == epoch {
		return s.lay
	}
	nb := s.Blocks()
	p := newPerm(uint64(nb), Mix(s.Seed, uint64(epoch)))
	if r := s.Regular; r != nil {
		last := nb - 1
		s.lay = &computed{r: *r, p: p, nb: nb, firstAt: int(p.inv(0)), lastAt: int(p.inv(uint64(last))),
			firstLag: r.Every - (r.bound(1) - r.bound(0)), lastLag: r.Every - (r.bound(nb) - r.bound(last))}
		if nb == 1 {
			s.lay.(*computed).firstLag, s.lay.(*computed).lastLag = 0, 0
		}
	} else {
		l := &listed{order: make([]int32, nb), pos: make([]int, nb+1)}
		for i := range nb {
			b := int(p.at(uint64(i)))
			l.order[i] = int32(b)
			l.pos[i+1] = l.pos[i] + s.Bounds[b+1] - s.Bounds[b]
		}
		s.lay = l
	}
	s.epoch = epoch
	return s.lay
}

func (s *Block) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.Len()-pos))
	if n == 0 {
		return 0
	}
	l := s.layout(epoch)
	nb := s.Blocks()
	key := Mix(s.Seed^0x5bd1e995, uint64(epoch))
	w := s.Window
	for i := 0; i < n; {
		p := pos + i
		// The window of blocks holding p, and p's rank inside it.
		k := l.find(p)
		wlo := k / w * w
		whi := min(wlo+w, nb)
		lo, hi := l.start(wlo), l.start(whi)
		wp := newPerm(uint64(hi-lo), key^uint64(wlo)*0x9e3779b97f4a7c15)
		for ; i < n && pos+i < hi; i++ {
			r := int(wp.at(uint64(pos + i - lo)))
			// r-th record of the window: find its block among the window's.
			j := wlo + sort.Search(whi-wlo, func(x int) bool { return l.start(wlo+x) > lo+r }) - 1
			dst[i] = s.Bound(l.at(j)) + (lo + r - l.start(j))
		}
	}
	return n
}

// blockDefaults fills in BlockBounds' defaults: 4 KiB blocks on 4 KiB
// pages, and a span of 16 blocks or 1 MiB.
func blockDefaults(size, align, maxSpan int) (int, int, int) {
	if size <= 0 {
		size = 4096
	}
	if align <= 0 {
		align = 4096
	}
	if maxSpan < size {
		maxSpan = max(16*size, 1<<20)
	}
	return size, align, maxSpan
}

// fixedBlock is how many records of rs bytes a block starting at offset
// start holds: enough for size bytes, then up to a page edge or maxSpan
// (and at most limit); edge says it ends on a page edge.
func fixedBlock(start int64, rs, size, align, maxSpan int, limit int64) (k int64, edge bool) {
	r, a := int64(rs), int64(align)
	k = int64((size + rs - 1) / rs)
	for k < limit && (start+k*r)%a != 0 && k*r < int64(maxSpan) {
		k++
	}
	return k, (start+k*r)%a == 0
}

// BlockBounds groups records 0..n-1 into blocks for Block. A block holds
// consecutive records of one object and grows until it spans at least size
// bytes; it ends only where a record ends on a multiple of align (the page),
// so that no page is shared by two blocks. If no such end comes within
// maxSpan bytes (default 1 MiB or 16 blocks; a record size like 4097 aligns
// only every 16 MiB), the block ends at the next record end anyway and that
// one page is shared. locate returns a record's
// object, offset and length.
func BlockBounds(n int, locate func(id int) (obj int, off int64, length int), size, align int, maxSpan int) []int {
	size, align, maxSpan = blockDefaults(size, align, maxSpan)
	bounds := []int{0}
	if n == 0 {
		return bounds
	}
	obj, start, _ := locate(0)
	for id := 0; id < n; id++ {
		o, off, l := locate(id)
		if o != obj { // a new object starts a new block
			if bounds[len(bounds)-1] != id {
				bounds = append(bounds, id)
			}
			obj, start = o, off
		}
		end := off + int64(l)
		span := end - start
		if id+1 < n && span >= int64(size) && (end%int64(align) == 0 || span >= int64(maxSpan)) {
			bounds = append(bounds, id+1)
			_, start, _ = locate(id + 1)
		}
	}
	return append(bounds, n)
}

// FixedBlockBounds is BlockBounds for records of one size, rs bytes: a
// block's end is worked out from its start, not found by locating every
// record, so a dataset of 10^9 records is cut in the blocks' count of
// steps (when its records fall on page edges), not in 10^9. Records of
// an object are consecutive ids, as in every dataset.
func FixedBlockBounds(n, rs int, locate func(id int) (obj int, off int64, length int), size, align int, maxSpan int) []int {
	size, align, maxSpan = blockDefaults(size, align, maxSpan)
	bounds := []int{0}
	if n == 0 {
		return bounds
	}
	r := int64(rs)
	for id := 0; id < n; {
		obj, start, _ := locate(id)
		end := objectEnd(n, id, obj, locate)
		if bounds[len(bounds)-1] != id {
			bounds = append(bounds, id) // a new object starts a new block
		}
		for s := id; s < end; {
			k, _ := fixedBlock(start, rs, size, align, maxSpan, int64(end-s))
			e := int(min(int64(s)+k, int64(end)))
			if e < n && bounds[len(bounds)-1] != e {
				bounds = append(bounds, e)
			}
			start += int64(e-s) * r
			s = e
		}
		id = end
	}
	if bounds[len(bounds)-1] != n {
		bounds = append(bounds, n)
	}
	return bounds
}

// objectEnd is the first id after id whose object is not obj (n if none):
// galloping, then a binary search.
func objectEnd(n, id, obj int, locate func(id int) (int, int64, int)) int {
	lo, step := id, 1
	for {
		hi := lo + step
		if hi >= n {
			hi = n
		} else if o, _, _ := locate(hi); o == obj {
			lo, step = hi, step*2
			continue
		}
		// locate(lo) is obj; hi is n or another object's.
		for lo+1 < hi {
			mid := lo + (hi-lo)/2
			if o, _, _ := locate(mid); o == obj {
				lo = mid
			} else {
				hi = mid
			}
		}
		return hi
	}
}

// RegularCut is BlockBounds' cut of one object of fixed-size records, rs
// bytes, when it is regular: the first block ends on a page edge, and so
// does every block of Every records after it. ok is false otherwise (the
// records do not meet page edges within maxSpan, or there are several
// objects): list the bounds then.
func RegularCut(n, rs int, locate func(id int) (obj int, off int64, length int), size, align int, maxSpan int) (Regular, bool) {
	size, align, maxSpan = blockDefaults(size, align, maxSpan)
	if n < 1 {
		return Regular{}, false
	}
	first, off0, _ := locate(0)
	if last, _, _ := locate(n - 1); last != first {
		return Regular{}, false
	}
	k0, ok0 := fixedBlock(off0, rs, size, align, maxSpan, math.MaxInt64)
	if k0 >= int64(n) {
		return Regular{N: n, First: n, Every: n}, true
	}
	every, ok := fixedBlock(0, rs, size, align, maxSpan, math.MaxInt64)
	if !ok0 || !ok {
		return Regular{}, false
	}
	return Regular{N: n, First: int(k0), Every: int(every)}, true
}
