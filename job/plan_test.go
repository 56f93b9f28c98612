package job

import (
	"errors"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/wire"
)

// Every int option's bounds are checked, and one past either bound is a
// spec error naming the option.
func TestCheckBounds(t *testing.T) {
	base := func() *wire.JobSpec { return &wire.JobSpec{Paths: []string{"/x"}, BatchSize: 8} }
	if _, err := Check(base()); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	set := map[string]func(*wire.JobSpec, int64){
		"record_size": func(s *wire.JobSpec, v int64) { s.RecordSize = int(v) }, "header_bytes": func(s *wire.JobSpec, v int64) { s.HeaderBytes = v },
		"block_size": func(s *wire.JobSpec, v int64) { s.BlockSize = int(v) }, "window": func(s *wire.JobSpec, v int64) { s.Window = int(v) },
		"buffer": func(s *wire.JobSpec, v int64) { s.Buffer = int(v) }, "reservoir": func(s *wire.JobSpec, v int64) { s.Reservoir = int(v) },
		"opportunistic": func(s *wire.JobSpec, v int64) { s.Opportunistic = int(v) }, "rank": func(s *wire.JobSpec, v int64) { s.Rank = int(v) },
		"world": func(s *wire.JobSpec, v int64) { s.World = int(v) }, "batch_size": func(s *wire.JobSpec, v int64) { s.BatchSize = int(v) },
		"prefetch": func(s *wire.JobSpec, v int64) { s.Prefetch = int(v) }, "depth": func(s *wire.JobSpec, v int64) { s.Depth = int(v) },
		"memory_bytes": func(s *wire.JobSpec, v int64) { s.MemoryBytes = v }, "batch_stride": func(s *wire.JobSpec, v int64) { s.BatchStride = int(v) },
		"batch_offset": func(s *wire.JobSpec, v int64) { s.BatchOffset = int(v) }, "epoch": func(s *wire.JobSpec, v int64) { s.Epoch = int(v) },
		"start": func(s *wire.JobSpec, v int64) { s.Start = int(v) }, "generations": func(s *wire.JobSpec, v int64) { s.Generations = int(v) },
		"batch": func(s *wire.JobSpec, v int64) { s.Batch = int(v) }, "epochs": func(s *wire.JobSpec, v int64) { s.Epochs = int(v) },
	}
	for _, o := range Options {
		if o.int == nil || o.Name == "seed" {
			continue
		}
		f, ok := set[o.Name]
		if !ok {
			t.Fatalf("no test setter for %s", o.Name)
		}
		hi := o.Max
		if o.Name == "memory_bytes" {
			hi = MaxMemory()
		}
		for _, v := range []int64{o.Min - 1, hi + 1} {
			if v < o.Min && o.Name == "epochs" {
				continue // every negative count means without end
			}
			s := base()
			f(s, v)
			_, err := Check(s)
			if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), o.Name) {
				t.Errorf("%s = %d: %v, want a spec error naming it", o.Name, v, err)
			}
		}
	}
}

// The table names every field of a spec, once.
func TestOptionsCoverTheSpec(t *testing.T) {
	seen := map[string]bool{}
	for _, o := range Options {
		if seen[o.Name] {
			t.Errorf("%s twice", o.Name)
		}
		seen[o.Name] = true
	}
	for _, name := range wire.SpecFields() {
		if !seen[name] {
			t.Errorf("spec field %s has no row in Options", name)
		}
		delete(seen, name)
	}
	for name := range seen {
		t.Errorf("Options has %s, which no spec field is", name)
	}
}

// A start (the rest of an epoch begun on another topology) is one epoch of
// an order that is a function of position: anything else is refused.
func TestStartNeedsOneEpochOfAPositionalOrder(t *testing.T) {
	yes := true
	for name, c := range map[string]wire.JobSpec{
		"ok":            {Epochs: 1, Sampler: "block"},
		"ok buffered":   {Epochs: 1, Sampler: "buffered"},
		"ok reservoir":  {Epochs: 1, Sampler: "reservoir"},
		"many epochs":   {Epochs: -1},
		"a stream":      {Epochs: 1, SamplerState: []byte("RFSHR2")},
		"shared":        {Epochs: 1, Share: &yes},
		"opportunistic": {Epochs: 1, Opportunistic: 4},
	} {
		c.Paths, c.BatchSize, c.Start, c.Shuffle = []string{"/x"}, 8, 100, true
		_, err := Check(&c)
		if (err == nil) != strings.HasPrefix(name, "ok") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// Jobs share a global shuffle only: share with another order reads alone,
// so a place in it is a position, as the Python client's _shared says.
func TestShareIsOfTheGlobalOrder(t *testing.T) {
	yes := true
	for _, c := range []struct {
		sampler string
		shuffle bool
		shared  bool
	}{{"", true, true}, {"global", true, true}, {"global", false, true}, {"", false, false},
		{"block", true, false}, {"buffered", true, false}, {"sequential", true, false}, {"auto", true, false}} {
		s := wire.JobSpec{Paths: []string{"/x"}, BatchSize: 8, Sampler: c.sampler, Shuffle: c.shuffle, Share: &yes}
		p, err := Check(&s)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if p.Share != c.shared {
			t.Errorf("sampler %q, shuffle %v: shared %v, want %v", c.sampler, c.shuffle, p.Share, c.shared)
		}
	}
}
