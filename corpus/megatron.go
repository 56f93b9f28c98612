package corpus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py,
// _IndexWriter and _IndexReader): PREFIX.bin holds every sequence's tokens
// back to back, PREFIX.idx says where:
//
//	0  magic "MMIDIDX\x00\x00"
//	9  version uint64 (1)
//	17 dtype code uint8 (DType: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//	   6 float64, 7 float32, 8 uint16)
//	18 sequence count n uint64
//	26 document index count d uint64
//	34 sequence lengths [n]int32
//	.. sequence pointers [n]int64 (byte offsets in the .bin)
//	.. document indices [d]int64 (the first sequence of each document, and n)
//	.. sequence modes [n]int8, only in a multimodal index
//
// Nothing in the file says it is multimodal (Megatron's reader is told):
// the modes are there when the file is n bytes longer than the rest needs.
const (
	idxMagic  = "MMIDIDX\x00\x00"
	idxHeader = 34
)

// megatronCodes are Megatron's DType codes of integer tokens.
var megatronCodes = map[uint8]Dtype{1: Uint8, 2: Int8, 3: Int16, 4: Int32, 5: Int64, 8: Uint16}

// megatronCode is d's DType code; false for a dtype Megatron has no code
// for (uint32, uint64).
func megatronCode(d Dtype) (uint8, bool) {
	for c, t := range megatronCodes {
		if t == d {
			return c, true
		}
	}
	return 0, false
}

