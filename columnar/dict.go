package columnar

import (
	"encoding/binary"
	"fmt"
)

// Dict is a dictionary's values, held whole: dictionary-encoded columns
// reach the user decoded, so a row's index is looked up here.
type Dict struct {
	Kind   Kind
	Width  int
	N      int64
	valid  []byte // nil: no nulls
	data   []byte
	offs   []int64 // KBinary: N+1
	MaxLen int64   // KBinary: the longest value
}

// NewDict reads a dictionary batch's values (node 0 and its buffers) of
// value node v's kind from the batch's body.
func NewDict(v *Node, m *BatchMeta, body []byte) (*Dict, error) {
	d := &Dict{Kind: v.Kind, Width: v.Width}
	if len(m.Nodes) < 1 {
		return nil, fmt.Errorf("dictionary batch without a node")
	}
	d.N = m.Nodes[0].Length
	if v.ViewValues {
		return viewDict(d, m, body)
	}
	nb := map[Kind]int{KFixed: 2, KBool: 2, KBinary: 3}[v.Kind]
	if len(m.Buffers) < nb {
		return nil, fmt.Errorf("dictionary batch with %d buffers, want %d", len(m.Buffers), nb)
	}
	buf := func(k int, need int64) ([]byte, error) {
		b := m.Buffers[k]
		if b.Offset < 0 || b.Length < 0 || b.Offset > int64(len(body)) || b.Length > int64(len(body))-b.Offset {
			return nil, fmt.Errorf("dictionary buffer %d outside its body", k)
		}
		if b.Length < need {
			return nil, fmt.Errorf("dictionary buffer %d of %d bytes for %d values", k, b.Length, d.N)
		}
		return body[b.Offset : b.Offset+b.Length], nil
	}
	if d.N < 0 || d.N > int64(len(body))*8+1 {
		return nil, fmt.Errorf("dictionary of %d values in %d bytes", d.N, len(body))
	}
	if m.Buffers[0].Length > 0 {
		vb, err := buf(0, (d.N+7)/8)
		if err != nil {
			return nil, err
		}
		d.valid = append([]byte(nil), vb...)
	}
	var err error
	switch v.Kind {
	case KFixed:
		var b []byte
		b, err = buf(1, d.N*int64(v.Width))
		d.data = append([]byte(nil), b[:d.N*int64(v.Width)]...)
	case KBool:
		var b []byte
		b, err = buf(1, (d.N+7)/8)
		d.data = append([]byte(nil), b...)
	case KBinary:
		var ob, db []byte
		if ob, err = buf(1, (d.N+1)*int64(v.Width)); err != nil {
			return nil, err
		}
		d.offs = make([]int64, d.N+1)
		for i := range d.offs {
			if v.Width == 4 {
				d.offs[i] = int64(int32(binary.LittleEndian.Uint32(ob[4*i:])))
			} else {
				d.offs[i] = int64(binary.LittleEndian.Uint64(ob[8*i:]))
			}
			if i > 0 && d.offs[i] < d.offs[i-1] || d.offs[i] < 0 {
				return nil, fmt.Errorf("dictionary offsets out of order at %d", i)
			}
			if i > 0 {
				d.MaxLen = max(d.MaxLen, d.offs[i]-d.offs[i-1])
			}
		}
		if db, err = buf(2, d.offs[d.N]); err == nil {
			d.data = append([]byte(nil), db[d.offs[0]:d.offs[d.N]]...)
			base := d.offs[0]
			for i := range d.offs {
				d.offs[i] -= base
			}
		}
	}
	return d, err
}

