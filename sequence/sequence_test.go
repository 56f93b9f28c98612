package sequence

import (
	"cmp"
	"slices"
	"sync"
	"testing"

	"pgregory.net/rapid"

	"github.com/riffle-ml/riffle/sampler"
)

// lens is a corpus of documents of the given lengths.
type lens struct {
	l      []int64
	inBand bool
}

func (c lens) Docs() int       { return len(c.l) }
func (c lens) Len(d int) int64 { return c.l[d] }
func (c lens) InBand() bool    { return c.inBand }
func drawLens(t *rapid.T) lens {
	return lens{l: rapid.SliceOfN(rapid.Int64Range(1, 90), 1, 120).Draw(t, "lens")}
}

// tok names one token of the corpus.
type tok struct {
	doc int
	off int64
}

func expand(pieces []Piece) []tok {
	var out []tok
	for _, p := range pieces {
		for k := range int64(p.Len) {
			out = append(out, tok{p.Doc, p.Off + k})
		}
	}
	return out
}

// pieces groups tokens into runs of one document.
func pieces(toks []tok) []Piece {
	var out []Piece
	for _, x := range toks {
		if k := len(out) - 1; k >= 0 && out[k].Doc == x.doc && out[k].Off+int64(out[k].Len) == x.off {
			out[k].Len++
			continue
		}
		out = append(out, Piece{Doc: x.doc, Off: x.off, Len: 1})
	}
	return out
}

// epochOrder is the naive epoch order: the whole permutation.
func epochOrder(c lens, seed uint64, epoch int) []int {
	if c.inBand {
		return sampler.Order(sampler.Sequential{N: c.Docs()}, epoch)
	}
	return sampler.Order(sampler.Global{N: c.Docs(), Seed: seed}, epoch)
}

// refConcat materializes the epoch's stream and cuts it (doc.go's concat).
func refConcat(c lens, seed uint64, epoch, S int, padLast bool) [][]tok {
	var stream []tok
	for _, d := range epochOrder(c, seed, epoch) {
		for o := range c.l[d] {
			stream = append(stream, tok{d, o})
		}
	}
	T := len(stream)
	if T < 2 {
		return nil
	}
	n := (T - 1) / S
	if padLast {
		n = (T - 1 + S - 1) / S
	}
	out := make([][]tok, n)
	for i := range out {
		out[i] = stream[i*S : min(i*S+S+1, T)]
	}
	return out
}

func all(t interface{ Fatal(...any) }, s Samples, epoch int) [][]Piece {
	out := make([][]Piece, s.Len(epoch))
	for i := range out {
		p, err := s.Sample(epoch, i, nil)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p
	}
	return out
}

func TestConcatMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawLens(t)
		c.inBand = rapid.Bool().Draw(t, "inBand")
		S := rapid.IntRange(1, 70).Draw(t, "S")
		seed := rapid.Uint64().Draw(t, "seed")
		epoch := rapid.IntRange(0, 5).Draw(t, "epoch")
		padLast := rapid.Bool().Draw(t, "padLast")
		s, err := New(c, Options{SeqLen: S, Seed: seed, PadLast: padLast})
		if err != nil {
			t.Fatal(err)
		}
		want := refConcat(c, seed, epoch, S, padLast)
		if s.Len(epoch) != len(want) {
			t.Fatalf("%d samples, reference %d", s.Len(epoch), len(want))
		}
		for i, p := range all(t, s, epoch) {
			if w := pieces(want[i]); !slices.Equal(p, w) {
				t.Fatalf("sample %d: %v, reference %v", i, p, w)
			}
		}
		// The stats, counted on the materialized stream: a document is
		// cut when a sample's first token (after the first sample's)
		// falls strictly inside it, up to the last sample's shared token.
		n := len(want)
		var cut int
		var T int64
		for _, d := range epochOrder(c, seed, epoch) {
			for k := T/int64(S) + 1; k <= int64(n) && k*int64(S) < T+c.l[d]; k++ {
				if k*int64(S) > T {
					cut++
					break
				}
			}
			T += c.l[d]
		}
		var pad int64
		if n > 0 && len(want[n-1]) < S {
			pad = int64(S - len(want[n-1]))
		}
		st := s.Stats(epoch)
		if st.Cut != cut || st.Padding != pad || st.Samples != n || st.Tokens != T {
			t.Fatalf("stats %+v: want %d cut, %d padding", st, cut, pad)
		}
	})
}