// megatronPrefixes turns names (prefixes, .idx or .bin names, globs of
// any) into prefixes, each once, in order.
func megatronPrefixes(ctx context.Context, store storage.Store, names []string) ([]string, error) {
	var out []string
	for _, n := range names {
		ext := path.Ext(n)
		if ext != ".idx" && ext != ".bin" {
			n, ext = n+".idx", ".idx"
		}
		m, err := dataset.ExpandPaths(ctx, store, []string{n})
		if err != nil {
			return nil, err
		}
		for _, x := range m {
			if p := strings.TrimSuffix(x, ext); !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out, nil
}

func openMegatron(ctx context.Context, opts Options, names []string) (*Corpus, error) {
	prefixes, err := megatronPrefixes(ctx, opts.Store, names)
	if err != nil {
		return nil, err
	}
	c := &Corpus{}
	for _, p := range prefixes {
		if err := c.addMegatron(ctx, opts.Store, p); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.finish(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// megatronIndex is what an .idx's header says.
type megatronIndex struct {
	dtype      Dtype
	seqs, docs int64
	multimodal bool
}

// parseIndexHeader checks an .idx's header against the file's size.
func parseIndexHeader(name string, h []byte, size int64) (megatronIndex, error) {
	var ix megatronIndex
	bad := func(off int64, err error, format string, args ...any) error {
		return &FormatError{Path: name, Offset: off, Err: fmt.Errorf(format+": %w", append(args, err)...)}
	}
	if size < idxHeader || len(h) < idxHeader {
		if len(h) >= 9 && string(h[:9]) != idxMagic {
			return ix, bad(0, ErrCorrupt, "not a Megatron index (magic %q, want %q)", h[:9], idxMagic)
		}
		return ix, bad(size, ErrCorrupt, "index of %d bytes is cut short inside its %d-byte header", size, idxHeader)
	}
	if string(h[:9]) != idxMagic {
		return ix, bad(0, ErrCorrupt, "not a Megatron index (magic %q, want %q)", h[:9], idxMagic)
	}
	if v := binary.LittleEndian.Uint64(h[9:]); v != 1 {
		return ix, bad(9, ErrUnsupported, "index version %d (riffle reads version 1)", v)
	}
	code := h[17]
	switch code {
	case 6, 7:
		name := map[uint8]string{6: "float64", 7: "float32 (float64 in fairseq's older table)"}[code]
		return ix, bad(17, ErrUnsupported, "dtype code %d is %s: a corpus of floats holds no token ids", code, name)
	}
	d, ok := megatronCodes[code]
	if !ok {
		return ix, bad(17, ErrCorrupt, "dtype code %d is not Megatron's (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16)", code)
	}
	ix.dtype = d
	seqs, docs := binary.LittleEndian.Uint64(h[18:]), binary.LittleEndian.Uint64(h[26:])
	if seqs > uint64(size) || docs > uint64(size) {
		return ix, bad(18, ErrCorrupt, "index says %d sequences and %d document indices, more than its %d bytes hold", seqs, docs, size)
	}
	ix.seqs, ix.docs = int64(seqs), int64(docs)
	want := idxHeader + 12*ix.seqs + 8*ix.docs
	switch {
	case size == want:
	case size == want+ix.seqs && ix.seqs > 0:
		ix.multimodal = true
	case size < want:
		return ix, bad(size, ErrCorrupt, "index of %d sequences and %d document indices needs %d bytes, the file has %d: it is cut short", ix.seqs, ix.docs, want, size)
	default:
		return ix, bad(want, ErrCorrupt, "index of %d sequences and %d document indices needs %d bytes (%d with sequence modes), the file has %d", ix.seqs, ix.docs, want, want+ix.seqs, size)
	}
	return ix, nil
}

// readChunks reads n records of width bytes from off of r, a chunk at a
// time, calling fn with each chunk and the index of its first record.
func readChunks(ctx context.Context, r storage.Reader, off, n int64, width int, fn func(first int64, b []byte) error) error {
	const chunk = 1 << 20
	per := int64(chunk / width)
	buf := make([]byte, min(n, per)*int64(width))
	for first := int64(0); first < n; first += per {
		k := min(per, n-first)
		b := buf[:k*int64(width)]
		if err := r.ReadAt(ctx, b, off+first*int64(width)); err != nil {
			return err
		}
		if err := fn(first, b); err != nil {
			return err
		}
	}
	return nil
}

// addMegatron adds the sequences of prefix.idx and prefix.bin as
// documents, checking every length and pointer against the .bin.
func (c *Corpus) addMegatron(ctx context.Context, store storage.Store, prefix string) error {
	idx, err := store.Open(ctx, prefix+".idx")
	if err != nil {
		return err
	}
	defer idx.Close()
	h := make([]byte, min(idxHeader, idx.Size()))
	if err := idx.ReadAt(ctx, h, 0); err != nil {
		return err
	}
	ix, err := parseIndexHeader(idx.Name(), h, idx.Size())
	if err != nil {
		return err
	}
	if len(c.objs) > 0 && ix.dtype != c.inf.Dtype {
		return &FormatError{Path: idx.Name(), Offset: 17, Err: fmt.Errorf("tokens of %s, the corpus's first index says %s: %w", ix.dtype, c.inf.Dtype, ErrCorrupt)}
	}
	c.inf.Dtype = ix.dtype
	c.inf.Multimodal = c.inf.Multimodal || ix.multimodal
	if ix.seqs == 0 {
		return &FormatError{Path: idx.Name(), Offset: 18, Err: fmt.Errorf("index of no sequences: %w", ErrEmpty)}
	}
	if int64(len(c.lens))+ix.seqs > 1<<40 {
		return &FormatError{Path: idx.Name(), Offset: 18, Err: fmt.Errorf("%d sequences: %w", ix.seqs, ErrUnsupported)}
	}
	first := len(c.lens)
	c.lens = slices.Grow(c.lens, int(ix.seqs))
	err = readChunks(ctx, idx, idxHeader, ix.seqs, 4, func(at int64, b []byte) error {
		for i := 0; i < len(b); i += 4 {
			l := int32(binary.LittleEndian.Uint32(b[i:]))
			if l <= 0 {
				what := "is empty"
				if l < 0 {
					what = "has a negative length"
				}
				return &FormatError{Path: idx.Name(), Offset: idxHeader + 4*(at+int64(i/4)),
					Err: fmt.Errorf("sequence %d %s (%d tokens): %w", at+int64(i/4), what, l, ErrCorrupt)}
			}
			c.lens = append(c.lens, uint32(l))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if ix.multimodal {
		modesAt := idxHeader + 12*ix.seqs + 8*ix.docs
		err = readChunks(ctx, idx, modesAt, ix.seqs, 1, func(at int64, b []byte) error {
			for i, m := range b {
				if m != 0 {
					return &FormatError{Path: idx.Name(), Offset: modesAt + at + int64(i),
						Err: fmt.Errorf("sequence %d has mode %d: a multimodal index (Megatron's preprocess_mmdata.py writes images as mode 1) holds sequences that are not text; riffle reads one whose every sequence is text (mode 0): %w", at+int64(i), int8(m), ErrUnsupported)}
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	bin, err := store.Open(ctx, prefix+".bin")
	if err != nil {
		return err
	}
	obj := len(c.objs)
	c.objs = append(c.objs, bin)
	c.inf.Paths = append(c.inf.Paths, bin.Name())
	c.inf.Versions = append(c.inf.Versions, version(idx), version(bin))
	c.inf.Files = append(c.inf.Files, idx.Name(), bin.Name())
	size := int64(ix.dtype.Size())
	ptrAt := idxHeader + 4*ix.seqs
	end := int64(-1) // where the sequence before ends in the .bin
	return readChunks(ctx, idx, ptrAt, ix.seqs, 8, func(at int64, b []byte) error {
		for i := 0; i < len(b); i += 8 {
			s := at + int64(i/8)
			p := int64(binary.LittleEndian.Uint64(b[i:]))
			n := int64(c.lens[first+int(s)]) * size
			where := ptrAt + 8*s
			switch {
			case p < 0 || p > bin.Size():
				return &FormatError{Path: idx.Name(), Offset: where, Err: fmt.Errorf("pointer %d of sequence %d is past the end of %s (%d bytes): %w", p, s, bin.Name(), bin.Size(), ErrCorrupt)}
			case p < end:
				return &FormatError{Path: idx.Name(), Offset: where, Err: fmt.Errorf("pointer %d of sequence %d goes back into the sequence before, which ends at %d: pointers are not monotone: %w", p, s, end, ErrCorrupt)}
			case p+n > bin.Size():
				return &FormatError{Path: bin.Name(), Offset: bin.Size(), Err: fmt.Errorf("%s is %d bytes, shorter than its index says: sequence %d of %d tokens at %d ends at %d: %w", bin.Name(), bin.Size(), s, n/size, p, p+n, io.ErrUnexpectedEOF)}
			}
			if p != end {
				// Megatron's writer leaves no gaps; a run begins at the
				// first sequence and wherever another writer left one.
				c.runs = append(c.runs, run{doc: first + int(s), obj: obj, off: p})
			}
			end = p + n
		}
		return nil
	})
}

// ErrNoDtypeCode says a dtype has no Megatron code.
var ErrNoDtypeCode = errors.New("no Megatron dtype code")

// WriteIndex writes a Megatron .idx (version 1, not multimodal) for
// sequences of the given lengths lying back to back from the start of
// their .bin, each its own document, as megatron-core's
// IndexedDatasetBuilder writes one.
func WriteIndex(w io.Writer, dtype Dtype, lens []int64) error {
	code, ok := megatronCode(dtype)
	if !ok {
		return fmt.Errorf("%s: %w (Megatron's are uint8, int8, int16, uint16, int32, int64)", dtype, ErrNoDtypeCode)
	}
	n := int64(len(lens))
	h := make([]byte, idxHeader)
	copy(h, idxMagic)
	binary.LittleEndian.PutUint64(h[9:], 1)
	h[17] = code
	binary.LittleEndian.PutUint64(h[18:], uint64(n))
	binary.LittleEndian.PutUint64(h[26:], uint64(n+1))
	if _, err := w.Write(h); err != nil {
		return err
	}
	write := func(width int, count int64, at func(i int64) uint64) error {
		const chunk = 1 << 16
		buf := make([]byte, 0, chunk*8)
		for i := range count {
			buf = binary.LittleEndian.AppendUint64(buf, at(i))[:len(buf)+width]
			if len(buf) >= chunk*width || i == count-1 {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
		return nil
	}
	for _, l := range lens {
		if l <= 0 || l > 1<<31-1 {
			return fmt.Errorf("sequence of %d tokens: a Megatron index holds lengths of 1 to 2^31-1: %w", l, ErrUnsupported)
		}
	}
	if err := write(4, n, func(i int64) uint64 { return uint64(lens[i]) }); err != nil {
		return err
	}
	ptr := int64(0)
	if err := write(8, n, func(i int64) uint64 { p := ptr; ptr += lens[i] * int64(dtype.Size()); return uint64(p) }); err != nil {
		return err
	}
	// Document indices: 0, then each sequence's end.
	return write(8, n+1, func(i int64) uint64 { return uint64(i) })
}
