package mirror

import (
	"strings"
	"testing"
)

func TestPython(t *testing.T) {
	src := []byte(`package wire

// Limit bounds a thing.
const Limit = 16 << 20

// Ops.
const (
	OpHello = "hello"
	KindNotFound = "not_found" // a path names nothing
	unexported = 3
)

type Part struct {
	Rank int ` + "`json:\"rank\"`" + `
	Skip int ` + "`json:\"-\"`" + `
	Window int ` + "`json:\"window,omitempty\"`" + `
}

type NoTags struct{ A int }
`)
	got, err := Python(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"# Limit bounds a thing.\nLIMIT = 1 << 24\n",
		"# Ops.\nOP_HELLO = \"hello\"\nKIND_NOT_FOUND = \"not_found\"  # a path names nothing\n",
		`"Part": ("rank", "window"),`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	for _, not := range []string{"UNEXPORTED", "NoTags"} {
		if strings.Contains(got, not) {
			t.Errorf("%s in:\n%s", not, got)
		}
	}
	if _, err := Splice(src, "no markers"); err == nil {
		t.Error("Splice without markers: no error")
	}
}

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{"MaxHelloHeader": "MAX_HELLO_HEADER", "Version": "VERSION",
		"KindNotFound": "KIND_NOT_FOUND", "OpOK": "OP_OK"} {
		if got := snake(in); got != want {
			t.Errorf("snake(%s) = %s, want %s", in, got, want)
		}
	}
}
