package loader_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
)

// tokenCorpus writes documents of lens as a Megatron uint16 corpus (token
// j of document d is d*100+j) and opens it.
func tokenCorpus(t *testing.T, lens []int64, opts corpus.Options) *corpus.Corpus {
	t.Helper()
	prefix := filepath.Join(t.TempDir(), "c")
	var bin, idx bytes.Buffer
	for d, l := range lens {
		for j := range l {
			binary.Write(&bin, binary.LittleEndian, uint16(int64(d)*100+j))
		}
	}
	if err := corpus.WriteIndex(&idx, corpus.Uint16, lens); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(prefix+".bin", bin.Bytes(), 0o644)
	os.WriteFile(prefix+".idx", idx.Bytes(), 0o644)
	c, err := corpus.Open(context.Background(), opts, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A loader of samples reads each sample's pieces, coalesced with their
// neighbours, and puts the batch's arrays together: each sample's rows
// are the sample filled alone, and every sample of the epoch comes once.
func TestSamplesBatches(t *testing.T) {
	lens := []int64{7, 30, 2, 15, 41, 9, 3, 22, 18, 5, 60, 1, 12}
	c := tokenCorpus(t, lens, corpus.Options{})
	const S = 8
	s, err := sequence.New(c, sequence.Options{SeqLen: S, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	b, err := sequence.NewBatcher([]sequence.Source{{Corpus: c, Samples: s}}, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	const epoch = 1
	n := s.Len(epoch)
	l, err := loader.New(context.Background(), c.Dataset(), sampler.Global{N: n, Seed: 4},
		loader.Options{BatchSize: 5, Samples: b, Epoch: epoch, MemoryBytes: 1 << 16})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	seen := map[int]bool{}
	for {
		bt, err := l.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ids := unsafe.Slice((*int64)(unsafe.Pointer(&bt.Data[bt.Arrays[0].Off])), len(bt.IDs)*S)
		labels := unsafe.Slice((*int64)(unsafe.Pointer(&bt.Data[bt.Arrays[1].Off])), len(bt.IDs)*S)
		for slot, id := range bt.IDs {
			if seen[id] {
				t.Fatalf("sample %d twice", id)
			}
			seen[id] = true
			p, _ := s.Sample(epoch, id, nil)
			toks, err := sequence.Read(context.Background(), c, p, nil)
			if err != nil {
				t.Fatal(err)
			}
			a := sequence.NewArrays(S)
			sequence.Fill(a, p, toks, 0, -1)
			if !slices.Equal(ids[slot*S:slot*S+S], a.InputIDs) || !slices.Equal(labels[slot*S:slot*S+S], a.Labels) {
				t.Fatalf("sample %d: %v %v, filled alone %v %v", id, ids[slot*S:slot*S+S], labels[slot*S:slot*S+S], a.InputIDs, a.Labels)
			}
		}
		if len(bt.Used()) != bt.Arrays[5].Off+bt.Arrays[5].Len {
			t.Fatalf("the batch uses %d bytes, its arrays end at %d", len(bt.Used()), bt.Arrays[5].Off+bt.Arrays[5].Len)
		}
		bt.Release()
	}
	if len(seen) != n {
		t.Fatalf("%d samples of %d", len(seen), n)
	}
}

// A token past the vocabulary fails the batch with the .bin's name and
// the token's offset.
func TestSamplesVocab(t *testing.T) {
	c := tokenCorpus(t, []int64{10, 10, 10}, corpus.Options{Vocab: 205})
	s, _ := sequence.New(c, sequence.Options{SeqLen: 16, Mode: sequence.Pad, InOrder: true})
	b, _ := sequence.NewBatcher([]sequence.Source{{Corpus: c, Samples: s}}, 0, -1)
	l, err := loader.New(context.Background(), c.Dataset(), sampler.Sequential{N: 3}, loader.Options{BatchSize: 3, Samples: b, Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, err = l.Next(context.Background())
	var fe *corpus.FormatError
	// Document 2's tokens are 200..209, from byte 40: 205 is at byte 50.
	if !errors.As(err, &fe) || !errors.Is(err, corpus.ErrVocab) || fe.Offset != 50 || filepath.Base(fe.Path) != "c.bin" {
		t.Fatalf("error %v: want token 205 of c.bin at offset 50", err)
	}
}
