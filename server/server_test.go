package server

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"pgregory.net/rapid"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Allocations never overlap, and freeing everything leaves one free span:
// checked against a plain list of what is allocated.
func TestArena(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a, err := NewArena("test", 1<<16)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var live [][]byte
		for range rapid.IntRange(1, 200).Draw(t, "steps") {
			if len(live) > 0 && rapid.Bool().Draw(t, "free") {
				i := rapid.IntRange(0, len(live)-1).Draw(t, "which")
				a.Free(live[i])
				live = append(live[:i], live[i+1:]...)
				continue
			}
			n := rapid.IntRange(1, 4000).Draw(t, "n")
			if a.InUse()+int64(n)+4096 > a.Size()/2 {
				continue // would wait: this test does not block
			}
			b, err := a.Alloc(context.Background(), n, []int{1, 64, 4096}[rapid.IntRange(0, 2).Draw(t, "align")])
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != n || a.Offset(b)%64 != 0 {
				t.Fatalf("allocation of %d: %d bytes at %d", n, len(b), a.Offset(b))
			}
			live = append(live, b)
			sorted := append([][]byte{}, live...)
			sort.Slice(sorted, func(i, j int) bool { return a.Offset(sorted[i]) < a.Offset(sorted[j]) })
			for i := 1; i < len(sorted); i++ {
				if a.Offset(sorted[i-1])+int64(cap(sorted[i-1])) > a.Offset(sorted[i]) {
					t.Fatalf("allocations overlap")
				}
			}
		}
		for _, b := range live {
			a.Free(b)
		}
		if len(a.free) != 1 || a.free[0] != (span{0, a.Size()}) || a.InUse() != 0 {
			t.Fatalf("after freeing everything: %v", a.free)
		}
	})
}

func TestArenaStopWakesWaiters(t *testing.T) {
	a, _ := NewArena("test", 4096)
	b, _ := a.Alloc(context.Background(), 4096, 64)
	done := make(chan error)
	go func() {
		_, err := a.Alloc(context.Background(), 100, 64)
		done <- err
	}()
	eventually(t, "an Alloc waits for space", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.waiting == 1
	})
	a.stop()
	if err := <-done; !errors.Is(err, ErrArenaClosed) {
		t.Fatalf("a waiting Alloc after stop: %v", err)
	}
	a.Free(b)
	a.Close()
}

// client is a Go client of the daemon over a real socket.
type client struct {
	c   net.Conn
	r   *bufio.Reader
	fd  int
	tag uint64
}

func dial(t *testing.T, sock string) *client {
	t.Helper()
	cl := dialRaw(t, "unix", sock)
	if m := cl.req(t, &wire.Msg{Op: wire.OpHello, Version: wire.Version}); m.Op != wire.OpHello {
		t.Fatalf("hello: %+v", m)
	}
	return cl
}

