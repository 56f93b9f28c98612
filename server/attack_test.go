package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/peer"
	"github.com/riffle-ml/riffle/wire"
)

// daemon starts a server on a private socket with a small dataset and
// returns it, a client and the dataset's path.
func daemon(t *testing.T, s *Server) (*client, string) {
	t.Helper()
	if s.Socket == "" {
		s.Socket = sockPath(t)
	}
	data := filepath.Join(t.TempDir(), "d.bin")
	if err := synth.WriteFixed(data, 500, 128, 0); err != nil {
		t.Fatal(err)
	}
	stop := serve(t, s)
	cl := dial(t, s.Addr())
	t.Cleanup(func() {
		cl.c.Close()
		stop()
	})
	return cl, data
}

// wholeEpoch loads a job to its end and returns the ids it delivered.
func wholeEpoch(t *testing.T, cl *client, spec *wire.JobSpec) []int {
	t.Helper()
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec})
	if op.Op != wire.OpOpened {
		t.Fatalf("open: %+v", op)
	}
	var ids []int
	for {
		b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		if b.Op == wire.OpEnd {
			break
		}
		if b.Op != wire.OpBatch {
			t.Fatalf("next: %+v", b)
		}
		ids = append(ids, make([]int, b.N)...)
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{b.Seq}})
	}
	cl.req(t, &wire.Msg{Op: wire.OpClose, Job: op.Job})
	return ids
}

// Absurd values in a spec are refused at open with an error naming the
// field, and the daemon serves everyone else as before.
func TestAbsurdSpecs(t *testing.T) {
	cl, data := daemon(t, &Server{})
	good := func() *wire.JobSpec {
		return &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 64}
	}
	for _, c := range []struct {
		field string
		edit  func(*wire.JobSpec)
	}{
		{"batch_size", func(s *wire.JobSpec) { s.BatchSize = 1 << 62 }},
		{"batch_size", func(s *wire.JobSpec) { s.BatchSize = 0 }},
		{"depth", func(s *wire.JobSpec) { s.Depth = 1e9 }},
		{"depth", func(s *wire.JobSpec) { s.Depth = 1e5 }},
		{"depth", func(s *wire.JobSpec) { s.Depth = -1 }},
		{"memory_bytes", func(s *wire.JobSpec) { s.MemoryBytes = 1 }},
		{"memory_bytes", func(s *wire.JobSpec) { s.MemoryBytes = 1 << 62 }},
		{"memory_bytes", func(s *wire.JobSpec) { s.MemoryBytes = -5 }},
		{"world", func(s *wire.JobSpec) { s.World = -3 }},
		{"rank", func(s *wire.JobSpec) { s.World = 2; s.Rank = 2 }},
		{"rank", func(s *wire.JobSpec) { s.Rank = -1 }},
		{"prefetch", func(s *wire.JobSpec) { s.Prefetch = math.MaxInt32 }},
		{"record_size", func(s *wire.JobSpec) { s.RecordSize = math.MaxInt }},
		{"header_bytes", func(s *wire.JobSpec) { s.HeaderBytes = math.MaxInt64 }},
		{"buffer", func(s *wire.JobSpec) { s.Sampler = "buffered"; s.Buffer = math.MaxInt }},
		{"window", func(s *wire.JobSpec) { s.Sampler = "block"; s.Window = 1 << 40 }},
		{"opportunistic", func(s *wire.JobSpec) { s.Opportunistic = 1 << 30 }},
		{"epochs", func(s *wire.JobSpec) { s.Epochs = math.MaxInt }},
		{"epoch", func(s *wire.JobSpec) { s.Epoch = -1 }},
		{"sampler", func(s *wire.JobSpec) { s.Sampler = "chaos" }},
		{"format", func(s *wire.JobSpec) { s.Format = "../../etc" }},
		{"paths", func(s *wire.JobSpec) { s.Paths = nil }},
		{"path", func(s *wire.JobSpec) { s.Paths = []string{"a\x00b"} }},
		{"subset", func(s *wire.JobSpec) { s.Subset = &wire.Subset{Ranges: [][2]int{{5, 1}}} }},
		{"sampler state", func(s *wire.JobSpec) { s.Sampler = "buffered"; s.Batch = 2; s.SamplerState = []byte("junk") }},
	} {
		spec := good()
		c.edit(spec)
		m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec})
		if m.Op != wire.OpError || !strings.Contains(m.Message, c.field) {
			t.Errorf("%s: reply %+v, want an error naming %s", c.field, m, c.field)
		}
	}
	if ids := wholeEpoch(t, cl, good()); len(ids) != 500 {
		t.Fatalf("after the absurd specs a good job loaded %d records", len(ids))
	}
}

