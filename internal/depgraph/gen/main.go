// Command gen writes docs/design.md's table of imports from the packages'
// sources. Run by `go generate ./internal/depgraph` from that directory.
package main

import (
	"log"
	"path/filepath"

	"github.com/riffle-ml/riffle/internal/depgraph"
)

func main() {
	root := filepath.Join("..", "..")
	if err := depgraph.Rewrite(root, filepath.Join(root, "docs", "design.md")); err != nil {
		log.Fatal(err)
	}
}
