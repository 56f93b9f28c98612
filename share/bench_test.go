package share

import (
	"fmt"
	"testing"
)

// simulate runs jobs consuming one epoch each at rates (records per tick)
// from start ticks, with a queue cap, and returns the reads their rounds
// cost (records given, less those one read gave several jobs) and the
// peak of records given and not taken.
func simulate(n int, rates []float64, starts []int, qcap int) (reads, peak int) {
	g := NewGroup(Options{Records: n, Seed: 1, QueueCap: qcap})
	type js struct {
		m   *Member
		pos int
		acc float64
	}
	jobs := make([]js, len(rates))
	buf := []int{0}
	for t := 0; ; t++ {
		busy := false
		q := 0
		for k := range jobs {
			j := &jobs[k]
			if t < starts[k] {
				busy = true
				continue
			}
			if j.m == nil {
				j.m, _ = g.Join(nil, 0)
				j.m.Last = 0
			}
			if j.pos == n {
				continue
			}
			busy = true
			for j.acc += rates[k]; j.acc >= 1 && j.pos < n; j.acc-- {
				j.m.Fill(0, j.pos, buf)
				j.pos++
				if j.pos == n {
					j.m.Leave()
				}
			}
			q += len(j.m.queue)
		}
		peak = max(peak, q)
		if !busy {
			break
		}
	}
	st := g.Stats()
	return int(st.Given - st.Saved), peak
}

// BenchmarkSpeeds is the sharing benchmark's schedule, modelled: four jobs
// consuming at 1x, 1x, 2x and 4x, started 0.5% of an epoch apart, against
// the cache a group may fill (as the queue cap, a fraction of the
// dataset). It reports the records read per record of one job's epoch:
// 4 without sharing.
func BenchmarkSpeeds(b *testing.B) {
	const n = 100000
	for _, frac := range []float64{0.05, 0.25, 0.5, 1} {
		for _, rates := range [][]float64{{1, 1, 2, 4}, {1, 1, 1, 1}} {
			b.Run(fmt.Sprintf("cache=%.0f%%/speeds=%v", 100*frac, rates), func(b *testing.B) {
				var reads, peak int
				for b.Loop() {
					reads, peak = simulate(n, rates, []int{0, 500, 1000, 1500}, int(frac*n))
				}
				b.ReportMetric(float64(reads)/n, "reads/epoch")
				b.ReportMetric(float64(peak)/n, "queued/epoch")
			})
		}
	}
}
