package columnar

import (
	"encoding/binary"
	"strings"
	"testing"
)

// A dictionary of views (Polars' Categorical) reads into offsets and
// bytes: short values from the view, long ones from a data buffer; a view
// naming bytes outside its buffers is an error, not a panic.
func TestViewDict(t *testing.T) {
	view := func(s string, buf, off int32) []byte {
		v := make([]byte, 16)
		binary.LittleEndian.PutUint32(v, uint32(len(s)))
		if len(s) <= 12 {
			copy(v[4:], s)
		} else {
			copy(v[4:8], s)
			binary.LittleEndian.PutUint32(v[8:], uint32(buf))
			binary.LittleEndian.PutUint32(v[12:], uint32(off))
		}
		return v
	}
	long := "a value longer than twelve bytes"
	data := "xx" + long
	body := append(append(view("short", 0, 0), view(long, 0, 2)...), data...)
	m := &BatchMeta{Nodes: []FieldNode{{Length: 2}}, Buffers: []BufferLoc{{0, 0}, {0, 32}, {32, int64(len(data))}}}
	v := &Node{Kind: KBinary, Width: 4, ViewValues: true}
	d, err := NewDict(v, m, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(d.data[d.offs[0]:d.offs[1]]) + "|" + string(d.data[d.offs[1]:d.offs[2]]); got != "short|"+long || d.MaxLen != int64(len(long)) {
		t.Fatalf("values %q, longest %d", got, d.MaxLen)
	}
	bad := append(append(view("short", 0, 0), view(long, 0, 20)...), data...)
	if _, err := NewDict(v, m, bad); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("a view past its buffer: %v", err)
	}
	bad = append(append(view("short", 0, 0), view(long, 5, 0)...), data...)
	if _, err := NewDict(v, m, bad); err == nil {
		t.Fatal("a view of a buffer that is not there: no error")
	}
}