// Append adds a delta dictionary's values.
func (d *Dict) Append(e *Dict) *Dict {
	out := &Dict{Kind: d.Kind, Width: d.Width, N: d.N + e.N, MaxLen: max(d.MaxLen, e.MaxLen)}
	if d.valid != nil || e.valid != nil {
		out.valid = make([]byte, (out.N+7)/8)
		setBits(out.valid, 0, d.N, d.valid)
		setBits(out.valid, d.N, e.N, e.valid)
	}
	switch d.Kind {
	case KFixed:
		out.data = append(append([]byte(nil), d.data...), e.data...)
	case KBool:
		out.data = make([]byte, (out.N+7)/8)
		copyBits(out.data, 0, d.data, 0, d.N)
		copyBits(out.data, d.N, e.data, 0, e.N)
	case KBinary:
		out.data = append(append([]byte(nil), d.data...), e.data...)
		out.offs = append([]int64(nil), d.offs...)
		base := d.offs[d.N]
		for _, o := range e.offs[1:] {
			out.offs = append(out.offs, base+o)
		}
	}
	return out
}

// setBits copies n validity bits from src (all set if src is nil) to dst at bit at.
func setBits(dst []byte, at, n int64, src []byte) {
	if src == nil {
		fillBits(dst, at, n)
		return
	}
	copyBits(dst, at, src, 0, n)
}

func (d *Dict) isValid(i int64) bool {
	return d.valid == nil || d.valid[i>>3]&(1<<(i&7)) != 0
}

// viewDict reads a dictionary whose values are views (buffers: validity,
// the 16-byte views, then their data buffers) into offsets and bytes: a
// view of at most 12 bytes holds them itself; a longer one names a data
// buffer and an offset there.
func viewDict(d *Dict, m *BatchMeta, body []byte) (*Dict, error) {
	if len(m.Buffers) < 2 {
		return nil, fmt.Errorf("dictionary of views with %d buffers, want at least 2", len(m.Buffers))
	}
	buf := func(k int) ([]byte, error) {
		b := m.Buffers[k]
		if b.Offset < 0 || b.Length < 0 || b.Offset > int64(len(body)) || b.Length > int64(len(body))-b.Offset {
			return nil, fmt.Errorf("dictionary buffer %d outside its body", k)
		}
		return body[b.Offset : b.Offset+b.Length], nil
	}
	if d.N < 0 || d.N > int64(len(body))/16+1 {
		return nil, fmt.Errorf("dictionary of %d views in %d bytes", d.N, len(body))
	}
	if m.Buffers[0].Length > 0 {
		vb, err := buf(0)
		if err != nil {
			return nil, err
		}
		if int64(len(vb)) < (d.N+7)/8 {
			return nil, fmt.Errorf("dictionary validity of %d bytes for %d values", len(vb), d.N)
		}
		d.valid = append([]byte(nil), vb...)
	}
	views, err := buf(1)
	if err != nil {
		return nil, err
	}
	if int64(len(views)) < 16*d.N {
		return nil, fmt.Errorf("dictionary views of %d bytes for %d values", len(views), d.N)
	}
	data := make([][]byte, len(m.Buffers)-2)
	for k := range data {
		if data[k], err = buf(k + 2); err != nil {
			return nil, err
		}
	}
	d.offs = make([]int64, d.N+1)
	for i := range d.N {
		v := views[16*i : 16*i+16]
		n := int64(int32(binary.LittleEndian.Uint32(v)))
		var b []byte
		switch {
		case n < 0:
			return nil, fmt.Errorf("dictionary view %d of length %d", i, n)
		case n <= 12:
			b = v[4 : 4+n]
		default:
			k, off := int32(binary.LittleEndian.Uint32(v[8:])), int64(int32(binary.LittleEndian.Uint32(v[12:])))
			if k < 0 || int(k) >= len(data) || off < 0 || off > int64(len(data[k])) || n > int64(len(data[k]))-off {
				return nil, fmt.Errorf("dictionary view %d names bytes [%d, %d) of data buffer %d, outside it", i, off, off+n, k)
			}
			b = data[k][off : off+n]
		}
		d.data = append(d.data, b...)
		d.offs[i+1] = d.offs[i] + n
		d.MaxLen = max(d.MaxLen, n)
	}
	return d, nil
}
