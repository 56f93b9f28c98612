package job

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

// What an opened reply says the order is (wire.OrderInfo, from the job
// as it opened) agrees with what Check decides of the spec, for every
// sampler kind and option the combination test draws
// (python/tests/test_combinations.py: sampler, auto and opportunistic
// among them, x share x a subset x a mixture x a dataset with blocks of
// its own x ordered x ranks) and for each case it keeps
// (python/tests/combinations.json): a place is a position exactly when
// Check takes a start, the epoch resumes as its rest exactly when Check
// takes every part's places (shared exactly when the plan shares), the
// records are delivered as they lie in memory exactly when the daemon
// did so (its rule, before the order said it: memoryOrdered below), the
// order is shared exactly when the Python client took it to be before it
// asked (share with the global order, a mixture's too), a client may
// replay a shared state exactly when the client kept one then, and the
// kind is the one the job reads.
func TestOrderInfoAgreesWithCheck(t *testing.T) {
	dir := t.TempDir()
	fixed, fixed2, rows := filepath.Join(dir, "a.bin"), filepath.Join(dir, "b.bin"), filepath.Join(dir, "r.arrow")
	for _, p := range []string{fixed, fixed2} {
		if err := synth.WriteFixed(p, 600, 64, 0); err != nil {
			t.Fatal(err)
		}
	}
	writeBatches(t, rows, 3, 200)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()

	type kase struct {
		data, sampler string
		share, subset bool
		ordered       *bool
		world         int
	}
	yes := true
	var cases []kase
	for _, data := range []string{"fixed", "rows", "mixture"} {
		for _, s := range []string{"", "global", "block", "buffered", "reservoir", "sequential", "opportunistic", "auto"} {
			for _, share := range []bool{false, true} {
				for _, subset := range []bool{false, true} {
					for _, ordered := range []*bool{nil, &yes} {
						cases = append(cases, kase{data, s, share, subset, ordered, 1 + len(cases)%2})
					}
				}
			}
		}
	}
	// The combination test's kept cases: their formats as the order sees
	// them (rows with blocks of their own, a mixture, or records).
	b, err := os.ReadFile(filepath.Join("..", "python", "tests", "combinations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var kept []struct {
		Format, Sampler string
		Share, Subset   bool
		World           int
	}
	if err := json.Unmarshal(b, &kept); err != nil || len(kept) == 0 {
		t.Fatalf("combinations.json: %d cases (%v)", len(kept), err)
	}
	for _, c := range kept {
		data := "fixed"
		switch {
		case c.Format == "parquet" || c.Format == "arrow":
			data = "rows"
		case len(c.Format) >= 7 && c.Format[:7] == "mixture":
			data = "mixture"
		}
		cases = append(cases, kase{data: data, sampler: c.Sampler, share: c.Share, subset: c.Subset, world: c.World})
	}

	for _, c := range cases {
		name := fmt.Sprintf("%+v", c)
		// The spec as the Python client makes it of its keywords
		// (test_combinations.py's options).
		spec := &wire.JobSpec{BatchSize: 16, Shuffle: true, Seed: 5, Epochs: 2, World: c.world, Ordered: c.ordered}
		switch c.data {
		case "fixed":
			spec.Paths, spec.RecordSize = []string{fixed}, 64
		case "rows":
			spec.Paths = []string{rows}
		case "mixture":
			spec.Mixture, spec.RecordSize = []wire.MixSource{{Paths: []string{fixed}, Weight: 1}, {Paths: []string{fixed2}, Weight: 2}}, 64
		}
		switch c.sampler {
		case "opportunistic":
			spec.Sampler, spec.Opportunistic = "global", 2
		case "block":
			spec.Sampler = "block"
			if c.data != "rows" {
				spec.BlockSize, spec.Window = 4096, 4
			}
		default:
			spec.Sampler = c.sampler
		}
		if c.share {
			spec.Share = &yes
		}
		if c.subset {
			spec.Subset = &wire.Subset{Ranges: [][2]int{{10, 400}}}
			if c.data == "mixture" {
				spec.Subset.Ranges = append(spec.Subset.Ranges, [2]int{610, 1000})
			}
		}
		d, err := env.Check(context.Background(), spec)
		if c.sampler == "auto" && c.data != "fixed" {
			// Auto weighs orders of one dataset of records: it refuses a
			// mixture (Check) and a dataset's own blocks (at open).
			if err == nil {
				t.Errorf("%s: opened", name)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		plan, err := Check(spec)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := d.Order

		start := *spec
		start.Start, start.Epochs = 1, 1
		_, startErr := Check(&start)
		rest := *spec
		rest.Epochs, rest.Delivered = 1, []wire.State{{Epoch: 0}}
		_, restErr := Check(&rest)
		if got.Positional != (startErr == nil) {
			t.Errorf("%s: positional %v, but Check of a start says %v", name, got.Positional, startErr)
		}
		if (got.Rest != "") != (restErr == nil) || (got.Rest == "shared") != (plan.Share && plan.Mixture == nil) {
			t.Errorf("%s: rest %q (the plan shares: %v), but Check of every part's places says %v", name, got.Rest, plan.Share, restErr)
		}
		if got.Packed != memoryOrdered(plan) {
			t.Errorf("%s: packed %v, the daemon's rule says %v", name, got.Packed, !got.Packed)
		}
		shared := c.share && (c.sampler == "" || c.sampler == "global" || c.sampler == "opportunistic")
		if got.Shared != shared {
			t.Errorf("%s: shared %v, the client took it to be %v", name, got.Shared, shared)
		}
		keeps := plan.Share && plan.Loader.Opportunistic <= 1 && plan.Mixture == nil
		if got.Replay != keeps {
			t.Errorf("%s: replay %v, the client kept a shared state: %v", name, got.Replay, keeps)
		}
		want := plan.Sampler.Kind
		switch {
		case want == "auto":
			want = d.Auto.Sampler
		case c.data == "rows" && (want == "" || want == "block"):
			want = "block" // the file's record batches
		case want == "":
			want = "global"
		}
		if got.Kind != want {
			t.Errorf("%s: kind %q, want %q", name, got.Kind, want)
		}
	}
}

// memoryOrdered is the daemon's rule before the order said it
// (server/handle.go): a plan's batches are delivered in the order their
// records lie in memory when the client left the order inside batches to
// the batch and the layout is a function of the plan.
func memoryOrdered(plan Plan) bool {
	switch plan.Sampler.Kind {
	case "", "global", "sequential", "block", "auto":
	default:
		return false
	}
	return !plan.Loader.Ordered && !plan.Share && plan.Loader.Opportunistic <= 1 && plan.Mixture == nil
}

// writeBatches writes an LZ4 Arrow IPC file of batches record batches of
// rows int64 rows each: a dataset of rows with blocks of its own.
func writeBatches(t *testing.T, path string, batches, rows int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := arrow.NewSchema([]arrow.Field{{Name: "x", Type: arrow.PrimitiveTypes.Int64}}, nil)
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(sc), ipc.WithLZ4())
	if err != nil {
		t.Fatal(err)
	}
	b := array.NewInt64Builder(memory.NewGoAllocator())
	for k := range batches {
		for i := range rows {
			b.Append(int64(k*rows + i))
		}
		arr := b.NewArray()
		rec := array.NewRecord(sc, []arrow.Array{arr}, int64(rows))
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
		arr.Release()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
