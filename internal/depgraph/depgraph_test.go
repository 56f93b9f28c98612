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

// The graph the table is drawn from is the real one, and the wire format
// imports nothing of riffle's (its Python mirror could not follow it), a
// rule no compiler keeps. That order imports no job or server needs no
// test here: job imports order, server job, so the compiler refuses it.
func TestImports(t *testing.T) {
	imports, err := Imports("../..")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(imports["order"], "sampler") || !slices.Contains(imports["job"], "order") ||
		!slices.Contains(imports["storage/stack"], "storage/tier") {
		t.Fatalf("order's imports %v, job's %v, storage/stack's %v: the graph is not read",
			imports["order"], imports["job"], imports["storage/stack"])
	}
	if len(imports["wire"]) != 0 {
		t.Errorf("wire imports %v: the wire format imports nothing of riffle's", imports["wire"])
	}
}