// TestConcatExactlyOnce: ranks that split an epoch's positions between
// them, each with its own Samples as a process would have, read every
// token of the kept samples exactly once as an input (the shared token is
// the next sample's first input); the split is disjoint and complete.
func TestConcatExactlyOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawLens(t)
		S := rapid.IntRange(1, 70).Draw(t, "S")
		seed := rapid.Uint64().Draw(t, "seed")
		epoch := rapid.IntRange(0, 5).Draw(t, "epoch")
		padLast := rapid.Bool().Draw(t, "padLast")
		ranks := rapid.IntRange(1, 8).Draw(t, "ranks")
		strided := rapid.Bool().Draw(t, "strided")
		opts := Options{SeqLen: S, Seed: seed, PadLast: padLast}
		s0, _ := New(c, opts)
		n := s0.Len(epoch)
		seen := map[tok]int{}
		positions := make([]int, n)
		for r := range ranks {
			s, _ := New(c, opts)
			for i := range n {
				mine := i%ranks == r
				if !strided {
					mine = i*ranks/max(1, n) == r
				}
				if !mine {
					continue
				}
				positions[i]++
				p, err := s.Sample(epoch, i, nil)
				if err != nil {
					t.Fatal(err)
				}
				toks := expand(p)
				for _, x := range toks[:min(len(toks), S)] {
					seen[x]++
				}
			}
		}
		for i, k := range positions {
			if k != 1 {
				t.Fatalf("position %d read by %d ranks", i, k)
			}
		}
		T := int64(0)
		for _, l := range c.l {
			T += l
		}
		want := int64(0)
		if n > 0 {
			want = min(T, int64(n)*int64(S))
		}
		if int64(len(seen)) != want {
			t.Fatalf("%d distinct input tokens, want %d", len(seen), want)
		}
		for x, k := range seen {
			if k != 1 {
				t.Fatalf("token %v is an input %d times", x, k)
			}
		}
		st := s0.Stats(epoch)
		if st.Dropped != T-min(T, int64(n)*int64(S)+1) && n > 0 {
			t.Fatalf("dropped %d of %d tokens in %d samples", st.Dropped, T, n)
		}
	})
}

// TestDeterministic: a sample is the same from another Samples, from
// many goroutines at once, and asked in any order; another epoch's order
// differs.
func TestDeterministic(t *testing.T) {
	c := lens{l: make([]int64, 5000)}
	for i := range c.l {
		c.l[i] = int64(1 + (i*7919)%300)
	}
	for _, mode := range []Mode{Concat, BestFit, Pad} {
		t.Run(string(mode), func(t *testing.T) {
			opts := Options{SeqLen: 128, Seed: 42, Mode: mode, Window: 100}
			a, _ := New(c, opts)
			b, _ := New(c, opts)
			want := all(t, a, 3)
			n := b.Len(3)
			got := make([][]Piece, n)
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := n - 1 - g; i >= 0; i -= 4 {
						p, err := b.Sample(3, i, nil)
						if err != nil {
							t.Error(err)
							return
						}
						got[i] = p
					}
				}()
			}
			wg.Wait()
			for i := range want {
				if !slices.Equal(want[i], got[i]) {
					t.Fatalf("sample %d: %v, then %v", i, want[i], got[i])
				}
			}
			other := all(t, a, 4)
			same := 0
			for i := range min(len(other), len(want)) {
				if slices.Equal(other[i], want[i]) {
					same++
				}
			}
			if same > len(want)/10 {
				t.Fatalf("epochs 3 and 4 share %d of %d samples", same, len(want))
			}
		})
	}
}

// refBestFit packs each window naively (doc.go's best_fit): every open
// bin is looked at for each piece.
func refBestFit(c lens, seed uint64, epoch, S, W int) [][]Piece {
	order := epochOrder(c, seed, epoch)
	var out [][]Piece
	for lo := 0; lo < len(order); lo += W {
		type it struct {
			pos int
			p   Piece
		}
		var items []it
		for j, d := range order[lo:min(lo+W, len(order))] {
			for off := int64(0); off < c.l[d]; off += int64(S) {
				items = append(items, it{j, Piece{Doc: d, Off: off, Len: int(min(int64(S), c.l[d]-off))}})
			}
		}
		slices.SortStableFunc(items, func(a, b it) int {
			if x := cmp.Compare(b.p.Len, a.p.Len); x != 0 {
				return x
			}
			if x := cmp.Compare(a.pos, b.pos); x != 0 {
				return x
			}
			return cmp.Compare(a.p.Off, b.p.Off)
		})
		type bin struct {
			room, stamp int
			pieces      []Piece
		}
		var bins []*bin
		clock := 0
		for _, x := range items {
			var best *bin
			for _, b := range bins {
				if b.room >= x.p.Len && (best == nil || b.room < best.room || b.room == best.room && b.stamp > best.stamp) {
					best = b
				}
			}
			if best == nil {
				best = &bin{room: S}
				bins = append(bins, best)
			}
			best.room -= x.p.Len
			best.pieces = append(best.pieces, x.p)
			clock++
			best.stamp = clock
		}
		for _, b := range bins {
			out = append(out, b.pieces)
		}
	}
	return out
}

func TestBestFitMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawLens(t)
		S := rapid.IntRange(1, 70).Draw(t, "S")
		W := rapid.IntRange(1, 40).Draw(t, "W")
		seed := rapid.Uint64().Draw(t, "seed")
		epoch := rapid.IntRange(0, 5).Draw(t, "epoch")
		s, err := New(c, Options{SeqLen: S, Seed: seed, Mode: BestFit, Window: W})
		if err != nil {
			t.Fatal(err)
		}
		want := refBestFit(c, seed, epoch, S, W)
		got := all(t, s, epoch)
		if len(got) != len(want) {
			t.Fatalf("%d samples, reference %d", len(got), len(want))
		}
		seen := map[tok]int{}
		T, split := int64(0), 0
		for _, l := range c.l {
			T += l
			if l > int64(S) {
				split++
			}
		}
		for i := range got {
			if !slices.Equal(got[i], want[i]) {
				t.Fatalf("sample %d: %v, reference %v", i, got[i], want[i])
			}
			if Tokens(got[i]) > S {
				t.Fatalf("sample %d holds %d tokens, more than %d", i, Tokens(got[i]), S)
			}
			for _, x := range expand(got[i]) {
				seen[x]++
			}
		}
		// No document lost or duplicated: every token once.
		if int64(len(seen)) != T {
			t.Fatalf("%d distinct tokens, the corpus has %d", len(seen), T)
		}
		for x, k := range seen {
			if k != 1 {
				t.Fatalf("token %v in %d samples", x, k)
			}
		}
		st := s.Stats(epoch)
		if st.Padding != int64(len(got))*int64(S)-T || st.Cut != split || st.Samples != len(got) {
			t.Fatalf("stats %+v: want padding %d, cut %d", st, int64(len(got))*int64(S)-T, split)
		}
	})
}

func TestPadEachDocumentOnce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := drawLens(t)
		S := rapid.IntRange(1, 70).Draw(t, "S")
		seed := rapid.Uint64().Draw(t, "seed")
		epoch := rapid.IntRange(0, 5).Draw(t, "epoch")
		s, err := New(c, Options{SeqLen: S, Seed: seed, Mode: Pad})
		if err != nil {
			t.Fatal(err)
		}
		order := epochOrder(c, seed, epoch)
		got := all(t, s, epoch)
		if len(got) != len(order) {
			t.Fatalf("%d samples of %d documents", len(got), len(order))
		}
		for i, p := range got {
			want := []Piece{{Doc: order[i], Len: int(min(c.l[order[i]], int64(S)+1))}}
			if !slices.Equal(p, want) {
				t.Fatalf("sample %d: %v, want %v", i, p, want)
			}
		}
	})
}

func TestInBandRefusesPacking(t *testing.T) {
	for _, m := range []Mode{BestFit, Pad} {
		if _, err := New(lens{l: []int64{10}, inBand: true}, Options{SeqLen: 4, Mode: m}); err == nil {
			t.Fatalf("%s over an in-band corpus: no error", m)
		}
	}
}

// refFill is Fill by its definition, one array at a time.
func refFill(S int, pieces []Piece, tokens []int64, pad, eod int64) Arrays {
	n := len(tokens)
	seg := make([]int, n) // segment of each token
	begins := map[int]bool{0: true}
	at := 0
	for _, p := range pieces {
		begins[at] = true
		at += p.Len
	}
	for i := 1; i < n; i++ {
		seg[i] = seg[i-1]
		if begins[i] || eod >= 0 && tokens[i-1] == eod {
			seg[i]++
		}
	}
	a := Arrays{}
	for i := range S {
		if i < n {
			a.InputIDs = append(a.InputIDs, tokens[i])
			if i+1 < n && seg[i+1] == seg[i] {
				a.Labels = append(a.Labels, tokens[i+1])
			} else {
				a.Labels = append(a.Labels, Ignore)
			}
			if i == 0 || seg[i] != seg[i-1] {
				a.CuSeqlens = append(a.CuSeqlens, int32(i))
			}
		} else {
			a.InputIDs = append(a.InputIDs, pad)
			a.Labels = append(a.Labels, Ignore)
			if i == n {
				a.CuSeqlens = append(a.CuSeqlens, int32(i))
			}
		}
		start := a.CuSeqlens[len(a.CuSeqlens)-1]
		a.PositionIDs = append(a.PositionIDs, int64(i)-int64(start))
		mask := float32(0)
		if a.Labels[i] != Ignore {
			mask = 1
		}
		a.LossMask = append(a.LossMask, mask)
	}
	a.CuSeqlens = append(a.CuSeqlens, int32(S))
	return a
}

