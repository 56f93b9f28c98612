package sampler

import (
	"slices"
	"testing"
)

// Every row of the kinds table builds its order, each record once an
// epoch, and says what the daemon and the client are told of it: the
// orders that are functions of position, and those whose batches the
// loader reads itself (packed). A name not in the table is none of them.
func TestKindsTable(t *testing.T) {
	const n = 300
	locate := func(id int) (int, int64, int) { return 0, int64(id) * 64, 64 }
	for _, name := range Kinds {
		s, _, err := Config{Kind: name, Seed: 3, RecordSize: 64}.Build(n, locate)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ids := Order(s, 1)
		slices.Sort(ids)
		for i, id := range ids {
			if id != i {
				t.Fatalf("%s: epoch 1 holds %d at %d of its sorted ids: not each record once", name, id, i)
			}
		}
		if !Positional(name) {
			t.Errorf("%s: not positional", name)
		}
		if want := name != "buffered" && name != "reservoir"; Packed(name) != want {
			t.Errorf("%s: packed %v, want %v", name, Packed(name), want)
		}
		if Uniform(name) != (name == "global") || Windows(name) != (name == "block") {
			t.Errorf("%s: uniform %v, windows %v", name, Uniform(name), Windows(name))
		}
	}
	if k, ok := KindOf(""); !ok || k.Name != "global" || !Packed("") || !Positional("") || !Uniform("") {
		t.Errorf(`"" is %+v (%v), want the global order`, k, ok)
	}
	for _, name := range []string{"auto", "opportunistic", "Global"} {
		if _, ok := KindOf(name); ok || Positional(name) || Packed(name) || Uniform(name) || Windows(name) {
			t.Errorf("%s: in the table", name)
		}
		if _, _, err := (Config{Kind: name}).Build(n, locate); err == nil {
			t.Errorf("%s: built", name)
		}
	}
}
