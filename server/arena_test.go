package server

import (
	"bytes"
	"context"
	"testing"

	"golang.org/x/sys/unix"
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
