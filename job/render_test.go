package job

import (
	"os"
	"testing"
)

// The generated views of Options are current: run `go generate ./job`
// when this fails.
func TestGeneratedAreCurrent(t *testing.T) {
	py, err := os.ReadFile("../python/riffle/spec.py")
	if err != nil {
		t.Fatal(err)
	}
	if string(py) != string(RenderPython()) {
		t.Error("python/riffle/spec.py is stale: run go generate ./job")
	}
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := SpliceTable(string(doc))
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != want {
		t.Error("docs/protocol.md's table of job options is stale: run go generate ./job")
	}
}
