package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
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

// longNamed writes n files of one 16-byte record each, every path padded
// to at least width bytes, and returns their directory.
func longNamed(t *testing.T, n, width int) string {
	t.Helper()
	dir := t.TempDir()
	pad := max(1, width-len(dir)-len("/-00000.bin"))
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("%s-%05d.bin", strings.Repeat("r", pad), i))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("%016d", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// An "opened" reply far larger than the socket's buffer (a glob of 8,000
// files of 65-character paths lists every path: over half a MiB) arrives
// whole, its arena's descriptor with it, and the job serves every record.
// (One sendmsg sent what the buffer took and dropped the rest: the client
// waited for the frame's tail for ever.)
func TestLargeOpenedReplyArrivesWhole(t *testing.T) {
	dir := longNamed(t, 8000, 65)
	cl, _ := daemon(t, &Server{})
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{dir + "/*.bin"}, RecordSize: 16,
		Shuffle: true, BatchSize: 1000, Epochs: 1}})
	if op.Op != wire.OpOpened || op.Records != 8000 || len(op.Info.Paths) != 8000 || cl.fd < 0 {
		t.Fatalf("opened: op %s, %d records, %d paths, fd %d: %s", op.Op, op.Records, len(op.Info.Paths), cl.fd, op.Message)
	}
	b, _ := wire.Encode(op)
	if len(b) < 512<<10 {
		t.Fatalf("the reply is %d bytes: too small to test a reply larger than the socket's buffer", len(b))
	}
	defer unix.Close(cl.fd)
	mem, err := unix.Mmap(cl.fd, 0, int(op.ArenaSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	seen := map[string]int{}
	for {
		m := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		if m.Op == wire.OpEnd {
			break
		}
		if m.Op != wire.OpBatch {
			t.Fatalf("next: %+v", m)
		}
		data := mem[m.DataOff : m.DataOff+m.DataLen]
		for i := 0; i+16 <= len(data); i += 16 {
			seen[string(data[i:i+16])]++
		}
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{m.Seq}})
	}
	for i := range 8000 {
		if k := fmt.Sprintf("%016d", i); seen[k] != 1 {
			t.Fatalf("file %d's record delivered %d times", i, seen[k])
		}
	}
}

// A mixture of as many sources as a spec may name (16,384, each a file)
// opens over the socket: its "opened" lists every path and every
// source's first id, and arrives whole.
func TestLargestMixtureOpens(t *testing.T) {
	dir := longNamed(t, 1<<14, 65)
	names, err := filepath.Glob(dir + "/*.bin")
	if err != nil || len(names) != 1<<14 {
		t.Fatalf("%d files: %v", len(names), err)
	}
	mix := make([]wire.MixSource, len(names))
	for i, p := range names {
		mix[i] = wire.MixSource{Paths: []string{p}, Weight: 1}
	}
	cl, _ := daemon(t, &Server{})
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Mixture: mix, RecordSize: 16, Shuffle: true, BatchSize: 64, Epochs: 1}})
	if op.Op != wire.OpOpened || len(op.Info.Offsets) != 1<<14 || cl.fd < 0 {
		t.Fatalf("opened: op %s, %d offsets, fd %d: %s", op.Op, len(op.Info.Offsets), cl.fd, op.Message)
	}
	unix.Close(cl.fd)
	if b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job}); b.Op != wire.OpBatch || b.N != 64 {
		t.Fatalf("next: %+v", b)
	}
	// One more than the bound is refused, naming it.
	mix = append(mix, mix[0])
	if m := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Mixture: mix, RecordSize: 16, BatchSize: 64}}); m.Op != wire.OpError ||
		m.Kind != wire.KindSpec || !strings.Contains(m.Message, "at most 16384") {
		t.Fatalf("a mixture of 16,385 sources: %+v", m)
	}
}

