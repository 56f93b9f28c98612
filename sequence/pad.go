package sequence

// pad is one document a sample, its first SeqLen+1 tokens at most.
type pad struct {
	c      Corpus
	o      order
	seqLen int
	stats  Stats
}

func newPad(c Corpus, o order, opts Options) *pad {
	s := &pad{c: c, o: o, seqLen: opts.SeqLen}
	S := int64(opts.SeqLen)
	st := Stats{Samples: o.n, SeqLen: opts.SeqLen, Docs: o.n}
	for d := range o.n {
		l := c.Len(d)
		st.Tokens += l
		st.Padding += S - min(l, S)
		if l > S+1 {
			st.Dropped += l - S - 1
			st.Cut++
		}
	}
	s.stats = st
	return s
}

func (s *pad) Len(int) int           { return s.o.n }
func (s *pad) Width() int            { return s.seqLen + 1 }
func (s *pad) SeqLen() int           { return s.seqLen }
func (s *pad) Stats(epoch int) Stats { return s.stats }

func (s *pad) Sample(epoch, i int, dst []Piece) ([]Piece, error) {
	if i < 0 || i >= s.o.n {
		return dst, outside(epoch, i, s.o.n)
	}
	d := s.o.at(epoch, i)
	return append(dst, Piece{Doc: d, Len: int(min(s.c.Len(d), int64(s.seqLen)+1))}), nil
}
