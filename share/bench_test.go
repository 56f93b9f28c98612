package share

import (
	"fmt"
	"testing"
)

// schedule runs jobs on g, one epoch each of its n records, consuming at
// rates (records per tick) from start ticks, each reading a record fresh
// takes after it took it at most (Member.Fresh). took is told each record
// a job takes (got: its records so far), tick the members after each
// tick. It returns each job's epoch.
func schedule(g *Group, n int, rates []float64, starts []int, fresh int, took func(k int, got []int), tick func([]*Member)) [][]int {
	ms := make([]*Member, len(rates))
	got := make([][]int, len(rates))
	acc := make([]float64, len(rates))
	buf := []int{0}
	for t := 0; ; t++ {
		busy := false
		for k := range ms {
			if t < starts[k] {
				busy = true
				continue
			}
			if ms[k] == nil {
				ms[k], _ = g.Join(nil, 0)
				ms[k].Last = 0
				ms[k].SetFresh(fresh)
			}
			if len(got[k]) == n {
				continue
			}
			busy = true
			for acc[k] += rates[k]; acc[k] >= 1 && len(got[k]) < n; acc[k]-- {
				ms[k].Fill(0, len(got[k]), buf)
				got[k] = append(got[k], buf[0])
				took(k, got[k])
				if len(got[k]) == n {
					ms[k].Leave()
				}
			}
		}
		if tick != nil {
			tick(ms)
		}
		if !busy {
			return got
		}
	}
}

// simulate runs jobs consuming one epoch each at rates (records per tick)
// from start ticks, with a queue cap, and returns the reads their rounds
// cost (records given, less those one read gave several jobs) and the
// peak of records given and not taken.
func simulate(n int, rates []float64, starts []int, qcap int) (reads, peak int) {
	g := NewGroup(Options{Records: n, Seed: 1, QueueCap: qcap})
	schedule(g, n, rates, starts, 0, func(int, []int) {}, func(ms []*Member) {
		q := 0
		for _, m := range ms {
			if m != nil {
				q += len(m.queue)
			}
		}
		peak = max(peak, q)
	})
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
