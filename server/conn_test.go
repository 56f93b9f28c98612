package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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
