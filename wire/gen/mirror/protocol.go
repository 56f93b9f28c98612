package mirror

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"strings"
)

// Markers of the generated tables in docs/protocol.md: the parts of an
// opened reply a client reads to know what its job is, each field's doc
// the comment on it in wire.go, so the page says what the code says.
const (
	DocBegin = "<!-- opened reply's parts: generated from wire.go by `go generate ./wire` (wire/gen) -->"
	DocEnd   = "<!-- end of the opened reply's parts -->"
)

// Described are the structs docs/protocol.md describes field by field,
// each with where it is found in an opened reply.
var Described = []struct{ Type, Where string }{
	{"OrderInfo", "order"},
	{"AutoOrder", "auto"},
	{"Tokens", "tokens"},
	{"Array", "tokens.arrays[]"},
}

// Markdown is the generated tables for wire.go's source: for each of
// Described, a table of its JSON fields, their JSON types and their docs.
// A field with no doc comment is an error: the page would say nothing of
// it.
func Markdown(src []byte) (string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), "wire.go", src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(DocBegin + "\n")
	for _, d := range Described {
		st, doc := structOf(f, d.Type)
		if st == nil {
			return "", fmt.Errorf("wire.go has no struct %s", d.Type)
		}
		fmt.Fprintf(&b, "\n`%s` (`wire.%s`): %s\n\n", d.Where, d.Type, firstSentence(doc))
		b.WriteString("| field | type | meaning |\n|---|---|---|\n")
		for _, field := range st.Fields.List {
			name, omit, err := jsonName(field)
			if err != nil {
				return "", fmt.Errorf("%s: %w", d.Type, err)
			}
			if name == "" {
				continue
			}
			text := oneLine(field.Doc)
			if text == "" {
				text = oneLine(field.Comment)
			}
			if text == "" {
				return "", fmt.Errorf("wire.go: %s.%s has no doc comment", d.Type, field.Names[0].Name)
			}
			if omit {
				text += " (left out when empty)"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", name, jsonType(field.Type), strings.ReplaceAll(text, "|", `\|`))
		}
	}
	b.WriteString("\n" + DocEnd)
	return b.String(), nil
}

// SpliceDoc puts the tables generated from src between doc's markers.
func SpliceDoc(src []byte, doc string) (string, error) {
	return splice(doc, "docs/protocol.md", DocBegin, DocEnd, func() (string, error) { return Markdown(src) })
}

// structOf finds struct type name in f, with its doc comment.
func structOf(f *ast.File, name string) (*ast.StructType, *ast.CommentGroup) {
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, s := range g.Specs {
			ts := s.(*ast.TypeSpec)
			if st, ok := ts.Type.(*ast.StructType); ok && ts.Name.Name == name {
				doc := ts.Doc
				if doc == nil {
					doc = g.Doc
				}
				return st, doc
			}
		}
	}
	return nil, nil
}

// jsonName is a field's JSON name ("" if it has none) and whether it is
// left out when empty.
func jsonName(field *ast.Field) (string, bool, error) {
	if field.Tag == nil {
		return "", false, nil
	}
	tag, err := strconv.Unquote(field.Tag.Value)
	if err != nil {
		return "", false, err
	}
	name, opts, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
	if name == "-" {
		name = ""
	}
	return name, strings.Contains(","+opts+",", ",omitempty,"), nil
}

// jsonType is how a field's Go type looks in JSON.
func jsonType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		switch {
		case t.Name == "string":
			return "string"
		case t.Name == "bool":
			return "bool"
		case strings.HasPrefix(t.Name, "int") || strings.HasPrefix(t.Name, "uint"):
			return "integer"
		case strings.HasPrefix(t.Name, "float"):
			return "number"
		}
		return "object"
	case *ast.StarExpr:
		return jsonType(t.X)
	case *ast.ArrayType:
		if id, ok := t.Elt.(*ast.Ident); ok && id.Name == "byte" {
			return "base64"
		}
		return "[" + jsonType(t.Elt) + "]"
	}
	return "object"
}

// oneLine is a comment's text on one line.
func oneLine(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

// firstSentence is a doc comment's text up to its first full stop that
// ends a line's word, on one line.
func firstSentence(g *ast.CommentGroup) string {
	s := oneLine(g)
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}
