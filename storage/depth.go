package storage

import (
	"math"
	"sync/atomic"
	"time"
)

// Adaptive depth: how many reads of one device (or one object store) to keep
// in flight, chosen from what the device does while the job runs instead of
// a constant tuned on one disk.
//
// Little's law ties the three figures together: reads in flight = rate ×
// latency (L = λW). A device's rate grows with the reads in flight until
// its parallelism is used up (the knee); past the knee more reads only wait
// in a queue, so latency grows with them and the rate does not. A PCIe Gen5
// NVMe needs about 3.3M IOPS × 60 µs ≈ 200 reads in flight; a virtio disk
// whose rate keeps rising with depth wants more; a RAM-backed device
// saturates its one worker thread at a few dozen; an object store needs its
// bandwidth-delay product, hundreds of requests.
//
// The controller measures each window's rate (reads finished over time) and
// the mean reads in flight (the time integral of the in-flight count, taken
// once per round of the ring, not per read), so the latency is L/λ and no
// read carries a clock. It then searches for the knee the way TCP Vegas
// (Brakmo & Peterson, 1995) and BBR's ProbeBW (Cardwell et al., 2016) find
// a path's bandwidth-delay product: it holds a depth, and now and then
// probes another for a while. A deeper probe whose rate grew (by at least
// a tenth of the depth's growth) is kept, and the next probe comes soon;
// one whose rate did not grow only added latency (Vegas's "expected minus
// actual": the extra reads were queued), so the depth goes back. Probes
// downwards keep a smaller depth that loses no rate: it carries the same
// rate at a lower latency and holds less memory in flight (blk-iolatency's
// reason for throttling a queue that no longer buys throughput). Each
// probe that fails doubles the wait before the next one, so a device that
// stays the same is left alone; the start doubles the depth until the
// first failure, as TCP's slow start and BBR's Startup do.
//
// Rates are noisy on a busy machine (one window's rate can be off by half
// when the CPU is shared), so a probe and the held depth before it are
// each measured over as many windows as make the standard error of their
// mean about 5%, from the spread of the held depth's windows, and the
// search is asymmetric: a depth too deep costs latency, one too shallow
// costs rate, so a shallower probe must lose nothing. Little's law caps
// the search from above as BBR caps its window at a multiple of the
// bandwidth-delay product: deeper probes stop at 4 × rate × the least
// latency seen (which creeps up slowly, so a device that changed is
// measured anew), where noise alone would walk the depth up.
//
// Windows end after enough reads (4 × the depth, at least 64) and at least
// 10 ms, so a decision costs nothing per read. A window whose mean reads in
// flight were under 80% of the depth (the loader offered fewer) says
// nothing about a deeper queue (BBR's application-limited samples) and is
// skipped. The search starts at the reader's Hints.Depth. The depth stays within
// [1, hi]: hi is the engine's bound, which a loader sets from
// loader.MaxDepth and its memory bound (reads in flight × read size within
// what it may hold). A pinned depth (an explicit depth= option) never moves.

const (
	depthMinWindow  = 64 // reads per window, at least
	depthWindowTime = 10 * time.Millisecond
	depthMaxHold    = 64 // windows between probes, at most
	depthGainShare  = 0.1
	// A probe lasts enough windows that the standard error of its mean
	// rate is about depthError, from the spread of the held depth's
	// windows (on a busy machine one window's rate is off by tens of
	// percent), within [2, depthMaxWindows]; a held depth's rate is the
	// mean of as many.
	depthError      = 0.05
	depthMaxWindows = 32
	depthGain       = 4     // the cap's multiple of rate × least latency
	depthForget     = 0.002 // the least latency's creep per window
)

// MaxDepth is the most reads in flight an engine keeps per device by
// default (loader.MaxDepth is the same bound for a job's depth option).
const MaxDepth = 4096

// depthSample is what one lane saw over one window.
type depthSample struct {
	Reads    int64         // reads finished
	Elapsed  time.Duration // the window's length
	InFlight float64       // mean reads in flight over the window
}

