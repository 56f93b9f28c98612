package wire

import (
	"os"
	"testing"

	"github.com/riffle-ml/riffle/wire/gen/mirror"
)

// python/riffle/wire.py's generated block is wire.go's constants and field
// names as they are: run `go generate ./wire` when this fails.
func TestPythonMirrorIsCurrent(t *testing.T) {
	src, err := os.ReadFile("wire.go")
	if err != nil {
		t.Fatal(err)
	}
	py, err := os.ReadFile("../python/riffle/wire.py")
	if err != nil {
		t.Fatal(err)
	}
	want, err := mirror.Splice(src, string(py))
	if err != nil {
		t.Fatal(err)
	}
	if string(py) != want {
		t.Error("python/riffle/wire.py is stale: run go generate ./wire")
	}
}
