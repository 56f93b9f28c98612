package server

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// The split adds up to the limit, and the Go heap's limit gives back what
// the arenas take and leaves the decodes' part (libjpeg's memory is not
// the Go heap's); a cache asked for larger than the limit leaves the jobs
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
		if got := sp.heapLimit(0) + sp.slack + sp.decode; got != tc.total {
			t.Errorf("%+v: no job: Go limit %d + slack %d + decodes %d, want the limit", tc, sp.heapLimit(0), sp.slack, sp.decode)
		}
		if got := sp.heapLimit(sp.jobs); got != sp.cache+sp.heap-sp.decode {
			t.Errorf("%+v: every arena reserved: Go limit %d, want the cache and the heap's reserve less the decodes'", tc, got)
		}
		if sp.decode <= 0 || sp.decode > sp.heap {
			t.Errorf("%+v: decodes get %d of the heap's %d", tc, sp.decode, sp.heap)
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

// fixed reserves a hold that does not bend (want == floor).
func fixed(t *testing.T, b *budget, n int64) func() {
	t.Helper()
	h, err := b.reserve(context.Background(), n, n)
	if err != nil {
		t.Fatal(err)
	}
	b.attach(h, func(int64, func()) bool { return true })
	return func() { b.release(h) }
}

func TestBudget(t *testing.T) {
	var limits []int64
	b := &budget{sp: split{total: 1000, jobs: 100, cache: 10, heap: 10}, wait: time.Minute,
		changed: func(held int64) { limits = append(limits, held) }}
	ctx := context.Background()

	// Larger than the whole budget: refused at once, saying what fits.
	if _, err := b.reserve(ctx, 101, 101); !errors.Is(err, job.ErrMemory) || job.Kind(err) != "memory" ||
		!strings.Contains(err.Error(), "lower memory_bytes or batch_size") {
		t.Fatalf("a job larger than the budget: %v", err)
	}
	r1 := fixed(t, b, 60)
	r2 := fixed(t, b, 40)
	// Full: the next waits, first come first served: a large waiter is
	// not passed by a small one behind it.
	big := make(chan func(), 1)
	go func() { big <- fixed(t, b, 70) }()
	waitFor(t, "the first waiter", func() bool { return len(b.status().Waiting) == 1 })
	small := make(chan func(), 1)
	go func() { small <- fixed(t, b, 10) }()
	waitFor(t, "the second waiter", func() bool { return len(b.status().Waiting) == 2 })
	r2() // 40 free: the 70 at the head still waits, and so does the 10 behind it
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
	go func() { _, err := b.reserve(cctx, 30, 30); gone <- err }()
	waitFor(t, "the waiter", func() bool { return len(b.status().Waiting) == 1 })
	cancel()
	if err := <-gone; !errors.Is(err, job.ErrMemory) || !strings.Contains(err.Error(), "the client went") {
		t.Fatalf("a waiter whose client went: %v", err)
	}
	b.wait = 20 * time.Millisecond
	_, err := b.reserve(ctx, 30, 30)
	if !errors.Is(err, job.ErrMemory) || !strings.Contains(err.Error(), "80 B of the daemon's 100 B for all jobs' is held by 2 jobs (80 B of it the least they run in") {
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

// bender is a job as the budget sees it: its size, and the bytes its
// arena holds above a size (batches its client has not released).
type bender struct {
	b           *budget
	h           *hold
	mu          sync.Mutex
	size, inUse int64
	fit         func()
	resized     int
}

func bend(t *testing.T, b *budget, want, floor int64) *bender {
	t.Helper()
	h, err := b.reserve(context.Background(), want, floor)
	if err != nil {
		t.Fatal(err)
	}
	j := &bender{b: b, h: h, size: h.size}
	b.attach(h, j.resize)
	return j
}

func (j *bender) resize(size int64, fit func()) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.size, j.fit = size, nil
	j.resized++
	if j.inUse > size {
		j.fit = fit
		return false
	}
	return true
}

// use sets the bytes the job's arena holds; a shrink waiting for them to
// fall completes once they do.
func (j *bender) use(n int64) {
	j.mu.Lock()
	j.inUse = n
	var fit func()
	if j.fit != nil && n <= j.size {
		fit, j.fit = j.fit, nil
	}
	j.mu.Unlock()
	if fit != nil {
		fit()
	}
}

func (j *bender) now() int64 { return j.b.sizeOf(j.h) }

// Memory bends before it refuses: opens past what fits whole are given
// less, down to their floor, and the jobs above their share give some
// back; a shrink is charged until the job's batches above its new size
// are released; memory freed grows the jobs back; an open whose floor
// does not fit beside the others' floors waits, and is refused after the
// wait, saying what it needs.
func TestBudgetBends(t *testing.T) {
	b := &budget{sp: split{total: 1000, jobs: 100}, wait: time.Minute}
	a := bend(t, b, 40, 10)
	c := bend(t, b, 40, 10)
	if a.now() != 40 || c.now() != 40 {
		t.Fatalf("room for both: %d, %d", a.now(), c.now())
	}
	a.use(40) // a's arena is full: it can shrink only as its client releases batches
	// A third: its share would be 33, the room is 20: it gets the room,
	// and nobody shrinks for it.
	d := bend(t, b, 40, 10)
	if st := b.status(); st.Held != 100 || a.now() != 40 || c.now() != 40 || d.now() != 20 || st.Bent != 1 {
		t.Fatalf("three jobs of 40 in 100: a %d, c %d, d %d, %+v", a.now(), c.now(), d.now(), st)
	}
	// A fourth, of floor 10, finds no room: a and c shrink to their share
	// (25), c at once, a once its batches go; it gets what room there is
	// meanwhile (c's 15).
	e := bend(t, b, 40, 10)
	if st := b.status(); st.Held != 100 || a.now() != 25 || c.now() != 25 || e.now() != 15 {
		t.Fatalf("four jobs of 40 in 100: a %d, c %d, d %d, e %d, %+v", a.now(), c.now(), d.now(), e.now(), st)
	}
	a.use(5)
	waitFor(t, "e grown to its share", func() bool { return e.now() == 25 })
	if st := b.status(); st.Held != 100 || st.Bent != 4 || d.now() != 25 {
		t.Fatalf("four jobs: a %d, c %d, d %d, e %d, %+v", a.now(), c.now(), d.now(), e.now(), st)
	}
	b.release(e.h)
	// Ten more of floor 7: all fit at their floors beside the three at
	// theirs; one more does not, waits, and is refused.
	var more []*bender
	for range 10 {
		more = append(more, bend(t, b, 40, 7))
	}
	if st := b.status(); st.Held > 100 || st.Holders != 13 || len(st.Waiting) != 0 {
		t.Fatalf("13 jobs: %+v", st)
	}
	b.wait = 20 * time.Millisecond
	if _, err := b.reserve(context.Background(), 40, 7); !errors.Is(err, job.ErrMemory) ||
		!strings.Contains(err.Error(), "needs at least 7 B (two batches in flight; 40 B for all it reads ahead)") {
		t.Fatalf("a 14th whose floor does not fit: %v", err)
	}
	// They close: the first three grow back to all they want.
	for _, m := range more {
		b.release(m.h)
	}
	b.release(c.h)
	if a.now() != 40 || d.now() != 40 {
		t.Fatalf("after the others closed: a %d, d %d", a.now(), d.now())
	}
	if st := b.status(); st.Held != 80 || st.Bent != 0 || st.Shrunk == 0 || st.Grown == 0 {
		t.Fatalf("two jobs whole again: %+v", st)
	}
	b.release(a.h)
	b.release(d.h)
	if st := b.status(); st.Held != 0 || st.Holders != 0 {
		t.Fatalf("after every release: %+v", st)
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

// Over the socket, memory bends: twelve default jobs whose arenas fit
// only four at a time all open at once (each below its full arena, at
// least two batches), every one reads each of its records once, reading
// in turn; and the one left open grows back to its full arena, as status
// shows, once the others close.
func TestMemoryBendsOverTheSocket(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.bin")
	synth.WriteFixed(data, 4096, 4096, 0)
	// 64 MiB: 36 for jobs. A default job: 4 MiB of 256 KiB batches, an
	// arena of 8 MiB; its least, two batches, an arena of 1 MiB.
	s := &Server{Socket: sockPath(t), MemoryBytes: 64 << 20, MemoryWait: time.Minute}
	stop := serve(t, s)
	defer stop()
	watch := dial(t, s.Socket)
	defer watch.c.Close()
	status := func() *wire.Status { return watch.req(t, &wire.Msg{Op: wire.OpStatus}).Status }
	type reader struct {
		cl   *client
		job  int
		mem  []byte
		seen map[int]int
		done bool
	}
	var rs []*reader
	for range 12 {
		cl := dial(t, s.Socket)
		defer cl.c.Close()
		op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 4096, Shuffle: true, BatchSize: 64, World: 1, Epochs: 1}})
		if op.Op != wire.OpOpened {
			t.Fatalf("open %d: %+v", len(rs), op)
		}
		mem, err := unix.Mmap(cl.fd, 0, int(op.ArenaSize), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		unix.Close(cl.fd)
		rs = append(rs, &reader{cl: cl, job: op.Job, mem: mem, seen: map[int]int{}})
	}
	st := status()
	if m := st.Memory; m.Holders != 12 || m.Bent != 12 || m.Held > m.Jobs || len(m.Waiting) != 0 {
		t.Fatalf("12 jobs open: %+v", m)
	}
	var full int64
	for _, g := range st.Groups {
		for _, j := range g.Jobs {
			if j.MemoryFull == 0 || j.Memory >= j.MemoryFull || j.Memory < 1<<20 {
				t.Fatalf("a job of 12: memory %d of %d", j.Memory, j.MemoryFull)
			}
			full = j.MemoryFull
		}
	}
	// next reads r's next batch, checking its records; false at the end.
	next := func(r *reader) bool {
		b := r.cl.req(t, &wire.Msg{Op: wire.OpNext, Job: r.job})
		if b.Op == wire.OpEnd {
			return false
		}
		if b.Op != wire.OpBatch {
			t.Fatalf("next: %+v", b)
		}
		meta := r.mem[b.MetaOff:]
		for i := range b.N {
			id := int(binary.LittleEndian.Uint64(meta[8*i:]))
			off := int64(binary.LittleEndian.Uint64(meta[8*(b.N+i):]))
			n := int64(binary.LittleEndian.Uint64(meta[8*(2*b.N+i):]))
			if err := synth.CheckRecord(r.mem[b.DataOff+off:b.DataOff+off+n], id); err != nil {
				t.Fatal(err)
			}
			r.seen[id]++
		}
		r.cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: r.job, Seqs: []uint64{b.Seq}})
		return true
	}
	// In turn, a batch each; the first stops after three.
	for left := len(rs); left > 0; {
		for i, r := range rs {
			if r.done || i == 0 && len(r.seen) >= 3*64 {
				continue
			}
			if !next(r) {
				r.done = true
				left--
				if i == 0 {
					t.Fatal("the first job ended early")
				}
			}
			if i == 0 && len(r.seen) >= 3*64 {
				left--
			}
		}
	}
	for i, r := range rs[1:] {
		if len(r.seen) != 4096 {
			t.Fatalf("job %d: %d records seen, want 4096", i+1, len(r.seen))
		}
		for id, n := range r.seen {
			if n != 1 {
				t.Fatalf("job %d: record %d seen %d times", i+1, id, n)
			}
		}
		r.cl.req(t, &wire.Msg{Op: wire.OpClose, Job: r.job})
	}
	// Alone now, the first grows back to its full arena.
	waitFor(t, "the last job's arena to grow", func() bool {
		m := status()
		return m.Memory.Holders == 1 && m.Memory.Bent == 0 && len(m.Groups) == 1 && m.Groups[0].Jobs[0].Memory == full
	})
	for next(rs[0]) {
	}
	if len(rs[0].seen) != 4096 {
		t.Fatalf("the first job: %d records seen, want 4096", len(rs[0].seen))
	}
	if m := status().Memory; m.Shrunk == 0 || m.Grown == 0 {
		t.Fatalf("no job shrunk or grew: %+v", m)
	}
}

