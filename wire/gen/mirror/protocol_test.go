package mirror

import (
	"strings"
	"testing"
)

// Each described struct becomes a table of its JSON fields, their types and
// their comments; a field with no comment is refused, so the page cannot
// leave a new field out.
func TestMarkdown(t *testing.T) {
	body := func(order string) []byte {
		return []byte(`package wire

// OrderInfo is what an order is. More.
type OrderInfo struct {
	` + order + `
	Hidden int ` + "`json:\"-\"`" + `
}

// AutoOrder is a choice.
type AutoOrder struct {
	Sampler string ` + "`json:\"sampler\"`" + ` // global | block
}

// Tokens is a corpus.
type Tokens struct {
	// Arrays are a batch's.
	Arrays []Array ` + "`json:\"arrays\"`" + `
	Raw []byte ` + "`json:\"raw,omitempty\"`" + ` // bytes
}

// Array is one array.
type Array struct {
	Shape []int ` + "`json:\"shape\"`" + ` // its shape
}
`)
	}
	got, err := Markdown(body("// Kind is the order's kind.\n\tKind string `json:\"kind\"`"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"`order` (`wire.OrderInfo`): OrderInfo is what an order is.\n",
		"| `kind` | string | Kind is the order's kind. |\n",
		"| `sampler` | string | global \\| block |\n",
		"| `arrays` | [object] | Arrays are a batch's. |\n",
		"| `raw` | base64 | bytes (left out when empty) |\n",
		"| `shape` | [integer] | its shape |\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Hidden") || strings.Contains(got, "More.") {
		t.Errorf("a field with no JSON name, or past the type's first sentence, in:\n%s", got)
	}
	if _, err := Markdown(body("Kind string `json:\"kind\"`")); err == nil || !strings.Contains(err.Error(), "OrderInfo.Kind has no doc comment") {
		t.Errorf("a field with no comment: %v", err)
	}
	if _, err := SpliceDoc(body("// K.\n\tKind string `json:\"kind\"`"), "no markers"); err == nil {
		t.Error("SpliceDoc without markers: no error")
	}
}
