package storage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tornRecord is the size of the torn-read test's records: not a multiple
// of the page, so records end inside pages as a truncation's cut does.
const tornRecord = 1000

// tornBytes is record id's bytes: none zero, so a zero-filled tail shows.
func tornBytes(id int, p []byte) {
	for j := range p {
		p[j] = byte(1 + (id*31+j)%255)
	}
}

// TestTornWriter is the torn-read test's writer, run as a process of its
// own (TestTornReads starts it): it shrinks the file named by
// RIFFLE_TORN_WRITER and grows it back with the same bytes, over and over,
// two ways (a truncation, then the rest written back; a truncation and an
// extension with zeros, then the bytes written over them), printing a
// line after each round, until its standard input closes.
func TestTornWriter(t *testing.T) {
	path := os.Getenv("RIFFLE_TORN_WRITER")
	if path == "" {
		t.Skip("the torn-read test's writer process")
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	stop := make(chan struct{})
	go func() {
		bufio.NewReader(os.Stdin).ReadString('\n')
		close(stop)
	}()
	r := rand.New(rand.NewPCG(11, 12))
	size := int64(len(want))
	for round := 0; ; round++ {
		select {
		case <-stop:
			return
		default:
		}
		cut := r.Int64N(size)
		if err := unix.Ftruncate(fd, cut); err != nil {
			t.Fatal(err)
		}
		if round%2 == 1 {
			if err := unix.Ftruncate(fd, size); err != nil { // zeros, then the bytes
				t.Fatal(err)
			}
		}
		for at := cut; at < size; {
			n, err := unix.Pwrite(fd, want[at:min(size, at+64<<10)], at)
			if err != nil {
				t.Fatal(err)
			}
			at += int64(n)
		}
		fmt.Println(round)
	}
}

// A writer that shrinks a file and grows it back with the same bytes,
// while the engine reads its records, never makes the engine deliver a
// record with other bytes (a zero-filled tail): a read after a change
// fails naming the file and the record's offset (changed.go). Both
// engines, with copies from the mapping, from the page cache and reads
// at the device; before the fix one read in eight here delivered a
// record with zeros in it, silently.
func TestTornReads(t *testing.T) {
	if testing.Short() {
		t.Skip("a writer process racing reads")
	}
	const n = 4096
	want := make([]byte, n*tornRecord)
	for id := range n {
		tornBytes(id, want[id*tornRecord:(id+1)*tornRecord])
	}
	for name, e := range engines(t) {
		t.Run(name, func(t *testing.T) {
			p := t.TempDir() + "/torn.bin"
			if err := os.WriteFile(p, want, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := OpenFile(p, FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			mapped(t, e, f, want) // the mapping's look found every page cached
			var spans []span
			for id := range n {
				spans = append(spans, span{int64(id * tornRecord), tornRecord})
			}
			if err := errors.Join(readSpans(e, f, want, spans)...); err != nil {
				t.Fatalf("before the writer: %v", err)
			}
			w := exec.Command(os.Args[0], "-test.run=^TestTornWriter$", "-test.count=1")
			w.Env = append(os.Environ(), "RIFFLE_TORN_WRITER="+p)
			stdin, err := w.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			out, err := w.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Start(); err != nil {
				t.Fatal(err)
			}
			var rounds sync.WaitGroup
			var last int
			var mu sync.Mutex
			rounds.Go(func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					if v, err := strconv.Atoi(strings.TrimSpace(sc.Text())); err == nil {
						mu.Lock()
						last = v
						mu.Unlock()
					}
				}
			})
			writerRounds := func() int {
				mu.Lock()
				defer mu.Unlock()
				return last
			}
			var torn, failed, right int // while the writer runs
			var firstTorn error
			r := rand.New(rand.NewPCG(3, 4))
			// Rounds of reads of 256 random records until the writer has
			// shrunk and regrown the file 1,000 times.
			deadline := time.Now().Add(2 * time.Minute)
			for writerRounds() < 1000 && time.Now().Before(deadline) {
				var wg sync.WaitGroup
				var rmu sync.Mutex
				for range 256 {
					id := r.IntN(n)
					buf := make([]byte, tornRecord)
					wg.Add(1)
					e.Submit(&Request{Ctx: context.Background(), R: f, P: buf, Off: int64(id * tornRecord), Done: func(err error) {
						defer wg.Done()
						rmu.Lock()
						defer rmu.Unlock()
						switch {
						case err != nil:
							var se *Error
							if !errors.As(err, &se) || se.Object != p || se.Offset != int64(id*tornRecord) ||
								!(errors.Is(err, ErrChanged) || errors.Is(err, ErrShrunk)) {
								t.Errorf("record %d: %v, want ErrChanged or ErrShrunk naming %s at offset %d", id, err, p, id*tornRecord)
							}
							failed++
						case !bytes.Equal(buf, want[id*tornRecord:(id+1)*tornRecord]):
							if torn++; firstTorn == nil {
								z := bytes.IndexByte(buf, 0)
								firstTorn = fmt.Errorf("record %d delivered with other bytes (first zero at byte %d)", id, z)
							}
						default:
							right++
						}
					}})
				}
				wg.Wait()
			}
			stdin.Close()
			if err := w.Wait(); err != nil {
				t.Fatalf("writer: %v", err)
			}
			rounds.Wait()
			t.Logf("%d writer rounds: %d records right, %d failed naming the file, %d torn", writerRounds(), right, failed, torn)
			if torn > 0 {
				t.Fatalf("%d records delivered torn: %v", torn, firstTorn)
			}
		})
	}
}

// BenchmarkReadChecked is the cost of the check after a read (changed.go)
// where it is paid per read, ReadAt alone: a cached 4 KiB pread, and the
// same with the fstat after it, side by side.
func BenchmarkReadChecked(b *testing.B) {
	p := b.TempDir() + "/f"
	if err := os.WriteFile(p, make([]byte, 64<<20), 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := OpenFile(p, FileOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	r := rand.New(rand.NewPCG(1, 1))
	for name, read := range map[string]func(context.Context, []byte, int64) error{"pread": f.readAt, "checked": f.ReadAt} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if err := read(context.Background(), buf, r.Int64N(16<<10)*4096); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
