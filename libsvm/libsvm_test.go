package libsvm

import (
	"errors"
	"slices"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in    string
		label float64
		idx   []int32
		val   []float32
		bad   bool
	}{
		{"1 1:0.5 3:2", 1, []int32{1, 3}, []float32{0.5, 2}, false},
		{"-1 qid:3 2:1e-3 # comment", -1, []int32{2}, []float32{0.001}, false},
		{"+1", 1, nil, nil, false},
		{"", 0, nil, nil, true},
		{"x 1:2", 0, nil, nil, true},
		{"1 2", 0, nil, nil, true},
		{"1 a:2", 0, nil, nil, true},
		{"1 3:1 2:1", 0, nil, nil, true},
		{"1 1:z", 0, nil, nil, true},
	} {
		var r Row
		err := Parse([]byte(c.in), &r)
		if c.bad {
			if !errors.Is(err, ErrSyntax) {
				t.Errorf("%q: error %v, want ErrSyntax", c.in, err)
			}
			continue
		}
		if err != nil || r.Label != c.label || !slices.Equal(r.Index, c.idx) || !slices.Equal(r.Value, c.val) {
			t.Errorf("%q: %+v %v", c.in, r, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("1 1:0.5 3:2"))
	f.Add([]byte("-1 qid:1 7:3 # x"))
	f.Add([]byte(":::"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Row
		if err := Parse(b, &r); err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("error %v is not ErrSyntax", err)
			}
			return
		}
		if len(r.Index) != len(r.Value) {
			t.Fatal("indices and values differ in number")
		}
		for i := 1; i < len(r.Index); i++ {
			if r.Index[i] <= r.Index[i-1] {
				t.Fatal("accepted non-increasing indices")
			}
		}
	})
}
