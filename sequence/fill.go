package sequence

import (
	"context"
	"fmt"
)

// Ignore is the label of an input with no next token in its document,
// and of padding: PyTorch's cross_entropy ignore_index.
const Ignore = -100

// Arrays are one sample's training arrays, SeqLen long each but
// CuSeqlens, which Fill cuts to its segments' count plus one (at most
// SeqLen+1: make its capacity that). Their types are those the models
// take without a cast (batch.go says why for each): LossMask is float32,
// as Megatron's GPTDataset makes it, to multiply the per-token losses.
type Arrays struct {
	InputIDs    []int64
	Labels      []int64
	PositionIDs []int64
	LossMask    []float32
	CuSeqlens   []int32
}

// NewArrays makes Arrays for samples of seqLen inputs.
func NewArrays(seqLen int) *Arrays {
	return &Arrays{
		InputIDs:    make([]int64, seqLen),
		Labels:      make([]int64, seqLen),
		PositionIDs: make([]int64, seqLen),
		LossMask:    make([]float32, seqLen),
		CuSeqlens:   make([]int32, 0, seqLen+1),
	}
}

// Tokens is the number of tokens of a sample's pieces.
func Tokens(pieces []Piece) int {
	n := 0
	for _, p := range pieces {
		n += p.Len
	}
	return n
}

// Fill writes a sample's arrays from its tokens (its pieces' tokens one
// after another) as doc.go defines them: a segment (a document) starts
// at each piece and, when eod >= 0, after each eod token; pad fills the
// inputs past the tokens. tokens may hold one more than SeqLen, the
// label of the last input.
func Fill(a *Arrays, pieces []Piece, tokens []int64, pad, eod int64) error {
	S := len(a.InputIDs)
	n := len(tokens)
	if Tokens(pieces) != n {
		return fmt.Errorf("fill: %d tokens for pieces of %d", n, Tokens(pieces))
	}
	if n > S+1 || len(a.Labels) != S || len(a.PositionIDs) != S || len(a.LossMask) != S {
		return fmt.Errorf("fill: %d tokens into arrays of %d inputs (%d labels, %d positions, %d mask)", n, S, len(a.Labels), len(a.PositionIDs), len(a.LossMask))
	}
	// starts reports whether token i begins a segment: pieces' starts are
	// walked with a cursor, as i only grows.
	piece, pieceEnd := 0, 0
	starts := func(i int) bool {
		if i == 0 {
			return true
		}
		for piece < len(pieces) && pieceEnd < i {
			pieceEnd += pieces[piece].Len
			piece++
		}
		return pieceEnd == i || eod >= 0 && tokens[i-1] == eod
	}
	cu := append(a.CuSeqlens[:0], 0)
	pos := int64(0)
	next := n > 0 && starts(0)
	for i := range S {
		begin := next
		if i < n {
			a.InputIDs[i] = tokens[i]
			next = i+1 < n && starts(i+1)
			a.Labels[i] = Ignore
			if i+1 < n && !next {
				a.Labels[i] = tokens[i+1]
			}
		} else {
			a.InputIDs[i], a.Labels[i] = pad, Ignore
			begin = i == n // padding is one segment
		}
		if begin {
			if i > 0 {
				cu = append(cu, int32(i))
			}
			pos = 0
		}
		a.PositionIDs[i] = pos
		pos++
		a.LossMask[i] = 0
		if a.Labels[i] != Ignore {
			a.LossMask[i] = 1
		}
	}
	a.CuSeqlens = append(cu, int32(S))
	return nil
}

// Reader reads tokens of a document (corpus.Corpus is one).
type Reader interface {
	Read(ctx context.Context, doc int, off int64, dst []int64) error
}

// Read reads a sample's tokens into dst, which must hold Tokens(pieces),
// and returns them.
func Read(ctx context.Context, r Reader, pieces []Piece, dst []int64) ([]int64, error) {
	dst = dst[:0]
	for _, p := range pieces {
		at := len(dst)
		dst = append(dst, make([]int64, p.Len)...)
		if err := r.Read(ctx, p.Doc, p.Off, dst[at:]); err != nil {
			return nil, err
		}
	}
	return dst, nil
}