// Whole open specs, fuzzed, against a running daemon: it answers each
// with opened or an error, and stays up.
func FuzzOpenSpec(f *testing.F) {
	f.Add([]byte(`{"paths":["DATA"],"record_size":128,"batch_size":64,"shuffle":true}`))
	f.Add([]byte(`{"paths":["DATA"],"record_size":128,"batch_size":4611686018427387904}`))
	f.Add([]byte(`{"paths":["DATA"],"record_size":128,"batch_size":8,"depth":1000000000,"memory_bytes":1}`))
	f.Add([]byte(`{"paths":["DATA"],"record_size":128,"batch_size":8,"world":-3,"sampler":"block","window":99999}`))
	f.Add([]byte(`{"paths":["DATA"],"format":"jsonl","batch_size":8,"epochs":-1,"subset":{"ranges":[[0,9999999999]]}}`))
	s := &Server{Socket: sockPathF(f)}
	data := filepath.Join(f.TempDir(), "d.bin")
	synth.WriteFixed(data, 200, 128, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	<-s.Ready()
	defer func() {
		cancel()
		<-done
	}()
	f.Fuzz(func(t *testing.T, raw []byte) {
		spec := &wire.JobSpec{}
		if json.Unmarshal([]byte(strings.ReplaceAll(string(raw), "DATA", data)), spec) != nil {
			return
		}
		if spec.Epochs < 0 || spec.Epochs > 2 {
			spec.Epochs = 1 // a fuzzed job is loaded for one batch only anyway
		}
		cl := dial(t, s.Addr())
		defer cl.c.Close()
		m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec})
		switch m.Op {
		case wire.OpOpened:
			b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: m.Job})
			if b.Op != wire.OpBatch && b.Op != wire.OpEnd && b.Op != wire.OpError {
				t.Fatalf("next: %+v", b)
			}
			cl.req(t, &wire.Msg{Op: wire.OpClose, Job: m.Job})
		case wire.OpError:
		default:
			t.Fatalf("open: %+v", m)
		}
		if st := cl.req(t, &wire.Msg{Op: wire.OpStats}); st.Op != wire.OpStats {
			t.Fatalf("the daemon stopped answering: %+v", st)
		}
	})
}

func sockPathF(f *testing.F) string {
	dir := filepath.Join(f.TempDir(), "run")
	os.Mkdir(dir, 0o700)
	return filepath.Join(dir, "s.sock")
}

// A client several next requests ahead, holding batches up to its memory,
// releases one: the release is read at once, though a next is waiting for
// the memory it frees. (One handler per connection never read it: the job
// and its connection stayed for ever.)
func TestReleaseBehindWaitingNext(t *testing.T) {
	cl, data := daemon(t, &Server{})
	// Batches of 64 records of 128 bytes, 8 KiB: 16 KiB of memory holds two.
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true,
		BatchSize: 64, MemoryBytes: 1 << 16, Prefetch: 1}})
	if op.Op != wire.OpOpened {
		t.Fatalf("open: %+v", op)
	}
	const ahead = 8
	for range ahead {
		cl.send(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
	}
	got := 0
	for got < op.Batches {
		m := cl.recv(t)
		if m.Op != wire.OpBatch {
			t.Fatalf("reply %d: %+v", got, m)
		}
		got++
		// Release only after the reply, with more nexts queued behind it.
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{m.Seq}})
		if got+ahead-1 < op.Batches {
			cl.send(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		}
	}
	if m := cl.req(t, &wire.Msg{Op: wire.OpClose, Job: op.Job}); m.Op != wire.OpClosed {
		t.Fatalf("close: %+v", m)
	}
}

