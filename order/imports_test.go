package order

import (
	"go/build"
	"strings"
	"testing"
)

// The order is below the job and the daemon: nothing it imports, through
// any path, is package job or server, which would make a change of order
// reach back up into them (and a cycle once they import it).
func TestImportsNoJob(t *testing.T) {
	const module = "github.com/riffle-ml/riffle/"
	seen := map[string]string{} // package -> the package that imports it
	var walk func(path, from string)
	walk = func(path, from string) {
		if _, ok := seen[path]; ok || !strings.HasPrefix(path, module) {
			return
		}
		seen[path] = from
		for _, no := range []string{"job", "server"} {
			if path == module+no || strings.HasPrefix(path, module+no+"/") {
				t.Errorf("order imports %s (through %s)", path, from)
			}
		}
		p, err := build.Default.Import(path, ".", 0)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, imp := range p.Imports {
			walk(imp, path)
		}
	}
	walk(module+"order", "")
	if len(seen) < 5 {
		t.Fatalf("walked %d packages: the walk found no imports", len(seen))
	}
}
