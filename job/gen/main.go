// Command gen writes the views of job.Options: python/riffle/spec.py and
// the table of job options in docs/protocol.md. Run by `go generate ./job`
// from the job directory.
package main

import (
	"log"
	"os"
	"path/filepath"

	"github.com/riffle-ml/riffle/job"
)

func main() {
	root := ".."
	if err := os.WriteFile(filepath.Join(root, "python", "riffle", "spec.py"), job.RenderPython(), 0o644); err != nil {
		log.Fatal(err)
	}
	doc := filepath.Join(root, "docs", "protocol.md")
	b, err := os.ReadFile(doc)
	if err != nil {
		log.Fatal(err)
	}
	out, err := job.SpliceTable(string(b))
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
		log.Fatal(err)
	}
}
