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
	"sync"
	"testing"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/storage"
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

// readCounter is a store whose objects count the bytes read at each
// offset.
type readCounter struct {
	storage.Store
	mu    sync.Mutex
	reads map[int64]int // offset: bytes read from it, summed
}

func (s *readCounter) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := s.Store.Open(ctx, name)
	return &countedReader{Reader: r, s: s}, err
}

type countedReader struct {
	storage.Reader
	s *readCounter
}

func (r *countedReader) ReadAt(ctx context.Context, p []byte, off int64) error {
	r.s.mu.Lock()
	r.s.reads[off] += len(p)
	r.s.mu.Unlock()
	return r.Reader.ReadAt(ctx, p, off)
}

// A token column of Parquet is read from its pages unpacked: a batch of
// samples reads each page it takes once however many of its samples take
// pieces of it, later batches find it in the dataset's unpacked cache, so
// an epoch reads each page once; and each sample is the sample filled
// alone.
func TestSamplesPackedPagesOnce(t *testing.T) {
	dir := t.TempDir()
	sc := arrow.NewSchema([]arrow.Field{{Name: "input_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32)}}, nil)
	bld := array.NewRecordBuilder(memory.DefaultAllocator, sc)
	lb := bld.Field(0).(*array.ListBuilder)
	lens := make([]int, 600)
	for d := range lens {
		lens[d] = 1 + d*37%90
		lb.Append(true)
		for j := range lens[d] {
			lb.ValueBuilder().(*array.Int32Builder).Append(int32(d*100 + j))
		}
	}
	rec := bld.NewRecordBatch()
	bld.Release()
	p := filepath.Join(dir, "tok.parquet")
	f, _ := os.Create(p)
	w, err := pqarrow.NewFileWriter(sc, f, parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Snappy),
		parquet.WithMaxRowGroupLength(200), parquet.WithDataPageSize(2048), parquet.WithDictionaryDefault(false)), pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	w.Write(rec)
	w.Close()
	rec.Release()

	local, _ := storage.NewLocal(false, nil)
	store := &readCounter{Store: local, reads: map[int64]int{}}
	ref, err := corpus.Open(context.Background(), corpus.Options{IndexDir: t.TempDir(), IndexInDirOnly: true}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	pages := map[int64]int{} // each document's page group: its bytes
	for d := range ref.Docs() {
		l := ref.Locate(d, 0, ref.Len(d))
		pages[l.Off] = int(l.Len)
	}
	for _, mode := range []sequence.Mode{sequence.Concat, sequence.BestFit, sequence.Pad} {
		const S, epoch = 32, 0
		// Opened afresh, with its own unpacked cache.
		c, err := corpus.Open(context.Background(), corpus.Options{Store: store, IndexDir: t.TempDir(), IndexInDirOnly: true}, p)
		if err != nil {
			t.Fatal(err)
		}
		s, err := sequence.New(c, sequence.Options{SeqLen: S, Mode: mode, Seed: 3, Window: 50})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := sequence.NewBatcher([]sequence.Source{{Corpus: c, Samples: s}}, 0, -1)
		store.mu.Lock()
		clear(store.reads)
		store.mu.Unlock()
		l, err := loader.New(context.Background(), c.Dataset(), sampler.Global{N: s.Len(epoch), Seed: 4},
			loader.Options{BatchSize: 8, Samples: b, Epoch: epoch})
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for {
			bt, err := l.Next(context.Background())
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			ids := unsafe.Slice((*int64)(unsafe.Pointer(&bt.Data[bt.Arrays[0].Off])), len(bt.IDs)*S)
			for slot, id := range bt.IDs {
				pc, _ := s.Sample(epoch, id, nil)
				toks, err := sequence.Read(context.Background(), ref, pc, nil)
				if err != nil {
					t.Fatal(err)
				}
				a := sequence.NewArrays(S)
				sequence.Fill(a, pc, toks, 0, -1)
				if !slices.Equal(ids[slot*S:slot*S+S], a.InputIDs) {
					t.Fatalf("%s: sample %d: %v, filled alone %v", mode, id, ids[slot*S:slot*S+S], a.InputIDs)
				}
				seen++
			}
			bt.Release()
		}
		l.Close()
		if seen != s.Len(epoch) {
			t.Fatalf("%s: %d samples of %d", mode, seen, s.Len(epoch))
		}
		store.mu.Lock()
		total, want := 0, 0
		for _, n := range store.reads {
			total += n
		}
		for _, n := range pages {
			want += n
		}
		store.mu.Unlock()
		// Every page once (coalesced with its neighbours or not; there
		// are no dictionary pages: dictionary encoding is off).
		if total != want {
			t.Fatalf("%s: the epoch read %d bytes, its pages are %d", mode, total, want)
		}
		c.Close()
	}
}
