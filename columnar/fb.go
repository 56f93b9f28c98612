package columnar

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The Arrow IPC metadata is flatbuffers. It is read here with a bounds
// check on every access, so that a corrupt or hostile file is an error,
// never a panic: the generated flatbuffers accessors trust their input.

var errFB = errors.New("malformed flatbuffer")

// table is one flatbuffers table: its position, and its vtable's.
type table struct {
	b      []byte
	pos    int
	vt     int
	vtLen  int
	objLen int
}

func le16(b []byte) int { return int(binary.LittleEndian.Uint16(b)) }
func le32(b []byte) int { return int(int32(binary.LittleEndian.Uint32(b))) }

// root returns the table a buffer's first word points to.
func root(b []byte) (table, error) {
	if len(b) < 4 {
		return table{}, errFB
	}
	return tableAt(b, int(binary.LittleEndian.Uint32(b)))
}

func tableAt(b []byte, pos int) (table, error) {
	if pos < 0 || pos+4 > len(b) {
		return table{}, fmt.Errorf("%w: table at %d of %d bytes", errFB, pos, len(b))
	}
	vt := pos - le32(b[pos:])
	if vt < 0 || vt+4 > len(b) {
		return table{}, fmt.Errorf("%w: vtable at %d", errFB, vt)
	}
	t := table{b: b, pos: pos, vt: vt, vtLen: le16(b[vt:]), objLen: le16(b[vt+2:])}
	if t.vtLen < 4 || vt+t.vtLen > len(b) {
		return table{}, fmt.Errorf("%w: table sizes", errFB)
	}
	return t, nil
}

// field returns where field i sits, or 0 if it is absent.
func (t table) field(i, size int) (int, error) {
	// As the flatbuffers runtime reads it (arrow-go's reader must see
	// what this one checked): a field is present if its slot starts
	// inside the vtable's stated length.
	o := 4 + 2*i
	if o >= t.vtLen {
		return 0, nil
	}
	if t.vt+o+2 > len(t.b) {
		return 0, fmt.Errorf("%w: vtable past the buffer", errFB)
	}
	f := le16(t.b[t.vt+o:])
	if f == 0 {
		return 0, nil
	}
	// Bounded by the buffer, not by the vtable's object size: Go's
	// flatbuffers builder shares a vtable between tables of the same
	// fields whatever their sizes.
	if t.pos+f+size > len(t.b) {
		return 0, fmt.Errorf("%w: field %d outside the buffer", errFB, i)
	}
	return t.pos + f, nil
}

func (t table) int64(i int, def int64) (int64, error) {
	p, err := t.field(i, 8)
	if err != nil || p == 0 {
		return def, err
	}
	return int64(binary.LittleEndian.Uint64(t.b[p:])), nil
}

func (t table) int32(i int, def int32) (int32, error) {
	p, err := t.field(i, 4)
	if err != nil || p == 0 {
		return def, err
	}
	return int32(binary.LittleEndian.Uint32(t.b[p:])), nil
}

func (t table) int16(i int, def int16) (int16, error) {
	p, err := t.field(i, 2)
	if err != nil || p == 0 {
		return def, err
	}
	return int16(binary.LittleEndian.Uint16(t.b[p:])), nil
}

func (t table) uint8(i int, def uint8) (uint8, error) {
	p, err := t.field(i, 1)
	if err != nil || p == 0 {
		return def, err
	}
	return t.b[p], nil
}

// offset follows the uoffset in field i; ok is false if the field is absent.
func (t table) offset(i int) (int, bool, error) {
	p, err := t.field(i, 4)
	if err != nil || p == 0 {
		return 0, false, err
	}
	q := p + int(binary.LittleEndian.Uint32(t.b[p:]))
	if q < p || q >= len(t.b) {
		return 0, false, fmt.Errorf("%w: offset out of the buffer", errFB)
	}
	return q, true, nil
}

// table returns the table in field i.
func (t table) table(i int) (table, bool, error) {
	q, ok, err := t.offset(i)
	if !ok || err != nil {
		return table{}, false, err
	}
	s, err := tableAt(t.b, q)
	return s, err == nil, err
}

// vector returns the start and length of the vector in field i, whose
// elements are elem bytes each.
func (t table) vector(i, elem int) (start, n int, err error) {
	q, ok, err := t.offset(i)
	if !ok || err != nil {
		return 0, 0, err
	}
	if q+4 > len(t.b) {
		return 0, 0, fmt.Errorf("%w: vector length", errFB)
	}
	n = int(binary.LittleEndian.Uint32(t.b[q:]))
	start = q + 4
	if n < 0 || n > (len(t.b)-start)/max(elem, 1) {
		return 0, 0, fmt.Errorf("%w: vector of %d elements", errFB, n)
	}
	return start, n, nil
}

// tables returns the tables of a vector of tables in field i.
func (t table) tables(i int) ([]table, error) {
	start, n, err := t.vector(i, 4)
	if err != nil {
		return nil, err
	}
	out := make([]table, n)
	for k := range out {
		p := start + 4*k
		if out[k], err = tableAt(t.b, p+int(binary.LittleEndian.Uint32(t.b[p:]))); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// string returns the string in field i.
func (t table) string(i int) (string, error) {
	start, n, err := t.vector(i, 1)
	if err != nil {
		return "", err
	}
	return string(t.b[start : start+n]), nil
}