// A job waiting on memory does not stall another job on the same
// connection: each job's requests have a worker of their own.
func TestJobsOnOneConnectionDoNotWaitForEachOther(t *testing.T) {
	cl, _ := daemon(t, &Server{})
	data := filepath.Join(t.TempDir(), "d.bin")
	synth.WriteFixed(data, 2000, 128, 0)
	spec := func() *wire.JobSpec {
		return &wire.JobSpec{Paths: []string{data}, RecordSize: 128, BatchSize: 64, MemoryBytes: 1 << 16, Prefetch: 1}
	}
	a := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec()})
	b := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: spec()})
	// Job a: take batches and hold them all (8 KiB each, 64 KiB of
	// memory), then ask once more: that request waits for memory.
	var held []uint64
	for {
		m := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: a.Job})
		held = append(held, m.Seq)
		if len(held) == 8 {
			break
		}
	}
	stuck := cl.send(t, &wire.Msg{Op: wire.OpNext, Job: a.Job})
	// Job b is served meanwhile.
	for range b.Batches {
		m := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: b.Job})
		if m.Op != wire.OpBatch {
			t.Fatalf("job b: %+v", m)
		}
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: b.Job, Seqs: []uint64{m.Seq}})
	}
	cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: a.Job, Seqs: held})
	if m := cl.recv(t); m.Tag != stuck || m.Op != wire.OpBatch {
		t.Fatalf("the waiting request: %+v", m)
	}
}

// Opening one dataset (a long index build) does not hold up opens of
// others, and two jobs on one dataset share one open.
func TestOpensDoNotWaitForEachOther(t *testing.T) {
	slow := filepath.Join(t.TempDir(), "slow.bin")
	synth.WriteFixed(slow, 10, 128, 0)
	release := make(chan struct{})
	var opens atomic.Int64
	s := &Server{opener: func(ctx context.Context, o dataset.Options, paths ...string) (dataset.Dataset, error) {
		opens.Add(1)
		if paths[0] == slow {
			<-release
		}
		return dataset.Open(ctx, o, paths...)
	}}
	cl, data := daemon(t, s)
	second := dial(t, s.Addr())
	defer second.c.Close()
	first := cl.send(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{slow}, RecordSize: 128, BatchSize: 4}})
	again := second.send(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{slow}, RecordSize: 128, BatchSize: 4}})
	third := dial(t, s.Addr())
	defer third.c.Close()
	if m := third.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, BatchSize: 4}}); m.Op != wire.OpOpened {
		t.Fatalf("an open behind a slow one: %+v", m)
	}
	close(release)
	if m := cl.recv(t); m.Tag != first || m.Op != wire.OpOpened {
		t.Fatalf("slow open: %+v", m)
	}
	if m := second.recv(t); m.Tag != again || m.Op != wire.OpOpened {
		t.Fatalf("second open of the slow dataset: %+v", m)
	}
	if n := opens.Load(); n != 2 {
		t.Fatalf("%d opens for two datasets", n)
	}
}

// A memory bound smaller than one batch is an error at open, not a job
// that never answers.
func TestMemorySmallerThanABatch(t *testing.T) {
	cl, _ := daemon(t, &Server{})
	p := filepath.Join(t.TempDir(), "big.bin")
	synth.WriteFixed(p, 100, 4096, 0)
	m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{p}, RecordSize: 4096, BatchSize: 64, MemoryBytes: 128 << 10}})
	if m.Op != wire.OpError || !strings.Contains(m.Message, "smaller than one batch") {
		t.Fatalf("memory below one batch: %+v", m)
	}
}

