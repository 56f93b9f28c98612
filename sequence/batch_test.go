package sequence

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
)

// writeCorpus writes documents of the given lengths as a Megatron uint16
// corpus, token j of document d being (d*31+j) % vocab, and opens it.
func writeCorpus(t *testing.T, lens []int64, vocab int64, opts corpus.Options) *corpus.Corpus {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "c")
	var bin bytes.Buffer
	for d, l := range lens {
		for j := range l {
			binary.Write(&bin, binary.LittleEndian, uint16((int64(d)*31+j)%vocab))
		}
	}
	var idx bytes.Buffer
	if err := corpus.WriteIndex(&idx, corpus.Uint16, lens); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prefix+".bin", bin.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prefix+".idx", idx.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := corpus.Open(context.Background(), opts, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// assemble plans, reads (one cell at a time) and assembles a batch.
func assemble(t *testing.T, c *corpus.Corpus, b *Batcher, epoch int, ids []int) (*Batch, []byte, error) {
	t.Helper()
	rb, err := b.BatchOf(epoch, ids)
	if err != nil {
		t.Fatal(err)
	}
	var cells [][][]byte
	for slot := range ids {
		var row [][]byte
		for _, l := range rb.Cells(slot, nil) {
			p := make([]byte, l.Len)
			if err := c.Object(l.Object).ReadAt(context.Background(), p, l.Off); err != nil {
				t.Fatal(err)
			}
			row = append(row, p)
		}
		cells = append(cells, row)
	}
	words := make([]int64, rb.Size()/8+1) // 8-byte aligned
	out := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), rb.Size())
	m, err := rb.Assemble(context.Background(), func(slot, k int) []byte { return cells[slot][k] }, out)
	return rb.(*Batch), out[:max(0, m)], err
}

func arrayOf[T int64 | int32 | float32](out []byte, a Array) []T {
	n := 1
	for _, d := range a.Shape {
		n *= d
	}
	return slices.Clone(view[T](out, a.Off, n))
}

