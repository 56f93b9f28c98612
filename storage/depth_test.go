package storage

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// device is a model of a device for the controller: its rate at a depth.
// Its latency follows from Little's law (W = d / rate(d)), so a window at a
// depth past the knee shows latency rising without rate, as a real queue
// does.
type device func(depth int) float64

// server is one queue of capacity c reads/s served in w when idle: the
// rate grows with the depth up to the knee c×w, then stays.
func server(c float64, w time.Duration) device {
	return func(d int) float64 { return min(c, float64(d)/w.Seconds()) }
}

// window is what a lane would measure over one window at depth d, the
// reads offered at least the depth (a loader keeps its reads submitted),
// with multiplicative noise of up to ±noise.
func window(dev device, d int, noise float64, rng *rand.Rand) depthSample {
	r := dev(d) * (1 + noise*(2*rng.Float64()-1))
	el := 20 * time.Millisecond
	return depthSample{Reads: int64(math.Max(1, r*el.Seconds())), Elapsed: el, InFlight: float64(d)}
}

// run feeds c n windows of dev and returns the depths it chose.
func run(c *depthControl, dev device, n int, noise float64, rng *rand.Rand) []int {
	var ds []int
	for range n {
		ds = append(ds, c.observe(window(dev, c.Limit(), noise, rng)))
	}
	return ds
}

func TestDepthConvergesToTheKnee(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  float64
		idle  time.Duration
		start int
	}{
		{"Gen5 NVMe, from below", 3.3e6, 60 * time.Microsecond, 64},   // knee ~198
		{"RAM disk, from above", 150e3, 100 * time.Microsecond, 64},   // knee 15
		{"object store, from below", 2000, 50 * time.Millisecond, 64}, // knee 100
		{"slow disk at the start", 20e3, 3 * time.Millisecond, 64},    // knee 60
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := server(tc.rate, tc.idle)
			knee := tc.rate * tc.idle.Seconds() // Little's law: L = λW at the knee
			rng := rand.New(rand.NewPCG(1, 2))
			c := newDepthControl(tc.start, MaxDepth, false)
			ds := run(c, dev, 400, 0, rng)
			settled(t, dev, ds[200:], tc.rate, knee)
		})
	}
}

// settled checks windows after the search: their mean rate is at least 97%
// of the device's (the probes below the knee are rare and short), and no
// window holds more than twice the reads the rate needs (past the knee
// they would only queue).
func settled(t *testing.T, dev device, ds []int, rate, knee float64) {
	t.Helper()
	var sum float64
	for i, d := range ds {
		if float64(d) > 2*knee+2 {
			t.Fatalf("window %d: depth %d, more than twice the knee %.0f: latency without rate; depths %v", i, d, knee, ds)
		}
		sum += dev(d)
	}
	if mean := sum / float64(len(ds)); mean < 0.97*rate {
		t.Fatalf("mean rate %.0f, under 97%% of %.0f (knee %.0f); depths %v", mean, rate, knee, ds)
	}
}

func TestDepthGrowsWhileRateGrows(t *testing.T) {
	// A disk whose rate keeps growing with depth (latency grows too, but
	// slower than the depth): the search climbs to the bound. (Beyond
	// depthGain times rate × least latency it climbs only as the least
	// latency is forgotten: 4096 would take thousands of windows.)
	disk := func(d int) float64 { return 1000 * math.Sqrt(float64(d)) }
	for _, hi := range []int{256, 1000} {
		c := newDepthControl(64, hi, false)
		ds := run(c, disk, 600, 0, rand.New(rand.NewPCG(3, 4)))
		for i, d := range ds {
			if d > hi {
				t.Fatalf("bound %d: window %d at depth %d", hi, i, d)
			}
		}
		tail := ds[len(ds)-20:]
		for _, d := range tail {
			if d < int(0.8*float64(hi)) {
				t.Fatalf("bound %d: a device that gains at every depth was held at %d; depths %v", hi, d, ds)
			}
		}
	}
}

func TestDepthBacksOffWhenLatencyRisesWithoutRate(t *testing.T) {
	// The device slows down mid-run (another tenant takes half of it):
	// the same depth now only adds latency, and the depth comes down to
	// the new knee.
	rng := rand.New(rand.NewPCG(5, 6))
	c := newDepthControl(64, MaxDepth, false)
	run(c, server(1e6, 200*time.Microsecond), 200, 0, rng) // knee 200
	before := c.Limit()
	slow := server(0.25e6, 200*time.Microsecond) // knee 50
	ds := run(c, slow, 400, 0, rng)
	after := ds[len(ds)-1]
	if before < 180 {
		t.Fatalf("did not reach the first knee (200): %d", before)
	}
	settled(t, slow, ds[200:], 0.25e6, 50)
	t.Logf("depth %d at knee 200, %d at knee 50", before, after)
}

func TestDepthUnderNoise(t *testing.T) {
	// Noise in every window of up to ±10%, ±30%, ±50% (a shared 2-core
	// machine gives the last): the rate stays near the device's, and the
	// depth within the bound.
	dev := server(150e3, 100*time.Microsecond) // knee 15
	for _, noise := range []float64{0.1, 0.3, 0.5} {
		c := newDepthControl(64, 512, false)
		ds := run(c, dev, 3000, noise, rand.New(rand.NewPCG(7, 8)))
		var sum float64
		for _, d := range ds[500:] {
			if d < 1 || d > 512 {
				t.Fatalf("depth %d out of [1, 512]", d)
			}
			sum += dev(d)
		}
		if mean := sum / float64(len(ds)-500); mean < 0.95*150e3 {
			t.Fatalf("noise ±%.0f%%: mean rate %.0f under 95%% of the device's 150k; depths %v", 100*noise, mean, ds[500:])
		}
	}
}

func TestDepthPinned(t *testing.T) {
	c := newDepthControl(32, MaxDepth, true)
	for _, d := range run(c, server(1e6, time.Millisecond), 200, 0.1, rand.New(rand.NewPCG(9, 10))) {
		if d != 32 {
			t.Fatalf("a pinned depth moved to %d", d)
		}
	}
}

func TestDepthSkipsApplicationLimitedWindows(t *testing.T) {
	// Fewer reads offered than allowed: nothing to learn, the depth stays.
	c := newDepthControl(64, MaxDepth, false)
	for range 100 {
		if d := c.observe(depthSample{Reads: 1000, Elapsed: 20 * time.Millisecond, InFlight: 10}); d != 64 {
			t.Fatalf("depth moved to %d on windows with 10 reads offered", d)
		}
	}
}

func TestDepthMeterIsLittlesLaw(t *testing.T) {
	// 8 reads in flight for 10 ms, 4 for 10 ms, 1,200 reads: L = 6,
	// λ = 60k/s, W = L/λ = 100 µs.
	c := newDepthControl(8, MaxDepth, true)
	var m depthMeter
	m.advance(time.Second, 8)
	m.advance(time.Second+10*time.Millisecond, 4)
	m.advance(time.Second+20*time.Millisecond, 0)
	m.reads = 1200
	s, ok := m.sample(time.Second+20*time.Millisecond, c)
	if !ok {
		t.Fatal("a 20 ms window of 1,200 reads was not done")
	}
	if math.Abs(s.InFlight-6) > 1e-9 || math.Abs(s.Rate()-60e3) > 1e-6 || s.Latency() != 100*time.Microsecond {
		t.Fatalf("L %.3f, λ %.1f, W %v; want 6, 60000, 100µs", s.InFlight, s.Rate(), s.Latency())
	}
}
