// Package tokgen writes large synthetic token corpora in Megatron's
// .bin/.idx layout, for benchmarks: 10^9 tokens in 10^6 documents is
// 2 GB of uint16 tokens and a 20 MB index, made in one sequential pass.
// Every token is a function of its document and place (Token), so a
// reader can check what it read without keeping a copy.
package tokgen

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"

	"github.com/riffle-ml/riffle/corpus"
)

// Spec says what corpus to make.
type Spec struct {
	Docs   int
	Tokens int64
	Vocab  int64 // token ids are below it; default 50257 (GPT-2's)
	Seed   uint64
}

func (s Spec) vocab() int64 {
	if s.Vocab > 0 {
		return s.Vocab
	}
	return 50257
}

// Lengths are the documents' lengths: skewed as text's are (many short
// documents, a long tail, the longest about 15 times the mean), each at
// least 1, summing to exactly s.Tokens.
func Lengths(s Spec) []int64 {
	w := make([]float64, s.Docs)
	sum := 0.0
	x := s.Seed | 1
	for i := range w {
		x = next(x)
		u := float64(x>>11) / (1 << 53)
		u2 := u * u
		u4 := u2 * u2
		u8 := u4 * u4
		w[i] = 0.001 + u8*u8
		sum += w[i]
	}
	out := make([]int64, s.Docs)
	spare := s.Tokens - int64(s.Docs)
	left := spare
	for i := range out {
		k := int64(w[i] / sum * float64(spare))
		out[i] = 1 + k
		left -= k
	}
	for i := 0; left > 0; i = (i + 1) % s.Docs {
		out[i]++
		left--
	}
	return out
}

// Token is token i of document doc.
func Token(s Spec, doc int, i int64) int64 {
	return int64(mix(s.Seed^uint64(doc)<<32^uint64(i)) % uint64(s.vocab()))
}

// WriteMegatron writes prefix.bin and prefix.idx (uint16 tokens).
func WriteMegatron(ctx context.Context, prefix string, s Spec) error {
	if s.vocab() > 1<<16 {
		return fmt.Errorf("vocabulary of %d: uint16 tokens hold 65536", s.vocab())
	}
	lens := Lengths(s)
	bin, err := os.Create(prefix + ".bin")
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(bin, 1<<20)
	var b [2]byte
	for d, l := range lens {
		if d%1024 == 0 {
			if err := ctx.Err(); err != nil {
				bin.Close()
				return err
			}
		}
		for i := range l {
			binary.LittleEndian.PutUint16(b[:], uint16(Token(s, d, i)))
			w.Write(b[:])
		}
	}
	if err := w.Flush(); err != nil {
		bin.Close()
		return err
	}
	if err := bin.Close(); err != nil {
		return err
	}
	idx, err := os.Create(prefix + ".idx")
	if err != nil {
		return err
	}
	iw := bufio.NewWriterSize(idx, 1<<20)
	if err := corpus.WriteIndex(iw, corpus.Uint16, lens); err != nil {
		idx.Close()
		return err
	}
	if err := iw.Flush(); err != nil {
		idx.Close()
		return err
	}
	return idx.Close()
}

func next(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

// mix is SplitMix64's finalizer.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