func dialRaw(t *testing.T, network, addr string) *client {
	t.Helper()
	var c net.Conn
	var err error
	for range 200 {
		if c, err = net.Dial(network, addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &client{c: c, r: bufio.NewReader(c), fd: -1}
}

// send writes a request with a fresh tag and returns the tag.
func (cl *client) send(t *testing.T, m *wire.Msg) uint64 {
	t.Helper()
	cl.tag++
	m.Tag = cl.tag
	if err := wire.Write(cl.c, m); err != nil {
		t.Fatal(err)
	}
	return cl.tag
}

// recv reads the next reply, collecting a passed descriptor.
func (cl *client) recv(t *testing.T) *wire.Msg {
	t.Helper()
	uc, ok := cl.c.(*net.UnixConn)
	if !ok {
		r, err := wire.Read(cl.r)
		if err != nil {
			t.Fatal(err)
		}
		if r.Payload > 0 {
			io.CopyN(io.Discard, cl.r, r.Payload)
		}
		return r
	}
	// Frames are read one at a time with their ancillary data, so a
	// descriptor is never left behind in a buffer.
	head := make([]byte, 4)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(head, oob)
	if err != nil || n < 4 {
		if n < 4 && err == nil {
			_, err = io.ReadFull(cl.c, head[n:])
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && len(msgs) == 1 {
		fds, _ := unix.ParseUnixRights(&msgs[0])
		cl.fd = fds[0]
	}
	body := make([]byte, binary.LittleEndian.Uint32(head))
	if _, err := io.ReadFull(cl.c, body); err != nil {
		t.Fatal(err)
	}
	m, err := wire.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func (cl *client) req(t *testing.T, m *wire.Msg) *wire.Msg {
	t.Helper()
	tag := cl.send(t, m)
	r := cl.recv(t)
	if r.Tag != tag {
		t.Fatalf("reply to tag %d, want %d: %+v", r.Tag, tag, r)
	}
	return r
}

// sockPath is a socket in a directory only this user can enter, as the
// daemon demands.
func sockPath(t *testing.T) string {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "s.sock")
}

func serve(t *testing.T, s *Server) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	select {
	case <-s.Ready():
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}
}

func TestJobOverUnixSocket(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.bin")
	synth.WriteFixed(data, 500, 128, 0)
	s := &Server{Socket: sockPath(t)}
	stop := serve(t, s)
	defer stop()
	cl := dial(t, s.Socket)
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true, BatchSize: 64, World: 1}})
	if op.Op != wire.OpOpened || op.Records != 500 || op.Batches != 8 || cl.fd < 0 {
		t.Fatalf("opened: %+v fd %d", op, cl.fd)
	}
	mem, err := unix.Mmap(cl.fd, 0, int(op.ArenaSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	defer unix.Close(cl.fd)
	seen := map[int]bool{}
	for {
		b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		if b.Op == wire.OpEnd {
			break
		}
		for i := range b.N {
			meta := mem[b.MetaOff:]
			id := int(binary.LittleEndian.Uint64(meta[8*i:]))
			off := int64(binary.LittleEndian.Uint64(meta[8*(b.N+i):]))
			n := int64(binary.LittleEndian.Uint64(meta[8*(2*b.N+i):]))
			if err := synth.CheckRecord(mem[b.DataOff+off:b.DataOff+off+n], id); err != nil {
				t.Fatal(err)
			}
			seen[id] = true
		}
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{b.Seq}})
	}
	if len(seen) != 500 {
		t.Fatalf("%d records seen, want 500", len(seen))
	}
	if st := cl.req(t, &wire.Msg{Op: wire.OpStats}); st.Jobs != 1 || st.Clients != 1 {
		t.Fatalf("stats %+v", st)
	}
	// A client that goes away has its job closed at once.
	cl.c.Close()
	other := dial(t, s.Socket)
	defer other.c.Close()
	deadline := time.Now().Add(time.Second)
	for {
		st := other.req(t, &wire.Msg{Op: wire.OpStats})
		if st.Jobs == 0 && st.Clients == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a second after the client left: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestErrorsAndRoots(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	synth.WriteTree(root, []string{"a"}, 1)
	odd := filepath.Join(root, "odd.bin")
	synth.WriteFixed(odd, 10, 100, 0)
	outside := filepath.Join(dir, "out.bin")
	synth.WriteFixed(outside, 10, 64, 0)
	s := &Server{Socket: sockPath(t), Roots: []string{root}}
	stop := serve(t, s)
	defer stop()
	cl := dial(t, s.Socket)
	defer cl.c.Close()
	m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{odd}, RecordSize: 64, BatchSize: 4}})
	if m.Op != wire.OpError || m.Path != odd || m.Offset != 960 {
		t.Fatalf("open of a file with a partial record: %+v", m)
	}
	m = cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{outside}, RecordSize: 64, BatchSize: 4}})
	if m.Op != wire.OpError || !strings.Contains(m.Message, "outside the allowed roots") {
		t.Fatalf("open outside the roots: %+v", m)
	}
	if m := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: 99}); m.Op != wire.OpError {
		t.Fatalf("next of no job: %+v", m)
	}
}

func TestSecondDaemonOnOneSocket(t *testing.T) {
	sock := sockPath(t)
	stop := serve(t, &Server{Socket: sock})
	defer stop()
	dial(t, sock).c.Close()
	err := (&Server{Socket: sock}).Serve(context.Background())
	if !errors.Is(err, ErrRunning) {
		t.Fatalf("second daemon: %v", err)
	}
}

