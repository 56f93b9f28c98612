// Command gen writes the views of package wire: the block of
// python/riffle/wire.py between mirror.Begin and mirror.End, and the
// tables of the opened reply's parts in docs/protocol.md between
// mirror.DocBegin and mirror.DocEnd, from wire.go. Run by `go generate
// ./wire` from the wire directory.
package main

import (
	"log"
	"os"
	"path/filepath"

	"github.com/riffle-ml/riffle/wire/gen/mirror"
)

func main() {
	src, err := os.ReadFile("wire.go")
	if err != nil {
		log.Fatal(err)
	}
	py := filepath.Join("..", "python", "riffle", "wire.py")
	b, err := os.ReadFile(py)
	if err != nil {
		log.Fatal(err)
	}
	out, err := mirror.Splice(src, string(b))
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(py, []byte(out), 0o644); err != nil {
		log.Fatal(err)
	}
	doc := filepath.Join("..", "docs", "protocol.md")
	if b, err = os.ReadFile(doc); err != nil {
		log.Fatal(err)
	}
	if out, err = mirror.SpliceDoc(src, string(b)); err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
		log.Fatal(err)
	}
}