// A FIFO (or device) given as a dataset is refused at once.
func TestFIFORefused(t *testing.T) {
	cl, _ := daemon(t, &Server{})
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, "/dev/zero"} {
		m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{p}, RecordSize: 8, BatchSize: 4}})
		if m.Op != wire.OpError || !strings.Contains(m.Message, "not a regular file") {
			t.Fatalf("%s: %+v", p, m)
		}
	}
}

// A file rewritten in place (same size, new bytes) is opened anew for the
// next job, not served from the dataset kept open for the last one.
func TestRewrittenFileIsNotServedStale(t *testing.T) {
	cl, _ := daemon(t, &Server{})
	p := filepath.Join(t.TempDir(), "d.bin")
	write := func(base int) {
		b := make([]byte, 100*8)
		for i := range 100 {
			binary.LittleEndian.PutUint64(b[8*i:], uint64(base+i))
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	first := func() uint64 {
		op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{p}, RecordSize: 8, BatchSize: 100}})
		if op.Op != wire.OpOpened {
			t.Fatalf("open: %+v", op)
		}
		b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		mem, err := syscall.Mmap(cl.fd, 0, int(op.ArenaSize), syscall.PROT_READ, syscall.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Munmap(mem)
		defer syscall.Close(cl.fd)
		off := binary.LittleEndian.Uint64(mem[b.MetaOff+int64(8*b.N):])
		v := binary.LittleEndian.Uint64(mem[b.DataOff+int64(off):])
		cl.req(t, &wire.Msg{Op: wire.OpClose, Job: op.Job})
		return v
	}
	write(0)
	if v := first(); v != 0 {
		t.Fatalf("first record %d", v)
	}
	time.Sleep(10 * time.Millisecond) // a new mtime on file systems with coarse clocks
	write(1000)
	if v := first(); v != 1000 {
		t.Fatalf("after the rewrite the first record is %d: served stale", v)
	}
}

// Before a TCP peer authenticates, it may send only a small header, must
// send its hello promptly, and a frame cut short does not hold its
// connection.
func TestPreAuthLimits(t *testing.T) {
	s := &Server{TCP: "127.0.0.1:0", Token: "secret", helloWait: 200 * time.Millisecond}
	daemon(t, s)
	big := dialRaw(t, "tcp", s.TCPAddr())
	var hdr [4]byte
	binary.LittleEndian.PutUint32(hdr[:], 16<<20)
	big.c.Write(hdr[:])
	if _, err := wire.Read(big.r); err == nil {
		t.Fatal("a 16 MiB header before hello was taken")
	}
	for name, send := range map[string][]byte{"silent": nil, "half a frame": {200, 0, 0, 0, '{'}, "a peer's magic alone": []byte(peer.Magic)} {
		c := dialRaw(t, "tcp", s.TCPAddr())
		c.c.Write(send)
		c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := wire.Read(c.r)
		var ne interface{ Timeout() bool }
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: the daemon kept the connection (%v)", name, err)
		}
	}
}

// Connections beyond MaxConns are closed at once.
func TestConnectionCap(t *testing.T) {
	s := &Server{MaxConns: 2}
	daemon(t, s) // one connection
	second := dial(t, s.Addr())
	defer second.c.Close()
	third := dialRaw(t, "unix", s.Addr())
	defer third.c.Close()
	wire.Write(third.c, &wire.Msg{Op: wire.OpHello, Version: wire.Version})
	third.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := wire.Read(third.r); err == nil {
		t.Fatal("a connection beyond the cap was served")
	}
}