// Clients that go away 0 to 4 ms after asking for a job (Ctrl-C during an
// open, a DataLoader worker killed while it opens) leave nothing behind:
// no job, no reservation of the memory budget, no connection's place, no
// client counted, and the daemon still stops when told. (A connection
// that closed after its job was made and before the job's worker started
// waited for that worker for ever: everything it held stayed held, the
// daemon no longer stopped, and once the abandoned connections filled
// the socket's places it refused everyone.)
func TestAbandonedOpensLeaveNothing(t *testing.T) {
	data := filepath.Join(t.TempDir(), "d.bin")
	if err := synth.WriteFixed(data, 500, 128, 0); err != nil {
		t.Fatal(err)
	}
	const places = 16
	s := &Server{Socket: sockPath(t), MaxConns: places, MemoryBytes: 1 << 30}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	<-s.Ready()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(time.Minute):
			t.Fatal("the daemon did not stop when told: a connection's close waits for ever")
		}
	}()
	hello, _ := wire.Encode(&wire.Msg{Op: wire.OpHello, Tag: 1, Version: wire.Version})
	open, _ := wire.Encode(&wire.Msg{Op: wire.OpOpen, Tag: 2, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128,
		Shuffle: true, BatchSize: 64, Epochs: -1}})
	var wg sync.WaitGroup
	work := make(chan int)
	for range places - 1 {
		wg.Go(func() {
			for i := range work {
				c, err := net.Dial("unix", s.Addr())
				if err != nil {
					continue // refused: the check below says why
				}
				c.Write(append(slices.Clip(hello), open...))
				time.Sleep(time.Duration(i%5) * time.Millisecond)
				c.Close()
			}
		})
	}
	for i := range 300 {
		work <- i
	}
	close(work)
	wg.Wait()
	watch := dial(t, s.Addr())
	defer watch.c.Close()
	idle := func() string {
		st := watch.req(t, &wire.Msg{Op: wire.OpStatus}).Status
		jobs := watch.req(t, &wire.Msg{Op: wire.OpStats}).Jobs
		if jobs != 0 || st.Clients != 1 || st.Memory.Held != 0 || st.Memory.Holders != 0 || len(st.Memory.Waiting) != 0 {
			return fmt.Sprintf("%d jobs, %d clients, %d bytes held by %d jobs, %d opens waiting", jobs, st.Clients,
				st.Memory.Held, st.Memory.Holders, len(st.Memory.Waiting))
		}
		return ""
	}
	deadline := time.Now().Add(time.Minute)
	for idle() != "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if now := idle(); now != "" {
		t.Fatalf("after 300 abandoned opens the daemon is not idle: %s", now)
	}
	// Every place on the socket is free: as many clients as it serves at
	// once (the watcher and 15 more) each get an answer.
	var more []*client
	for range places - 1 {
		cl := dial(t, s.Addr())
		defer cl.c.Close()
		more = append(more, cl)
	}
	for _, cl := range more {
		if m := cl.req(t, &wire.Msg{Op: wire.OpStats}); m.Op != wire.OpStats {
			t.Fatalf("a client after the abandoned ones: %+v", m)
		}
	}
}

