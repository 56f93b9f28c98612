package sequence

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"unsafe"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
)

// A batch of n samples of SeqLen S is these arrays, one after another in
// one buffer, each at a multiple of 8 bytes from its start, little-endian:
//
//	input_ids    int64   [n, S]  at 0
//	labels       int64   [n, S]  at 8nS
//	position_ids int64   [n, S]  at 16nS
//	loss_mask    float32 [n, S]  at 24nS
//	max_seqlen   int32   []      at 28nS
//	cu_seqlens   int32   [k+1]   at 28nS+8
//
// The types are those the models take without a cast or a copy:
// input_ids and labels int64, the index type of torch.nn.Embedding and of
// cross_entropy's targets (Megatron's GPTDataset and Hugging Face's
// collators make them so; labels holds -100, cross_entropy's ignore_index,
// where no token is predicted); position_ids int64, what rotary and
// learned position embeddings index with (Megatron's, and Hugging Face's
// position_ids); loss_mask float32, Megatron's loss_mask, which multiplies
// the per-token losses. cu_seqlens and max_seqlen are flash-attention's
// variable-length arguments (flash_attn_varlen_func's cu_seqlens_q/k,
// Megatron's PackedSeqParams, Hugging Face's cu_seq_lens_q/k and
// max_length_q/k), int32 as its kernels take them: cu_seqlens is
// flattened over the batch, as those kernels see a batch of packed
// samples, [n*S] tokens with each sample's segments (documents, and its
// padding as one segment) one after another: 0, the end of each segment
// counted from the batch's first token, n*S last; k is the number of
// segments of the batch, at most n*S. max_seqlen is the longest segment.

// Array is one array of a batch: its name, numpy dtype and shape, and its
// bytes Off..Off+Len of the batch's buffer.
type Array struct {
	Name  string
	Dtype string
	Shape []int
	Off   int
	Len   int
}

// The batch's arrays, in the order they lie.
const (
	InputIDs    = "input_ids"
	Labels      = "labels"
	PositionIDs = "position_ids"
	LossMask    = "loss_mask"
	MaxSeqlen   = "max_seqlen"
	CuSeqlens   = "cu_seqlens"
)

// BatchBytes is the most bytes a batch of n samples of seqLen takes: its
// cu_seqlens as long as it may be (every token a segment).
func BatchBytes(n, seqLen int) int64 {
	ns := int64(n) * int64(seqLen)
	return 28*ns + 8 + 4*(ns+1)
}

// Layout is the arrays of a batch of n samples of seqLen whose cu_seqlens
// has cu entries; cu -1 says a batch's own number (its shape is then [-1]
// and its length the most it may be).
func Layout(n, seqLen, cu int) []Array {
	ns := n * seqLen
	cuLen := 4 * cu
	if cu < 0 {
		cuLen = 4 * (ns + 1)
	}
	return []Array{
		{Name: InputIDs, Dtype: "<i8", Shape: []int{n, seqLen}, Off: 0, Len: 8 * ns},
		{Name: Labels, Dtype: "<i8", Shape: []int{n, seqLen}, Off: 8 * ns, Len: 8 * ns},
		{Name: PositionIDs, Dtype: "<i8", Shape: []int{n, seqLen}, Off: 16 * ns, Len: 8 * ns},
		{Name: LossMask, Dtype: "<f4", Shape: []int{n, seqLen}, Off: 24 * ns, Len: 4 * ns},
		{Name: MaxSeqlen, Dtype: "<i4", Shape: []int{}, Off: 28 * ns, Len: 4},
		{Name: CuSeqlens, Dtype: "<i4", Shape: []int{cu}, Off: 28*ns + 8, Len: cuLen},
	}
}

// Source is one corpus's samples, as a batch reads them: Objects is the
// index of the corpus's first object among those the loader reads (a
// mixture's sources' objects are one list).
type Source struct {
	Corpus  *corpus.Corpus
	Samples Samples
	Objects int
}

// Batcher plans batches of samples of one corpus, or of a mixture's
// (each source's samples, then the next's, in the ids of an epoch): what
// the loader reads of each sample (its pieces, byte ranges of the
// corpus's files) and how the batch is put together from them (Fill's
// arrays, in the layout above). It is safe for concurrent use.
type Batcher struct {
	srcs   []Source
	seqLen int
	pad    int64
	eod    int64
}