// A socket directory made by someone else, or open to others, is refused:
// a client would talk to whoever answers there.
func TestSocketDirMustBePrivate(t *testing.T) {
	for name, fix := range map[string]func(dir string){
		"open to all":   func(dir string) { os.Chmod(dir, 0o777) },
		"group open":    func(dir string) { os.Chmod(dir, 0o750) },
		"another owner": func(dir string) { os.Chown(dir, 4242, 4242) },
	} {
		dir := filepath.Join(t.TempDir(), "run")
		os.Mkdir(dir, 0o700)
		fix(dir)
		if name == "another owner" && os.Geteuid() != 0 {
			continue // only root can give a directory away
		}
		err := (&Server{Socket: filepath.Join(dir, "s.sock")}).Serve(context.Background())
		if !errors.Is(err, ErrUnsafeDir) {
			t.Fatalf("%s: %v", name, err)
		}
	}
}

// Under --root, a directory dataset whose tree holds a link to a file
// outside is refused, naming the link.
func TestDirDatasetLinkOutOfRoot(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	synth.WriteTree(root, []string{"a"}, 2)
	secret := filepath.Join(dir, "shadow")
	os.WriteFile(secret, []byte("secret"), 0o600)
	os.Symlink(secret, filepath.Join(root, "a", "link"))
	cl, _ := daemon(t, &Server{Roots: []string{root}})
	m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{root}, BatchSize: 4}})
	if m.Op != wire.OpError || !strings.Contains(m.Message, "outside the allowed roots") || !strings.Contains(m.Message, "link") {
		t.Fatalf("a tree with a link out of the root: %+v", m)
	}
}

// Indexes go beside the data only under a root; a daemon without roots
// keeps them in its own directory, never next to a file it was asked for.
func TestIndexPlacement(t *testing.T) {
	for _, rooted := range []bool{false, true} {
		t.Run(fmt.Sprint("roots=", rooted), func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "d.jsonl")
			synth.WriteLines(p, "jsonl", 50, false)
			s := &Server{IndexDir: filepath.Join(t.TempDir(), "cache")}
			if rooted {
				s.Roots = []string{dir}
			}
			cl, _ := daemon(t, s)
			if m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{p}, BatchSize: 4}}); m.Op != wire.OpOpened {
				t.Fatalf("open: %+v", m)
			}
			_, err := os.Stat(p + dataset.IndexExt)
			if beside := err == nil; beside != rooted {
				t.Fatalf("index beside the data: %v", beside)
			}
			m, _ := filepath.Glob(filepath.Join(s.IndexDir, "*"+dataset.IndexExt))
			if inCache := len(m) > 0; inCache == rooted {
				t.Fatalf("index in the cache directory: %v", m)
			}
		})
	}
}

// mentions reports whether a reply's message mentions s.
func mentions(m *wire.Msg, s string) bool { return strings.Contains(m.Message, s) }

