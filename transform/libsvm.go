package transform

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/riffle-ml/riffle/libsvm"
)

func init() {
	Register(Entry{
		Name: "libsvm_dense", Version: 1,
		Params: map[string]string{"n_features": "0", "zero_based": "false"},
		Doc:    "a LIBSVM line to little-endian float32[1+n_features]: the label, then the features (1-based indices unless zero_based=true)",
		New: func(s Spec) (Transform, error) {
			n, err := s.Int("n_features", 0, 1, 1<<24)
			if err != nil {
				return nil, fmt.Errorf("%w (n_features is required)", err)
			}
			return &libsvmDense{n: n, zero: s.Params["zero_based"] == "true"}, nil
		},
	})
}

// libsvmDense parses a LIBSVM line into a dense vector, the work a linear
// model's training loop repeats per record per epoch per job otherwise.
type libsvmDense struct {
	n    int
	zero bool
	rows sync.Pool
}

func (t *libsvmDense) Size() int { return 4 * (1 + t.n) }

func (t *libsvmDense) Shape() (string, []int) { return "<f4", []int{1 + t.n} }

func (t *libsvmDense) Apply(raw, out []byte) error {
	r, _ := t.rows.Get().(*libsvm.Row)
	if r == nil {
		r = &libsvm.Row{}
	}
	defer t.rows.Put(r)
	if err := libsvm.Parse(raw, r); err != nil {
		return err
	}
	clear(out)
	binary.LittleEndian.PutUint32(out, math.Float32bits(float32(r.Label)))
	shift := int32(1)
	if t.zero {
		shift = 0
	}
	for k, idx := range r.Index {
		i := idx - shift
		if i < 0 || int(i) >= t.n {
			return fmt.Errorf("%w: feature index %d outside [%d, %d]", libsvm.ErrSyntax, idx, shift, int32(t.n)-1+shift)
		}
		binary.LittleEndian.PutUint32(out[4*(1+i):], math.Float32bits(r.Value[k]))
	}
	return nil
}