// NewBatcher makes the batches of srcs' samples (one SeqLen for all),
// padded with pad; a document also ends after each eod token if eod >= 0.
func NewBatcher(srcs []Source, pad, eod int64) (*Batcher, error) {
	if len(srcs) == 0 {
		return nil, fmt.Errorf("batches of no source")
	}
	b := &Batcher{srcs: srcs, pad: pad, eod: eod}
	for i, s := range srcs {
		S := s.Samples.SeqLen()
		if i == 0 {
			b.seqLen = S
		} else if S != b.seqLen {
			return nil, fmt.Errorf("source %d cuts samples of %d tokens, source 0 of %d: a batch's samples are of one seq_len", i, S, b.seqLen)
		}
	}
	return b, nil
}

// SeqLen is the inputs of a sample.
func (b *Batcher) SeqLen() int { return b.seqLen }

// Sources are the corpora whose samples the batches are.
func (b *Batcher) Sources() []Source { return slices.Clone(b.srcs) }

// Offsets are each source's first id in epoch, and the epoch's samples
// at the end.
func (b *Batcher) Offsets(epoch int) []int {
	out := make([]int, len(b.srcs)+1)
	for i, s := range b.srcs {
		out[i+1] = out[i] + s.Samples.Len(epoch)
	}
	return out
}

// Windows are epoch's best_fit windows as runs of its samples (Windowed),
// of one source; false for samples cut otherwise, or a mixture's.
func (b *Batcher) Windows(epoch int) ([]int, bool) {
	w, ok := b.srcs[0].Samples.(Windowed)
	if !ok || len(b.srcs) != 1 {
		return nil, false
	}
	return w.Windows(epoch), true
}

// Len is the samples of epoch over every source.
func (b *Batcher) Len(epoch int) int {
	n := 0
	for _, s := range b.srcs {
		n += s.Samples.Len(epoch)
	}
	return n
}

// BatchOf lays out the batch of samples ids of epoch (in delivery order).
func (b *Batcher) BatchOf(epoch int, ids []int) (dataset.RowBatch, error) {
	bt := &Batch{b: b, n: len(ids), at: make([]int32, 1, len(ids)+1)}
	offs := []int{0, b.srcs[0].Samples.Len(epoch)}
	if len(b.srcs) > 1 {
		offs = b.Offsets(epoch)
	}
	for slot, id := range ids {
		k := sort.SearchInts(offs, id+1) - 1
		if id < 0 || k >= len(b.srcs) {
			return nil, fmt.Errorf("sample %d of epoch %d: the epoch has %d samples", id, epoch, offs[len(offs)-1])
		}
		var err error
		from := len(bt.pieces)
		if bt.pieces, err = b.srcs[k].Samples.Sample(epoch, id-offs[k], bt.pieces); err != nil {
			return nil, err
		}
		for range len(bt.pieces) - from {
			bt.src = append(bt.src, int32(k))
		}
		if t := Tokens(bt.pieces[from:]); t > b.seqLen+1 {
			return nil, fmt.Errorf("sample %d of epoch %d (slot %d): %d tokens, more than seq_len %d and its last label", id, epoch, slot, t, b.seqLen)
		}
		bt.at = append(bt.at, int32(len(bt.pieces)))
	}
	if err := bt.planPacked(); err != nil {
		return nil, err
	}
	return bt, nil
}

// packedDocs are the documents a batch takes of one packed source (a
// Parquet or compressed Arrow column: corpus.Packed), read as rows of
// its dataset: each block they lie in read and unpacked once for the
// batch, however many of its samples take pieces of it. Document j's
// cells are cells of the first slot that takes a piece of it (owner),
// from its cell at.
type packedDocs struct {
	db     *corpus.DocBatch
	owner  []int32
	at     []int32
	pieces [][]int32 // [j]: the batch's pieces of document j
}

// owned is a document of a packed source whose cells are a slot's.
type owned struct{ src, j int32 }