func TestIdleExit(t *testing.T) {
	s := &Server{Socket: sockPath(t), IdleExit: 50 * time.Millisecond}
	done := make(chan error)
	go func() { done <- s.Serve(context.Background()) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("an idle daemon did not exit")
	}
}

// Every TCP listener needs a token: one is made and written, mode 0600,
// next to the socket when none is given; a bare port is loopback; a
// wrong token closes the connection.
func TestTCPNeedsAToken(t *testing.T) {
	s := &Server{Socket: sockPath(t), TCP: ":0"}
	stop := serve(t, s)
	defer stop()
	if !strings.HasPrefix(s.TCPAddr(), "127.0.0.1:") || s.TCP != ":0" {
		t.Fatalf("a bare port listens on %s (config now %q)", s.TCPAddr(), s.TCP)
	}
	st, err := os.Stat(s.TokenFile())
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v %v", st, err)
	}
	token, _ := os.ReadFile(s.TokenFile())
	bad := dialRaw(t, "tcp", s.TCPAddr())
	if m := bad.req(t, &wire.Msg{Op: wire.OpHello, Version: wire.Version, Token: "guess"}); m.Op != wire.OpError {
		t.Fatalf("wrong token: %+v", m)
	}
	if _, err := wire.Read(bad.r); err == nil {
		t.Fatal("the connection stayed open after a wrong token")
	}
	good := dialRaw(t, "tcp", s.TCPAddr())
	defer good.c.Close()
	if m := good.req(t, &wire.Msg{Op: wire.OpHello, Version: wire.Version, Token: strings.TrimSpace(string(token))}); m.Op != wire.OpHello {
		t.Fatalf("right token: %+v", m)
	}
	if m := good.req(t, &wire.Msg{Op: wire.OpStats}); m.Op != wire.OpStats {
		t.Fatalf("after hello: %+v", m)
	}
}

// Failed handshakes are spaced failRate a second for the whole daemon,
// however many connections fail at once.
func TestFailuresAreSpaced(t *testing.T) {
	var f failures
	f.next = time.Now().Add(time.Hour) // no sleeping: only the schedule is checked
	start := f.next
	for i := range 10 {
		f.mu.Lock()
		f.next = f.next.Add(time.Second / failRate)
		f.mu.Unlock()
		if got := f.next.Sub(start); got != time.Duration(i+1)*time.Second/failRate {
			t.Fatalf("failure %d scheduled %v after the first", i, got)
		}
	}
}

// Every error frame says what it is about, and a check answers as an
// open would without making a job.
func TestErrorKindsAndCheck(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "d.bin")
	synth.WriteFixed(data, 100, 64, 0)
	odd := filepath.Join(dir, "odd.bin")
	synth.WriteFixed(odd, 10, 100, 0)
	s := &Server{Socket: sockPath(t)}
	stop := serve(t, s)
	defer stop()
	cl := dial(t, s.Socket)
	defer cl.c.Close()
	for _, c := range []struct {
		name string
		spec *wire.JobSpec
		kind string
	}{
		{"missing", &wire.JobSpec{Paths: []string{filepath.Join(dir, "nope.bin")}, RecordSize: 64, BatchSize: 4}, wire.KindNotFound},
		{"batch 0", &wire.JobSpec{Paths: []string{data}, RecordSize: 64}, wire.KindSpec},
		{"sampler", &wire.JobSpec{Paths: []string{data}, RecordSize: 64, BatchSize: 4, Sampler: "bogus"}, wire.KindSpec},
		{"partial", &wire.JobSpec{Paths: []string{odd}, RecordSize: 64, BatchSize: 4}, wire.KindData},
	} {
		for _, op := range []string{wire.OpCheck, wire.OpOpen} {
			m := cl.req(t, &wire.Msg{Op: op, Spec: c.spec})
			if m.Op != wire.OpError || m.Kind != c.kind {
				t.Errorf("%s of %s: %+v, want an error of kind %q", op, c.name, m, c.kind)
			}
		}
	}
	m := cl.req(t, &wire.Msg{Op: wire.OpCheck, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 64, BatchSize: 8, World: 1}})
	if m.Op != wire.OpOpened || m.Job != 0 || m.Records != 100 || m.Batches != 13 || m.Left != 13 {
		t.Fatalf("check: %+v", m)
	}
	if st := cl.req(t, &wire.Msg{Op: wire.OpStats}); st.Jobs != 0 {
		t.Fatalf("a check left %d jobs open", st.Jobs)
	}
}

