package dataset

import (
	"encoding/binary"
	"fmt"
)

// Words are how the sidecar indexes of Arrow, Parquet and the offset
// tables lay out what they hold inside their frame (index.go): little-endian
// int64s, a list written as its count and then its values (a counted run).
// A payload is read back from a file anyone could have written or damaged,
// so the reader checks what it hands out: a count is bounded by what its
// caller allows and by the words left (so nothing is allocated for words
// that are not there), a run may be required to not decrease, and a payload
// must be read to its end, nothing left over.

// wordWriter builds a payload of words.
type wordWriter struct{ b []byte }

// Int appends each of v.
func (w *wordWriter) Int(v ...int64) {
	for _, x := range v {
		w.b = binary.LittleEndian.AppendUint64(w.b, uint64(x))
	}
}

// Run appends a counted run: len(s), then s.
func (w *wordWriter) Run(s []int64) {
	w.Int(int64(len(s)))
	w.Int(s...)
}

// Bytes is the payload written so far; it is the writer's until the next
// write.
func (w *wordWriter) Bytes() []byte { return w.b }

// wordReader reads a payload of words. Its errors say which byte of the
// payload is at fault; the caller names the file.
type wordReader struct {
	p  []byte
	at int // the next word's byte
}

// newWordReader reads p, which must be whole words.
func newWordReader(p []byte) (*wordReader, error) {
	if len(p)%8 != 0 {
		return nil, fmt.Errorf("index payload of %d bytes, not whole words", len(p))
	}
	return &wordReader{p: p}, nil
}

// Off is the byte of the payload the next word starts at.
func (r *wordReader) Off() int { return r.at }

// Left is how many words are left to read.
func (r *wordReader) Left() int { return (len(r.p) - r.at) / 8 }

// Int reads one word.
func (r *wordReader) Int() (int64, error) {
	if r.at+8 > len(r.p) {
		return 0, fmt.Errorf("index payload cut short at byte %d", r.at)
	}
	v := int64(binary.LittleEndian.Uint64(r.p[r.at:]))
	r.at += 8
	return v, nil
}

// Ints reads one word into each of v, in turn.
func (r *wordReader) Ints(v ...*int64) error {
	for _, x := range v {
		var err error
		if *x, err = r.Int(); err != nil {
			return err
		}
	}
	return nil
}

// Count reads the count of a list each of whose items takes a word at
// least: at most limit, and at most the words left after it.
func (r *wordReader) Count(limit int64) (int, error) {
	at := r.at
	v, err := r.Int()
	if err == nil && (v < 0 || v > limit || v > int64(r.Left())) {
		err = fmt.Errorf("index count %d at byte %d (at most %d, and %d words left)", v, at, limit, r.Left())
	}
	if err != nil {
		return 0, err
	}
	return int(v), nil
}

// Run reads a counted run (Count(limit) words). A monotone run's words
// must not decrease.
func (r *wordReader) Run(limit int64, monotone bool) ([]int64, error) {
	n, err := r.Count(limit)
	if err != nil {
		return nil, err
	}
	s := make([]int64, n)
	for k := range s {
		at := r.at
		if s[k], err = r.Int(); err != nil {
			return nil, err
		}
		if monotone && k > 0 && s[k] < s[k-1] {
			return nil, fmt.Errorf("index run out of order at byte %d: %d after %d", at, s[k], s[k-1])
		}
	}
	return s, nil
}

// Done checks that the payload was read to its end.
func (r *wordReader) Done() error {
	if r.at != len(r.p) {
		return fmt.Errorf("%d bytes after the index payload", len(r.p)-r.at)
	}
	return nil
}