// The daemon's memory as the kernel counts it, split by kind, in status
// and /metrics: the kinds add up to its resident memory; the arenas'
// pages it wrote are shared memory within what the budget holds for them;
// a data file read warm through its mapping counts as mapped file pages
// (the page cache's, not the daemon's allocations); the cache is in the Go
// heap, the heap in what the Go runtime holds.
func TestResidentMemorySplit(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.bin")
	synth.WriteFixed(data, 8192, 4096, 0) // 32 MiB, in the page cache as written
	s := &Server{Socket: sockPath(t), Metrics: "127.0.0.1:0"}
	stop := serve(t, s)
	defer stop()
	cl := dial(t, s.Socket)
	defer cl.c.Close()
	memory := func() *wire.MemoryStatus { return cl.req(t, &wire.Msg{Op: wire.OpStatus}).Status.Memory }
	before := memory()
	// Whole epochs of a job until the mapped file pages grew by a quarter
	// of the file (a look at the page cache comes before the copies).
	var job *wire.Msg
	waitFor(t, "the data file's pages mapped", func() bool {
		if job != nil {
			cl.req(t, &wire.Msg{Op: wire.OpClose, Job: job.Job})
		}
		job = cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 4096, Shuffle: true, BatchSize: 256, World: 1, Epochs: 1}})
		if job.Op != wire.OpOpened {
			t.Fatalf("open: %+v", job)
		}
		for {
			b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: job.Job})
			if b.Op != wire.OpBatch {
				break
			}
			cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: job.Job, Seqs: []uint64{b.Seq}})
		}
		return memory().RSSFile-before.RSSFile >= 8<<20
	})
	unix.Close(cl.fd)
	m := memory()
	if m.RSS == 0 || m.RSS != m.RSSAnon+m.RSSFile+m.RSSShmem || m.RSSPeak < m.RSS {
		t.Fatalf("resident %d is not anon %d + file %d + shmem %d, or above its peak %d", m.RSS, m.RSSAnon, m.RSSFile, m.RSSShmem, m.RSSPeak)
	}
	if m.RSSShmem == 0 || m.RSSShmem > m.Held {
		t.Fatalf("the arenas' resident pages %d, out of the %d the budget holds for them", m.RSSShmem, m.Held)
	}
	st := cl.req(t, &wire.Msg{Op: wire.OpStatus}).Status
	if st.Cache.Bytes > m.GoHeap || m.GoHeap > m.GoRuntime || m.Decode == 0 || m.Decoding != 0 {
		t.Fatalf("cache %d, Go heap %d, Go runtime %d, decodes %d of %d", st.Cache.Bytes, m.GoHeap, m.GoRuntime, m.Decoding, m.Decode)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Get("http://" + s.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, re := range []string{`riffle_memory_resident_bytes\{kind="anon"\} [1-9]`, `riffle_memory_resident_bytes\{kind="shmem"\} [1-9]`,
		`riffle_memory_resident_bytes\{kind="file"\} [1-9]`, `riffle_memory_resident_peak_bytes [1-9]`, `riffle_go_heap_bytes [1-9]`,
		`riffle_go_runtime_bytes [1-9]`, `riffle_memory_decode_budget_bytes [1-9]`, `riffle_memory_decoding_bytes 0`,
		`riffle_memory_bent_jobs 0`, `riffle_memory_shrunk_total 0`, `riffle_memory_grown_total 0`} {
		if !regexp.MustCompile(`(?m)^` + re + `$|(?m)^` + re + `[0-9.e+]*$`).Match(body) {
			t.Fatalf("/metrics has no %s:\n%s", re, body)
		}
	}
}
