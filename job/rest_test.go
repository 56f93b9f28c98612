package job

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

// A shared order's epoch, stopped part way on one topology, goes on on
// another from the places of every part of the first, and that rest,
// stopped too, on a third: together the runs deliver each record once
// (less the pads each run's equal parts add), with the right bytes,
// whatever the numbers of ranks and workers, and though some parts
// delivered all of theirs (their place is the next epoch's start, which
// says what they delivered only by whose part it is).
func TestSharedRestOnAnotherTopology(t *testing.T) {
	yes := true
	restRuns(t, func(s *wire.JobSpec) { s.Share = &yes })
}

// So does an opportunistic order's (not shared): its windows deliver
// records in the order reads end, so a place is a window less what it
// delivered of it, per rank and worker, and the rest is the order from
// the first position not every part delivered, less what some delivered
// past it.
func TestOpportunisticRestOnAnotherTopology(t *testing.T) {
	restRuns(t, func(s *wire.JobSpec) { s.Opportunistic = 2 })
}

// restRuns reads an epoch of a global order, with the options set sets,
// over runs of several topologies, each resuming the one before from the
// places of all its parts.
func restRuns(t *testing.T, set func(*wire.JobSpec)) {
	const n, batch = 1000, 20
	path := filepath.Join(t.TempDir(), "records.bin")
	if err := synth.WriteFixed(path, n, 64, 0); err != nil {
		t.Fatal(err)
	}
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	spec := func(rank, world, worker, workers int) *wire.JobSpec {
		s := &wire.JobSpec{Paths: []string{path}, RecordSize: 64, BatchSize: batch, Shuffle: true, Seed: 7,
			Rank: rank, World: world, BatchStride: workers, BatchOffset: worker, Epoch: 3, Epochs: 1}
		set(s)
		return s
	}
	// read takes up to stop batches of a job (all, if negative), counting
	// each record in seen, and returns the job's place after them, and, of
	// a rest, what it was opened from, which its places carry.
	read := func(t *testing.T, s *wire.JobSpec, stop int, seen map[int]int) (wire.State, []byte) {
		t.Helper()
		j := openJob(t, env, s)
		defer j.Close()
		takeChecked(t, j, stop, seen)
		st := j.State()
		part := &wire.Part{Rank: s.Rank, World: max(1, s.World), Worker: s.BatchOffset, Workers: max(1, s.BatchStride)}
		if s.Opportunistic > 1 {
			part.BatchSize, part.Window = s.BatchSize, s.Opportunistic
		}
		return wire.State{Epoch: st.Epoch, Batch: st.Batch, Sampler: st.Sampler, Skip: st.Skip, Part: part}, j.Describe().Delivered
	}
	type topo struct{ world, workers int }
	for _, c := range []struct {
		runs  []topo
		whole int // every whole-th part of a run but the last reads all of its part
	}{
		{[]topo{{1, 2}, {1, 3}}, 3}, // DataLoader workers 2 -> 3
		{[]topo{{1, 3}, {1, 0}}, 3}, // 3 -> none
		{[]topo{{2, 2}, {3, 1}}, 3}, // 2 ranks x 2 workers -> 3 ranks x 1
		{[]topo{{3, 1}, {1, 4}}, 3},
		// The same topology, rank 1 done: its part of the rest holds no
		// record, and its epoch ends at once.
		{[]topo{{2, 1}, {2, 1}}, 2},
		// A rest of a rest: its parts, whole ones too, are of what the
		// first left.
		{[]topo{{2, 2}, {3, 1}, {2, 3}}, 3},
		{[]topo{{1, 0}, {2, 2}, {3, 0}, {1, 2}}, 2},
	} {
		seen := map[int]int{}
		var places []wire.State
		k, pads, before := 0, 0, 0
		for i, run := range c.runs {
			last := i == len(c.runs)-1
			var next []wire.State
			for r := range run.world {
				for w := range max(1, run.workers) {
					s := spec(r, run.world, w, max(1, run.workers))
					s.Delivered = places
					k++
					// Stops fall inside opportunistic windows (2 batches)
					// and on their ends.
					stop := k%4 + 1
					if last || k%c.whole == 0 {
						stop = -1
					}
					place, basis := read(t, s, stop, seen)
					next = append(next, place)
					if basis != nil && r == 0 && w == 0 {
						next = append(next, wire.State{Epoch: 3, Sampler: basis})
					}
				}
			}
			places = next
			pads += run.world - 1
			if i == 0 {
				before = len(seen)
			}
		}
		if len(seen) != n {
			t.Fatalf("%v: %d records of %d delivered", c.runs, len(seen), n)
		}
		// Parts are equal, as DistributedSampler's: each run pads its
		// ranks with at most world-1 records of another's.
		repeats := 0
		for _, m := range seen {
			repeats += m - 1
		}
		if repeats > pads {
			t.Fatalf("%v: %d records twice, at most %d pads", c.runs, repeats, pads)
		}
		if before == 0 || before == n {
			t.Fatalf("%v: %d delivered before the resume: the test resumes nothing", c.runs, before)
		}
	}
}

