package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

// epochIDs loads one epoch of a job and returns its ids and the bytes of
// each record as the client sees them (through shared memory).
func epochRecords(t *testing.T, cl *client, spec *wire.JobSpec) (ids []int, recs [][]byte, info *wire.Info) {
	return epochRecordsGated(t, cl, spec, nil, nil)
}

// epochRecordsGated is epochRecords, calling gate (if not nil) once the
// job is open and before it asks for a batch.
func epochRecordsGated(t *testing.T, cl *client, spec *wire.JobSpec, gate, end func()) (ids []int, recs [][]byte, info *wire.Info) {
	t.Helper()
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec})
	if op.Op != wire.OpOpened {
		t.Fatalf("open: %+v", op)
	}
	if gate != nil {
		gate()
	}
	mem, err := unix.Mmap(cl.fd, 0, int(op.ArenaSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	defer unix.Close(cl.fd)
	for {
		b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		if b.Op == wire.OpEnd {
			break
		}
		if b.Op != wire.OpBatch {
			t.Fatalf("next: %+v", b)
		}
		meta := mem[b.MetaOff:]
		for i := range b.N {
			id := int(binary.LittleEndian.Uint64(meta[8*i:]))
			off := int64(binary.LittleEndian.Uint64(meta[8*(b.N+i):]))
			n := int64(binary.LittleEndian.Uint64(meta[8*(2*b.N+i):]))
			ids = append(ids, id)
			recs = append(recs, slices.Clone(mem[b.DataOff+off:b.DataOff+off+n]))
		}
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{b.Seq}})
		if b.Last {
			break
		}
	}
	if end != nil {
		end()
	}
	cl.req(t, &wire.Msg{Op: wire.OpClose, Job: op.Job})
	return ids, recs, op.Info
}

// eventually waits for cond, polling it, for at most ten seconds: a test
// waits on a condition, never on a sleep that stands in for one.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Two clients sharing one source: each sees its records once with their
// bytes, the daemon reads far less than twice the data, and its status
// shows one group of two.
func TestSharedJobsOverSockets(t *testing.T) {
	s := &Server{CacheBytes: 64 << 20}
	cl0, _ := daemon(t, s)
	p := filepath.Join(t.TempDir(), "d.bin")
	const n = 4000
	synth.WriteFixed(p, n, 256, 0)
	yes := true
	var wg sync.WaitGroup
	results := make([][]int, 2)
	// Both jobs read only once both are open in one group: a job that
	// started alone would read alone until the other came (the flake this
	// test had, 5 runs in 60).
	start, closing := make(chan struct{}), make(chan struct{})
	var read sync.WaitGroup
	read.Add(2)
	for k := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A job that fails before its end still lets the test go on
			// (to fail on the counts, not wait for ever).
			done := sync.OnceFunc(read.Done)
			defer done()
			cl := dial(t, s.Addr())
			defer cl.c.Close()
			ids, recs, info := epochRecordsGated(t, cl, &wire.JobSpec{Paths: []string{p}, RecordSize: 256, Shuffle: true, BatchSize: 50,
				Share: &yes, Prefetch: 2, Seed: uint64(k)}, func() { <-start }, func() { done(); <-closing })
			if !info.Shared {
				t.Errorf("job %d not shared", k)
			}
			for i, id := range ids {
				if err := synth.CheckRecord(recs[i], id); err != nil {
					t.Errorf("job %d: %v", k, err)
					return
				}
			}
			results[k] = ids
		}()
	}
	eventually(t, "status shows the two jobs in one group", func() bool {
		for _, g := range cl0.req(t, &wire.Msg{Op: wire.OpStatus}).Status.Groups {
			if len(g.Jobs) == 2 {
				return true
			}
		}
		return false
	})
	close(start)
	// Both jobs have read their epoch and are still open: their group's
	// counts. Two jobs at one pace are given one record in most rounds,
	// read once: from the page cache for the second (the raw records of a
	// local file are held there, not copied), so the daemon's own reads
	// count both.
	read.Wait()
	var g wire.GroupStatus
	for _, gs := range cl0.req(t, &wire.Msg{Op: wire.OpStatus}).Status.Groups {
		if len(gs.Jobs) == 2 {
			g = gs
		}
	}
	close(closing)
	wg.Wait()
	for k, ids := range results {
		s := slices.Sorted(slices.Values(ids))
		if len(s) != n || s[0] != 0 || s[n-1] != n-1 || len(slices.Compact(s)) != n {
			t.Fatalf("job %d: %d records, not each of %d once", k, len(ids), n)
		}
	}
	if g.Given < 2*n || g.Saved < n/2 {
		t.Fatalf("the group gave %d records and saved %d reads for two jobs of %d records", g.Given, g.Saved, n)
	}
	if st := cl0.req(t, &wire.Msg{Op: wire.OpStatus}).Status; st.ServedBytes != 2*n*256 || st.Cache.Hits != 0 {
		t.Fatalf("served %d bytes for two jobs of %d bytes each, %d from copies in the record cache", st.ServedBytes, n*256, st.Cache.Hits)
	}
}

