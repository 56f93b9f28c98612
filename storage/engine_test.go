package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/alignbuf"
	"github.com/riffle-ml/riffle/internal/mincore"
)

// engines returns an engine per read path users run: io_uring where the
// kernel allows it, and goroutines calling pread.
func engines(t *testing.T) map[string]*Engine {
	t.Helper()
	out := map[string]*Engine{"threads": NewEngine(EngineOptions{Depth: 8, NoRing: true})}
	if e := NewEngine(EngineOptions{Depth: 8}); e.Ring() {
		out["ring"] = e
	} else {
		e.Close()
		t.Log("io_uring unavailable here: the ring path is not exercised")
	}
	t.Cleanup(func() {
		for _, e := range out {
			e.Close()
		}
	})
	return out
}

// readAll submits reads of every reader at random offsets at once and
// checks each against the file's bytes.
func readAll(t *testing.T, e *Engine, readers []Reader, want []byte, align int) {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 6))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for i := range 300 {
		rd := readers[i%len(readers)]
		off := int64(r.IntN(len(want)/DirectAlign-2)) * DirectAlign
		buf := alignbuf.Make(DirectAlign*(1+i%2), align)
		wg.Add(1)
		e.Submit(&Request{Ctx: context.Background(), R: rd, P: buf, Off: off, Done: func(err error) {
			defer wg.Done()
			if err == nil && !bytes.Equal(buf, want[off:off+int64(len(buf))]) {
				err = fmt.Errorf("read at %d differs", off)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errs[0])
	}
}

func TestEngineReadsEveryKindOfReader(t *testing.T) {
	p, want := testFile(t, 1<<20)
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			for _, direct := range []bool{false, true} {
				f, err := OpenFile(p, FileOptions{Direct: direct})
				if err != nil {
					t.Fatal(err)
				}
				set := NewFileSet(&Local{direct: direct}, []string{p}, []int64{int64(len(want))}, 1)
				readers := []Reader{f, set.Object(0), &Faulty{Reader: f}, &Faulty{Reader: set.Object(0)}}
				readAll(t, e, readers, want, AlignmentOf(f))
				set.Close()
				f.Close()
			}
		})
	}
}

// Injected faults reach the caller on both paths: an error naming the
// file and offset, a short first read that the continuation completes,
// and a slow read that its context cancels.
func TestEngineFaults(t *testing.T) {
	p, want := testFile(t, 1<<18)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			bad := &Faulty{Reader: f, Inject: func(off int64, n int) error {
				if off == 8192 {
					return syscall.EIO
				}
				return nil
			}}
			err := e.Read(context.Background(), bad, make([]byte, 100), 8192)
			var se *Error
			if !errors.Is(err, syscall.EIO) || !errors.As(err, &se) || se.Object != p || se.Offset != 8192 {
				t.Fatalf("injected EIO: %v", err)
			}
			short := &Faulty{Reader: f, Short: func(off int64, n int) int { return n / 3 }}
			got := make([]byte, 10000)
			if err := e.Read(context.Background(), short, got, 777); err != nil || !bytes.Equal(got, want[777:10777]) {
				t.Fatalf("short first read: %v", err)
			}
			if short.Reads.Load() != 1 {
				t.Fatalf("short read counted %d times", short.Reads.Load())
			}
			slow := &Faulty{Reader: f, Delay: time.Hour}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			start := time.Now()
			if err := e.Read(ctx, slow, got, 0); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("slow read under a deadline: %v", err)
			}
			if time.Since(start) > 10*time.Second {
				t.Fatal("a cancelled slow read did not return promptly")
			}
			slow.Delay = 10 * time.Millisecond
			if err := e.Read(context.Background(), slow, got[:10], 5); err != nil || !bytes.Equal(got[:10], want[5:15]) {
				t.Fatalf("slow read: %v", err)
			}
		})
	}
}

// A zero-length read completes at once, at any offset, and is no end of
// file; a read past the end is one; a file that shrank says so.
func TestEngineEdges(t *testing.T) {
	p, _ := testFile(t, 10000)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			for _, off := range []int64{0, 6, 10000} {
				if err := e.Read(context.Background(), f, nil, off); err != nil {
					t.Fatalf("zero-length read at %d: %v", off, err)
				}
			}
			if err := e.Read(context.Background(), f, make([]byte, 100), 9950); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("read past the end: %v", err)
			}
		})
	}
	if err := os.Truncate(p, 100); err != nil {
		t.Fatal(err)
	}
	for name, e := range engines(t) {
		if err := e.Read(context.Background(), f, make([]byte, 100), 4096); !errors.Is(err, ErrShrunk) {
			t.Fatalf("%s: read of a shrunk file: %v", name, err)
		}
	}
}

