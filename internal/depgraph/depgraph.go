// Package depgraph draws the import graph of riffle's packages for
// docs/design.md: which package imports which, read from the source with
// go/build (what `go list -f '{{.Imports}}'` says, without tests), so the
// page's table is the real graph. `go generate ./internal/depgraph`
// writes it between the page's markers and TestDesignIsCurrent fails when
// it is stale (every mirror generated or tested).
package depgraph

//go:generate go run ./gen

import (
	"fmt"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Module is riffle's module path.
const Module = "github.com/riffle-ml/riffle"

// Markers of the generated table in docs/design.md.
const (
	Begin = "<!-- imports: generated from the packages' sources by `go generate ./internal/depgraph` -->"
	End   = "<!-- end of imports -->"
)

// Imports maps each package under root (the module's directory), by its
// path in the module, to the module's packages it imports, tests left
// out.
func Imports(root string) (map[string][]string, error) {
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" ||
			name == "node_modules" || name == "python" || name == "site") {
			return filepath.SkipDir
		}
		p, err := build.ImportDir(path, 0)
		if err != nil {
			if _, none := err.(*build.NoGoError); none {
				return nil // a directory of no Go package: docs/, scripts/
			}
			return fmt.Errorf("%s: %w", path, err)
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		var deps []string
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, Module+"/") {
				deps = append(deps, strings.TrimPrefix(imp, Module+"/"))
			}
		}
		sort.Strings(deps)
		out[filepath.ToSlash(rel)] = deps
		return nil
	})
	return out, err
}

// Levels gives each package its level: 0 if it imports none of the
// module's packages on the data's path (internal/ is aside), else one more
// than the highest level it imports.
// Reading the table by level is reading the data's path from the bottom.
func Levels(imports map[string][]string) map[string]int {
	lv := map[string]int{}
	var level func(p string, seen map[string]bool) int
	level = func(p string, seen map[string]bool) int {
		if l, ok := lv[p]; ok {
			return l
		}
		if seen[p] {
			return 0 // a cycle: the compiler refuses it, so it is never met
		}
		seen[p] = true
		l := 0
		for _, d := range imports[p] {
			if !aside(d) {
				l = max(l, level(d, seen)+1)
			}
		}
		lv[p] = l
		return l
	}
	for p := range imports {
		level(p, map[string]bool{})
	}
	return lv
}

// Table is the page's table: each package, lowest level first, with the
// module's packages it imports. What is aside (bench, the generators,
// internal/) is left out: nothing on the data's path but the CLI imports
// it.
func Table(imports map[string][]string) string {
	lv := Levels(imports)
	var pkgs []string
	for p := range imports {
		if aside(p) {
			continue
		}
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool {
		if lv[pkgs[i]] != lv[pkgs[j]] {
			return lv[pkgs[i]] < lv[pkgs[j]]
		}
		return pkgs[i] < pkgs[j]
	})
	var b strings.Builder
	b.WriteString("| level | package | imports of riffle's |\n|---|---|---|\n")
	for _, p := range pkgs {
		var deps []string
		for _, d := range imports[p] {
			if !aside(d) {
				deps = append(deps, "`"+d+"`")
			}
		}
		fmt.Fprintf(&b, "| %d | `%s` | %s |\n", lv[p], p, strings.Join(deps, " "))
	}
	return b.String()
}

// aside says p is off the data's path: a benchmark, a generator, or
// internal.
func aside(p string) bool {
	return p == "bench" || strings.HasPrefix(p, "bench/") || strings.HasPrefix(p, "internal/") ||
		strings.HasSuffix(p, "/gen") || strings.Contains(p, "/gen/")
}

// Splice puts the table of the packages under root between doc's markers.
func Splice(root, doc string) (string, error) {
	i, j := strings.Index(doc, Begin), strings.Index(doc, End)
	if i < 0 || j < i {
		return "", fmt.Errorf("docs/design.md has no %q ... %q markers", Begin, End)
	}
	imports, err := Imports(root)
	if err != nil {
		return "", err
	}
	return doc[:i+len(Begin)] + "\n" + Table(imports) + doc[j:], nil
}

// Rewrite splices the table into the doc at path, for go generate.
func Rewrite(root, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := Splice(root, string(b))
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
