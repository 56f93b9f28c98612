package dataset

import (
	"bytes"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"testing"
)

// le is words as the indexes hold them: little-endian int64s.
func le(v ...int64) []byte {
	var b []byte
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return b
}

// The writer lays words out as every index written before it did: each
// a little-endian int64, a run its count and then its words.
func TestWordWriter(t *testing.T) {
	var w wordWriter
	w.Int(7, -2)
	w.Run([]int64{1, 1, 5})
	w.Run(nil)
	w.Int()
	if want := le(7, -2, 3, 1, 1, 5, 0); !bytes.Equal(w.Bytes(), want) {
		t.Fatalf("wrote % x, want % x", w.Bytes(), want)
	}
	r, err := newWordReader(w.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var a, b int64
	if err := r.Ints(&a, &b); err != nil || a != 7 || b != -2 {
		t.Fatalf("ints %d %d, %v", a, b, err)
	}
	if s, err := r.Run(3, true); err != nil || !slices.Equal(s, []int64{1, 1, 5}) {
		t.Fatalf("run %v, %v", s, err)
	}
	if r.Done() == nil {
		t.Fatal("done with a word left")
	}
	if s, err := r.Run(0, true); err != nil || len(s) != 0 {
		t.Fatalf("empty run %v, %v", s, err)
	}
	if err := r.Done(); err != nil {
		t.Fatal(err)
	}
}

// A payload the writer did not make is refused, saying what is wrong and
// at which byte, before anything is allocated for words not there.
func TestWordReaderRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		p    []byte
		read func(r *wordReader) error
		want string
	}{
		{"a partial word", append(le(1), 0, 0, 0), nil, "not whole words"},
		{"cut short", le(1), func(r *wordReader) error { var a, b int64; return r.Ints(&a, &b) }, "cut short at byte 8"},
		{"a negative count", le(-1), func(r *wordReader) error { _, err := r.Count(10); return err }, "index count -1 at byte 0"},
		{"a count over its limit", le(3, 0, 0, 0), func(r *wordReader) error { _, err := r.Count(2); return err }, "index count 3 at byte 0 (at most 2"},
		{"a count past the words left", le(2, 0), func(r *wordReader) error { _, err := r.Count(math.MaxInt64); return err }, "index count 2 at byte 0"},
		{"a run past the words left", le(1<<40, 0), func(r *wordReader) error { _, err := r.Run(math.MaxInt64, false); return err }, "1 words left"},
		{"a run that decreases", le(3, 1, 4, 2), func(r *wordReader) error { _, err := r.Run(3, true); return err }, "out of order at byte 24: 2 after 4"},
		{"a word left over", le(0, 9), func(r *wordReader) error {
			if _, err := r.Run(0, true); err != nil {
				return err
			}
			return r.Done()
		}, "8 bytes after the index payload"},
	} {
		r, err := newWordReader(c.p)
		if err == nil {
			err = c.read(r)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	// A run that may decrease reads as written.
	r, _ := newWordReader(le(3, 1, 4, 2))
	if s, err := r.Run(3, false); err != nil || !slices.Equal(s, []int64{1, 4, 2}) {
		t.Fatalf("a run not monotone: %v, %v", s, err)
	}
}

// Words of any bytes, read as any sequence of ints, counts and runs, are
// an error or values within their bounds; what was read writes back to
// the bytes it was read from, and Done says whether any are left.
func FuzzWords(f *testing.F) {
	var w wordWriter
	w.Int(2, -1)
	w.Run([]int64{0, 3, 3, 9})
	w.Run([]int64{5, 1})
	f.Add([]byte{0, 0, 0x0f, 0x0e}, w.Bytes())
	f.Add([]byte{0xff, 0xfd}, le(1<<62, 1))
	f.Add([]byte{0x05}, le(2, 4))
	f.Add([]byte{}, []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, ops, p []byte) {
		r, err := newWordReader(p)
		if err != nil {
			if len(p)%8 == 0 {
				t.Fatalf("%d bytes refused: %v", len(p), err)
			}
			return
		}
		var back wordWriter
		good := 0 // the bytes read by the reads that succeeded
		for _, op := range ops {
			left := r.Left()
			// A limit from -1 up, and none at all.
			limit := int64(op>>2) - 1
			if limit == 62 {
				limit = math.MaxInt64
			}
			switch op & 3 {
			case 0:
				var v int64
				if v, err = r.Int(); err == nil {
					back.Int(v)
				}
			case 1:
				var n int
				if n, err = r.Count(limit); err == nil {
					if n < 0 || int64(n) > limit || n > left-1 {
						t.Fatalf("count %d, limit %d, %d words left after it", n, limit, left-1)
					}
					back.Int(int64(n))
				}
			default:
				monotone := op&3 == 3
				var s []int64
				if s, err = r.Run(limit, monotone); err == nil {
					if int64(len(s)) > limit || len(s) > left-1 {
						t.Fatalf("run of %d, limit %d, %d words left after its count", len(s), limit, left-1)
					}
					for k := 1; monotone && k < len(s); k++ {
						if s[k] < s[k-1] {
							t.Fatalf("a monotone run %v", s)
						}
					}
					back.Run(s)
				}
			}
			if err != nil {
				break
			}
			good = r.Off()
		}
		if !bytes.Equal(back.Bytes(), p[:good]) {
			t.Fatalf("read back as % x from % x", back.Bytes(), p[:good])
		}
		if err == nil && (r.Done() == nil) != (good == len(p)) {
			t.Fatalf("done %v at byte %d of %d", r.Done(), good, len(p))
		}
	})
}

// indexCase is an index of file kind F made wrong, for the tests of a
// format's index reader: damage changes what is written, bytes the
// payload written; want is what the reader's error says ("" for none).
type indexCase[F any] struct {
	name   string
	damage func(f F)
	bytes  func(p []byte) []byte
	want   string
}

// written is c's payload: f's index, damaged.
func (c indexCase[F]) written(f F, write func() []byte) []byte {
	if c.damage != nil {
		c.damage(f)
	}
	p := write()
	if c.bytes != nil {
		p = c.bytes(p)
	}
	return p
}

// check says whether err is what c wants.
func (c indexCase[F]) check(t *testing.T, err error) {
	t.Helper()
	if c.want == "" {
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), c.want) {
		t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
	}
}

// wordCases are the damages every payload of words is refused for.
func wordCases[F any]() []indexCase[F] {
	return []indexCase[F]{
		{"as written", nil, nil, ""},
		{"a word left over", nil, func(p []byte) []byte { return append(p, le(0)...) }, "8 bytes after the index payload"},
		{"a word cut off", nil, func(p []byte) []byte { return p[:len(p)-8] }, "words left"},
		{"a part of a word", nil, func(p []byte) []byte { return p[:len(p)-3] }, "not whole words"},
	}
}
