package share

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/RoaringBitmap/roaring/v2"
	"pgregory.net/rapid"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/sampler"
)

func rangeSet(lo, hi int) *roaring.Bitmap {
	b := roaring.New()
	b.AddRange(uint64(lo), uint64(hi))
	return b
}

// epochOf takes a whole epoch of m, one record at a time.
func epochOf(m *Member, e int) []int {
	out := make([]int, m.Len())
	for p := range out {
		m.Fill(e, p, out[p:p+1])
	}
	return out
}

func isPermutationOf(t interface{ Fatalf(string, ...any) }, got []int, set *roaring.Bitmap, n int) {
	want := []int{}
	if set == nil {
		for i := range n {
			want = append(want, i)
		}
	} else {
		for _, x := range set.ToArray() {
			want = append(want, int(x))
		}
	}
	s := slices.Sorted(slices.Values(got))
	if !slices.Equal(s, want) {
		t.Fatalf("epoch of %d records is not its subset of %d exactly once", len(got), len(want))
	}
}

// Under random schedules (jobs joining, leaving and taking records at
// their own paces, epochs starting at any time), every job's every epoch
// is its subset exactly once.
func TestExactlyOnceUnderRandomSchedules(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 300).Draw(t, "n")
		g := NewGroup(Options{Records: n, Seed: rapid.Uint64Min(1).Draw(t, "seed"), QueueCap: rapid.IntRange(1, 20).Draw(t, "qcap")})
		type job struct {
			m      *Member
			set    *roaring.Bitmap
			epoch  int
			got    []int
			closed bool
		}
		var jobs []*job
		for range rapid.IntRange(1, 400).Draw(t, "steps") {
			switch op := rapid.IntRange(0, 9).Draw(t, "op"); {
			case op == 0 || len(jobs) == 0:
				var set *roaring.Bitmap
				if rapid.Bool().Draw(t, "subset") {
					lo := rapid.IntRange(0, n-1).Draw(t, "lo")
					set = rangeSet(lo, rapid.IntRange(lo+1, n).Draw(t, "hi"))
				}
				e := rapid.IntRange(0, 3).Draw(t, "epoch")
				m, err := g.Join(set, e)
				if err != nil {
					continue
				}
				jobs = append(jobs, &job{m: m, set: set, epoch: e})
			case op == 1:
				j := jobs[rapid.IntRange(0, len(jobs)-1).Draw(t, "leave")]
				j.m.Leave()
				j.closed = true
			default:
				j := jobs[rapid.IntRange(0, len(jobs)-1).Draw(t, "who")]
				if j.closed {
					continue
				}
				for range rapid.IntRange(1, 30).Draw(t, "take") {
					buf := []int{0}
					j.m.Fill(j.epoch, len(j.got), buf)
					j.got = append(j.got, buf[0])
					if len(j.got) == j.m.Len() {
						isPermutationOf(t, j.got, j.set, n)
						j.epoch++
						j.got = nil
					}
				}
			}
		}
	})
}

// chi is a chi-square statistic's z (Wilson-Hilferty) for counts against
// a uniform expectation.
func chi(counts []float64, df float64) float64 {
	sum := 0.0
	for _, c := range counts {
		sum += c
	}
	exp := sum / float64(len(counts))
	x := 0.0
	for _, c := range counts {
		x += (c - exp) * (c - exp) / exp
	}
	return (math.Cbrt(x/df) - (1 - 2/(9*df))) / math.Sqrt(2/(9*df))
}

