package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/riffle-ml/riffle/internal/alignbuf"
)

func testFile(t *testing.T, n int) (string, []byte) {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

func TestReadAt(t *testing.T) {
	p, want := testFile(t, 10000)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, 100)
	if err := f.ReadAt(context.Background(), got, 5000); err != nil || !bytes.Equal(got, want[5000:5100]) {
		t.Fatalf("read %v", err)
	}
	err = f.ReadAt(context.Background(), got, 9950)
	var se *Error
	if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &se) || se.Object != p || se.Offset != 9950 {
		t.Fatalf("read past the end: %v", err)
	}
	if errors.Is(err, ErrShrunk) {
		t.Fatal("a read past the end is not a shrunk file")
	}
}

// directTestFile is a test file of 3 aligned blocks and 100 bytes, opened
// asking for O_DIRECT, and its bytes.
func directTestFile(t *testing.T) (*File, []byte) {
	t.Helper()
	p, want := testFile(t, 3*DirectAlign+100)
	f, err := OpenFile(p, FileOptions{Direct: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, want
}

func TestDirectTail(t *testing.T) {
	f, want := directTestFile(t)
	if AlignmentOf(f) != DirectAlign {
		t.Skip("file system refused O_DIRECT")
	}
	buf := alignbuf.Make(2*DirectAlign, DirectAlign)
	if err := f.ReadAt(context.Background(), buf, 2*DirectAlign); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:DirectAlign+100], want[2*DirectAlign:]) {
		t.Fatal("O_DIRECT read of the tail differs")
	}
}

// An unaligned ReadAt of a file opened with O_DIRECT (as a Parquet
// footer's) gives the bytes, not EINVAL; one past the end is the error a
// buffered read's is, at the offset asked.
func TestDirectUnaligned(t *testing.T) {
	f, want := directTestFile(t)
	if !f.Direct() {
		t.Skip("file system refused O_DIRECT")
	}
	for _, c := range []struct{ off, n int }{{1, 8}, {DirectAlign - 3, 10}, {0, 100}, {2*DirectAlign + 7, DirectAlign + 93}, {3 * DirectAlign, 100}} {
		got := make([]byte, c.n+1)[1:] // unaligned memory too
		if err := f.ReadAt(context.Background(), got, int64(c.off)); err != nil {
			t.Fatalf("%d bytes at %d: %v", c.n, c.off, err)
		}
		if !bytes.Equal(got, want[c.off:c.off+c.n]) {
			t.Fatalf("%d bytes at %d differ", c.n, c.off)
		}
	}
	err := f.ReadAt(context.Background(), make([]byte, 10), 3*DirectAlign+95)
	var se *Error
	if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.As(err, &se) || se.Offset != 3*DirectAlign+95 {
		t.Fatalf("read past the end: %v", err)
	}
}

// Async reads give the same bytes as ReadAt, and the same errors, whether
// the ring waits for completions parked in Go's poller (its eventfd) or
// blocked in io_uring_enter (where no eventfd could be registered).
func TestAsync(t *testing.T) {
	p, want := testFile(t, 1<<20)
	for _, tc := range []struct{ direct, poller bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
		t.Run(fmt.Sprintf("direct=%v,poller=%v", tc.direct, tc.poller), func(t *testing.T) {
			f, err := OpenFile(p, FileOptions{Direct: tc.direct})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			a, err := NewAsync(16)
			if err != nil {
				t.Skipf("io_uring unavailable here: %v", err)
			}
			defer a.Close()
			if a.ring.wake == nil {
				t.Fatal("no eventfd registered with the ring: completions are waited for blocked in io_uring_enter")
			}
			if !tc.poller {
				a.ring.wake.Close()
				a.ring.wake = nil
			}
			r := rand.New(rand.NewPCG(3, 4))
			type req struct {
				off int64
				buf []byte
			}
			var reqs []req
			done := 0
			finish := func(tag uint64, err error) {
				if err != nil {
					t.Fatal(err)
				}
				q := reqs[tag]
				if !bytes.Equal(q.buf, want[q.off:q.off+int64(len(q.buf))]) {
					t.Fatalf("read at %d differs", q.off)
				}
				done++
			}
			for i := range 200 {
				off := int64(r.IntN(255)) * DirectAlign
				reqs = append(reqs, req{off, alignbuf.Make(DirectAlign*(1+i%3), DirectAlign)})
				for !a.Add(f, reqs[i].buf, off, uint64(i)) {
					if err := a.Wait(finish); err != nil {
						t.Fatal(err)
					}
				}
			}
			for a.InFlight() > 0 {
				if err := a.Wait(finish); err != nil {
					t.Fatal(err)
				}
			}
			if done != 200 {
				t.Fatalf("%d of 200 reads finished", done)
			}
		})
	}
}