// A rest refuses places it cannot hold to: of another dataset, past its
// epoch, or with no order that is shared.
func TestSharedRestRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.bin")
	if err := synth.WriteFixed(path, 100, 64, 0); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(t.TempDir(), "big.bin")
	if err := synth.WriteFixed(big, 1000, 64, 0); err != nil {
		t.Fatal(err)
	}
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	yes := true
	// A place 30 batches into an epoch of the larger file.
	plan, err := Check(&wire.JobSpec{Paths: []string{big}, RecordSize: 64, BatchSize: 10, Shuffle: true, Share: &yes, Epochs: 1})
	if err != nil {
		t.Fatal(err)
	}
	j, err := env.open(context.Background(), plan, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		b, err := j.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	}
	st := j.State()
	j.Close()
	place := wire.State{Epoch: st.Epoch, Batch: st.Batch, Sampler: st.Sampler}
	for _, c := range []struct {
		name string
		spec wire.JobSpec
	}{
		{"another dataset", wire.JobSpec{Paths: []string{path}, Epochs: 1, Delivered: []wire.State{place}}},
		{"past the epoch", wire.JobSpec{Paths: []string{big}, Epoch: 0, Epochs: 1, Delivered: []wire.State{{Epoch: 0, Batch: 1, Sampler: []byte("RFSET1\x00" + "2 0\n:0\x00\x00\x00\x00\x00\x00")}}}},
		{"not shared", wire.JobSpec{Paths: []string{big}, Epochs: 1, Delivered: []wire.State{place}, Share: new(bool)}},
		{"more epochs", wire.JobSpec{Paths: []string{big}, Epochs: 2, Delivered: []wire.State{place}}},
		{"a block order", wire.JobSpec{Paths: []string{big}, Epochs: 1, Delivered: []wire.State{place}, Sampler: "block"}},
		{"no sampler state", wire.JobSpec{Paths: []string{big}, Epochs: 1, Delivered: []wire.State{{Epoch: 0, Batch: 3}}}},
		{"past the epoch, whose part unsaid", wire.JobSpec{Paths: []string{big}, Epochs: 1, Delivered: []wire.State{{Epoch: 1}}}},
		{"a part out of bounds", wire.JobSpec{Paths: []string{big}, Epochs: 1, Delivered: []wire.State{{Epoch: 1, Part: &wire.Part{Rank: 2, World: 2, Workers: 1}}}}},
	} {
		s := c.spec
		s.RecordSize, s.BatchSize, s.Shuffle = 64, 10, true
		if s.Share == nil {
			s.Share = &yes
		}
		plan, err := Check(&s)
		if err == nil {
			var j *Job
			if j, err = env.open(context.Background(), plan, nil); err == nil {
				j.Close()
			}
		}
		if !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v, want a spec error", c.name, err)
		} else {
			t.Logf("%s: %v", c.name, err)
		}
	}
}

