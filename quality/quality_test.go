package quality

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/sampler"
)

func TestRL(t *testing.T) {
	block, _ := sampler.NewBlock([]int{0, 2, 4}, 1, 1)
	for _, c := range []struct {
		name string
		s    sampler.Sampler
		want float64
	}{
		{"full shuffle", sampler.Global{N: 1000}, 1},
		{"constant order", sampler.Sequential{N: 1000}, 0},
		{"buffer of one", &sampler.Buffered{N: 1000, Buffer: 1}, 0},
		{"buffer holding everything", &sampler.Buffered{N: 50, Buffer: 50}, 1},
		{"reservoir", &sampler.Reservoir{N: 100, Size: 10}, 1},
		// By hand: N=4, buffer 2: 1 bit of offset; offset 0 gives windows
		// {0,1} {2,3} (2 bits), offset 1 {0} {1,2} {3} (1 bit) -> 2.5 bits
		// of log2(4!) = 4.585.
		{"buffer 2 of 4", &sampler.Buffered{N: 4, Buffer: 2}, 2.5 / math.Log2(24)},
		// By hand: N=4 in blocks {0,1} {2,3}: 2 block orders x 2 x 2 inner orders = 8 -> 3 bits.
		{"two blocks of two", block, 3 / math.Log2(24)},
	} {
		got, ok := RL(c.s)
		if !ok || math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: RL %v (%v), want %v", c.name, got, ok, c.want)
		}
	}
}

// RL's closed forms against what each sampler really does: the entropy of
// the orders it produces over many epochs, on datasets small enough to see
// every order. A Global that repeated orders, or a Reservoir that did not
// mix its rounds, fails here, whatever RL's switch says.
func TestRLMatchesEmpiricalEntropy(t *testing.T) {
	block, _ := sampler.NewBlock([]int{0, 2, 4, 5}, 3, 1)
	for _, c := range []struct {
		name string
		s    sampler.Sampler
	}{
		{"global", sampler.Global{N: 5, Seed: 4}},
		{"sequential", sampler.Sequential{N: 5}},
		{"reservoir of 2", &sampler.Reservoir{N: 5, Size: 2, Seed: 4}},
		{"blocks 2,2,1", block},
	} {
		const epochs = 60000
		counts := map[string]float64{}
		for e := range epochs {
			counts[formatInts(sampler.Order(c.s, e))]++
		}
		h := 0.0
		for _, k := range counts {
			p := k / epochs
			h -= p * math.Log2(p)
		}
		rl, ok := RL(c.s)
		want := rl * math.Log2(120)
		if !ok || math.Abs(h-want) > 0.05 {
			t.Errorf("%s: the orders' entropy is %.3f bits, RL says %.3f", c.name, h, want)
		}
	}
}

// The closed-form count of a small block shuffle's orders matches the
// orders it really produces.
func TestBlockRLCountsTheOrders(t *testing.T) {
	s, _ := sampler.NewBlock([]int{0, 2, 4}, 7, 1)
	seen := map[string]bool{}
	for e := range 2000 {
		seen[formatInts(sampler.Order(s, e))] = true
	}
	if len(seen) != 8 {
		t.Fatalf("%d distinct orders over 2000 epochs, the formula counts 8", len(seen))
	}
}

func formatInts(v []int) string {
	var b strings.Builder
	for _, x := range v {
		b.WriteByte(byte('0' + x))
		b.WriteByte(' ')
	}
	return b.String()
}

func TestMeasures(t *testing.T) {
	full := Measure(sampler.Global{N: 2000, Seed: 1}, 32, 20)
	if math.Abs(full.NeighbourRatio-1) > 0.25 || math.Abs(full.Displacement-1) > 0.05 {
		t.Fatalf("full shuffle: %+v, want both about 1", full)
	}
	seq := Measure(sampler.Sequential{N: 2000}, 32, 1)
	if seq.Displacement != 0 || seq.NeighbourRatio < 50 {
		t.Fatalf("sequential: %+v", seq)
	}
	bounds := sampler.BlockBounds(2000, func(id int) (int, int64, int) { return 0, int64(id) * 256, 256 }, 4096, 4096, 0)
	blk, _ := sampler.NewBlock(bounds, 1, 1)
	b := Measure(blk, 32, 20)
	spread, _ := sampler.NewBlock(bounds, 1, 8)
	sp := Measure(spread, 32, 20)
	if !(b.NeighbourRatio > sp.NeighbourRatio && sp.NeighbourRatio > full.NeighbourRatio) {
		t.Fatalf("neighbour ratios: block %.1f, spread %.1f, full %.1f: want decreasing", b.NeighbourRatio, sp.NeighbourRatio, full.NeighbourRatio)
	}
}

func TestSVG(t *testing.T) {
	var buf bytes.Buffer
	if err := SVG(&buf, []Panel{{Name: "global <1>", Sampler: sampler.Global{N: 100}}, {Name: "sequential", Sampler: sampler.Sequential{N: 100}}}, 0, 50); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "<svg") || strings.Count(out, "<circle") != 100 || !strings.Contains(out, "global &lt;1&gt;") {
		t.Fatalf("svg:\n%.300s", out)
	}
	// A zoom draws only its positions: the sequential order's first 10 ids.
	buf.Reset()
	SVG(&buf, []Panel{{Name: "zoom", Sampler: sampler.Sequential{N: 100}, To: 10}}, 0, 50)
	if n := strings.Count(buf.String(), "<circle"); n != 10 || strings.Contains(buf.String(), "RL ") {
		t.Fatalf("zoom drew %d points", n)
	}
}

// Delivered orders are measured like generated ones, and an order that is
// not a permutation (a record repeated or missing) is an error, not a
// figure.
func TestMeasureOrders(t *testing.T) {
	seq := []int{0, 1, 2, 3, 4, 5, 6, 7}
	m, err := MeasureOrders([][]int{seq}, 2)
	if err != nil || m.Displacement != 0 {
		t.Fatalf("sequential: %+v %v", m, err)
	}
	if _, err := MeasureOrders([][]int{{0, 1, 2, 2, 4, 5, 6, 7}}, 2); err == nil {
		t.Fatal("a repeated record was measured")
	}
	if _, err := MeasureOrders([][]int{seq, {0, 1}}, 2); err == nil {
		t.Fatal("epochs of different lengths were measured")
	}
}