// A request with a field its type cannot hold (seed -1, from Python's
// riffle.Loader(seed=-1)) is refused as an invalid spec naming the field,
// and the connection serves the next request. (The frame failed to
// decode, and the daemon dropped the connection: the client said the
// daemon had died.)
func TestFieldOfTheWrongTypeIsRefused(t *testing.T) {
	cl, data := daemon(t, &Server{})
	raw := func(tag int, op, spec string) {
		b := []byte(fmt.Sprintf(`{"op":%q,"tag":%d,"spec":{"paths":[%q],"record_size":128,"batch_size":50,%s}}`, op, tag, data, spec))
		if _, err := cl.c.Write(append(binary.LittleEndian.AppendUint32(nil, uint32(len(b))), b...)); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range []struct{ op, spec, says string }{
		{wire.OpCheck, `"seed":-1`, "seed: -1 is not an integer from 0 to 18446744073709551615"},
		{wire.OpOpen, `"seed":-1`, "seed: -1 is not an integer"},
		{wire.OpOpen, `"seed":18446744073709551616`, "seed: 18446744073709551616 is not an integer"},
		{wire.OpOpen, `"epochs":"all"`, "epochs: a string is not an integer"},
		{wire.OpOpen, `"sampler_state":"***","sampler":"buffered","batch":2`, "sampler_state: illegal base64"},
		{wire.OpOpen, `"subset":{"ids":[1,-2.5]}`, "subset.ids[1]: -2.5 is not an integer"},
	} {
		raw(100+i, c.op, c.spec)
		m := cl.recv(t)
		if m.Tag != uint64(100+i) || m.Op != wire.OpError || m.Kind != wire.KindSpec || !strings.Contains(m.Message, "invalid job spec: "+c.says) {
			t.Errorf("%s %s: %+v, want an invalid spec saying %q", c.op, c.spec, m, c.says)
		}
	}
	if ids := wholeEpoch(t, cl, &wire.JobSpec{Paths: []string{data}, RecordSize: 128, BatchSize: 50}); len(ids) != 500 {
		t.Fatalf("a good job on the same connection delivered %d records", len(ids))
	}
}

// Any bytes a client sends after its hello, fuzzed, against a running
// daemon: whatever they open, ask or break, the daemon reads them to their
// end and closes the connection, and then serves a new one and holds no
// job, no memory and no client of it.
func FuzzConn(f *testing.F) {
	s := &Server{Socket: sockPathF(f), MaxConns: 4}
	data := filepath.Join(f.TempDir(), "d.bin")
	synth.WriteFixed(data, 200, 128, 0)
	frames := func(ms ...*wire.Msg) []byte {
		var b []byte
		for _, m := range ms {
			e, _ := wire.Encode(m)
			b = append(b, e...)
		}
		return b
	}
	spec := &wire.JobSpec{Paths: []string{data}, RecordSize: 128, BatchSize: 16, Shuffle: true, Epochs: 1}
	f.Add(frames(&wire.Msg{Op: wire.OpOpen, Tag: 2, Spec: spec}, &wire.Msg{Op: wire.OpNext, Tag: 3, Job: 1},
		&wire.Msg{Op: wire.OpNext, Tag: 4, Job: 1}, &wire.Msg{Op: wire.OpRelease, Job: 1, Seqs: []uint64{1, 2, 9}},
		&wire.Msg{Op: wire.OpState, Tag: 5, Job: 1, Epoch: 0, Index: 1}, &wire.Msg{Op: wire.OpLocate, Tag: 6, Job: 1, IDs: []int{0, 199, 200, -1}},
		&wire.Msg{Op: wire.OpClose, Tag: 7, Job: 1}))
	f.Add(frames(&wire.Msg{Op: wire.OpCheck, Tag: 2, Spec: spec}, &wire.Msg{Op: wire.OpStatus, Tag: 3}, &wire.Msg{Op: wire.OpStats, Tag: 4}))
	f.Add(frames(&wire.Msg{Op: wire.OpOpen, Tag: 2, Spec: spec}, &wire.Msg{Op: wire.OpOpen, Tag: 3, Spec: spec},
		&wire.Msg{Op: wire.OpNext, Tag: 4, Job: 2}, &wire.Msg{Op: wire.OpClose, Tag: 5, Job: 9}))
	f.Add(append(frames(&wire.Msg{Op: wire.OpOpen, Tag: 2, Spec: spec}), []byte("\xff\xff\xff\x00{")...))
	f.Add([]byte(`` + "\x40\x00\x00\x00" + `{"op":"open","tag":2,"spec":{"paths":["/nope"],"seed":-1}}                `))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	<-s.Ready()
	defer func() {
		cancel()
		<-done
	}()
	f.Fuzz(func(t *testing.T, b []byte) {
		cl := dial(t, s.Addr())
		// Whatever the daemon answers is read and dropped, so that it never
		// waits on a client that stopped reading.
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			buf := make([]byte, 1<<16)
			oob := make([]byte, unix.CmsgSpace(4*4))
			for {
				_, oobn, _, _, err := cl.c.(*net.UnixConn).ReadMsgUnix(buf, oob)
				if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
					for _, m := range msgs {
						fds, _ := unix.ParseUnixRights(&m)
						for _, fd := range fds {
							unix.Close(fd)
						}
					}
				}
				if err != nil {
					return
				}
			}
		}()
		cl.c.Write(b)
		cl.c.(*net.UnixConn).CloseWrite() // the daemon reads to the end, then closes
		<-drained
		cl.c.Close()
		watch := dial(t, s.Addr())
		defer watch.c.Close()
		eventually(t, "the fuzzed connection's end", func() bool {
			st := watch.req(t, &wire.Msg{Op: wire.OpStatus}).Status
			return st.Clients == 1 && st.Memory.Held == 0 && len(st.Groups) == 0
		})
	})
}