func TestAsyncShrunk(t *testing.T) {
	p, _ := testFile(t, 1<<16)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, err := NewAsync(4)
	if err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	defer a.Close()
	if err := os.Truncate(p, 1000); err != nil {
		t.Fatal(err)
	}
	a.Add(f, make([]byte, 4096), 4096, 7)
	var got error
	if err := a.Wait(func(tag uint64, err error) { got = err }); err != nil {
		t.Fatal(err)
	}
	var se *Error
	if !errors.Is(got, ErrShrunk) || !errors.As(got, &se) || se.Offset != 4096 || se.Object != p {
		t.Fatalf("read of a shrunk file: %v", got)
	}
}

func TestFileSetBoundsOpenFiles(t *testing.T) {
	var paths []string
	var sizes []int64
	for i := range 10 {
		p, _ := testFile(t, 100+i)
		paths = append(paths, p)
		sizes = append(sizes, int64(100+i))
	}
	s := NewFileSet(&Local{}, paths, sizes, 3)
	defer s.Close()
	for round := range 3 {
		for i := range 10 {
			b := make([]byte, 100+i)
			if err := s.Object(i).ReadAt(context.Background(), b, 0); err != nil {
				t.Fatalf("round %d file %d: %v", round, i, err)
			}
			if len(s.open) > 3 {
				t.Fatalf("%d files open, the bound is 3", len(s.open))
			}
		}
	}
	if err := s.Object(0).ReadAt(context.Background(), make([]byte, 200), 0); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read past a file's end: %v", err)
	}
	// The least recently used idle file is the one closed; a file a read
	// holds is never closed under it.
	read := func(i int) {
		t.Helper()
		if err := s.Object(i).ReadAt(context.Background(), make([]byte, 100), 0); err != nil {
			t.Fatal(err)
		}
	}
	openNow := func() []int {
		var out []int
		for i := range 10 {
			if _, ok := s.open[i]; ok {
				out = append(out, i)
			}
		}
		return out
	}
	read(7)
	read(8)
	read(9)
	read(7)
	read(1) // closes 8, the least recently used
	if got := openNow(); !slices.Equal(got, []int{1, 7, 9}) {
		t.Fatalf("open after reading 7 8 9 7 1: %v, want [1 7 9]", got)
	}
	held, done, err := s.Object(9).(setFile).ringFile()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		read(i)
	}
	if _, ok := s.open[9]; !ok {
		t.Fatal("a held file was closed")
	}
	if err := held.ReadAt(context.Background(), make([]byte, 100), 0); err != nil {
		t.Fatalf("a read of the held file: %v", err)
	}
	done()
}

func TestFaulty(t *testing.T) {
	p, want := testFile(t, 100)
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	boom := errors.New("boom")
	fa := &Faulty{Reader: f, Inject: func(off int64, n int) error {
		if off == 50 {
			return boom
		}
		return nil
	}}
	got := make([]byte, 10)
	if err := fa.ReadAt(context.Background(), got, 0); err != nil || !bytes.Equal(got, want[:10]) {
		t.Fatalf("read through Faulty: %v", err)
	}
	err = fa.ReadAt(context.Background(), make([]byte, 10), 50)
	var se *Error
	if !errors.Is(err, boom) || !errors.As(err, &se) || se.Offset != 50 {
		t.Fatalf("injected error: %v", err)
	}
}

// BenchmarkFileSetRead reads small files of a tree at random through a
// FileSet holding at most 256 open, as a daemon reads an ImageFolder.
func BenchmarkFileSetRead(b *testing.B) {
	dir := b.TempDir()
	const files = 2048
	var paths []string
	var sizes []int64
	for i := range files {
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, make([]byte, 512), 0o644); err != nil {
			b.Fatal(err)
		}
		paths, sizes = append(paths, p), append(sizes, 512)
	}
	s := NewFileSet(&Local{}, paths, sizes, 256)
	defer s.Close()
	r := rand.New(rand.NewPCG(1, 1))
	buf := make([]byte, 512)
	// Mostly the files open now, as a batch's reads of files its
	// neighbours just opened: the lookups and the eviction, not the opens.
	hot := r.Perm(files)[:240]
	b.ResetTimer()
	for i := range b.N {
		f := hot[i%len(hot)]
		if i%16 == 0 {
			f = r.IntN(files)
		}
		if err := s.Object(f).ReadAt(context.Background(), buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}
