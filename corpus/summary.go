package corpus

import "math/bits"

// Summary is what riffle inspect shows of a corpus.
type Summary struct {
	Docs     int
	Tokens   int64
	Dtype    Dtype
	Shortest int64
	Longest  int64
	// Histogram counts documents by length in powers of two: bucket b
	// holds lengths from 2^(b-1) to 2^b-1 (bucket 0: none, as no document
	// is empty).
	Histogram [64]int
}

// Mean is the mean document length.
func (s Summary) Mean() float64 { return float64(s.Tokens) / float64(max(1, s.Docs)) }

// Summarize describes c's documents: one pass over their lengths. A flat
// corpus's documents are its files.
func (c *Corpus) Summarize() Summary {
	s := Summary{Docs: c.Docs(), Tokens: c.Tokens(), Dtype: c.Dtype(), Shortest: c.Len(0)}
	for d := range c.Docs() {
		n := c.Len(d)
		s.Histogram[bits.Len64(uint64(n))]++
		s.Shortest, s.Longest = min(s.Shortest, n), max(s.Longest, n)
	}
	return s
}
