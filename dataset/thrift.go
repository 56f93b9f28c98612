package dataset

import (
	"errors"
	"fmt"
)

// A Parquet page header is a Thrift struct in the compact protocol. riffle
// reads the few fields it needs of one itself (where the page ends, how
// many values and rows it holds) with a bound on every length, so that a
// scan over pages never trusts a size it has not checked.

var errThrift = errors.New("malformed Thrift")

type thriftReader struct {
	b []byte
	i int
}

func (r *thriftReader) byte() (byte, error) {
	if r.i >= len(r.b) {
		return 0, fmt.Errorf("%w: header cut short", errThrift)
	}
	c := r.b[r.i]
	r.i++
	return c, nil
}

func (r *thriftReader) uvarint() (uint64, error) {
	var v uint64
	for shift := 0; shift < 64; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			return v, nil
		}
	}
	return 0, fmt.Errorf("%w: varint too long", errThrift)
}

func (r *thriftReader) varint() (int64, error) {
	u, err := r.uvarint()
	return int64(u>>1) ^ -int64(u&1), err
}

// skip passes over a value of compact type t.
func (r *thriftReader) skip(t byte, depth int) error {
	if depth > 32 {
		return fmt.Errorf("%w: nested too deep", errThrift)
	}
	switch t {
	case 1, 2: // booleans in the field header
	case 3:
		_, err := r.byte()
		return err
	case 4, 5, 6:
		_, err := r.varint()
		return err
	case 7:
		if r.i+8 > len(r.b) {
			return fmt.Errorf("%w: double cut short", errThrift)
		}
		r.i += 8
	case 8:
		n, err := r.uvarint()
		if err != nil {
			return err
		}
		if n > uint64(len(r.b)-r.i) {
			return fmt.Errorf("%w: binary of %d bytes", errThrift, n)
		}
		r.i += int(n)
	case 9, 10:
		h, err := r.byte()
		if err != nil {
			return err
		}
		n := uint64(h >> 4)
		if n == 15 {
			if n, err = r.uvarint(); err != nil {
				return err
			}
		}
		if n > uint64(len(r.b)-r.i) {
			return fmt.Errorf("%w: list of %d elements", errThrift, n)
		}
		for range n {
			if err := r.skip(h&0x0f, depth+1); err != nil {
				return err
			}
		}
	case 11:
		n, err := r.uvarint()
		if err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		kv, err := r.byte()
		if err != nil {
			return err
		}
		if n > uint64(len(r.b)-r.i) {
			return fmt.Errorf("%w: map of %d entries", errThrift, n)
		}
		for range n {
			if err := r.skip(kv>>4, depth+1); err != nil {
				return err
			}
			if err := r.skip(kv&0x0f, depth+1); err != nil {
				return err
			}
		}
	case 12:
		return r.fields(depth+1, func(id int16, t byte) (bool, error) { return false, nil })
	default:
		return fmt.Errorf("%w: type %d", errThrift, t)
	}
	return nil
}

// fields walks a struct's fields, giving each to fn, which reads it
// itself (returning true) or leaves it to be skipped.
func (r *thriftReader) fields(depth int, fn func(id int16, t byte) (bool, error)) error {
	var last int16
	for {
		h, err := r.byte()
		if err != nil {
			return err
		}
		if h == 0 {
			return nil
		}
		t := h & 0x0f
		id := last + int16(h>>4)
		if h>>4 == 0 {
			v, err := r.varint()
			if err != nil {
				return err
			}
			id = int16(v)
		}
		last = id
		done, err := fn(id, t)
		if err != nil {
			return err
		}
		if !done {
			if err := r.skip(t, depth); err != nil {
				return err
			}
		}
	}
}

// pageHeader is what riffle reads of a Parquet PageHeader.
type pageHeader struct {
	typ        int32 // 0 data page, 2 dictionary page, 3 data page v2
	compressed int32
	values     int32
	rows       int32 // v2 data pages only; -1 otherwise
	headerLen  int
	// crc, if hasCRC, is the CRC-32 of the page's bytes after its header,
	// as written (compressed).
	crc    uint32
	hasCRC bool
}

// parsePageHeader reads a PageHeader from the start of b.
func parsePageHeader(b []byte) (pageHeader, error) {
	h := pageHeader{typ: -1, compressed: -1, rows: -1}
	r := &thriftReader{b: b}
	i32 := func() (int32, error) {
		v, err := r.varint()
		if err == nil && (v < -1<<31 || v >= 1<<31) {
			err = fmt.Errorf("%w: i32 out of range", errThrift)
		}
		return int32(v), err
	}
	err := r.fields(0, func(id int16, t byte) (bool, error) {
		var err error
		switch {
		case id == 1 && t == 5:
			h.typ, err = i32()
		case id == 3 && t == 5:
			h.compressed, err = i32()
		case id == 4 && t == 5:
			var c int32
			c, err = i32()
			h.crc, h.hasCRC = uint32(c), true
		case (id == 5 || id == 7 || id == 8) && t == 12:
			v2 := id == 8
			err = r.fields(1, func(id int16, t byte) (bool, error) {
				var err error
				switch {
				case id == 1 && t == 5:
					h.values, err = i32()
				case v2 && id == 3 && t == 5:
					h.rows, err = i32()
				default:
					return false, nil
				}
				return true, err
			})
		default:
			return false, nil
		}
		return true, err
	})
	if err != nil {
		return h, err
	}
	if h.typ < 0 || h.compressed < 0 || h.values < 0 {
		return h, fmt.Errorf("%w: page header without its type, size or count", errThrift)
	}
	h.headerLen = r.i
	return h, nil
}