func writeLines(t *testing.T, p string, lines []string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// dialFrom dials the daemon's TCP port from a local address of its own:
// all of 127/8 is loopback, so a test has many source addresses.
func dialFrom(t *testing.T, local, addr string) (*client, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &client{c: c, r: bufio.NewReader(c), fd: -1}, nil
}

// helloTCP says hello with token on a fresh TCP connection from local and
// returns the reply, or the error that ended the connection.
func helloTCP(t *testing.T, local, addr, token string) (*client, *wire.Msg, error) {
	t.Helper()
	cl, err := dialFrom(t, local, addr)
	if err != nil {
		return nil, nil, err
	}
	cl.c.SetDeadline(time.Now().Add(10 * time.Second))
	m := &wire.Msg{Op: wire.OpHello, Version: wire.Version, Token: token, Tag: 1}
	if err := wire.Write(cl.c, m); err != nil {
		cl.c.Close()
		return nil, nil, err
	}
	r, err := wire.Read(cl.r)
	if err != nil {
		cl.c.Close()
		return nil, nil, err
	}
	cl.c.SetDeadline(time.Time{})
	cl.tag = 1
	return cl, r, nil
}

// TCP connections that never say hello lock no one out: 300 of them
// (more than MaxConns' default) from one address hold maxPreAuthAddr
// places and the rest are closed at once; the owner's Unix socket has a
// room of its own and serves a job; a client with the token from another
// address gets in at once, and from the flooding address once the flood's
// connections go.
func TestUnauthenticatedFloodLocksOutNoOne(t *testing.T) {
	s := &Server{TCP: "127.0.0.1:0", Token: "secret", helloWait: time.Minute}
	_, data := daemon(t, s)
	const n = 300
	var flood []net.Conn
	closed := make(chan struct{}, n)
	var readers sync.WaitGroup
	defer func() {
		for _, c := range flood {
			c.Close()
		}
		readers.Wait()
	}()
	for range n {
		c, err := net.Dial("tcp", s.TCPAddr())
		if err != nil {
			t.Fatal(err)
		}
		flood = append(flood, c)
		readers.Add(1)
		go func() {
			defer readers.Done()
			var b [1]byte
			if _, err := c.Read(b[:]); err != nil && !strings.Contains(err.Error(), "use of closed") {
				closed <- struct{}{}
			}
		}()
	}
	// Wait until the daemon has closed every connection beyond the cap.
	timeout := time.After(30 * time.Second)
	for range n - maxPreAuthAddr {
		select {
		case <-closed:
		case <-timeout:
			t.Fatal("the daemon did not close the connections beyond the unauthenticated cap")
		}
	}
	// The owner, on the socket: opens a job and loads a whole epoch.
	owner := dial(t, s.Addr())
	defer owner.c.Close()
	if ids := wholeEpoch(t, owner, &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 64}); len(ids) != 500 {
		t.Fatalf("the owner loaded %d records during the flood, want 500", len(ids))
	}
	// A client with the token from another address.
	other, m, err := helloTCP(t, "127.0.0.2", s.TCPAddr(), "secret")
	if err != nil || m.Op != wire.OpHello {
		t.Fatalf("a client with the token from another address: %+v %v", m, err)
	}
	defer other.c.Close()
	if st := other.req(t, &wire.Msg{Op: wire.OpStats}); st.Op != wire.OpStats {
		t.Fatalf("stats: %+v", st)
	}
	select {
	case <-closed:
		t.Fatal("a connection within the cap was closed before its hello deadline")
	default:
	}
	// From the flooding address, a client gets in once the flood goes.
	if _, m, err := helloTCP(t, "127.0.0.1", s.TCPAddr(), "secret"); err == nil {
		t.Fatalf("a connection beyond the flooding address's cap was served: %+v", m)
	}
	during := owner.req(t, &wire.Msg{Op: wire.OpStats}).Clients
	for _, c := range flood {
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		st := owner.req(t, &wire.Msg{Op: wire.OpStats})
		if st.Clients == during-maxPreAuthAddr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood's connections were not let go: %d clients, %d during the flood", st.Clients, during)
		}
	}
	cl, m, err := helloTCP(t, "127.0.0.1", s.TCPAddr(), "secret")
	if err != nil || m.Op != wire.OpHello {
		t.Fatalf("after the flood, a client with the token from its address: %+v %v", m, err)
	}
	cl.c.Close()
}

