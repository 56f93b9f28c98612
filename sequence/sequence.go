package sequence

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"github.com/riffle-ml/riffle/sampler"
)

// Corpus is what cutting samples needs of a corpus (corpus.Corpus is
// one): its documents' lengths, and whether its boundaries are only its
// EOD tokens (then its documents are files, kept in order).
type Corpus interface {
	Docs() int
	Len(doc int) int64
	InBand() bool
}

// Piece is a run of one document's tokens: Len tokens from token Off of
// document Doc.
type Piece struct {
	Doc int
	Off int64
	Len int
}

// Mode is how documents become samples.
type Mode string

// The modes; doc.go defines each.
const (
	Concat  Mode = "concat"
	BestFit Mode = "best_fit"
	Pad     Mode = "pad"
)

// Options say how to cut samples. SeqLen is required; the rest's zero
// values work.
type Options struct {
	// SeqLen is the inputs of a sample.
	SeqLen int
	// Mode is concat (the default), best_fit or pad.
	Mode Mode
	// Seed keys the epochs' document orders.
	Seed uint64
	// InOrder keeps the documents in the corpus's order every epoch (a
	// job that reads without shuffling: an evaluation), instead of the
	// global shuffle of Seed and the epoch.
	InOrder bool
	// PadLast keeps concat's last partial sample, padded.
	PadLast bool
	// Window is best_fit's documents per window; default 1024: on
	// lengths like web text's (mean 1000, a long tail) it leaves 0.1%
	// padding at SeqLen 2048 (64 documents: 2.4%, 4096: 0.03%), and a
	// window is packed again on demand in about a millisecond.
	Window int
}

// DefaultWindow is best_fit's default window.
const DefaultWindow = 1024

// Samples is an epoch's samples: each a pure function of (epoch, i),
// safe for concurrent use.
type Samples interface {
	// Len is the number of samples of epoch.
	Len(epoch int) int
	// Sample appends sample i's pieces to dst.
	Sample(epoch, i int, dst []Piece) ([]Piece, error)
	// Width is the most tokens a sample holds: SeqLen+1 (concat, pad) or
	// SeqLen (best_fit).
	Width() int
	// SeqLen is the inputs of a sample.
	SeqLen() int
	// Stats are an epoch's padding and truncation.
	Stats(epoch int) Stats
}

// Windowed is implemented by samples cut window by window (best_fit's):
// Windows are an epoch's windows as runs of its samples, the first sample
// of each and the epoch's samples at the end.
type Windowed interface {
	Windows(epoch int) []int
}

// Stats describe an epoch's samples.
type Stats struct {
	Samples int
	SeqLen  int
	Docs    int
	Tokens  int64 // the corpus's, every epoch
	// Padding is the input positions that are padding, of Samples*SeqLen.
	Padding int64
	// Dropped is the tokens in no sample, neither input nor label.
	Dropped int64
	// Cut is the documents cut: concat, those a sample boundary falls
	// inside; best_fit, those split into pieces; pad, those truncated.
	Cut int
}

// PaddingRate is the share of input positions that are padding.
func (s Stats) PaddingRate() float64 {
	return float64(s.Padding) / float64(max(1, int64(s.Samples)*int64(s.SeqLen)))
}

// CutRate is the share of documents cut.
func (s Stats) CutRate() float64 { return float64(s.Cut) / float64(max(1, s.Docs)) }

// DropRate is the share of tokens in no sample.
func (s Stats) DropRate() float64 { return float64(s.Dropped) / float64(max(1, s.Tokens)) }

// ErrInBand says a mode needs documents' lengths a corpus does not know.
var ErrInBand = errors.New("the corpus's documents are known only by their EOD tokens")

// New returns c's samples under opts.
func New(c Corpus, opts Options) (Samples, error) {
	if opts.SeqLen <= 0 {
		return nil, fmt.Errorf("seq_len %d: want at least 1", opts.SeqLen)
	}
	if opts.Mode == "" {
		opts.Mode = Concat
	}
	if opts.Window == 0 {
		opts.Window = DefaultWindow
	}
	if opts.Window < 0 {
		return nil, fmt.Errorf("window %d: want at least 1", opts.Window)
	}
	if c.Docs() == 0 {
		return nil, fmt.Errorf("a corpus of no documents")
	}
	if c.InBand() && opts.Mode != Concat {
		return nil, fmt.Errorf("%s: %w: a flat token file's documents are found by its EOD tokens inside each sample, so it is cut in file order (concat); to pack or pad its documents, make it a Megatron corpus: riffle index PREFIX.bin --token-dtype DTYPE --eod EOD reads it once and writes PREFIX.idx beside it (in Go, corpus.EODLengths and corpus.WriteIndex)", opts.Mode, ErrInBand)
	}
	o := order{n: c.Docs(), seed: opts.Seed, inOrder: c.InBand() || opts.InOrder}
	switch opts.Mode {
	case Concat:
		return newConcat(c, o, opts), nil
	case BestFit:
		return newBestFit(c, o, opts), nil
	case Pad:
		return newPad(c, o, opts), nil
	}
	return nil, fmt.Errorf("mode %q: want concat, best_fit or pad", opts.Mode)
}

// order is an epoch's document order: sampler.Global's shuffle, or the
// corpus's own order for an in-band corpus.
type order struct {
	n       int
	seed    uint64
	inOrder bool
}

// fill writes the documents at positions pos, pos+1, ... of epoch.
func (o order) fill(epoch, pos int, dst []int) int {
	if o.inOrder {
		return sampler.Sequential{N: o.n}.Fill(epoch, pos, dst)
	}
	return sampler.Global{N: o.n, Seed: o.seed}.Fill(epoch, pos, dst)
}

// at is the document at position pos of epoch.
func (o order) at(epoch, pos int) int {
	if o.inOrder {
		return pos
	}
	return sampler.Global{N: o.n, Seed: o.seed}.At(epoch, pos)
}

// memo keeps the few most recent values of a pure function of a key
// (an epoch's table, a window's packing), each made once however many
// goroutines ask for it together.
type memo[K comparable, V any] struct {
	mu    sync.Mutex
	keep  int
	m     map[K]*memoEntry[V]
	order []K
	fn    func(K) V
}

type memoEntry[V any] struct {
	once sync.Once
	v    V
}

func newMemo[K comparable, V any](keep int, fn func(K) V) *memo[K, V] {
	return &memo[K, V]{keep: keep, m: map[K]*memoEntry[V]{}, fn: fn}
}

func (m *memo[K, V]) get(k K) V {
	m.mu.Lock()
	e, ok := m.m[k]
	if !ok {
		e = &memoEntry[V]{}
		m.m[k] = e
		m.order = append(m.order, k)
		if len(m.order) > m.keep {
			delete(m.m, m.order[0])
			m.order = m.order[1:]
		}
	}
	m.mu.Unlock()
	e.once.Do(func() { e.v = m.fn(k) })
	return e.v
}

// parallel calls fn on parts of [0, n) from one goroutine per core, and
// returns when every part is done.
func parallel(n int, fn func(lo, hi int)) {
	parts := min(runtime.GOMAXPROCS(0), max(1, n/64))
	var wg sync.WaitGroup
	for k := range parts {
		wg.Go(func() { fn(k*n/parts, (k+1)*n/parts) })
	}
	wg.Wait()
}

// outside is the error of a sample asked for outside its epoch.
func outside(epoch, i, n int) error {
	return fmt.Errorf("sample %d of epoch %d: the epoch has %d samples", i, epoch, n)
}
