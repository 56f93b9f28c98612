package order

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
)

// An ids file of any bytes is an error (a spec error, or a FormatError
// naming the file) or ids, each not negative, no more than the bound.
func FuzzParseIDs(f *testing.F) {
	npy := func(descr, shape string, data []byte) []byte {
		d := "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }"
		b := binary.LittleEndian.AppendUint16([]byte("\x93NUMPY\x01\x00"), uint16(len(d)))
		return append(append(b, d...), data...)
	}
	f.Add([]byte("3\n1\n# a comment\n\n2\n"))
	f.Add([]byte("-1\n"))
	f.Add(npy("<i8", "(2,)", []byte{1, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0}))
	f.Add(npy(">u2", "(3,)", []byte{0, 1, 0, 2, 0, 3}))
	f.Add(npy("<i4", "(1000,)", []byte{1, 2, 3}))
	f.Add(npy("|u1", "(2, 2)", []byte{1, 2, 3, 4}))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := parseIDs("ids.npy", b)
		if err != nil {
			var fe *dataset.FormatError
			if !errors.Is(err, ErrSpec) && !errors.As(err, &fe) {
				t.Fatalf("error %v is neither a spec error nor a FormatError", err)
			}
			return
		}
		if len(ids) > MaxSubsetIDs {
			t.Fatalf("%d ids, at most %d", len(ids), MaxSubsetIDs)
		}
		for _, id := range ids {
			if id < 0 {
				t.Fatalf("accepted id %d", id)
			}
		}
	})
}

// A positional rest's basis of any bytes is an error wrapping ErrState,
// or a rest of the order: its start within it, its skips after the start,
// increasing, within the order, and no more than the bytes that held them.
func FuzzDecodeBasis(f *testing.F) {
	f.Add(basis{epoch: 2, start: 10, skip: []int{11, 15, 90}}.encode())
	f.Add(basis{epoch: 0, start: 0}.encode())
	f.Add([]byte(posMagic + "0 0 1000000000\n\x01"))
	f.Add([]byte(posMagic + "0 5 2\n\x00\x00"))
	f.Fuzz(func(t *testing.T, state []byte) {
		const n = 100
		if len(state) < len(posMagic) {
			return
		}
		b, err := decodeBasis(state, n)
		if err != nil {
			if !errors.Is(err, sampler.ErrState) {
				t.Fatalf("error %v is not ErrState", err)
			}
			return
		}
		if _, ok := sampler.NewRest(sampler.Sequential{N: n}, b.start, b.skip); !ok || len(b.skip) > len(state) {
			t.Fatalf("accepted basis %+v", b)
		}
	})
}
