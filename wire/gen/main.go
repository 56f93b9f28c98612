// Command gen writes the Python mirror of package wire: the block of
// python/riffle/wire.py between mirror.Begin and mirror.End, from wire.go.
// Run by `go generate ./wire` from the wire directory.
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
}
