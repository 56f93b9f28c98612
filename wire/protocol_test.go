package wire

import (
	"os"
	"testing"

	"github.com/riffle-ml/riffle/wire/gen/mirror"
)

// docs/protocol.md's tables of the opened reply's parts (order, auto,
// tokens) are wire.go's fields and their comments as they are: run `go
// generate ./wire` when this fails.
func TestProtocolDocIsCurrent(t *testing.T) {
	src, err := os.ReadFile("wire.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	want, err := mirror.SpliceDoc(src, string(doc))
	if err != nil {
		t.Fatal(err)
	}
	if string(doc) != want {
		t.Error("docs/protocol.md's tables of the opened reply's parts are stale: run go generate ./wire")
	}
}