// Metrics name a source by a keyed hash of its paths, the same across
// restarts; a scrape with the token sees the paths, one with a wrong
// token is refused.
func TestMetricsHidePaths(t *testing.T) {
	s := &Server{Metrics: "127.0.0.1:0", Token: "secret"}
	cl, data := daemon(t, s)
	if m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, BatchSize: 64}}); m.Op != wire.OpOpened {
		t.Fatalf("open: %+v", m)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // no idle connection outlives the test
	scrape := func(auth string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+s.MetricsAddr()+"/metrics", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := scrape("")
	label := regexp.MustCompile(`riffle_group_jobs\{source="([^"]*)"\} 1`).FindStringSubmatch(body)
	if code != 200 || label == nil || strings.Contains(body, filepath.Dir(data)) {
		t.Fatalf("metrics without the token (%d):\n%s", code, body)
	}
	if !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(label[1]) {
		t.Fatalf("a source's label %q is not a short hash", label[1])
	}
	// The memory budget and what holds it: the one job's arena.
	if !regexp.MustCompile(`(?m)^riffle_memory_holders 1$`).MatchString(body) ||
		!regexp.MustCompile(`(?m)^riffle_memory_held_bytes [1-9]`).MatchString(body) ||
		!regexp.MustCompile(`(?m)^riffle_job_memory_bytes\{job="[0-9]+"\} [1-9]`).MatchString(body) {
		t.Fatalf("metrics without the memory budget:\n%s", body)
	}
	// The same key, and so the same label, for a daemon on this socket later.
	again := &Server{socket: s.Addr()}
	if err := again.loadMetricsKey(); err != nil || again.hashPath(data) != s.hashPath(data) {
		t.Fatalf("the hash of a path changed across a restart (%v)", err)
	}
	if code, body = scrape("Bearer secret"); code != 200 || !strings.Contains(body, `source="`+data) {
		t.Fatalf("metrics with the token (%d):\n%s", code, body)
	}
	if code, body = scrape("Bearer guess"); code != http.StatusUnauthorized || strings.Contains(body, data) {
		t.Fatalf("metrics with a wrong token (%d):\n%s", code, body)
	}
}

// A directory the daemon was told to keep its data in that it cannot
// trust stops it at start, saying which flag and what to do: one another
// user owns, or one anyone may write. (A --cache-dir another user owned
// was skipped with a warning when the first object was read, and the
// daemon ran without the tier it was asked for.)
func TestUntrustedDirsStopTheDaemonAtStart(t *testing.T) {
	foreign := filepath.Join(t.TempDir(), "theirs")
	os.Mkdir(foreign, 0o700)
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Skipf("this test gives a directory to another user: %v", err)
	}
	open := filepath.Join(t.TempDir(), "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	for _, c := range []struct {
		flag string
		set  func(s *Server, dir string)
	}{
		{"--cache-dir", func(s *Server, dir string) { s.TierDir = dir }},
		{"--index-dir", func(s *Server, dir string) { s.IndexDir = dir }},
		{"--outputs", func(s *Server, dir string) { s.Outputs = dir }},
	} {
		for dir, says := range map[string]string{foreign: "owned by uid 65534", open: "chmod go-w " + open} {
			s := &Server{Socket: sockPath(t)}
			c.set(s, dir)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(ctx) }()
			select {
			case <-s.Ready():
				t.Errorf("%s %s: the daemon served", c.flag, dir)
				cancel()
				<-done
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), c.flag) || !strings.Contains(err.Error(), says) {
					t.Errorf("%s %s: %v, want an error naming the flag and saying %q", c.flag, dir, err, says)
				}
			}
			cancel()
		}
	}
}
