package server

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// The split adds up to the limit, and the Go heap's limit gives back what
// the arenas take; a cache asked for larger than the limit leaves the jobs
// an eighth.
func TestSplitMemory(t *testing.T) {
	for _, tc := range []struct {
		total, cache int64
		fits         bool
	}{{512 << 20, 0, true}, {512 << 20, 64 << 20, true}, {24 << 30, 0, true}, {512 << 20, 1 << 30, false}} {
		sp := splitMemory(tc.total, tc.cache)
		if tc.cache > 0 && sp.cache != tc.cache {
			t.Errorf("%+v: cache %d", tc, sp.cache)
		}
		if sp.jobs < tc.total/8 {
			t.Errorf("%+v: jobs get %d, less than an eighth", tc, sp.jobs)
		}
		if !tc.fits {
			continue
		}
		if sum := sp.slack + sp.cache + sp.heap + sp.jobs; sum != tc.total {
			t.Errorf("%+v: %+v adds up to %d, not the limit", tc, sp, sum)
		}
		if got := sp.heapLimit(0) + sp.slack; got != tc.total {
			t.Errorf("%+v: no job: Go limit %d + slack %d, want the limit", tc, sp.heapLimit(0), sp.slack)
		}
		if got := sp.heapLimit(sp.jobs); got != sp.cache+sp.heap {
			t.Errorf("%+v: every arena reserved: Go limit %d, want the cache and the heap's reserve", tc, got)
		}
	}
}

// waitFor polls cond with a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestBudget(t *testing.T) {
	var limits []int64
	b := &budget{sp: split{total: 1000, jobs: 100, cache: 10, heap: 10}, wait: time.Minute,
		changed: func(held int64) { limits = append(limits, held) }}
	ctx := context.Background()

	// Larger than the whole budget: refused at once, saying what fits.
	if _, err := b.reserve(ctx, 101); !errors.Is(err, job.ErrMemory) || job.Kind(err) != "memory" ||
		!strings.Contains(err.Error(), "lower memory_bytes or batch_size") {
		t.Fatalf("a job larger than the budget: %v", err)
	}
	r1, err := b.reserve(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := b.reserve(ctx, 40)
	if err != nil {
		t.Fatal(err)
	}
	// Full: the next waits, first come first served: a large waiter is
	// not passed by a small one behind it.
	big := make(chan func(), 1)
	go func() {
		r, err := b.reserve(ctx, 70)
		if err != nil {
			t.Error(err)
		}
		big <- r
	}()
	waitFor(t, "the first waiter", func() bool { return len(b.status().Waiting) == 1 })
	small := make(chan func(), 1)
	go func() {
		r, err := b.reserve(ctx, 10)
		if err != nil {
			t.Error(err)
		}
		small <- r
	}()
	waitFor(t, "the second waiter", func() bool { return len(b.status().Waiting) == 2 })
	r2() // 40 free: the 70 at the head still waits, and so does the 10 behind it
	time.Sleep(10 * time.Millisecond)
	if st := b.status(); len(st.Waiting) != 2 || st.Held != 60 || st.Holders != 1 {
		t.Fatalf("after a release that fits only the second waiter: %+v", st)
	}
	r1()
	rBig, rSmall := <-big, <-small
	if st := b.status(); len(st.Waiting) != 0 || st.Held != 80 || st.Holders != 2 {
		t.Fatalf("after both waiters fit: %+v", st)
	}

	// A waiter whose client goes leaves the queue; one that waits too
	// long is refused, saying what holds the budget.
	cctx, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() { _, err := b.reserve(cctx, 30); gone <- err }()
	waitFor(t, "the waiter", func() bool { return len(b.status().Waiting) == 1 })
	cancel()
	if err := <-gone; !errors.Is(err, job.ErrMemory) || !strings.Contains(err.Error(), "the client went") {
		t.Fatalf("a waiter whose client went: %v", err)
	}
	b.wait = 20 * time.Millisecond
	_, err = b.reserve(ctx, 30)
	if !errors.Is(err, job.ErrMemory) || !strings.Contains(err.Error(), "80 B of the daemon's 100 B for all jobs' is held by 2 jobs") {
		t.Fatalf("a waiter that waited too long: %v", err)
	}
	if st := b.status(); len(st.Waiting) != 0 || st.Refused != 3 {
		t.Fatalf("after the refusals: %+v", st)
	}
	rBig()
	rSmall()
	if st := b.status(); st.Held != 0 || st.Holders != 0 {
		t.Fatalf("after every release: %+v", st)
	}
	if limits[len(limits)-1] != 0 {
		t.Fatalf("the heap's limit was last told %d held", limits[len(limits)-1])
	}
}

