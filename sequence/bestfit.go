package sequence

import (
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
)

// KeptWindows is how many windows best_fit keeps packed: an order that
// takes its samples from at most this many windows at once packs each
// once (Windows).
const KeptWindows = 8

// bestFit packs each window of the epoch's document order by best-fit
// decreasing (doc.go).
type bestFit struct {
	c       Corpus
	o       order
	seqLen  int
	window  int
	tables  *memo[int, *fitTable]
	windows *memo[[2]int, *packing]
	packers sync.Pool
	// packed counts the windows packed again on demand (Sample).
	packed atomic.Int64
}

// fitTable is one epoch's windows: starts[w] is the first sample of
// window w; the last is the epoch's samples.
type fitTable struct {
	starts []int
	stats  Stats
}

// packing is one window's bins: bin b holds pieces[bins[b]:bins[b+1]].
type packing struct {
	pieces []Piece
	bins   []int32
}

func newBestFit(c Corpus, o order, opts Options) *bestFit {
	s := &bestFit{c: c, o: o, seqLen: opts.SeqLen, window: opts.Window}
	s.packers.New = func() any { return newPacker(opts.SeqLen) }
	s.tables = newMemo(3, s.table)
	s.windows = newMemo(KeptWindows, func(k [2]int) *packing {
		s.packed.Add(1)
		p := s.packers.Get().(*packer)
		defer s.packers.Put(p)
		s.pack(p, k[0], k[1])
		return &packing{pieces: slices.Clone(p.out), bins: slices.Clone(p.starts)}
	})
	return s
}

func (s *bestFit) windowsOf() int { return (s.o.n + s.window - 1) / s.window }

// table packs every window of epoch once, keeping its bin count; the
// windows are split between the cores.
func (s *bestFit) table(epoch int) *fitTable {
	nw := s.windowsOf()
	t := &fitTable{starts: make([]int, nw+1)}
	type part struct {
		tokens, padding int64
		cut             int
	}
	var mu sync.Mutex
	var sum part
	parallel(nw, func(lo, hi int) {
		p := s.packers.Get().(*packer)
		defer s.packers.Put(p)
		var my part
		for w := lo; w < hi; w++ {
			s.pack(p, epoch, w)
			bins := len(p.starts) - 1
			t.starts[w+1] = bins
			my.tokens += p.tokens
			my.padding += int64(bins)*int64(s.seqLen) - p.tokens
			my.cut += p.split
		}
		mu.Lock()
		sum.tokens, sum.padding, sum.cut = sum.tokens+my.tokens, sum.padding+my.padding, sum.cut+my.cut
		mu.Unlock()
	})
	for w := range nw {
		t.starts[w+1] += t.starts[w]
	}
	t.stats = Stats{SeqLen: s.seqLen, Docs: s.o.n, Samples: t.starts[nw], Tokens: sum.tokens, Padding: sum.padding, Cut: sum.cut}
	return t
}

func (s *bestFit) Len(epoch int) int { return s.tables.get(epoch).stats.Samples }

// Windows are epoch's windows as runs of its samples: the first sample of
// each window, then the epoch's samples. An order that takes a window's
// samples together packs it once (sampler.NewBlock over them); one that
// takes them anywhere packs a window again for nearly every sample.
func (s *bestFit) Windows(epoch int) []int {
	t := s.tables.get(epoch)
	out := make([]int, 0, len(t.starts))
	for i, v := range t.starts {
		if i == 0 || v > out[len(out)-1] {
			out = append(out, v)
		}
	}
	return out
}
func (s *bestFit) Width() int            { return s.seqLen }
func (s *bestFit) SeqLen() int           { return s.seqLen }
func (s *bestFit) Stats(epoch int) Stats { return s.tables.get(epoch).stats }

func (s *bestFit) Sample(epoch, i int, dst []Piece) ([]Piece, error) {
	t := s.tables.get(epoch)
	if i < 0 || i >= t.stats.Samples {
		return dst, outside(epoch, i, t.stats.Samples)
	}
	w := sort.Search(len(t.starts), func(w int) bool { return t.starts[w] > i }) - 1
	pk := s.windows.get([2]int{epoch, w})
	b := i - t.starts[w]
	return append(dst, pk.pieces[pk.bins[b]:pk.bins[b+1]]...), nil
}