// Each job's order is uniform over its subset though coupled to another
// job's: positions and adjacent pairs of both jobs pass chi-square tests,
// for datasets overlapping by half.
func TestDependentOrdersAreUniform(t *testing.T) {
	const n, trials = 8, 12000
	d1, d2 := rangeSet(0, 6), rangeSet(2, 8) // overlap by 4 of 6
	pos := [2][]float64{make([]float64, 64), make([]float64, 64)}
	pairs := [2][]float64{make([]float64, 64), make([]float64, 64)}
	for trial := range trials {
		g := NewGroup(Options{Records: n, Seed: uint64(trial + 1)})
		a, _ := g.Join(d1, 0)
		b, _ := g.Join(d2, 0)
		// Lockstep: both take at each round.
		for p := range 6 {
			for k, m := range []*Member{a, b} {
				buf := []int{0}
				m.Fill(0, p, buf)
				pos[k][buf[0]*8+p]++
				if p == 0 {
					pairs[k][buf[0]*8] += 0 // first of a pair below
				}
			}
		}
		for k, m := range []*Member{a, b} {
			o := m.seq
			pairs[k][int(o[0])*8+int(o[1])]++
		}
	}
	for k, set := range []*roaring.Bitmap{d1, d2} {
		var cells, pcells []float64
		for _, id := range set.ToArray() {
			for p := range 6 {
				cells = append(cells, pos[k][int(id)*8+p])
			}
			for _, id2 := range set.ToArray() {
				if id2 != id {
					pcells = append(pcells, pairs[k][int(id)*8+int(id2)])
				}
			}
		}
		if z := chi(cells, 25); z > 5 {
			t.Errorf("job %d: positions not uniform (z=%.1f)", k, z)
		}
		if z := chi(pcells, float64(len(pcells)-1)); z > 5 {
			t.Errorf("job %d: first two records not uniform pairs (z=%.1f)", k, z)
		}
	}
}

// The probability that two jobs pick the same record in a round reaches
// Joader's bound |I| / max(|D1|, |D2|) (Theorem 1), for nested and for
// partly overlapping datasets, within four standard errors.
func TestShareRateReachesTheBound(t *testing.T) {
	for _, c := range []struct {
		name   string
		d1, d2 *roaring.Bitmap
		bound  float64
	}{
		{"nested", rangeSet(0, 500), rangeSet(0, 1000), 500.0 / 1000},
		{"overlap", rangeSet(0, 600), rangeSet(300, 1000), 300.0 / 700},
		{"same", rangeSet(0, 1000), rangeSet(0, 1000), 1},
		{"disjoint", rangeSet(0, 500), rangeSet(500, 1000), 0},
	} {
		const trials = 20000
		same := 0
		for trial := range trials {
			g := NewGroup(Options{Records: 1000, Seed: uint64(trial + 1)})
			a, _ := g.Join(c.d1, 0)
			b, _ := g.Join(c.d2, 0)
			x, y := []int{0}, []int{0}
			a.Fill(0, 0, x) // the round gives b its first record too
			b.Fill(0, 0, y)
			if x[0] == y[0] {
				same++
			}
		}
		p := float64(same) / trials
		se := math.Sqrt(c.bound*(1-c.bound)/trials) + 1e-9
		if math.Abs(p-c.bound) > 4*se {
			t.Errorf("%s: shared %.4f of first rounds, the bound is %.4f", c.name, p, c.bound)
		}
	}
}

// Records a job does not share with the other are ordered independently
// of the other job: the correlation of their positions is about zero.
func TestNonSharedRecordsIndependent(t *testing.T) {
	const trials = 3000
	var sx, sy, sxx, syy, sxy float64
	n := 0.0
	for trial := range trials {
		g := NewGroup(Options{Records: 40, Seed: uint64(trial + 1)})
		a, _ := g.Join(rangeSet(0, 30), 0)
		b, _ := g.Join(rangeSet(10, 40), 0)
		ea, eb := epochOf(a, 0), epochOf(b, 0)
		pa, pb := map[int]int{}, map[int]int{}
		for p, id := range ea {
			pa[id] = p
		}
		for p, id := range eb {
			pb[id] = p
		}
		// Record 0 is a's alone, record 39 b's alone.
		x, y := float64(pa[0]), float64(pb[39])
		sx, sy, sxx, syy, sxy, n = sx+x, sy+y, sxx+x*x, syy+y*y, sxy+x*y, n+1
	}
	r := (n*sxy - sx*sy) / math.Sqrt((n*sxx-sx*sx)*(n*syy-sy*sy))
	if math.Abs(r) > 4/math.Sqrt(n) {
		t.Fatalf("positions of unshared records correlate: r=%.3f", r)
	}
}

// A job that falls behind is given at most QueueCap records ahead: the
// rest of its epoch waits in the classes.
func TestQueueCapBoundsLag(t *testing.T) {
	g := NewGroup(Options{Records: 1000, Seed: 1, QueueCap: 16})
	fast, _ := g.Join(nil, 0)
	slow, _ := g.Join(nil, 0)
	slow.Fill(0, 0, []int{0})
	epochOf(fast, 0)
	if len(slow.queue) > 16 {
		t.Fatalf("a slow job was given %d records ahead", len(slow.queue))
	}
	isPermutationOf(t, append(slices.Clone([]int{int(slow.seq[0])}), epochOf(slow, 0)[1:]...), nil, 1000)
}

