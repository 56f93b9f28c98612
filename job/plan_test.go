package job

import (
	"errors"
	"reflect"
	"slices"
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
	for _, o := range Options {
		if o.int == nil || o.Name == "seed" {
			continue
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
			setInt(specField(s, o.Name), v)
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

// Each option's kind is its spec field's Go type, and an int option's
// bounds are checked on its own field: the table's rows and JobSpec's
// fields are matched by name, and nothing else keeps them so.
func TestOptionKindsMatchTheSpec(t *testing.T) {
	kinds := map[string][]reflect.Type{
		"int":      {reflect.TypeFor[int](), reflect.TypeFor[int64](), reflect.TypeFor[uint64](), reflect.TypeFor[*int64]()},
		"bool":     {reflect.TypeFor[bool](), reflect.TypeFor[*bool]()},
		"string":   {reflect.TypeFor[string]()},
		"strings":  {reflect.TypeFor[[]string]()},
		"float":    {reflect.TypeFor[float64]()},
		"ids":      {reflect.TypeFor[[]int]()},
		"bytes":    {reflect.TypeFor[[]byte]()},
		"subset":   {reflect.TypeFor[*wire.Subset]()},
		"filter":   {reflect.TypeFor[*wire.Filter]()},
		"mixture":  {reflect.TypeFor[[]wire.MixSource]()},
		"weights":  {reflect.TypeFor[[]wire.MixWeights]()},
		"schedule": {reflect.TypeFor[[]wire.MixChange]()},
		"order":    {reflect.TypeFor[*wire.AutoOrder]()},
		"states":   {reflect.TypeFor[[]wire.State]()},
	}
	for _, o := range Options {
		f := specField(&wire.JobSpec{}, o.Name)
		if !f.IsValid() {
			t.Errorf("%s: no spec field", o.Name)
			continue
		}
		if !slices.Contains(kinds[o.Kind], f.Type()) {
			t.Errorf("%s: kind %q, and its spec field is a %s", o.Name, o.Kind, f.Type())
		}
		if (o.int != nil) != (o.Kind == "int") {
			t.Errorf("%s: kind %q with a bound check %v", o.Name, o.Kind, o.int != nil)
		}
		if o.int == nil || o.Name == "seed" { // seed's check reads it halved: every uint64 seed is in bounds
			continue
		}
		s := &wire.JobSpec{}
		setInt(specField(s, o.Name), 1234)
		if got := o.int(s); got != 1234 {
			t.Errorf("%s: its bound check reads %d, not its field's 1234", o.Name, got)
		}
	}
}

// specField is s's field whose JSON name is name (not valid if none).
func specField(s *wire.JobSpec, name string) reflect.Value {
	v := reflect.ValueOf(s).Elem()
	for i := range v.NumField() {
		if tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ","); tag == name {
			return v.Field(i)
		}
	}
	return reflect.Value{}
}

// setInt sets an integer field (or one an integer pointer points to:
// an option whose absence is not its zero, eod's) to v.
func setInt(f reflect.Value, v int64) {
	if f.Kind() == reflect.Pointer {
		f.Set(reflect.New(f.Type().Elem()))
		f = f.Elem()
	}
	if f.CanUint() {
		f.SetUint(uint64(v))
		return
	}
	f.SetInt(v)
}

// Every option is of one of Groups, and every group has options: the
// Python client's keywords follow them.
func TestOptionGroups(t *testing.T) {
	used := map[string]int{}
	for _, o := range Options {
		used[o.Group]++
	}
	for _, g := range Groups {
		if used[g.Name] == 0 {
			t.Errorf("group %s has no option", g.Name)
		}
		delete(used, g.Name)
	}
	for g := range used {
		t.Errorf("options of group %q, which Groups does not list", g)
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
// so a place in it is a position, as an opened reply's order says.
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
