// Command files measures how the files of one package hold together: an
// edge goes from a file to each other file that declares a package-level
// object or method it uses, and the strongly connected components of that
// graph are the knots a reader must take in at once. docs/design.md
// reports job's. Usage, from the module's root:
//
//	go run ./internal/depgraph/files ./job
//
// Tests are left out. The imports are type-checked from the build cache's
// export data (go list -export), so a run takes seconds.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: files ./pkg")
	}
	pkg := os.Args[1]
	exports, err := goList("-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}", pkg)
	if err != nil {
		log.Fatal(err)
	}
	target, err := goList("-f", "{{.Dir}}\t{{join .GoFiles \" \"}}", pkg)
	if err != nil || len(target) != 1 {
		log.Fatalf("go list %s: %v", pkg, err)
	}
	dir, names := target[0][0], strings.Fields(target[0][1])
	export := map[string]string{}
	for _, e := range exports {
		export[e[0]] = e[1]
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, n := range names {
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, 0)
		if err != nil {
			log.Fatal(err)
		}
		files = append(files, f)
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if export[path] == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(export[path])
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
	p, err := (&types.Config{Importer: imp}).Check(pkg, fset, files, info)
	if err != nil {
		log.Fatal(err)
	}
	edges := map[string]map[string]bool{}
	for _, n := range names {
		edges[n] = map[string]bool{}
	}
	add := func(at token.Pos, obj types.Object) {
		if obj == nil || obj.Pkg() != p || !obj.Pos().IsValid() {
			return
		}
		if v, ok := obj.(*types.Var); ok && v.IsField() {
			return
		}
		if _, method := obj.(*types.Func); !method && obj.Parent() != p.Scope() {
			return // a local name
		}
		from, to := filepath.Base(fset.Position(at).Filename), filepath.Base(fset.Position(obj.Pos()).Filename)
		if from != to {
			edges[from][to] = true
		}
	}
	for id, obj := range info.Uses {
		add(id.Pos(), obj)
	}
	for se, sel := range info.Selections {
		add(se.Pos(), sel.Obj())
	}
	comps := components(names, edges)
	sort.SliceStable(comps, func(i, j int) bool { return len(comps[i]) > len(comps[j]) })
	fmt.Printf("%s: %d files; largest component %d files\n", pkg, len(names), len(comps[0]))
	for _, c := range comps {
		fmt.Printf("%d\t%s\n", len(c), strings.Join(c, " "))
	}
}

// goList runs go list with args and splits each line of its output at tabs.
func goList(args ...string) ([][]string, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, err
	}
	var rows [][]string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		rows = append(rows, strings.Split(sc.Text(), "\t"))
	}
	return rows, sc.Err()
}

// components is Tarjan's strongly connected components of the graph.
func components(nodes []string, edges map[string]map[string]bool) [][]string {
	index, low, on := map[string]int{}, map[string]int{}, map[string]bool{}
	var stack []string
	var out [][]string
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = len(index), len(index)
		stack, on[v] = append(stack, v), true
		var next []string
		for w := range edges[v] {
			next = append(next, w)
		}
		sort.Strings(next)
		for _, w := range next {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var c []string
			for {
				w := stack[len(stack)-1]
				stack, on[w] = stack[:len(stack)-1], false
				c = append(c, w)
				if w == v {
					break
				}
			}
			sort.Strings(c)
			out = append(out, c)
		}
	}
	for _, v := range nodes {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return out
}