// Rate is reads per second.
func (s depthSample) Rate() float64 { return float64(s.Reads) / s.Elapsed.Seconds() }

// Latency is the mean time a read spent in flight, by Little's law (W = L/λ).
func (s depthSample) Latency() time.Duration {
	if s.Reads == 0 {
		return 0
	}
	return time.Duration(s.InFlight / s.Rate() * 1e9)
}

// depthControl chooses one lane's depth; it is used by one goroutine
// (observe), while Limit may be read from any.
type depthControl struct {
	lo, hi int
	pinned bool
	limit  atomic.Int64

	base  int // the depth held
	probe int // the depth being probed, 0 when holding
	// The rates of the last windows at the depth in use now (held or
	// probed), newest at rates[(n-1) % len].
	rates [depthMaxWindows]float64
	n     int
	// What the held depth gave just before the probe started, and how
	// many windows the probe lasts.
	baseRate  float64
	probeWant int
	down      bool // the next probe goes down
	startup   bool // doubling until a probe fails
	hold      int  // windows to hold before the next probe
	fails     int
	// The least latency seen (seconds; it creeps up by depthForget a
	// window, so a device that changed is measured anew), for the cap.
	wmin float64
}

// newDepthControl starts a lane at start reads in flight, adapting within
// [1, hi], or pinned at start when pin is set.
func newDepthControl(start, hi int, pin bool) *depthControl {
	hi = max(1, hi)
	start = min(max(1, start), hi)
	c := &depthControl{lo: 1, hi: hi, pinned: pin, base: start, startup: true, hold: 2}
	c.limit.Store(int64(start))
	return c
}

// Limit is the reads in flight allowed now.
func (c *depthControl) Limit() int { return int(c.limit.Load()) }

// windowDone says whether a window of reads over elapsed is long enough to
// decide on.
func (c *depthControl) windowDone(reads int64, elapsed time.Duration) bool {
	return reads >= int64(max(depthMinWindow, 4*c.Limit())) && elapsed >= depthWindowTime ||
		elapsed >= 20*depthWindowTime && reads > 0
}

func (c *depthControl) set(d int) {
	c.limit.Store(int64(min(c.hi, max(c.lo, d))))
}

// stats is the mean rate of the last k windows and their variance
// relative to it.
func (c *depthControl) stats(k int) (mean, rvar float64) {
	k = min(k, c.n, len(c.rates))
	if k == 0 {
		return 0, 0
	}
	for i := range k {
		mean += c.rates[(c.n-1-i)%len(c.rates)]
	}
	mean /= float64(k)
	if k < 2 || mean == 0 {
		return mean, 0
	}
	for i := range k {
		d := c.rates[(c.n-1-i)%len(c.rates)]/mean - 1
		rvar += d * d
	}
	return mean, rvar / float64(k-1)
}

// windows is how many windows a probe lasts (and a held depth's rate is
// measured over before one): enough for the mean to be within about
// depthError of the rate, given the spread of the held depth's windows.
func (c *depthControl) windows() int {
	_, v := c.stats(len(c.rates))
	return min(depthMaxWindows, max(2, int(math.Ceil(v/(depthError*depthError)))))
}