// A connection that opens with the peer protocol is handed to package
// peer: a daemon without peers refuses it, one with peers checks its
// token and serves it, and closes it once idle past its deadline. A
// client's connection, idle as long, is not closed (its jobs may wait
// between batches as long as a training step takes).
func TestPeerConnections(t *testing.T) {
	peerHello := func(addr, token string) (net.Conn, *bufio.Reader, peer.Answer) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(peer.AppendHello(nil, token)); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		a, err := peer.ReadAnswer(r, 0)
		if err != nil {
			t.Fatalf("the hello's answer: %v", err)
		}
		return c, r, a
	}
	alone := &Server{TCP: "127.0.0.1:0", Token: "secret"}
	daemon(t, alone)
	if _, _, a := peerHello(alone.TCPAddr(), "secret"); a.Status != peer.StatusError || !strings.Contains(a.Message, "no peers") {
		t.Fatalf("a daemon without peers: %+v", a)
	}

	// Peers, and an object store no request reaches.
	s := &Server{TCP: "127.0.0.1:0", Token: "secret", Peers: []string{"self", "127.0.0.1:1"},
		S3: storage.S3Options{Endpoint: "http://127.0.0.1:1"}, peerIdle: 100 * time.Millisecond}
	daemon(t, s)
	if _, _, a := peerHello(s.TCPAddr(), "wrong"); a.Status != peer.StatusError || a.Message != "wrong token" {
		t.Fatalf("a wrong token: %+v", a)
	}
	cl, m, err := helloTCP(t, "127.0.0.1", s.TCPAddr(), "secret")
	if err != nil || m.Op != wire.OpHello {
		t.Fatalf("client hello: %+v %v", m, err)
	}
	defer cl.c.Close()
	pc, r, a := peerHello(s.TCPAddr(), "secret")
	if a.Status != peer.StatusOK {
		t.Fatalf("a peer's hello: %+v", a)
	}
	q := peer.Request{Tag: 4, Object: "/etc/passwd", Length: 16}
	pc.Write(q.Append(nil))
	if a, err := peer.ReadAnswer(r, 16); err != nil || a.Tag != 4 || a.Status != peer.StatusError || !strings.Contains(a.Message, "not an object-store name") {
		t.Fatalf("a block of a file: %+v %v", a, err)
	}
	pc.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = peer.ReadAnswer(r, 0)
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("an idle peer's connection was kept (%v)", err)
	}
	// The client has been idle longer than the peer was.
	if m := cl.req(t, &wire.Msg{Op: wire.OpStats}); m.Op != wire.OpStats {
		t.Fatalf("an idle client after the peer's deadline: %+v", m)
	}
}

// Authenticated TCP connections have a room of their own, MaxConns: one
// beyond it is refused at its hello, and the socket's room is not theirs.
func TestAuthenticatedTCPCap(t *testing.T) {
	s := &Server{TCP: "127.0.0.1:0", Token: "secret", MaxConns: 1}
	owner, _ := daemon(t, s) // the socket's one place
	first, m, err := helloTCP(t, "127.0.0.1", s.TCPAddr(), "secret")
	if err != nil || m.Op != wire.OpHello {
		t.Fatalf("first TCP client: %+v %v", m, err)
	}
	defer first.c.Close()
	second, m, err := helloTCP(t, "127.0.0.1", s.TCPAddr(), "secret")
	if err != nil || m.Op != wire.OpError || !mentions(m, "authenticated TCP connections") {
		t.Fatalf("a TCP client beyond MaxConns: %+v %v", m, err)
	}
	second.c.Close()
	if m := owner.req(t, &wire.Msg{Op: wire.OpStats}); m.Op != wire.OpStats {
		t.Fatalf("the owner: %+v", m)
	}
}

// The unauthenticated room: an address is capped at its share, others
// still get in until the room is full, and a place given back is taken
// again.
func TestPreAuthRoom(t *testing.T) {
	p := preAuth{max: 5, perAddr: 2}
	for i, c := range []struct {
		addr string
		want bool
	}{{"a", true}, {"a", true}, {"a", false}, {"b", true}, {"b", true}, {"c", true}, {"d", false}} {
		if got := p.take(c.addr); got != c.want {
			t.Fatalf("take %d (%s): %v, want %v", i, c.addr, got, c.want)
		}
	}
	p.give("a")
	if !p.take("d") || p.take("a") {
		t.Fatal("a place given back went to the wrong address")
	}
	for _, a := range []string{"a", "b", "b", "c", "d"} {
		p.give(a)
	}
	if p.n != 0 || len(p.byAddr) != 0 {
		t.Fatalf("after every place was given back: %d held, %v", p.n, p.byAddr)
	}
}