// With no QueueCap, the jobs that fall behind are bounded by the group's
// bytes held: the records given to several jobs (read once, waiting in the
// cache, or in the page cache with none) come to at most four fifths of
// the cache's budget, or to Hold, counted once however many wait for one;
// a record given to one job alone counts nothing, as it is read when taken.
func TestLagBoundedByHeldBytes(t *testing.T) {
	const size, budget = 100, 64 << 10
	key := func(id int) cache.Key { return cache.Key{ID: int64(id)} }
	for _, k := range []struct {
		name       string
		opts       Options
		bound, per int64
	}{
		{"record cache", Options{Cache: cache.New(cache.Options{Budget: budget, DropUnreferenced: true})}, budget * 4 / 5, size + 64},
		{"page cache", Options{Hold: budget / 2}, budget / 2, size},
	} {
		t.Run(k.name, func(t *testing.T) {
			opts := k.opts
			opts.Records, opts.Seed, opts.Key, opts.Size = 5000, 2, key, func(int) int { return size }
			g := NewGroup(opts)
			// Two slow jobs want every record; the fast one the first half only.
			half := roaring.New()
			half.AddRange(0, 2500)
			fast, _ := g.Join(half, 0)
			slow, _ := g.Join(nil, 0)
			slow2, _ := g.Join(nil, 0)
			slow.Fill(0, 0, []int{0})
			slow2.Fill(0, 0, []int{0})
			held := func() int64 {
				ids := map[int32]int32{}
				for _, m := range []*Member{fast, slow, slow2} {
					for _, q := range m.queue {
						if q.size > 0 {
							ids[q.id] = q.size
						}
					}
				}
				var n int64
				for _, sz := range ids {
					if int64(sz) != k.per {
						t.Fatalf("a record held counts %d bytes, want %d", sz, k.per)
					}
					n += int64(sz)
				}
				return n
			}
			most := int64(0)
			for p := range 2500 {
				fast.Fill(0, p, []int{0})
				n := held()
				if n != g.held || n > k.bound+3*k.per {
					t.Fatalf("after %d of the fast job's records: %d bytes held (counted %d), want at most %d", p+1, n, g.held, k.bound+3*k.per)
				}
				most = max(most, n)
			}
			if most < k.bound/2 {
				t.Fatalf("at most %d bytes held of a bound of %d: the slow jobs did not share", most, k.bound)
			}
			// Taking records gives their bytes back, once the last taker has them.
			buf := []int{0}
			for p := 1; p < 2000; p++ {
				slow.Fill(0, p, buf)
				slow2.Fill(0, p, buf)
			}
			if n := held(); n != g.held {
				t.Fatalf("held %d after taking, queues' shared records hold %d", g.held, n)
			}
			slow.Leave()
			slow2.Leave()
			fast.Leave()
			if g.held != 0 || len(g.waiting) != 0 {
				t.Fatalf("%d bytes, %d records held after every job left", g.held, len(g.waiting))
			}
		})
	}
}

// Shared records are reserved in the cache with one use per job that was
// given them; a job that leaves gives its uses back, and a record no job
// will read again leaves the cache at once.
func TestLeaveReleasesReferences(t *testing.T) {
	c := cache.New(cache.Options{Budget: 1 << 20, DropUnreferenced: true})
	g := NewGroup(Options{Records: 100, Seed: 3, Cache: c, Key: func(id int) cache.Key { return cache.Key{ID: int64(id)} },
		Size: func(int) int { return 8 }, QueueCap: 1000})
	a, _ := g.Join(nil, 0)
	b, _ := g.Join(nil, 0)
	buf := []int{0}
	for p := range 10 {
		a.Fill(0, p, buf)
		// a's loader reads each record into the cache, as the first reader.
		it, st := c.Get(cache.Key{ID: int64(buf[0])})
		if st != cache.Claimed {
			t.Fatalf("record %d: %v, want it reserved for a to read", buf[0], st)
		}
		c.Fill(it, nil)
		it.Done(true)
	}
	if st := c.Stats(); st.Items != 10 {
		t.Fatalf("%d items held after 10 shared rounds, want 10 (b has not read them)", st.Items)
	}
	b.Leave()
	if st := c.Stats(); st.Items != 0 || st.Bytes != 0 {
		t.Fatalf("no job will read them, but %d items (%d bytes) are left", st.Items, st.Bytes)
	}
	// The records b had left carry its bit no more.
	if c2 := g.cl.count(func(sig uint64) bool { return sig&b.bit != 0 }); c2 != 0 {
		t.Fatalf("%d records still carry a departed job's bit", c2)
	}
}