// planPacked plans the reading of the documents of the batch's packed
// sources, and which slot's cells each one's are.
func (bt *Batch) planPacked() error {
	for k, s := range bt.b.srcs {
		if !s.Corpus.Packed() {
			continue
		}
		if bt.packed == nil {
			bt.packed = make([]*packedDocs, len(bt.b.srcs))
			bt.owned = make([][]owned, bt.n)
		}
		pd := &packedDocs{}
		index := map[int]int{}
		var docs []int
		for slot := range bt.n {
			for pk := bt.at[slot]; pk < bt.at[slot+1]; pk++ {
				if int(bt.src[pk]) != k {
					continue
				}
				doc := bt.pieces[pk].Doc
				j, ok := index[doc]
				if !ok {
					j = len(docs)
					index[doc] = j
					docs = append(docs, doc)
					pd.owner = append(pd.owner, int32(slot))
					pd.pieces = append(pd.pieces, nil)
					bt.owned[slot] = append(bt.owned[slot], owned{int32(k), int32(j)})
				}
				pd.pieces[j] = append(pd.pieces[j], pk)
			}
		}
		db, err := s.Corpus.DocsOf(docs)
		if err != nil {
			bt.Release()
			return err
		}
		pd.db = db
		bt.packed[k] = pd
	}
	if bt.packed == nil {
		return nil
	}
	// A slot's cells: one a piece (none to read of a packed one), then
	// those of the documents it owns.
	for _, pd := range bt.packed {
		if pd != nil {
			pd.at = make([]int32, len(pd.owner))
		}
	}
	for slot, os := range bt.owned {
		at := bt.at[slot+1] - bt.at[slot]
		for _, o := range os {
			pd := bt.packed[o.src]
			pd.at[o.j] = at
			at += int32(pd.db.NumCells())
		}
	}
	return nil
}

// Batch is one planned batch of samples: a dataset.RowBatch whose cells
// are its samples' pieces, a variable number a sample.
type Batch struct {
	b      *Batcher
	n      int
	pieces []Piece
	src    []int32 // each piece's source
	at     []int32 // slot s's pieces are pieces[at[s]:at[s+1]]
	arrays []Array
	// packed, of each packed source (nil for the others, and for a batch
	// of none), its documents read as rows; owned[slot] are the
	// documents whose cells are slot's.
	packed []*packedDocs
	owned  [][]owned
}

var _ dataset.RowBatch = (*Batch)(nil)

// Cells appends the byte ranges of slot's pieces, one a piece (empty
// for a piece of a packed source), then the cells of the packed sources'
// documents the slot owns.
func (bt *Batch) Cells(slot int, dst []dataset.Loc) []dataset.Loc {
	for k := bt.at[slot]; k < bt.at[slot+1]; k++ {
		p, s := bt.pieces[k], bt.b.srcs[bt.src[k]]
		if s.Corpus.Packed() {
			dst = append(dst, dataset.Loc{})
			continue
		}
		l := s.Corpus.Locate(p.Doc, p.Off, int64(p.Len))
		dst = append(dst, dataset.Loc{Object: s.Objects + l.Object, Off: l.Off, Len: int(l.Len)})
	}
	if bt.owned != nil {
		for _, o := range bt.owned[slot] {
			s := bt.b.srcs[o.src]
			from := len(dst)
			dst = bt.packed[o.src].db.Cells(int(o.j), dst)
			for i := from; i < len(dst); i++ {
				if dst[i].Len > 0 {
					dst[i].Object += s.Objects
				}
			}
		}
	}
	return dst
}

// Size is the most bytes the batch takes (BatchBytes).
func (bt *Batch) Size() int { return int(BatchBytes(bt.n, bt.b.seqLen)) }

