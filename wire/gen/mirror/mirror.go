// Package mirror writes the Python mirror of package wire's constants and
// field names: python/riffle/wire.py's block between Begin and End is
// generated from wire.go (go generate ./wire runs wire/gen), and
// wire.TestPythonMirrorIsCurrent fails when it is stale. It reads the
// source, not the compiled package, so that the names come from the code
// itself and a constant added to wire.go is in Python after the next
// generate, with no list kept by hand.
package mirror

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// maxLine is the longest line the block writes, as the Python client's.
const maxLine = 120

// Markers of the generated block in python/riffle/wire.py.
const (
	Begin = "# --- generated from Go's package wire by `go generate ./wire` (wire/gen): do not edit until the end marker ---"
	End   = "# --- end of the generated block ---"
)

// Python is the generated block for wire.go's source: every exported
// constant (its Python name in upper snake case, its doc as comments), and
// FIELDS, every struct's JSON field names in order.
func Python(src []byte) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "wire.go", src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	// The constants' values, worked out by the type checker over the
	// constant declarations alone (they use no import).
	consts := &ast.File{Name: f.Name}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			consts.Decls = append(consts.Decls, g)
		}
	}
	info := &types.Info{Defs: map[*ast.Ident]types.Object{}}
	if _, err := (&types.Config{}).Check("wire", fset, []*ast.File{consts}, info); err != nil {
		return "", fmt.Errorf("wire.go's constants: %w", err)
	}
	var b strings.Builder
	b.WriteString(Begin + "\n")
	for _, d := range consts.Decls {
		g := d.(*ast.GenDecl)
		if g.Lparen.IsValid() {
			comment(&b, g.Doc)
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			if !g.Lparen.IsValid() {
				comment(&b, g.Doc)
			}
			comment(&b, vs.Doc)
			for _, name := range vs.Names {
				if !name.IsExported() {
					continue
				}
				c, ok := info.Defs[name].(*types.Const)
				if !ok {
					return "", fmt.Errorf("%s: not a constant", name.Name)
				}
				v, err := value(c)
				if err != nil {
					return "", fmt.Errorf("%s: %w", name.Name, err)
				}
				line := fmt.Sprintf("%s = %s", snake(name.Name), v)
				if vs.Comment != nil {
					line += "  # " + strings.TrimSpace(vs.Comment.Text())
				}
				b.WriteString(line + "\n")
			}
		}
		b.WriteString("\n")
	}
	fields, err := structFields(f)
	if err != nil {
		return "", err
	}
	b.WriteString("# Every message struct's JSON field names, in order: what a client sends and reads of each.\n")
	b.WriteString("FIELDS: dict[str, tuple[str, ...]] = {\n")
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		line := fmt.Sprintf("    %q: (", name)
		for i, f := range fields[name] {
			item := strconv.Quote(f) + ", "
			if i == len(fields[name])-1 && i > 0 {
				item = strconv.Quote(f) + "),"
			} else if i == len(fields[name])-1 {
				item = strconv.Quote(f) + ",),"
			}
			if len(line)+len(strings.TrimRight(item, " ")) > maxLine {
				b.WriteString(strings.TrimRight(line, " ") + "\n")
				line = "        "
			}
			line += item
		}
		b.WriteString(line + "\n")
	}
	b.WriteString("}\n" + End)
	return b.String(), nil
}

// Splice puts the block generated from src between py's markers.
func Splice(src []byte, py string) (string, error) {
	return splice(py, "python/riffle/wire.py", Begin, End, func() (string, error) { return Python(src) })
}

// splice replaces text's begin and end markers and what lies between them
// with the block gen makes, which carries the markers again; name says
// which file lacks them.
func splice(text, name, begin, end string, gen func() (string, error)) (string, error) {
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("%s has no %q ... %q markers", name, begin, end)
	}
	block, err := gen()
	if err != nil {
		return "", err
	}
	return text[:i] + block + text[j+len(end):], nil
}

// value is a constant's value as Python writes it: a string, or an int.
func value(c *types.Const) (string, error) {
	v := c.Val()
	switch {
	case c.Type().Underlying().(*types.Basic).Info()&types.IsString != 0:
		s := v.ExactString() // Go's quoted literal
		u, err := strconv.Unquote(s)
		if err != nil || !isPrintableASCII(u) {
			return "", fmt.Errorf("a string Python would read otherwise: %s", s)
		}
		return s, nil
	case c.Type().Underlying().(*types.Basic).Info()&types.IsInteger != 0:
		n := v.ExactString()
		if i, err := strconv.ParseInt(n, 10, 64); err == nil && i >= 1<<10 && i&(i-1) == 0 {
			// A power of two, as wire.go writes its limits.
			k := 0
			for ; i > 1; i >>= 1 {
				k++
			}
			return fmt.Sprintf("1 << %d", k), nil
		}
		return n, nil
	}
	return "", fmt.Errorf("of type %s, which the mirror does not write", c.Type())
}

func isPrintableASCII(s string) bool {
	for _, r := range s {
		if r > unicode.MaxASCII || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// snake is a Go name in Python's upper snake case: MaxHelloHeader is
// MAX_HELLO_HEADER, KindNotFound KIND_NOT_FOUND.
func snake(name string) string {
	var b strings.Builder
	rs := []rune(name)
	for i, r := range rs {
		if i > 0 && unicode.IsUpper(r) && (unicode.IsLower(rs[i-1]) || i+1 < len(rs) && unicode.IsLower(rs[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// comment writes a Go doc comment as Python comments.
func comment(b *strings.Builder, g *ast.CommentGroup) {
	if g == nil {
		return
	}
	for _, line := range strings.Split(strings.TrimSpace(g.Text()), "\n") {
		b.WriteString(strings.TrimRight("# "+line, " ") + "\n")
	}
}

// structFields lists each exported struct type's JSON field names.
func structFields(f *ast.File) (map[string][]string, error) {
	out := map[string][]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, s := range g.Specs {
			ts := s.(*ast.TypeSpec)
			st, ok := ts.Type.(*ast.StructType)
			if !ok || !ts.Name.IsExported() {
				continue
			}
			var names []string
			for _, field := range st.Fields.List {
				if field.Tag == nil {
					continue
				}
				tag, err := strconv.Unquote(field.Tag.Value)
				if err != nil {
					return nil, err
				}
				name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
				if name == "" || name == "-" {
					continue
				}
				names = append(names, name)
			}
			if len(names) > 0 {
				out[ts.Name.Name] = names
			}
		}
	}
	return out, nil
}