// A subset by ranges, ids and labels is read exactly, once per epoch.
func TestSubsetJobs(t *testing.T) {
	cl, data := daemon(t, &Server{})
	ids, _, _ := epochRecords(t, cl, &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 16,
		Subset: &wire.Subset{Ranges: [][2]int{{10, 20}, {100, 105}}, IDs: []int{3, 499, 15}}})
	want := []int{3}
	for i := 10; i < 20; i++ {
		want = append(want, i)
	}
	want = append(want, 100, 101, 102, 103, 104, 499)
	if got := slices.Sorted(slices.Values(ids)); !slices.Equal(got, want) {
		t.Fatalf("subset delivered %v, want %v", got, want)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	synth.WriteTree(tree, []string{"a", "b", "c"}, 4)
	ids, _, _ = epochRecords(t, cl, &wire.JobSpec{Paths: []string{tree}, Shuffle: true, BatchSize: 3, Subset: &wire.Subset{Labels: []int{0, 2}}})
	if got := slices.Sorted(slices.Values(ids)); !slices.Equal(got, []int{0, 1, 2, 3, 8, 9, 10, 11}) {
		t.Fatalf("labels 0 and 2: %v", got)
	}
	if m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, BatchSize: 4,
		Subset: &wire.Subset{IDs: []int{500}}}}); m.Op != wire.OpError || !mentions(m, "subset") {
		t.Fatalf("an id past the end: %+v", m)
	}
}

// A job naming a transform gets its outputs, and is told their shape.
func TestTransformJob(t *testing.T) {
	cl, _ := daemon(t, &Server{})
	p := filepath.Join(t.TempDir(), "d.svm")
	var lines []string
	for i := range 100 {
		lines = append(lines, fmt.Sprintf("%d %d:%d.5", i, i%5+1, i))
	}
	writeLines(t, p, lines)
	ids, recs, info := epochRecords(t, cl, &wire.JobSpec{Paths: []string{p}, Shuffle: true, BatchSize: 32, Transform: "libsvm_dense:n_features=5"})
	if info.Dtype != "<f4" || !slices.Equal(info.Shape, []int{6}) || info.RecordSize != 24 || info.Transform == "" {
		t.Fatalf("info %+v", info)
	}
	for k, id := range ids {
		f := func(i int) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(recs[k][4*i:])) }
		if f(0) != float32(id) || f(1+id%5) != float32(id)+0.5 {
			t.Fatalf("record %d: %v", id, recs[k])
		}
	}
	if m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{p}, BatchSize: 4, Transform: "nope"}}); m.Op != wire.OpError || !mentions(m, "unknown transform") {
		t.Fatalf("unknown transform: %+v", m)
	}
}

// Prometheus metrics name the daemon's traffic, cache and groups.
func TestMetrics(t *testing.T) {
	s := &Server{Metrics: "127.0.0.1:0"}
	cl, data := daemon(t, s)
	wholeEpoch(t, cl, &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 64})
	var body string
	eventually(t, "metrics served", func() bool { return s.MetricsAddr() != "" })
	resp, err := http.Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body = string(b)
	for _, want := range []string{"riffle_read_bytes_total 64000", "riffle_served_bytes_total 64000", "riffle_cache_budget_bytes",
		"riffle_cache_hits_total", "riffle_clients 1"} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
}

// Status through the Go client, as `riffle status` asks.
func TestStatusClient(t *testing.T) {
	s := &Server{}
	cl, data := daemon(t, s)
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 64}})
	cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
	st, err := Status(context.Background(), s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Groups) != 1 || len(st.Groups[0].Jobs) != 1 || st.Groups[0].Jobs[0].Subset != 500 || st.Clients < 1 || !strings.HasSuffix(st.Groups[0].Source, "d.bin (fixed)") {
		t.Fatalf("status %+v", st)
	}
}
