package sampler

import (
	"fmt"
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
	// Bounds are the first record id of each block, and N at the end.
	Bounds []int
	Seed   uint64
	Window int

	mu    sync.Mutex
	epoch int
	order []int32 // block ids in this epoch's order
	start []int   // epoch position of each block in that order; N at the end
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

// Blocks is the number of blocks.
func (s *Block) Blocks() int { return len(s.Bounds) - 1 }

func (s *Block) Len() int { return s.Bounds[len(s.Bounds)-1] }

// layout returns the epoch's block order and positions, computed once per
// epoch: O(blocks) memory, not O(records).
func (s *Block) layout(epoch int) ([]int32, []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch == epoch {
		return s.order, s.start
	}
	nb := s.Blocks()
	p := newPerm(uint64(nb), Mix(s.Seed, uint64(epoch)))
	order := make([]int32, nb)
	start := make([]int, nb+1)
	for i := range nb {
		b := int(p.at(uint64(i)))
		order[i] = int32(b)
		start[i+1] = start[i] + s.Bounds[b+1] - s.Bounds[b]
	}
	s.epoch, s.order, s.start = epoch, order, start
	return order, start
}

func (s *Block) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.Len()-pos))
	if n == 0 {
		return 0
	}
	order, start := s.layout(epoch)
	key := Mix(s.Seed^0x5bd1e995, uint64(epoch))
	w := s.Window
	for i := 0; i < n; {
		p := pos + i
		// The window of blocks holding p, and p's rank inside it.
		k := sort.SearchInts(start, p+1) - 1
		wlo := k / w * w
		whi := min(wlo+w, len(order))
		lo, hi := start[wlo], start[whi]
		wp := newPerm(uint64(hi-lo), key^uint64(wlo)*0x9e3779b97f4a7c15)
		for ; i < n && pos+i < hi; i++ {
			r := int(wp.at(uint64(pos + i - lo)))
			// r-th record of the window: find its block.
			j := wlo + sort.SearchInts(start[wlo:whi+1], lo+r+1) - 1
			b := int(order[j])
			dst[i] = s.Bounds[b] + (lo + r - start[j])
		}
	}
	return n
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
	if size <= 0 {
		size = 4096
	}
	if align <= 0 {
		align = 4096
	}
	if maxSpan < size {
		maxSpan = max(16*size, 1<<20)
	}
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