func TestEngineClosedRefusesReads(t *testing.T) {
	e := NewEngine(EngineOptions{})
	e.Close()
	p, _ := testFile(t, 100)
	f, _ := OpenFile(p, FileOptions{})
	defer f.Close()
	if err := e.Read(context.Background(), f, make([]byte, 10), 0); err == nil {
		t.Fatal("a closed engine read")
	}
}

// Stats counts the reads that succeeded and their bytes, and a read is in
// flight from its Submit to its Done, whether it succeeds, fails, waits on
// an injected delay or is cancelled.
func TestEngineStats(t *testing.T) {
	p, _ := testFile(t, 1<<16)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			for i := range 5 {
				if err := e.Read(context.Background(), f, make([]byte, 1000), int64(i)*4096); err != nil {
					t.Fatal(err)
				}
			}
			if err := e.Read(context.Background(), f, make([]byte, 100), 1<<16-50); err == nil {
				t.Fatal("a read past the end succeeded")
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			e.Submit(&Request{Ctx: ctx, R: &Faulty{Reader: f, Delay: time.Hour}, P: make([]byte, 10), Done: func(err error) { done <- err }})
			if got := e.Stats().InFlight; got != 1 {
				t.Fatalf("a waiting read: %d in flight", got)
			}
			cancel()
			<-done
			if got := e.Stats(); got.InFlight != 0 || got.Reads != 5 || got.Bytes != 5000 {
				t.Fatalf("stats %+v, want 5 reads of 5000 bytes and none in flight", got)
			}
		})
	}
}

// ringLanes closes e and returns its devices' lanes (the ring's goroutine,
// their only writer, is done then).
func ringLanes(t *testing.T, e *Engine) []*lane {
	t.Helper()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	return e.lanes
}

func TestEngineDepthBounds(t *testing.T) {
	p, want := testFile(t, 4<<20)
	f, err := OpenFile(p, FileOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct {
		name string
		opts EngineOptions
		max  int
	}{
		{"pinned", EngineOptions{Depth: 4}, 4},
		{"bounded", EngineOptions{MaxDepth: 16}, 16},
		{"default", EngineOptions{}, MaxDepth},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := NewEngine(tc.opts)
			if !e.Ring() {
				e.Close()
				t.Skip("io_uring unavailable here")
			}
			// O_DIRECT reads, all submitted at once: far more offered than
			// any bound, so only the lane's depth holds them back.
			for range 4 {
				readAll(t, e, []Reader{f}, want, AlignmentOf(f))
			}
			if d := e.Stats().Depth; d < 1 || d > tc.max {
				t.Fatalf("depth %d, want within [1, %d]", d, tc.max)
			}
			lanes := ringLanes(t, e)
			if len(lanes) != 1 || lanes[0].dev != DeviceOf(f) {
				t.Fatalf("%d lanes for one file's device", len(lanes))
			}
			if ln := lanes[0]; ln.peak > tc.max || ln.peak < 1 {
				t.Fatalf("%d reads at the device at once, bound %d", ln.peak, tc.max)
			}
			if tc.opts.Depth > 0 && lanes[0].ctl.Limit() != tc.opts.Depth {
				t.Fatalf("a pinned depth %d moved to %d", tc.opts.Depth, lanes[0].ctl.Limit())
			}
		})
	}
}

