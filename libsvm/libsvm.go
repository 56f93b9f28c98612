// Package libsvm parses LIBSVM/SVMlight text records ("label idx:val ...")
// into sparse rows, for the libsvm transform and the training example.
// Errors name what was wrong and where in the record; the caller adds which
// record.
package libsvm

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// ErrSyntax marks a malformed record.
var ErrSyntax = errors.New("malformed record")

// Row is one sparse example: a label and (index, value) features.
type Row struct {
	Label float64
	Index []int32
	Value []float32
}

// Parse parses one LIBSVM/SVMlight line, "label idx:val idx:val ... #
// comment", into r, reusing its slices. Indices are kept as written (1-based
// by convention); a "qid:" pair is skipped.
func Parse(b []byte, r *Row) error {
	if i := bytes.IndexByte(b, '#'); i >= 0 {
		b = b[:i]
	}
	r.Index, r.Value = r.Index[:0], r.Value[:0]
	fields := bytes.Fields(b)
	if len(fields) == 0 {
		return fmt.Errorf("%w: empty line", ErrSyntax)
	}
	lab, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil {
		return fmt.Errorf("%w: label %q", ErrSyntax, fields[0])
	}
	r.Label = lab
	prev := int64(-1)
	for _, f := range fields[1:] {
		c := bytes.IndexByte(f, ':')
		if c <= 0 {
			return fmt.Errorf("%w: feature %q has no index:value", ErrSyntax, f)
		}
		if string(f[:c]) == "qid" {
			continue
		}
		idx, err := strconv.ParseInt(string(f[:c]), 10, 32)
		if err != nil || idx < 0 {
			return fmt.Errorf("%w: feature index %q", ErrSyntax, f[:c])
		}
		if idx <= prev {
			return fmt.Errorf("%w: feature indices not increasing at %d", ErrSyntax, idx)
		}
		prev = idx
		v, err := strconv.ParseFloat(string(f[c+1:]), 32)
		if err != nil {
			return fmt.Errorf("%w: feature value %q", ErrSyntax, f[c+1:])
		}
		r.Index = append(r.Index, int32(idx))
		r.Value = append(r.Value, float32(v))
	}
	return nil
}