// Assemble decodes each sample's tokens from its pieces as read (checking
// each against the vocabulary: an error names the file and the token's
// offset) and fills the batch's arrays in out, which must be 8-byte
// aligned, by Fill, the one definition of them.
func (bt *Batch) Assemble(ctx context.Context, cell func(slot, k int) []byte, out []byte) (int, error) {
	S, n := bt.b.seqLen, bt.n
	if len(out) < bt.Size() {
		return 0, fmt.Errorf("a batch of %d samples of %d tokens needs %d bytes, given %d", n, S, bt.Size(), len(out))
	}
	if n > 0 && uintptr(unsafe.Pointer(&out[0]))%8 != 0 {
		return 0, fmt.Errorf("a batch's buffer is not 8-byte aligned")
	}
	defer bt.Release()
	// Each piece's tokens, the batch's one after another (a slot's
	// pieces' together): those of packed sources taken from their
	// blocks unpacked, the others decoded from their cells below.
	pieceAt := make([]int, len(bt.pieces)+1)
	for k, p := range bt.pieces {
		pieceAt[k+1] = pieceAt[k] + p.Len
	}
	all := make([]int64, pieceAt[len(bt.pieces)])
	for _, pd := range bt.packed {
		if pd == nil {
			continue
		}
		err := pd.db.Tokens(ctx, func(j, k int) []byte { return cell(int(pd.owner[j]), int(pd.at[j])+k) },
			func(j int, read func(int64, []int64) error) error {
				for _, pk := range pd.pieces[j] {
					p := bt.pieces[pk]
					if err := read(p.Off, all[pieceAt[pk]:pieceAt[pk+1]]); err != nil {
						return err
					}
				}
				return nil
			})
		if err != nil {
			return 0, err
		}
	}
	lay := Layout(n, S, 0)
	ids := view[int64](out, lay[0].Off, n*S)
	labels := view[int64](out, lay[1].Off, n*S)
	pos := view[int64](out, lay[2].Off, n*S)
	mask := view[float32](out, lay[3].Off, n*S)
	cuAt := lay[5].Off
	a := &Arrays{CuSeqlens: make([]int32, 0, S+1)}
	cu := 0 // entries of the batch's cu_seqlens written
	longest := int32(0)
	for slot := range n {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		from, to := bt.at[slot], bt.at[slot+1]
		for k := from; k < to; k++ {
			p, s := bt.pieces[k], bt.b.srcs[bt.src[k]]
			if s.Corpus.Packed() {
				continue
			}
			l := s.Corpus.Locate(p.Doc, p.Off, int64(p.Len))
			if err := s.Corpus.Decode(l, cell(slot, int(k-from)), all[pieceAt[k]:pieceAt[k+1]]); err != nil {
				return 0, err
			}
		}
		tokens := all[pieceAt[from]:pieceAt[to]]
		r := slot * S
		a.InputIDs, a.Labels, a.PositionIDs, a.LossMask = ids[r:r+S], labels[r:r+S], pos[r:r+S], mask[r:r+S]
		if err := Fill(a, bt.pieces[from:to], tokens, bt.b.pad, bt.b.eod); err != nil {
			return 0, err
		}
		first := 1
		if slot == 0 {
			first = 0
		}
		for i, c := range a.CuSeqlens[first:] {
			if cuAt+4*(cu+1) > len(out) {
				return 0, fmt.Errorf("cu_seqlens past the batch's %d bytes", len(out))
			}
			view[int32](out, cuAt+4*cu, 1)[0] = int32(r) + c
			cu++
			if j := first + i; j > 0 {
				longest = max(longest, c-a.CuSeqlens[j-1])
			}
		}
	}
	if n == 0 {
		view[int32](out, cuAt, 1)[0] = 0
		cu = 1
	}
	view[int32](out, lay[4].Off, 1)[0] = longest
	bt.arrays = Layout(n, S, cu)
	last := bt.arrays[len(bt.arrays)-1]
	return last.Off + last.Len, nil
}

// view is count values of type T at off of b (aligned for T: the batch is
// 8-byte aligned and every array lies at a multiple of its size).
func view[T int64 | int32 | float32](b []byte, off, count int) []T {
	if count == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[off])), count)
}

// Arrays are the batch's arrays, once Assemble has written them.
func (bt *Batch) Arrays() []Array { return slices.Clone(bt.arrays) }

// Release gives up the claims on blocks of its packed sources' documents
// if the batch is not to be assembled; after Assemble it does nothing.
func (bt *Batch) Release() {
	for _, pd := range bt.packed {
		if pd != nil && pd.db != nil {
			pd.db.Release()
		}
	}
}

// Table is empty: the batch is arrays, not an Arrow message (Arrays).
func (bt *Batch) Table() ([][2]int64, [][2]int64, int) { return nil, nil, 0 }

// Buffers is empty, as Table is.
func (bt *Batch) Buffers() []columnar.BufferLoc { return nil }