// Over the socket: opens reserve their arenas from the budget; one that
// does not fit waits (status shows it) until a job closes; one larger than
// the budget is refused at once, and one that waits too long is refused;
// a client whose held batches fill its job's memory is told so.
func TestBudgetOverTheSocket(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.bin")
	synth.WriteFixed(data, 4096, 4096, 0)
	// 64 MiB: 4 slack, 16 cache, 8 heap, 36 for jobs.
	s := &Server{Socket: sockPath(t), MemoryBytes: 64 << 20, MemoryWait: time.Minute, heldWait: 50 * time.Millisecond}
	stop := serve(t, s)
	defer stop()
	spec := func(mem int64) *wire.JobSpec {
		return &wire.JobSpec{Paths: []string{data}, RecordSize: 4096, Shuffle: true, BatchSize: 64, World: 1, MemoryBytes: mem, Epochs: 1}
	}
	a, b, c, watch := dial(t, s.Socket), dial(t, s.Socket), dial(t, s.Socket), dial(t, s.Socket)
	for _, cl := range []*client{a, b, c, watch} {
		defer cl.c.Close()
	}
	memory := func() *wire.MemoryStatus { return watch.req(t, &wire.Msg{Op: wire.OpStatus}).Status.Memory }
	ja := a.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec(8 << 20)})
	jb := b.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec(8 << 20)})
	if ja.Op != wire.OpOpened || jb.Op != wire.OpOpened {
		t.Fatalf("opens that fit: %+v %+v", ja, jb)
	}
	unix.Close(a.fd)
	unix.Close(b.fd)
	if m := memory(); m.Jobs != 36<<20 || m.Holders != 2 || m.Held != ja.ArenaSize+jb.ArenaSize {
		t.Fatalf("two jobs open: %+v (arenas %d, %d)", m, ja.ArenaSize, jb.ArenaSize)
	}
	// Larger than the whole budget: refused at once.
	if r := c.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec(20 << 20)}); r.Op != wire.OpError || r.Kind != wire.KindMemory ||
		!strings.Contains(r.Message, "lower memory_bytes or batch_size") {
		t.Fatalf("a job larger than the budget: %+v", r)
	}
	// No room: c waits, and opens once a's job closes.
	tag := c.send(t, &wire.Msg{Op: wire.OpOpen, Spec: spec(8 << 20)})
	waitFor(t, "an open waiting", func() bool { return len(memory().Waiting) == 1 })
	a.req(t, &wire.Msg{Op: wire.OpClose, Job: ja.Job})
	if r := c.recv(t); r.Tag != tag || r.Op != wire.OpOpened {
		t.Fatalf("the waiting open: %+v", r)
	}
	if m := memory(); m.Holders != 2 || len(m.Waiting) != 0 {
		t.Fatalf("after the wait: %+v", m)
	}
	// c's job holds its batches: 8 MiB of memory, 256 KiB batches; the
	// request after the bound is filled is told why.
	var last *wire.Msg
	for range 40 {
		if last = c.req(t, &wire.Msg{Op: wire.OpNext, Job: 1}); last.Op != wire.OpBatch {
			break
		}
	}
	if last.Op != wire.OpError || last.Kind != wire.KindMemory || !strings.Contains(last.Message, "the client holds") {
		t.Fatalf("a client holding every batch: %+v", last)
	}
	unix.Close(c.fd)
}
