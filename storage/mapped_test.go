package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/internal/mincore"
)

// span is a read of n bytes at off.
type span struct {
	off int64
	n   int
}

// readSpans reads every span of r through e at once; each result is the
// read's error, or an error if its bytes differ from want's.
func readSpans(e *Engine, r Reader, want []byte, spans []span) []error {
	var wg sync.WaitGroup
	errs := make([]error, len(spans))
	for i, s := range spans {
		buf := make([]byte, s.n)
		wg.Add(1)
		e.Submit(&Request{Ctx: context.Background(), R: r, P: buf, Off: s.off, Done: func(err error) {
			defer wg.Done()
			if err == nil && !bytes.Equal(buf, want[s.off:s.off+int64(s.n)]) {
				err = fmt.Errorf("read of %d bytes at %d differs", s.n, s.off)
			}
			errs[i] = err
		}})
	}
	wg.Wait()
	return errs
}

// mapped reads f's first page until the engine copies it from f's
// mapping: a look at the cache is rationed across files (mapped.go), so
// a file's first may wait for another's.
func mapped(t *testing.T, e *Engine, f *File, want []byte) {
	t.Helper()
	before := e.Stats().Mapped
	for deadline := time.Now().Add(10 * time.Second); e.Stats().Mapped == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("reads of a cached page were not copied from the mapping within 10s")
		}
		if err := errors.Join(readSpans(e, f, want, []span{{0, mincore.PageSize}})...); err != nil {
			t.Fatal(err)
		}
	}
}

// warmFile writes a file past mapMin whose end is not on a page, reads it
// into the page cache and opens it.
func warmFile(t *testing.T) (*File, []byte) {
	t.Helper()
	p, want := testFile(t, mapMin+3*mincore.PageSize+100)
	if _, err := os.ReadFile(p); err != nil {
		t.Fatal(err)
	}
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, want
}

// Reads of cached pages are copies from the file's mapping, with the
// file's bytes, on both read paths; a drop (the steward's) still takes
// the pages out of the page cache, which a mapping would keep, and ends
// the copies.
func TestEngineCopiesCachedPages(t *testing.T) {
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			f, want := warmFile(t)
			size := int64(len(want))
			spans := []span{
				{0, mincore.PageSize}, {7 * mincore.PageSize, 2 * mincore.PageSize}, // pages
				{3*mincore.PageSize + 17, 5000},        // unaligned, across pages
				{size - 100, 100}, {size - 5000, 5000}, // the last page, which the file ends within
			}
			mapped(t, e, f, want)
			before := e.Stats().Mapped
			if err := errors.Join(readSpans(e, f, want, spans)...); err != nil {
				t.Fatal(err)
			}
			if got := e.Stats().Mapped - before; got != int64(len(spans)) {
				t.Fatalf("%d of %d reads of cached pages copied from the mapping", got, len(spans))
			}
			if err := unix.Fdatasync(f.fd); err != nil {
				t.Fatal(err) // written pages are dirty until written back; clean ones drop
			}
			if err := f.Drop(0, 0); err != nil {
				t.Fatal(err)
			}
			cached, err := mincore.Fd(f.Fd(), f.Size())
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range spans {
				for pg := s.off / mincore.PageSize; pg <= (s.off+int64(s.n)-1)/mincore.PageSize; pg++ {
					if cached[pg] {
						t.Fatalf("page %d, copied from the mapping, is still cached after a drop", pg)
					}
				}
			}
			before = e.Stats().Mapped
			if err := errors.Join(readSpans(e, f, want, spans)...); err != nil {
				t.Fatal(err)
			}
			if got := e.Stats().Mapped - before; got != 0 {
				t.Fatalf("%d reads copied from the mapping of a file whose pages are dropped", got)
			}
		})
	}
}

// A file truncated under its mapping is an error naming it, never a
// crash (the copy faults past the new end) and never zeros (within the
// new end's last page the mapping reads them): ErrShrunk past the new
// end, ErrChanged below it (changed.go: the file is not as it was
// opened).
func TestEngineCopiesFromAShrunkFile(t *testing.T) {
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			f, want := warmFile(t)
			mapped(t, e, f, want)         // the last look found every page held
			end := int64(mapMin/2 + 1000) // within a page
			if err := os.Truncate(f.Name(), end); err != nil {
				t.Fatal(err)
			}
			spans := []span{
				{0, mincore.PageSize},              // below the new end
				{end - 500, 1000},                  // across it, within its page: zeros in the mapping
				{end - end%mincore.PageSize, 4000}, // from its page's start to the page's end
				{mapMin, 2 * mincore.PageSize},     // pages past it: a fault
			}
			errs := readSpans(e, f, want, spans)
			if !errors.Is(errs[0], ErrChanged) || !strings.Contains(errs[0].Error(), f.Name()) {
				t.Fatalf("a read below the new end: %v, want ErrChanged naming %s", errs[0], f.Name())
			}
			for i, err := range errs[1:] {
				s := spans[i+1]
				if !errors.Is(err, ErrShrunk) || !strings.Contains(err.Error(), f.Name()) {
					t.Errorf("a read of %d bytes at %d past the new end %d: %v, want ErrShrunk naming %s", s.n, s.off, end, err, f.Name())
				}
			}
		})
	}
}
