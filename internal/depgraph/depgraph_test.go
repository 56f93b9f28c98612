package depgraph

import (
	"os"
	"slices"
	"testing"
)

// docs/design.md's table of imports is the packages' imports as they are:
// run `go generate ./internal/depgraph` when this fails.
func TestDesignIsCurrent(t *testing.T) {
	doc, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := Splice("../..", string(doc))
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != want {
		t.Error("docs/design.md's table of imports is stale: run go generate ./internal/depgraph")
	}
}

// The graph the table is drawn from is the real one: order, the room for
// which records in which order, imports no job or server (the daemon
// above it), and the wire format imports nothing of riffle's.
func TestImports(t *testing.T) {
	imports, err := Imports("../..")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(imports["order"], "sampler") || !slices.Contains(imports["job"], "order") {
		t.Fatalf("order's imports %v, job's %v: the graph is not read", imports["order"], imports["job"])
	}
	var deps func(p string, seen map[string]bool)
	deps = func(p string, seen map[string]bool) {
		for _, d := range imports[p] {
			if !seen[d] {
				seen[d] = true
				deps(d, seen)
			}
		}
	}
	below := map[string]bool{}
	deps("order", below)
	for _, up := range []string{"job", "server", "cmd/riffle"} {
		if below[up] {
			t.Errorf("order depends on %s", up)
		}
	}
	if len(imports["wire"]) != 0 {
		t.Errorf("wire imports %v", imports["wire"])
	}
	lv := Levels(imports)
	if lv["server"] <= lv["job"] || lv["job"] <= lv["order"] || lv["order"] <= lv["loader"] || lv["loader"] <= lv["storage"] {
		t.Errorf("levels server %d, job %d, order %d, loader %d, storage %d: the data's path is not a descent",
			lv["server"], lv["job"], lv["order"], lv["loader"], lv["storage"])
	}
}