// pack packs window w of epoch into p.out and p.starts.
func (s *bestFit) pack(p *packer, epoch, w int) {
	lo := w * s.window
	n := min(s.window, s.o.n-lo)
	p.ids = slices.Grow(p.ids[:0], n)[:n]
	s.o.fill(epoch, lo, p.ids)
	p.items = p.items[:0]
	p.tokens, p.split = 0, 0
	S := int64(s.seqLen)
	for j, d := range p.ids {
		l := s.c.Len(d)
		p.tokens += l
		if l > S {
			p.split++
		}
		for off := int64(0); off < l; off += S {
			p.items = append(p.items, item{pos: int32(j), doc: d, off: off, len: int32(min(S, l-off))})
		}
	}
	// Longest first, ties in window order: the pieces were appended in
	// (pos, off) order, so a key of the length's complement above the
	// piece's index sorts them so, as plain integers (a third of the
	// table's time went to a comparison function's calls).
	p.keys = slices.Grow(p.keys[:0], len(p.items))[:len(p.items)]
	for j, it := range p.items {
		p.keys[j] = uint64(math.MaxUint32-uint32(it.len))<<32 | uint64(j)
	}
	slices.Sort(p.keys)
	p.sorted = slices.Grow(p.sorted[:0], len(p.items))[:len(p.items)]
	for j, k := range p.keys {
		p.sorted[j] = p.items[uint32(k)]
	}
	p.items, p.sorted = p.sorted, p.items
	p.place()
}

// item is a piece of a document in a window: pos is its document's
// place in the window.
type item struct {
	pos int32
	len int32
	doc int
	off int64
	bin int32
}

// packer places a window's pieces: a tree over room sizes (a count of
// open bins at each room, summed up a binary tree) finds the least room
// that holds a piece in O(log S), and each room keeps a stack of its bins.
// Its buffers are reused window after window.
type packer struct {
	seqLen int
	leaves int     // a power of two above seqLen
	count  []int32 // the tree: count[leaves+r] is the open bins of room r
	head   []int32 // head[r]: the bin that came to room r last, or -1
	next   []int32 // next[b]: the bin below b in its room's stack
	room   []int32 // room[b]
	ids    []int
	items  []item
	keys   []uint64 // pack's sort keys
	sorted []item   // pack's items in order, swapped with items
	out    []Piece
	starts []int32
	fill   []int32
	tokens int64
	split  int
}

func newPacker(seqLen int) *packer {
	leaves := 1
	for leaves <= seqLen {
		leaves *= 2
	}
	p := &packer{seqLen: seqLen, leaves: leaves, count: make([]int32, 2*leaves), head: make([]int32, seqLen+1)}
	for r := range p.head {
		p.head[r] = -1
	}
	return p
}

func (p *packer) add(r int, delta int32) {
	for i := p.leaves + r; i > 0; i /= 2 {
		p.count[i] += delta
	}
}

// least returns the least room at or above lo with an open bin, or -1.
func (p *packer) least(lo int) int {
	i := p.leaves + lo
	if p.count[i] > 0 {
		return lo
	}
	for ; i > 1; i /= 2 {
		if i%2 == 0 && p.count[i+1] > 0 {
			i++
			for i < p.leaves {
				if p.count[2*i] > 0 {
					i = 2 * i
				} else {
					i = 2*i + 1
				}
			}
			return i - p.leaves
		}
	}
	return -1
}

// place puts the sorted items in bins, then lists the bins' pieces.
func (p *packer) place() {
	p.room, p.next = p.room[:0], p.next[:0]
	for k := range p.items {
		it := &p.items[k]
		l := int(it.len)
		b := int32(-1)
		if r := p.least(l); r >= 0 {
			b = p.head[r]
			p.head[r] = p.next[b]
			p.add(r, -1)
		} else {
			b = int32(len(p.room))
			p.room = append(p.room, int32(p.seqLen))
			p.next = append(p.next, -1)
		}
		it.bin = b
		r := int(p.room[b]) - l
		p.room[b] = int32(r)
		if r > 0 {
			p.next[b] = p.head[r]
			p.head[r] = b
			p.add(r, 1)
		}
	}
	// Clear the rooms left for the next window.
	for _, r := range p.room {
		if r > 0 {
			p.head[r] = -1
			p.add(int(r), -1)
		}
	}
	// The bins' pieces, bin by bin in the order they were opened, each
	// bin's in the order they were placed: a counting sort by bin.
	bins := len(p.room)
	p.starts = slices.Grow(p.starts[:0], bins+1)[:bins+1]
	clear(p.starts)
	for _, it := range p.items {
		p.starts[it.bin+1]++
	}
	for b := range bins {
		p.starts[b+1] += p.starts[b]
	}
	p.out = slices.Grow(p.out[:0], len(p.items))[:len(p.items)]
	p.fill = append(p.fill[:0], p.starts[:bins]...) // where each bin's next piece goes
	for _, it := range p.items {
		p.out[p.fill[it.bin]] = Piece{Doc: it.doc, Off: it.off, Len: int(it.len)}
		p.fill[it.bin]++
	}
}