// observe takes a window's sample and returns the depth for the next one.
func (c *depthControl) observe(s depthSample) int {
	if c.pinned || s.Reads <= 0 || s.Elapsed <= 0 {
		return c.Limit()
	}
	if s.InFlight < 0.8*float64(c.Limit()) {
		// Application-limited: fewer reads were offered than allowed, so
		// the window says nothing about a deeper queue. A probe that could
		// not be filled is abandoned without counting as a failure.
		if c.probe != 0 {
			c.probe, c.n = 0, 0
			c.set(c.base)
		}
		return c.Limit()
	}
	c.rates[c.n%len(c.rates)] = s.Rate()
	c.n++
	if w := s.InFlight / s.Rate(); c.wmin == 0 || w < c.wmin {
		c.wmin = w
	} else {
		c.wmin *= 1 + depthForget
	}
	if c.probe == 0 {
		c.holding()
		return c.Limit()
	}
	if c.n < c.probeWant {
		return c.Limit()
	}
	pr, _ := c.stats(c.probeWant)
	grow := float64(c.probe)/float64(c.base) - 1 // > 0 up, < 0 down
	var keep bool
	if grow > 0 {
		keep = pr >= c.baseRate*(1+depthGainShare*grow)
	} else {
		// Asymmetric: a depth too deep costs latency and memory, one too
		// shallow costs rate, so going down must lose nothing.
		keep = pr >= c.baseRate
	}
	if keep {
		// The rate moved with the depth (up), or did not need it (down):
		// hold the new depth (its windows so far are the probe's) and
		// probe again soon, the same way.
		c.base, c.hold, c.fails = c.probe, 1, 0
	} else {
		// Up: the extra reads only queued (latency rose, rate did not).
		// Down: the rate needed them. Either way go back, and wait longer
		// before trying again, the other way.
		c.startup = false
		c.fails++
		c.hold = min(depthMaxHold, 1<<min(c.fails, 6))
		c.down = grow > 0
		c.n = 0
	}
	if c.base == c.hi {
		c.down = true
	}
	c.probe = 0
	c.set(c.base)
	return c.Limit()
}

// holding is a window at the held depth: once the hold is over and enough
// windows measured the held depth's rate, a probe starts.
func (c *depthControl) holding() {
	want := c.windows()
	if c.n < max(c.hold, want) {
		return
	}
	var p int
	switch {
	case c.down && c.base > c.lo:
		p = max(c.lo, min(c.base-1, int(math.Floor(float64(c.base)*0.8))))
	case c.base < c.hi:
		step := 1.25
		if c.startup {
			step = 2
		}
		p = min(c.hi, max(c.base+1, int(math.Ceil(float64(c.base)*step))))
	default:
		return
	}
	c.baseRate, _ = c.stats(want)
	if p > c.base {
		// Little's law caps the search: the rate at the least latency
		// seen needs rate × latency reads in flight, and depthGain times
		// that leaves room for a device whose latency grows with its
		// rate; beyond it, noise would only walk the depth up.
		if bdp := int(math.Ceil(depthGain * c.baseRate * c.wmin)); p > bdp {
			if c.base > c.lo {
				p = max(c.lo, min(c.base-1, int(math.Floor(float64(c.base)*0.8))))
			} else {
				return
			}
		}
	}
	c.probe, c.probeWant, c.n = p, want, 0
	c.set(p)
}

// depthMeter integrates one lane's reads in flight over time, fed once per
// round by the goroutine that submits and reaps (no clock per read).
type depthMeter struct {
	start, last time.Duration
	cur         int     // reads in flight since last
	area        float64 // reads in flight × nanoseconds
	reads       int64   // reads finished in the window (the caller counts them)
}

// monoStart anchors the monotonic clock the meters read.
var monoStart = time.Now()

func monoNow() time.Duration { return time.Since(monoStart) + 1 } // never 0: 0 is "not started"

// advance counts the time since the last call at the reads in flight then,
// and notes inFlight, the count from now on.
func (m *depthMeter) advance(now time.Duration, inFlight int) {
	if m.start == 0 {
		m.start, m.last = now, now
	}
	m.area += float64(m.cur) * float64(now-m.last)
	m.last, m.cur = now, inFlight
}

// sample ends the window at now (after advance) if it is long enough for
// c, and returns it.
func (m *depthMeter) sample(now time.Duration, c *depthControl) (depthSample, bool) {
	el := now - m.start
	if m.start == 0 || !c.windowDone(m.reads, el) {
		return depthSample{}, false
	}
	s := depthSample{Reads: m.reads, Elapsed: el, InFlight: m.area / float64(el)}
	*m = depthMeter{start: now, last: now, cur: m.cur}
	return s, true
}