func TestEngineLanePerDevice(t *testing.T) {
	// Files on two devices (the test's temporary directory and tmpfs, when
	// they differ) get a depth each.
	p, want := testFile(t, 1<<20)
	shm, err := os.MkdirTemp("/dev/shm", "riffle-lanes")
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	q := shm + "/f"
	if err := os.WriteFile(q, want, 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := OpenFile(q, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if DeviceOf(a) == DeviceOf(b) {
		t.Skip("the temporary directory is on tmpfs too")
	}
	e := NewEngine(EngineOptions{})
	if !e.Ring() {
		e.Close()
		t.Skip("io_uring unavailable here")
	}
	// Cached pages are served before the ring; a read whose first attempt
	// is short always goes to the ring.
	short := func(off int64, n int) int { return n / 2 }
	fa, fb := &Faulty{Reader: a, Short: short}, &Faulty{Reader: b, Short: short}
	readAll(t, e, []Reader{fa, fb}, want, 1)
	lanes := ringLanes(t, e)
	devs := map[uint64]bool{}
	for _, ln := range lanes {
		devs[ln.dev] = true
	}
	if len(lanes) != 2 || !devs[DeviceOf(a)] || !devs[DeviceOf(b)] {
		t.Fatalf("lanes for devices %v, want %d and %d", devs, DeviceOf(a), DeviceOf(b))
	}
}

func TestEngineStopsProbingACold(t *testing.T) {
	// A cold file (its pages dropped from the cache): the RWF_NOWAIT probes
	// miss, and after probeMissRun of them most reads go to the ring
	// unprobed; once the file is cached, the first probe that hits turns
	// probing back on.
	p, want := testFile(t, 4<<20)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e := NewEngine(EngineOptions{})
	defer e.Close()
	if !e.Ring() {
		t.Skip("io_uring unavailable here")
	}
	if err := unix.Fdatasync(f.fd); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(f.fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for i := range 2 * probeMissRun {
		off := int64(i*7919%(len(want)/4096)) * 4096
		if err := e.Read(context.Background(), f, buf, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, want[off:off+4096]) {
			t.Fatalf("read at %d differs", off)
		}
	}
	if e.missRun.Load() < probeMissRun || e.unprobed.Load() == 0 {
		t.Skipf("the file stayed cached (%d misses in a row): nothing cold to test", e.missRun.Load())
	}
	if err := f.ReadAt(context.Background(), make([]byte, len(want)), 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; e.missRun.Load() != 0; i++ {
		if i > 4*probeEvery {
			t.Fatalf("%d reads of a cached file and probing is still off", i)
		}
		if err := e.Read(context.Background(), f, buf, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// A read asked to go past the page cache returns the file's bytes and
// leaves its pages out of the cache where it is aligned; unaligned, it
// reads through the cache, with the same bytes.
func TestEnginePastCache(t *testing.T) {
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			p, want := testFile(t, 64*DirectAlign)
			f, err := OpenFile(p, FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if !CanPastCache(f, alignbuf.Make(DirectAlign, DirectAlign), 0) {
				t.Skipf("the file system under %s refuses O_DIRECT", p)
			}
			// Written pages are dirty until written back; clean ones drop.
			if err := unix.Fdatasync(f.fd); err != nil {
				t.Fatal(err)
			}
			if err := f.Drop(0, 0); err != nil {
				t.Fatal(err)
			}
			type read struct {
				off  int64
				n    int
				skew int // the buffer's offset from an aligned start
				past bool
			}
			reads := []read{
				{0, DirectAlign, 0, true}, {5 * DirectAlign, 2 * DirectAlign, 0, true}, // past the cache
				{10 * DirectAlign, DirectAlign, 0, false}, // through it
				{20*DirectAlign + 100, 300, 0, true},      // unaligned offset and length
				{30 * DirectAlign, DirectAlign, 8, true},  // unaligned buffer
				{63 * DirectAlign, DirectAlign, 0, true},  // the last page
			}
			var wg sync.WaitGroup
			errs := make([]error, len(reads))
			for i, r := range reads {
				buf := alignbuf.Make(r.n+r.skew, DirectAlign)[r.skew:]
				wg.Add(1)
				e.Submit(&Request{Ctx: context.Background(), R: f, P: buf, Off: r.off, PastCache: r.past, Done: func(err error) {
					defer wg.Done()
					if err == nil && !bytes.Equal(buf, want[r.off:r.off+int64(r.n)]) {
						err = fmt.Errorf("read of %d bytes at %d differs", r.n, r.off)
					}
					errs[i] = err
				}})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			cached, err := mincore.Fd(f.Fd(), f.Size())
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range reads {
				first, last := r.off/DirectAlign, (r.off+int64(r.n)-1)/DirectAlign
				aligned := r.past && r.skew == 0 && r.off%DirectAlign == 0 && r.n%DirectAlign == 0
				for pg := first; pg <= last; pg++ {
					if cached[pg] == aligned {
						t.Errorf("page %d after a read of %d bytes at %d (past the cache: %v, buffer skew %d): cached %v",
							pg, r.n, r.off, r.past, r.skew, cached[pg])
					}
				}
			}
		})
	}
}
