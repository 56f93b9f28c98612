package dataset

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

func FuzzParseNpyHeader(f *testing.F) {
	hdr := func(d string) []byte {
		b := []byte("\x93NUMPY\x01\x00")
		b = binary.LittleEndian.AppendUint16(b, uint16(len(d)))
		return append(b, d...)
	}
	f.Add(hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }\n"))
	f.Add(hdr("{'descr': '|u1', 'fortran_order': True, 'shape': (7,), }"))
	f.Add(hdr("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }"))
	f.Add(hdr("{'descr': '<U5', 'shape': (), 'fortran_order': False}"))
	f.Add([]byte("\x93NUMPY\x02\x00\x10\x00\x00\x00{'a': 1}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseNpyHeader(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error %v is neither ErrCorrupt nor ErrUnsupported", err)
			}
			return
		}
		if h.DataOffset > int64(len(b)) {
			return // needs more bytes
		}
		if h.ItemSize <= 0 {
			t.Fatalf("accepted item size %d", h.ItemSize)
		}
		for _, d := range h.Shape {
			if d < 0 {
				t.Fatalf("accepted shape %v", h.Shape)
			}
		}
	})
}

// Scanning in chunks finds the same lines as scanning all at once.
func FuzzLineScanner(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc\n"), uint8(3), false)
	f.Add([]byte("1,\"x\ny\"\n2,3\n\"\"\"\"\n"), uint8(2), true)
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8, quotes bool) {
		whole := &lineScanner{offs: []int64{0}, quotes: quotes}
		whole.feed(0, b)
		parts := &lineScanner{offs: []int64{0}, quotes: quotes}
		c := int(chunk%16) + 1
		for off := 0; off < len(b); off += c {
			parts.feed(int64(off), b[off:min(off+c, len(b))])
		}
		if !slices.Equal(whole.offs, parts.offs) || whole.inQuote != parts.inQuote {
			t.Fatalf("chunked scan %v differs from whole %v", parts.offs, whole.offs)
		}
		if !quotes && len(whole.offs)-1 != bytes.Count(b, []byte("\n")) {
			t.Fatalf("%d lines for %d newlines", len(whole.offs)-1, bytes.Count(b, []byte("\n")))
		}
		for i := 1; i < len(whole.offs); i++ {
			if whole.offs[i] <= whole.offs[i-1] || b[whole.offs[i]-1] != '\n' {
				t.Fatalf("offset %d: %d does not follow a newline", i, whole.offs[i])
			}
		}
	})
}

// The TFRecord scanner finds the same frames however the file is chunked,
// and never accepts a frame whose length CRC is wrong.
func FuzzTFScanner(f *testing.F) {
	good := AppendTFRecord(AppendTFRecord(nil, []byte("hello")), []byte("world!!"))
	f.Add(good, uint8(5))
	f.Add(good[:20], uint8(1))
	f.Add([]byte("garbage that is not a tfrecord"), uint8(7))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		run := func(c int) ([]int64, int64, error) {
			s := &tfScanner{path: "fuzz"}
			for off := 0; off < len(b); off += c {
				if err := s.feed(int64(off), b[off:min(off+c, len(b))]); err != nil {
					return nil, 0, err
				}
			}
			return s.offs, s.next, nil
		}
		whole, wn, werr := run(max(1, len(b)))
		parts, pn, perr := run(int(chunk%32) + 1)
		if (werr == nil) != (perr == nil) {
			t.Fatalf("whole scan error %v, chunked %v", werr, perr)
		}
		if werr != nil {
			var fe *FormatError
			if !errors.As(werr, &fe) {
				t.Fatalf("error %v is not a FormatError", werr)
			}
			return
		}
		if !slices.Equal(whole, parts) || wn != pn {
			t.Fatalf("chunked frames %v/%d differ from whole %v/%d", parts, pn, whole, wn)
		}
		for _, o := range whole {
			if o+tfHead <= int64(len(b)) && binary.LittleEndian.Uint32(b[o+8:]) != maskedCRC(b[o:o+8]) {
				t.Fatalf("frame at %d accepted with a bad length CRC", o)
			}
		}
	})
}

func FuzzDecodeIndex(f *testing.F) {
	key := indexKey{variant: 1, size: 100, mtime: 5}
	f.Add(encodeIndex(key, []int64{0, 10, 50, 100}))
	f.Add(encodeIndex(key, []int64{0}))
	f.Add([]byte(indexMagic + "short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		offs, err := decodeIndex("fuzz.ridx", b, key)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Path != "fuzz.ridx" {
				t.Fatalf("error %v does not name the index", err)
			}
			return
		}
		for i := 1; i < len(offs); i++ {
			if offs[i] < offs[i-1] || offs[i] > key.size {
				t.Fatalf("accepted offsets %v", offs)
			}
		}
	})
}