// A resumed job delivers the rest of its epoch exactly once.
func TestMemberResume(t *testing.T) {
	g := NewGroup(Options{Records: 200, Seed: 5})
	a, _ := g.Join(rangeSet(50, 200), 0)
	head := make([]int, 60)
	a.Fill(0, 0, head)
	mark := a.Mark()
	// Read ahead past the mark: the state saved is still the mark's.
	ahead := make([]int, 25)
	a.Fill(0, 60, ahead)
	st, err := a.Save(mark)
	if err != nil {
		t.Fatal(err)
	}
	a.Leave()
	g2 := NewGroup(Options{Records: 200, Seed: 6})
	b, _ := g2.Join(rangeSet(50, 200), 0)
	e, pos, err := b.Restore(st)
	if err != nil || e != 0 || pos != 60 {
		t.Fatalf("restore: %d %d %v", e, pos, err)
	}
	rest := make([]int, 90)
	b.Fill(0, 60, rest)
	isPermutationOf(t, append(head, rest...), rangeSet(50, 200), 200)
	if _, _, err := b.Restore([]byte("junk")); err == nil {
		t.Fatal("junk state accepted")
	}
}

// A client whose daemon went away restores its member from the ids of
// the batches it delivered (RFBIT1, a bit a record): the rest of the
// epoch is exactly the records it did not deliver. A set of more records
// than the job has, or a record that is not its, is refused.
func TestMemberResumeFromClientBits(t *testing.T) {
	g := NewGroup(Options{Records: 200, Seed: 5})
	a, _ := g.Join(rangeSet(50, 200), 0)
	head := make([]int, 60)
	a.Fill(0, 0, head)
	opened, err := a.Save(a.Mark()) // a resumed job's state, the client's base
	if err != nil {
		t.Fatal(err)
	}
	more := make([]int, 30)
	a.Fill(0, 60, more)
	a.Leave()
	bitsOf := func(epoch, size int, base []byte, ids []int) []byte {
		b := append([]byte(fmt.Sprintf("%s%d %d %d\n", bitsMagic, epoch, size, len(base))), base...)
		set := make([]byte, 25)
		for _, id := range ids {
			set[id/8] |= 1 << (id % 8)
		}
		return append(b, set...)
	}
	for _, c := range []struct {
		state []byte
		head  []int
	}{
		{bitsOf(0, 150, nil, head), head},                                   // from the epoch's start
		{bitsOf(0, 150, opened, more), append(slices.Clone(head), more...)}, // from a resumed place
	} {
		g2 := NewGroup(Options{Records: 200, Seed: 6})
		b, _ := g2.Join(rangeSet(50, 200), 0)
		e, pos, err := b.Restore(c.state)
		if err != nil || e != 0 || pos != len(c.head) {
			t.Fatalf("restore: %d %d %v", e, pos, err)
		}
		rest := make([]int, 150-pos)
		b.Fill(0, pos, rest)
		isPermutationOf(t, append(c.head, rest...), rangeSet(50, 200), 200)
	}
	g3 := NewGroup(Options{Records: 200, Seed: 6})
	c, _ := g3.Join(rangeSet(50, 200), 0)
	for _, bad := range [][]byte{
		bitsOf(0, 150, nil, []int{3}),    // not the job's record
		bitsOf(0, 1, nil, head),          // more than the job has
		bitsOf(0, 150, opened, head[:1]), // delivered twice
		bitsOf(1, 150, opened, more),     // opened in another epoch
		[]byte(bitsMagic + "0 150\n"),
	} {
		if _, _, err := c.Restore(bad); !errors.Is(err, sampler.ErrState) {
			t.Fatalf("state %q: %v, want ErrState", bad[:min(len(bad), 20)], err)
		}
	}
}

