package corpus_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/internal/tokgen"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
)

// BenchmarkFirstBatch opens a corpus of 10^9 tokens in 10^6 documents
// (Megatron's layout, made once by tokgen in RIFFLE_TOKEN_CORPUS, a
// prefix, or a temporary directory) and makes the first batch: 8 samples
// of 2048 tokens at the first positions of a global shuffle of the
// epoch's samples, read and filled. It reports the time from nothing
// open to the batch, with the page cache dropped first (cold) and not
// (warm), and the memory the corpus and the epoch's table hold: the Go
// heap after the batch less before the open, and the process's resident
// set after.
func BenchmarkFirstBatch(b *testing.B) {
	spec := tokgen.Spec{Docs: 1_000_000, Tokens: 1_000_000_000, Seed: 1}
	prefix := os.Getenv("RIFFLE_TOKEN_CORPUS")
	if prefix == "" {
		prefix = filepath.Join(b.TempDir(), "synth")
	}
	if _, err := os.Stat(prefix + ".idx"); err != nil {
		start := time.Now()
		if err := tokgen.WriteMegatron(context.Background(), prefix, spec); err != nil {
			b.Fatal(err)
		}
		b.Logf("made %s in %v", prefix, time.Since(start))
	}
	for _, mode := range []sequence.Mode{sequence.Concat, sequence.BestFit} {
		for _, cold := range []bool{true, false} {
			name := string(mode) + "/warm"
			if cold {
				name = string(mode) + "/cold"
			}
			b.Run(name, func(b *testing.B) {
				var heap, rss float64
				var total time.Duration
				for b.Loop() {
					if cold {
						b.StopTimer()
						drop(b, prefix+".idx", prefix+".bin")
						b.StartTimer()
					}
					runtime.GC()
					var before, after runtime.MemStats
					runtime.ReadMemStats(&before)
					start := time.Now()
					c, s := firstBatch(b, prefix, mode)
					total += time.Since(start)
					runtime.GC()
					runtime.ReadMemStats(&after)
					heap = float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
					rss = residentMB()
					runtime.KeepAlive(s)
					c.Close()
				}
				b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/first-batch")
				b.ReportMetric(heap, "MB-heap")
				b.ReportMetric(rss, "MB-rss")
			})
		}
	}
}

func firstBatch(b *testing.B, prefix string, mode sequence.Mode) (*corpus.Corpus, sequence.Samples) {
	ctx := context.Background()
	c, err := corpus.Open(ctx, corpus.Options{Vocab: 50257}, prefix)
	if err != nil {
		b.Fatal(err)
	}
	const S, batch = 2048, 8
	s, err := sequence.New(c, sequence.Options{SeqLen: S, Mode: mode, Seed: 3})
	if err != nil {
		b.Fatal(err)
	}
	order := sampler.Global{N: s.Len(0), Seed: 3}
	a := sequence.NewArrays(S)
	var pieces []sequence.Piece
	var toks []int64
	for i := range batch {
		if pieces, err = s.Sample(0, order.At(0, i), pieces[:0]); err != nil {
			b.Fatal(err)
		}
		if toks, err = sequence.Read(ctx, c, pieces, toks); err != nil {
			b.Fatal(err)
		}
		if err := sequence.Fill(a, pieces, toks, 0, -1); err != nil {
			b.Fatal(err)
		}
	}
	return c, s
}

// drop asks the kernel to forget the files' cached pages.
func drop(b *testing.B, names ...string) {
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// residentMB is the process's resident set (VmRSS), in MiB.
func residentMB() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}