// TestBatchIsEachSampleFilled checks a batch against each of its samples
// read and filled alone (sequence.Read, Fill), and its cu_seqlens against
// the samples' own, flattened.
func TestBatchIsEachSampleFilled(t *testing.T) {
	lens := []int64{5, 17, 3, 40, 9, 1, 12, 30, 2, 8, 26}
	c := writeCorpus(t, lens, 1000, corpus.Options{})
	const S = 16
	for _, mode := range []Mode{Concat, BestFit, Pad} {
		s, err := New(c, Options{SeqLen: S, Mode: mode, Seed: 7, Window: 4})
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewBatcher([]Source{{Corpus: c, Samples: s}}, 99, -1)
		if err != nil {
			t.Fatal(err)
		}
		const epoch = 2
		ids := []int{s.Len(epoch) - 1, 0, s.Len(epoch) / 2}
		bt, out, err := assemble(t, c, b, epoch, ids)
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		lay := bt.Arrays()
		if lay[5].Name != CuSeqlens || lay[4].Name != MaxSeqlen {
			t.Fatalf("layout %+v", lay)
		}
		gotIDs, gotLab, gotPos := arrayOf[int64](out, lay[0]), arrayOf[int64](out, lay[1]), arrayOf[int64](out, lay[2])
		gotMask, cu := arrayOf[float32](out, lay[3]), arrayOf[int32](out, lay[5])
		var wantCu []int32
		longest := int32(0)
		for slot, id := range ids {
			p, err := s.Sample(epoch, id, nil)
			if err != nil {
				t.Fatal(err)
			}
			toks, err := Read(context.Background(), c, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			a := NewArrays(S)
			if err := Fill(a, p, toks, 99, -1); err != nil {
				t.Fatal(err)
			}
			r := slot * S
			if !slices.Equal(gotIDs[r:r+S], a.InputIDs) || !slices.Equal(gotLab[r:r+S], a.Labels) ||
				!slices.Equal(gotPos[r:r+S], a.PositionIDs) || !slices.Equal(gotMask[r:r+S], a.LossMask) {
				t.Fatalf("%s: slot %d (sample %d) differs from the sample filled alone", mode, slot, id)
			}
			for i, x := range a.CuSeqlens {
				if i > 0 {
					longest = max(longest, x-a.CuSeqlens[i-1])
				}
				if slot == 0 || i > 0 {
					wantCu = append(wantCu, int32(r)+x)
				}
			}
		}
		if !slices.Equal(cu, wantCu) {
			t.Fatalf("%s: cu_seqlens %v, want %v", mode, cu, wantCu)
		}
		if ms := arrayOf[int32](out, lay[4])[0]; ms != longest {
			t.Fatalf("%s: max_seqlen %d, want %d", mode, ms, longest)
		}
		if len(out) != lay[5].Off+lay[5].Len || int64(len(out)) > BatchBytes(len(ids), S) {
			t.Fatalf("%s: %d bytes written, layout ends at %d, bound %d", mode, len(out), lay[5].Off+lay[5].Len, BatchBytes(len(ids), S))
		}
		if gotMask[0] != 0 && gotMask[0] != 1 || math.IsNaN(float64(gotMask[0])) {
			t.Fatalf("loss_mask %v", gotMask[0])
		}
	}
}

// TestBatchRefusesTokensOutsideVocab: a token at or above vocab_size is an
// error naming the .bin and the token's byte offset, never a batch.
func TestBatchRefusesTokensOutsideVocab(t *testing.T) {
	lens := []int64{50, 50}
	c := writeCorpus(t, lens, 1000, corpus.Options{Vocab: 40})
	s, err := New(c, Options{SeqLen: 48, Mode: Pad})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewBatcher([]Source{{Corpus: c, Samples: s}}, 0, -1)
	_, _, err = assemble(t, c, b, 0, []int{0, 1})
	var fe *corpus.FormatError
	if !errors.As(err, &fe) || !errors.Is(err, corpus.ErrVocab) || filepath.Ext(fe.Path) != ".bin" {
		t.Fatalf("error %v: want a FormatError of the .bin wrapping ErrVocab", err)
	}
	// Document 0's token j is j: the first outside is its 41st, at byte
	// 80. Document 1's tokens start at byte 100, its token j is 31+j: the
	// first outside is its 10th, at byte 118. Slot 0 is checked first.
	p, _ := s.Sample(0, 0, nil)
	want := int64(80)
	if p[0].Doc == 1 {
		want = 118
	}
	if fe.Offset != want {
		t.Fatalf("offset %d, want %d", fe.Offset, want)
	}
}

// TestBatchCellsAreThePieces: the loader reads what Cells says: each
// piece's bytes of the .bin.
func TestBatchCellsAreThePieces(t *testing.T) {
	c := writeCorpus(t, []int64{4, 6, 3}, 1000, corpus.Options{})
	s, _ := New(c, Options{SeqLen: 5, Mode: Concat, InOrder: true})
	b, _ := NewBatcher([]Source{{Corpus: c, Samples: s, Objects: 3}}, 0, -1)
	rb, err := b.BatchOf(0, []int{0, 1})
	if err != nil {
		t.Fatal(err)
	}
	// In order: stream 0..12; sample 0 is tokens 0..5 (document 0 whole,
	// document 1's first 2), sample 1 tokens 5..10 (document 1's last 5,
	// document 2's first): a piece a document, as Fill starts a segment
	// at each.
	want := [][]dataset.Loc{{{Object: 3, Off: 0, Len: 8}, {Object: 3, Off: 8, Len: 4}}, {{Object: 3, Off: 10, Len: 10}, {Object: 3, Off: 20, Len: 2}}}
	for slot := range 2 {
		if got := rb.Cells(slot, nil); !slices.Equal(got, want[slot]) {
			t.Fatalf("slot %d: cells %v, want %v", slot, got, want[slot])
		}
	}
}
