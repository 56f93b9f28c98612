package dataset

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
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

// Scanning in chunks finds the same records as scanning all at once, and
// they are what splitting the bytes by hand under each format's rule gives.
func FuzzLineScanner(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc\n"), uint8(3), uint8(0))
	f.Add([]byte("1,\"x\ny\"\n2,3\n\"\"\"\"\n"), uint8(2), uint8(2))
	f.Add([]byte("# c\n1 1:1\n \n\t\n2 2:2"), uint8(4), uint8(3))
	formats := []string{"text", "jsonl", "csv", "libsvm"}
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8, format uint8) {
		rule := ruleOf(formats[int(format)%len(formats)])
		whole := newLineScanner(rule, 0)
		whole.feed(0, b)
		wt := whole.finish(int64(len(b)))
		parts := newLineScanner(rule, 0)
		c := int(chunk%16) + 1
		for off := 0; off < len(b); off += c {
			parts.feed(int64(off), b[off:min(off+c, len(b))])
		}
		pt := parts.finish(int64(len(b)))
		if !slices.Equal(wt.offs, pt.offs) || !slices.Equal(wt.ends, pt.ends) || whole.inQuote != parts.inQuote {
			t.Fatalf("chunked scan %v %v differs from whole %v %v", pt.offs, pt.ends, wt.offs, wt.ends)
		}
		if rule.quotes {
			return
		}
		p := &offsetPart{t: wt, tail: 1}
		var got []string
		for i := range p.Count() {
			off, n := p.Locate(i)
			got = append(got, string(b[off:off+int64(n)]))
		}
		var want []string
		lines := strings.Split(string(b), "\n")
		if strings.HasSuffix(string(b), "\n") || len(b) == 0 {
			lines = lines[:len(lines)-1]
		}
		for _, l := range lines {
			trimmed := strings.TrimLeft(l, " \t\r\v\f")
			if rule.blank && trimmed == "" || rule.comments && strings.HasPrefix(trimmed, "#") {
				continue
			}
			want = append(want, l)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("records %q, want %q", got, want)
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
	key := indexKey{variant: 1, size: 100, version: 5}
	f.Add(encodeIndex(key, table{offs: []int64{0, 10, 50, 100}}))
	f.Add(encodeIndex(key, table{offs: []int64{0, 10, 50, 100}, ends: []recordEnd{{1, 30}, {2, 100}}}))
	f.Add(encodeIndex(key, table{offs: []int64{0}}))
	f.Add([]byte(indexMagic + "short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tb, err := decodeIndex("fuzz.ridx", b, key)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Path != "fuzz.ridx" {
				t.Fatalf("error %v does not name the index", err)
			}
			return
		}
		offs := tb.offs
		for i := 1; i < len(offs); i++ {
			if offs[i] < offs[i-1] || offs[i] > key.size {
				t.Fatalf("accepted offsets %v", offs)
			}
		}
		for _, e := range tb.ends {
			if e.end < offs[e.record] || e.end > offs[e.record+1] {
				t.Fatalf("accepted end %v outside its record", e)
			}
		}
	})
}
