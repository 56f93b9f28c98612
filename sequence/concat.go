package sequence

import (
	"sort"
	"sync"
	"sync/atomic"
)

// concatEvery is how many positions of an epoch's document order one
// running-count checkpoint covers: a sample's first document is a binary
// search of the checkpoints and a scan of fewer than concatEvery
// documents.
const concatEvery = 64

type concat struct {
	c       Corpus
	o       order
	seqLen  int
	padLast bool
	total   int64
	samples int
	tables  *memo[int, *concatTable]
}

// concatTable is one epoch's checkpoints: cum[k] is the tokens before
// position k*concatEvery of the epoch's document order; the last is
// every token.
type concatTable struct {
	cum []int64
	// cut is the documents a sample boundary falls inside, counted once
	// (cutOnce) when Stats first asks: a job's description asks at every
	// check and open, and a pass over the epoch's order each time would
	// cost more than the table.
	cutOnce sync.Once
	cut     int
}

func newConcat(c Corpus, o order, opts Options) *concat {
	s := &concat{c: c, o: o, seqLen: opts.SeqLen, padLast: opts.PadLast}
	for d := range c.Docs() {
		s.total += c.Len(d)
	}
	if s.total >= 2 {
		S := int64(s.seqLen)
		n := (s.total - 1) / S
		if s.padLast {
			n = (s.total - 1 + S - 1) / S
		}
		s.samples = int(n)
	}
	s.tables = newMemo(3, s.table)
	return s
}

func (s *concat) Len(int) int { return s.samples }
func (s *concat) Width() int  { return s.seqLen + 1 }
func (s *concat) SeqLen() int { return s.seqLen }

// table makes epoch's checkpoints in one pass over its document order,
// split between the cores: each part sums its own documents, and the
// parts' sums are then added up in order.
func (s *concat) table(epoch int) *concatTable {
	n := s.o.n
	blocks := (n + concatEvery - 1) / concatEvery
	t := &concatTable{cum: make([]int64, blocks+1)}
	parallel(blocks, func(lo, hi int) {
		var ids [concatEvery]int
		for k := lo; k < hi; k++ {
			m := s.o.fill(epoch, k*concatEvery, ids[:])
			sum := int64(0)
			for _, d := range ids[:m] {
				sum += s.c.Len(d)
			}
			t.cum[k+1] = sum
		}
	})
	for k := range blocks {
		t.cum[k+1] += t.cum[k]
	}
	return t
}

// cut counts the documents of epoch a sample boundary (a multiple of
// SeqLen) falls strictly inside: one more pass, made only when Stats are
// asked for, split between the cores as the table is (each part starts at
// its first checkpoint's count). The multiples of SeqLen inside the stream
// are exactly the samples' starts and the last sample's shared token.
func (s *concat) cut(epoch int) int {
	t := s.tables.get(epoch)
	t.cutOnce.Do(func() {
		S := int64(s.seqLen)
		var total atomic.Int64
		parallel(len(t.cum)-1, func(lo, hi int) {
			var ids [concatEvery]int
			cut := 0
			for k := lo; k < hi; k++ {
				acc := t.cum[k]
				m := s.o.fill(epoch, k*concatEvery, ids[:])
				for _, d := range ids[:m] {
					l := s.c.Len(d)
					if b := (acc/S + 1) * S; b < acc+l {
						cut++
					}
					acc += l
				}
			}
			total.Add(int64(cut))
		})
		t.cut = int(total.Load())
	})
	return t.cut
}

func (s *concat) Sample(epoch, i int, dst []Piece) ([]Piece, error) {
	if i < 0 || i >= s.samples {
		return dst, outside(epoch, i, s.samples)
	}
	t := s.tables.get(epoch)
	p := int64(i) * int64(s.seqLen)
	end := min(p+int64(s.seqLen)+1, s.total)
	k := sort.Search(len(t.cum), func(k int) bool { return t.cum[k] > p }) - 1
	acc := t.cum[k]
	var ids [concatEvery]int
	for pos := k * concatEvery; pos < s.o.n && acc < end; pos += concatEvery {
		m := s.o.fill(epoch, pos, ids[:])
		for _, d := range ids[:m] {
			l := s.c.Len(d)
			if acc+l > p {
				from, to := max(p, acc), min(acc+l, end)
				dst = append(dst, Piece{Doc: d, Off: from - acc, Len: int(to - from)})
			}
			acc += l
			if acc >= end {
				break
			}
		}
	}
	return dst, nil
}

func (s *concat) Stats(epoch int) Stats {
	S := int64(s.seqLen)
	st := Stats{Samples: s.samples, SeqLen: s.seqLen, Docs: s.o.n, Tokens: s.total, Cut: s.cut(epoch)}
	if s.samples == 0 {
		st.Dropped = s.total
		return st
	}
	st.Dropped = s.total - min(s.total, int64(s.samples)*S+1)
	if r := s.total - int64(s.samples-1)*S; r < S {
		st.Padding = S - r
	}
	return st
}
