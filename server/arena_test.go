package server

import (
	"bytes"
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/wire"
)

// A closing job's arena keeps the pages of the batches its client may
// still read and gives the others back: the memfd's blocks fall, the kept
// bytes stay, the rest reads as zeros.
func TestArenaDropExcept(t *testing.T) {
	a, err := NewArena("test", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	var held [][]byte
	for i := range 8 {
		b, err := a.Alloc(ctx, 100<<10, 4096)
		if err != nil {
			t.Fatal(err)
		}
		for k := range b {
			b[k] = byte(i + 1)
		}
		if i%3 == 0 {
			held = append(held, b)
		}
	}
	blocks := func() int64 {
		var st unix.Stat_t
		if err := unix.Fstat(a.Fd(), &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	before := blocks()
	if err := a.dropExcept(held); err != nil {
		t.Fatal(err)
	}
	after := blocks()
	if after > before/2 || after < 3*100<<10 {
		t.Fatalf("memfd holds %d bytes after dropping all but 3 of 8 batches, %d before", after, before)
	}
	for _, b := range held {
		if want := bytes.Repeat(b[:1], len(b)); !bytes.Equal(b, want) {
			t.Fatalf("a kept batch changed")
		}
	}
	if n := bytes.Count(a.mem[len(a.mem)-4096:], []byte{0}); n != 4096 {
		t.Fatalf("the arena's last page (never a batch) reads %d zeros of 4096", n)
	}
	if a.mem[5*(100<<10)+8192] != 0 {
		t.Fatalf("a dropped batch's page still reads its bytes")
	}
}

// A client cannot change the size of the arena it was handed: truncating
// it, growing it and adding seals of its own are refused by the kernel,
// and the job goes on serving its batches. (A truncate left the daemon's
// mapping without pages and killed it with SIGBUS at its next write.)
func TestArenaSizeIsSealed(t *testing.T) {
	cl, data := daemon(t, &Server{})
	op := cl.req(t, &wire.Msg{Op: wire.OpOpen, Spec: &wire.JobSpec{Paths: []string{data}, RecordSize: 128, Shuffle: true,
		BatchSize: 64, Epochs: 2}})
	if op.Op != wire.OpOpened || cl.fd < 0 {
		t.Fatalf("opened: %+v fd %d", op, cl.fd)
	}
	defer unix.Close(cl.fd)
	for name, change := range map[string]func() error{
		"truncate to 0":      func() error { return unix.Ftruncate(cl.fd, 0) },
		"truncate by a page": func() error { return unix.Ftruncate(cl.fd, op.ArenaSize-4096) },
		"grow":               func() error { return unix.Ftruncate(cl.fd, op.ArenaSize+4096) },
		"grow by fallocate":  func() error { return unix.Fallocate(cl.fd, 0, op.ArenaSize, 4096) },
		"seal further writes": func() error {
			_, err := unix.FcntlInt(uintptr(cl.fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
			return err
		},
	} {
		if err := change(); err == nil {
			t.Fatalf("the client could %s its arena: the daemon's next write into it would fault", name)
		}
	}
	n := 0
	for {
		b := cl.req(t, &wire.Msg{Op: wire.OpNext, Job: op.Job})
		if b.Op == wire.OpEnd {
			break
		}
		if b.Op != wire.OpBatch {
			t.Fatalf("next: %+v", b)
		}
		n += b.N
		cl.send(t, &wire.Msg{Op: wire.OpRelease, Job: op.Job, Seqs: []uint64{b.Seq}})
	}
	if n != 1000 {
		t.Fatalf("two epochs of 500 records delivered %d", n)
	}
}