// An opportunistic rest refuses places it cannot hold to: of part of the
// ranks, without whose part they are, of parts of other runs, and skips
// of records their windows do not hold.
func TestOpportunisticRestRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "records.bin")
	if err := synth.WriteFixed(path, 1000, 64, 0); err != nil {
		t.Fatal(err)
	}
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	part := func(rank int) *wire.Part {
		return &wire.Part{Rank: rank, World: 2, Workers: 1, BatchSize: 10, Window: 2}
	}
	for name, places := range map[string][]wire.State{
		"one rank of two":    {{Epoch: 0, Batch: 2, Part: part(0)}},
		"no part":            {{Epoch: 0, Batch: 2}, {Epoch: 0, Batch: 2, Part: part(1)}},
		"another batch size": {{Epoch: 0, Batch: 2, Part: part(0)}, {Epoch: 0, Batch: 2, Part: &wire.Part{Rank: 1, World: 2, Workers: 1, BatchSize: 20, Window: 2}}},
		"a foreign skip":     {{Epoch: 0, Batch: 1, Skip: []int{100000}, Part: part(0)}, {Epoch: 0, Batch: 2, Part: part(1)}},
		"a shared state":     {{Epoch: 0, Batch: 2, Sampler: []byte("RFSET1\x00"), Part: part(0)}, {Epoch: 0, Batch: 2, Part: part(1)}},
		"given twice":        {{Epoch: 0, Batch: 2, Part: part(0)}, {Epoch: 0, Batch: 4, Part: part(0)}, {Epoch: 0, Batch: 2, Part: part(1)}},
	} {
		s := wire.JobSpec{Paths: []string{path}, RecordSize: 64, BatchSize: 10, Shuffle: true, Opportunistic: 2, Epochs: 1, Delivered: places}
		plan, err := Check(&s)
		if err == nil {
			var j *Job
			if j, err = env.open(context.Background(), plan, nil); err == nil {
				j.Close()
			}
		}
		if !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v, want a spec error", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// A part of an opportunistic rest opened again where it was (a client
// reconnecting to a restarted daemon) names only the rest, its basis, and
// its place in it: it goes on with the records the rest has left.
func TestOpportunisticRestReopens(t *testing.T) {
	const n = 1000
	path := filepath.Join(t.TempDir(), "records.bin")
	if err := synth.WriteFixed(path, n, 64, 0); err != nil {
		t.Fatal(err)
	}
	env, err := NewEnv(EnvOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	seen := map[int]int{}
	open := func(s wire.JobSpec) *Job {
		s.Paths, s.RecordSize, s.BatchSize, s.Shuffle, s.Seed, s.Opportunistic = []string{path}, 64, 20, true, 7, 2
		return openJob(t, env, &s)
	}
	take := func(j *Job, stop int) { takeChecked(t, j, stop, seen) }
	var places []wire.State
	for r := range 2 {
		j := open(wire.JobSpec{Rank: r, World: 2, Epochs: 1})
		take(j, 3+r)
		st := j.State()
		places = append(places, wire.State{Epoch: st.Epoch, Batch: st.Batch, Skip: st.Skip,
			Part: &wire.Part{Rank: r, World: 2, Workers: 1, BatchSize: 20, Window: 2}})
		j.Close()
	}
	rest := open(wire.JobSpec{Epochs: 1, Delivered: places})
	take(rest, 5) // inside a window of 2 batches
	st, basis := rest.State(), rest.Describe().Delivered
	rest.Close()
	if len(st.Skip) == 0 {
		t.Fatalf("the rest stopped at %+v, not inside a window: the test reopens nothing of one", st)
	}
	again := open(wire.JobSpec{Epochs: 1, Batch: st.Batch, Skip: st.Skip, Delivered: []wire.State{{Sampler: basis}}})
	take(again, -1)
	again.Close()
	if len(seen) != n {
		t.Fatalf("%d records of %d delivered", len(seen), n)
	}
	for id, k := range seen {
		if k != 1 {
			t.Fatalf("record %d delivered %d times", id, k)
		}
	}
}

// takeChecked takes up to stop batches of j (all, if negative), checking
// each record's bytes and counting it in seen.
func takeChecked(t *testing.T, j *Job, stop int, seen map[int]int) {
	t.Helper()
	for k := 0; stop < 0 || k < stop; k++ {
		b, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range b.IDs {
			if err := synth.CheckRecord(b.Record(i), id); err != nil {
				t.Fatalf("record %d: %v", id, err)
			}
			seen[id]++
		}
		b.Release()
	}
}