// BenchmarkJoin is the cost of inserting a job of 1M records (a job
// joining, or starting its next epoch) into a group of three.
func BenchmarkJoin(b *testing.B) {
	const n = 1 << 20
	g := NewGroup(Options{Records: n, Seed: 1})
	for range 3 {
		m, _ := g.Join(nil, 0)
		m.Fill(0, 0, []int{0})
	}
	for b.Loop() {
		m, _ := g.Join(nil, 0)
		m.Fill(0, 0, []int{0})
		m.Leave()
	}
	b.ReportMetric(float64(n)/(b.Elapsed().Seconds()/float64(b.N)), "records/s")
}

// BenchmarkRound is one record for each of four jobs on one source.
func BenchmarkRound(b *testing.B) {
	const n = 1 << 20
	g := NewGroup(Options{Records: n, Seed: 1, QueueCap: 1 << 30})
	var ms []*Member
	for range 4 {
		m, _ := g.Join(nil, 0)
		ms = append(ms, m)
	}
	pos := make([]int, 4)
	buf := []int{0}
	for b.Loop() {
		for k, m := range ms {
			if pos[k] == n {
				continue
			}
			m.Fill(0, pos[k], buf)
			pos[k]++
		}
	}
	b.ReportMetric(float64(b.N*4)/b.Elapsed().Seconds(), "records/s")
}

// A place's state asked for after the member read on into the next epoch
// (a loader reads ahead across the boundary) is that place's, not an empty
// set that says it delivered nothing: the resumed job then repeated the
// epoch's first records (a resume with DataLoader workers and short epochs).
func TestSaveAPlaceOfTheEpochBefore(t *testing.T) {
	// A member of 100 records that fills epoch 0 to left and goes on into
	// epoch 1: the state of its place at pos, saved then, resumes epoch 0
	// with every record once.
	placeBefore := func(pos, left int) (*Member, []byte) {
		t.Helper()
		m, _ := NewGroup(Options{Records: 100, Seed: 1}).Join(nil, 0)
		head := make([]int, pos)
		m.Fill(0, 0, head)
		mark := m.Mark()
		m.Fill(0, pos, make([]int, left-pos))
		m.Fill(1, 0, []int{0}) // on into epoch 1
		st, err := m.Save(mark)
		if err != nil {
			t.Fatalf("the place at %d of an epoch left at %d: %v", pos, left, err)
		}
		m2, _ := NewGroup(Options{Records: 100, Seed: 2}).Join(nil, 0)
		if e, at, err := m2.Restore(st); err != nil || e != 0 || at != pos {
			t.Fatalf("restored at epoch %d position %d (%v), want 0, %d", e, at, err, pos)
		}
		rest := make([]int, 100-pos)
		m2.Fill(0, pos, rest)
		isPermutationOf(t, append(head, rest...), nil, 100)
		return m, st
	}
	m, st := placeBefore(60, 100)
	mark := memberMark{0, 60}
	buf := []int{0}
	// Tiny epochs are kept further back: a loader over a small part reads
	// several ahead (here two) before a place is asked for.
	for e := 1; e <= 2; e++ {
		for p := range 100 {
			m.Fill(e, p, buf)
		}
	}
	m.Fill(3, 0, buf)
	if st2, err := m.Save(mark); err != nil || string(st2) != string(st) {
		t.Fatalf("a place of a tiny epoch three back: %v", err)
	}
	// An epoch left before it was whole (a mixture's source, when another
	// ran out first) keeps its places too: the state of one asked after
	// the member went on into the next epoch is that place's.
	mp, _ := placeBefore(30, 70)
	epoch1 := make([]int, 100) // and the epoch it went on into is whole
	mp.Fill(1, 0, epoch1)
	isPermutationOf(t, epoch1, nil, 100)
	// Epochs of more than keepIDs records are not: a place two back is
	// gone, an error, never an empty set.
	big := NewGroup(Options{Records: keepIDs + 100, Seed: 1})
	mb, _ := big.Join(nil, 0)
	mb.Fill(0, 0, buf)
	bigMark := mb.Mark()
	chunk := make([]int, 4096)
	for e := 0; e <= 2; e++ {
		for p := 0; p < keepIDs+100; p += len(chunk) {
			mb.Fill(e, p, chunk)
		}
	}
	mb.Fill(3, 0, buf)
	if _, err := mb.Save(bigMark); err == nil {
		t.Fatal("a place of a large epoch three back saved")
	}
}
