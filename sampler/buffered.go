package sampler

import (
	"slices"
)

// Buffered is a shuffle in a buffer's memory whose place is computable:
// file order is cut into windows of Buffer records, the first at an
// offset drawn each epoch in [0, Buffer), and each window comes in a
// uniform order of its own (a keyed permutation, as Global's). So the id
// at any position is a function of (seed, epoch, position), a state is
// the position alone, and a resume on any topology starts at once, with
// no replay. Buffer 1 is the sequential order; Buffer >= N is a full
// shuffle (one window, no offset).
//
// Records enter memory in file order, so storage sees one sequential
// stream: stage s is the Chunk records [s*Chunk, (s+1)*Chunk), read with
// large reads, and a window's records are drawn from memory once the
// window is loaded, as tf.data's shuffle buffer draws from its buffer.
//
// What the computable place costs in randomness: tf.data's buffer (this
// sampler before) draws each output uniformly from Buffer records, log2
// Buffer bits an output; a window permutes its records uniformly, log2
// Buffer! / Buffer bits an output, about log2 Buffer - 1.44 (Stirling),
// plus log2 Buffer bits of offset an epoch. With Buffer 1,024 over 100,000
// records the randomization level is 56% where tf.data's buffer gives 66%
// (BENCHMARKS.md), the price of resuming without replay. A record moves at
// most Buffer-1 places from its file position, as most do in tf.data's.
type Buffered struct {
	N, Buffer int
	Seed      uint64
	// Chunk is how many records of file order one stage loads; default 1024.
	Chunk int
}

func (s *Buffered) Len() int { return s.N }

func (s *Buffered) chunk() int {
	if s.Chunk > 0 {
		return s.Chunk
	}
	return 1024
}

func (s *Buffered) buffer() int { return max(1, s.Buffer) }

// window is the window holding position (and id) p of epoch: its first
// position and its length.
func (s *Buffered) window(epoch, p int) (start, n int) {
	b := s.buffer()
	off := 0
	if b < s.N { // a buffer of every record is one window: a full shuffle
		off = int(Mix(s.Seed, uint64(epoch)) % uint64(b))
	}
	if p < off {
		return 0, min(off, s.N)
	}
	start = off + (p-off)/b*b
	return start, min(b, s.N-start)
}

func (s *Buffered) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.N-pos))
	key := Mix(s.Seed, uint64(epoch))
	for i := 0; i < n; {
		start, w := s.window(epoch, pos+i)
		p := newPerm(uint64(w), Mix(key, uint64(start)+1))
		for ; i < n && pos+i < start+w; i++ {
			dst[i] = start + int(p.at(uint64(pos+i-start)))
		}
	}
	return n
}

// Windows are the epoch's windows' starts, and N at the end: for RL.
func (s *Buffered) Windows(epoch int) []int {
	out := []int{0}
	for p := 0; p < s.N; {
		start, n := s.window(epoch, p)
		if start > out[len(out)-1] {
			out = append(out, start)
		}
		p = start + n
	}
	return append(slices.Clip(out), s.N)
}

// Stage s loads records [s*Chunk, (s+1)*Chunk) of file order.
func (s *Buffered) Stage(epoch, st int) ([]int, bool) {
	c := s.chunk()
	if st < 0 || st*c >= s.N {
		return nil, false
	}
	ids := make([]int, min(c, s.N-st*c))
	for i := range ids {
		ids[i] = st*c + i
	}
	return ids, true
}

// StageOf: the output at pos needs its window loaded whole.
func (s *Buffered) StageOf(epoch, pos int) int {
	start, n := s.window(epoch, min(pos, s.N-1))
	return (start + n - 1) / s.chunk()
}
