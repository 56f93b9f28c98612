package job

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/wire"
)

// A spec as it crosses the socket: JSON, decoded as the daemon decodes an
// open's frame, then checked. Whatever the bytes, Check never panics; it
// refuses with an invalid-spec error, or its plan keeps the table's
// bounds. (The daemon runs this on every open and check from any client.)
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		`{"paths":["/d/a.bin"],"record_size":128,"batch_size":64,"shuffle":true,"seed":7}`,
		`{"paths":["/d/*.jpg"],"batch_size":256,"world":8,"rank":7,"rank_drop_last":true,"share":true,"epochs":-1}`,
		`{"mixture":[{"paths":["/a"],"weight":1},{"paths":["/b"],"weight":3}],"mixture_history":[{"until":2,"weights":[1,1]}],"epoch":2,"batch_size":8}`,
		`{"paths":["/d"],"sampler":"auto","min_randomness":0.5,"auto_order":{"sampler":"block","block_size":4096,"window":16},"batch_size":8}`,
		`{"paths":["/d"],"sampler":"buffered","buffer":4096,"batch":3,"sampler_state":"UkZCSVQx","skip":[1,2,3],"batch_size":8}`,
		`{"paths":["/d"],"subset":{"ranges":[[0,10],[20,30]],"ids":[99],"labels":[1]},"filter":{"glob":"*.png","min_size":10,"max_size":20},"batch_size":8}`,
		`{"paths":["/d"],"share":true,"opportunistic":4,"epochs":1,"delivered":[{"epoch":0,"batch":2,"part":{"rank":0,"world":2,"worker":0,"workers":1}}],"batch_size":8}`,
		`{"paths":["/d"],"filter":{"column":"label","in":["cat",1,true],"min":0.5},"batch_size":8}`,
		`{"paths":["/d"],"refresh":"epoch","epochs":1,"generations":3,"batch_size":8,"start":5}`,
		`{"paths":["/d"],"batch_size":4611686018427387904,"depth":-1,"memory_bytes":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := wire.Decode(append(append([]byte(`{"op":"open","tag":1,"spec":`), b...), '}'))
		if err != nil {
			return // not a spec the daemon reads (a field's error is answered, and never checked)
		}
		plan, err := Check(m.Spec)
		if err != nil {
			if !errors.Is(err, ErrSpec) || Kind(err) != wire.KindSpec {
				t.Fatalf("Check refused %s with %v, not an invalid spec", b, err)
			}
			return
		}
		l, smp := plan.Loader, plan.Sampler
		switch {
		case l.BatchSize < 1 || l.BatchSize > loader.MaxBatchSize:
			t.Fatalf("batch size %d", l.BatchSize)
		case smp.World < 1 || smp.World > maxWorld || smp.Rank < 0 || smp.Rank >= smp.World:
			t.Fatalf("rank %d of %d", smp.Rank, smp.World)
		case l.Depth < 0 || l.Depth > loader.MaxDepth || l.Prefetch < 0 || l.Prefetch > loader.MaxPrefetch:
			t.Fatalf("depth %d, prefetch %d", l.Depth, l.Prefetch)
		case plan.Memory < 0 || plan.Memory > MaxMemory():
			t.Fatalf("memory %d", plan.Memory)
		case plan.Mixture == nil && (len(plan.Paths) == 0 || len(plan.Paths) > maxPaths):
			t.Fatalf("%d paths", len(plan.Paths))
		case plan.Mixture != nil && (len(plan.Mixture.Sources) == 0 || len(plan.Mixture.Sources) > maxSources):
			t.Fatalf("%d sources", len(plan.Mixture.Sources))
		}
		if _, err := json.Marshal(m.Spec); err != nil {
			t.Fatalf("a checked spec does not encode again: %v", err)
		}
	})
}