func equalArrays(a, b *Arrays) bool {
	return slices.Equal(a.InputIDs, b.InputIDs) && slices.Equal(a.Labels, b.Labels) && slices.Equal(a.PositionIDs, b.PositionIDs) &&
		slices.Equal(a.LossMask, b.LossMask) && slices.Equal(a.CuSeqlens, b.CuSeqlens)
}

// TestFillCases are the convention, written out.
func TestFillCases(t *testing.T) {
	const P = 0
	cases := []struct {
		name   string
		S      int
		pieces []Piece
		tokens []int64
		eod    int64
		want   Arrays
	}{
		{"concat: two documents, the last token a label only", 6, []Piece{{0, 5, 3}, {1, 0, 4}}, []int64{10, 11, 12, 20, 21, 22, 23}, -1,
			Arrays{[]int64{10, 11, 12, 20, 21, 22}, []int64{11, 12, Ignore, 21, 22, 23}, []int64{0, 1, 2, 0, 1, 2}, []float32{1, 1, 0, 1, 1, 1}, []int32{0, 3, 6}}},
		{"best_fit: padded", 6, []Piece{{0, 0, 2}, {1, 0, 2}}, []int64{10, 11, 20, 21}, -1,
			Arrays{[]int64{10, 11, 20, 21, P, P}, []int64{11, Ignore, 21, Ignore, Ignore, Ignore}, []int64{0, 1, 0, 1, 0, 1}, []float32{1, 0, 1, 0, 0, 0}, []int32{0, 2, 4, 6}}},
		{"flat: documents end at EOD 2", 6, []Piece{{0, 0, 7}}, []int64{5, 2, 7, 8, 2, 9, 4}, 2,
			Arrays{[]int64{5, 2, 7, 8, 2, 9}, []int64{2, Ignore, 8, 2, Ignore, 4}, []int64{0, 1, 0, 1, 2, 0}, []float32{1, 0, 1, 1, 0, 1}, []int32{0, 2, 5, 6}}},
		{"pad: a short document", 4, []Piece{{3, 0, 1}}, []int64{7}, -1,
			Arrays{[]int64{7, P, P, P}, []int64{Ignore, Ignore, Ignore, Ignore}, []int64{0, 0, 1, 2}, []float32{0, 0, 0, 0}, []int32{0, 1, 4}}},
	}
	for _, c := range cases {
		a := NewArrays(c.S)
		if err := Fill(a, c.pieces, c.tokens, P, c.eod); err != nil {
			t.Fatal(err)
		}
		if !equalArrays(a, &c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, *a, c.want)
		}
		ref := refFill(c.S, c.pieces, c.tokens, P, c.eod)
		if !equalArrays(&ref, &c.want) {
			t.Errorf("%s: the reference gives %+v", c.name, ref)
		}
	}
}

func TestFillMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		S := rapid.IntRange(1, 40).Draw(t, "S")
		lens := rapid.SliceOfN(rapid.IntRange(1, 20), 0, 8).Draw(t, "pieces")
		var pieces []Piece
		n := 0
		for d, l := range lens {
			l = min(l, S+1-n)
			if l <= 0 {
				break
			}
			pieces = append(pieces, Piece{Doc: d, Len: l})
			n += l
		}
		tokens := rapid.SliceOfN(rapid.Int64Range(0, 5), n, n).Draw(t, "tokens")
		eod := rapid.Int64Range(-1, 5).Draw(t, "eod")
		a := NewArrays(S)
		if err := Fill(a, pieces, tokens, 99, eod); err != nil {
			t.Fatal(err)
		}
		want := refFill(S, pieces, tokens, 99, eod)
		if !equalArrays(a, &want) {
			t.Fatalf("got %+v\nwant %+v", *a, want)
		}
	})
}

func TestFillRefusesTooMany(t *testing.T) {
	a := NewArrays(2)
	if err := Fill(a, []Piece{{0, 0, 4}}, []int64{1, 2, 3, 4}, 0, -1); err == nil {
		t.Fatal("4 tokens into 2 inputs: no error")
	}
	if err := Fill(a, []Piece{{0, 0, 3}}, []int64{1, 2}, 0, -1); err == nil {
		t.Fatal("2 tokens for pieces of 3: no error")
	}
}
