package sequence

import (
	"fmt"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/sampler"
)

// u32 is a corpus held as a corpus.Corpus holds one: 4 bytes a document.
type u32 []uint32

func (c u32) Docs() int       { return len(c) }
func (c u32) Len(d int) int64 { return int64(c[d]) }
func (c u32) InBand() bool    { return false }

// synthLens are n document lengths averaging about 1000 tokens, spread
// from 1 to 4000 with a long tail, as tokenized web text's are.
func synthLens(n int) u32 {
	c := make(u32, n)
	x := uint64(12345)
	for i := range c {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		u := float64(x%1_000_000) / 1_000_000
		c[i] = uint32(1 + 4000*u*u*u*u*1.2)
		if c[i] > 4000 {
			c[i] = 4000
		}
	}
	return c
}

// BenchmarkEpochTable makes one epoch's table: what an epoch's first
// sample waits for. It reports the table's bytes a document, and the
// time to find a sample once the table is made (best_fit: a window
// packed again for each, as a shuffled order of samples asks).
func BenchmarkEpochTable(b *testing.B) {
	for _, n := range []int{1_000_000, 10_000_000} {
		c := synthLens(n)
		for _, mode := range []Mode{Concat, BestFit} {
			b.Run(fmt.Sprintf("%s/docs=%d", mode, n), func(b *testing.B) {
				s, _ := New(c, Options{SeqLen: 2048, Seed: 1, Mode: mode})
				var bytes int
				for i := 0; b.Loop(); i++ {
					switch s := s.(type) {
					case *concat:
						t := s.table(i)
						bytes = 8 * len(t.cum)
					case *bestFit:
						t := s.table(i)
						bytes = 8 * len(t.starts)
					}
				}
				b.ReportMetric(float64(bytes)/float64(n), "table-B/doc")
				b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/epoch")
				// A sample found, the table made.
				m := s.Len(0)
				dst, _ := s.Sample(0, 0, nil) // epoch 0's table made
				start := time.Now()
				const k = 2000
				for i := range k {
					dst, _ = s.Sample(0, (i*7919)%m, dst[:0])
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/k, "µs/sample")
			})
		}
	}
}

// BenchmarkBestFitOrder finds a batch's samples of a best_fit epoch in
// the global shuffle of its samples, against a block order over its
// windows (sampler.NewBlock: the windows shuffled, each window's samples
// spread over as many batches as the block window says): the global
// shuffle packs a window again for nearly every sample, the block order
// once a window. It reports samples/s and the windows packed a sample.
func BenchmarkBestFitOrder(b *testing.B) {
	c := synthLens(200_000)
	s, _ := New(c, Options{SeqLen: 2048, Seed: 1, Mode: BestFit})
	n := s.Len(0)
	bounds := s.(Windowed).Windows(0)
	for _, o := range []struct {
		name string
		smp  sampler.Sampler
	}{
		{"global", sampler.Global{N: n, Seed: 3}},
		{"block-window-1", mustBlock(b, bounds, 1)},
		{"block-window-4", mustBlock(b, bounds, 4)},
	} {
		b.Run(o.name, func(b *testing.B) {
			ids := make([]int, 8)
			var dst []Piece
			packs0 := s.(*bestFit).packed.Load()
			samples := 0
			for i := 0; b.Loop(); i++ {
				pos := (i * 8) % (n - 8)
				o.smp.Fill(0, pos, ids)
				for _, id := range ids {
					dst, _ = s.Sample(0, id, dst[:0])
				}
				samples += 8
			}
			b.ReportMetric(float64(samples)/b.Elapsed().Seconds(), "samples/s")
			b.ReportMetric(float64(s.(*bestFit).packed.Load()-packs0)/float64(samples), "packs/sample")
		})
	}
}

func mustBlock(b *testing.B, bounds []int, window int) sampler.Sampler {
	blk, err := sampler.NewBlock(bounds, 3, window)
	if err != nil {
		b.Fatal(err)
	}
	return blk
}
