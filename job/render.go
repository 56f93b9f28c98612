package job

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/riffle-ml/riffle/sampler"
)

// The generated views of Options: Python's option list and the protocol
// doc's table (go generate ./job writes them; TestGeneratedAreCurrent
// fails when they are stale).

// RenderPython is python/riffle/spec.py.
func RenderPython() []byte {
	var b bytes.Buffer
	b.WriteString(`"""The job options, generated from Go's job.Options by ` + "`go generate ./job`" + `: do not edit.

Each option's spec name, Python keyword, kind, bounds, default and meaning.
The daemon checks every option and fills every default (job.Check); a
client sends only what its user gave and never works a default out.
"""

from __future__ import annotations

`)
	fmt.Fprintf(&b, "DEFAULT_BATCH_SIZE = %d\n\n", DefaultBatchSize)
	b.WriteString("# name: (python keyword, kind, min, max, default, doc)\nOPTIONS: dict[str, tuple[str, str, int | None, int | None, str, str]] = {\n")
	for _, o := range Options {
		lo, hi := "None", "None"
		if o.int != nil {
			lo, hi = fmt.Sprint(o.Min), fmt.Sprint(o.Max)
		}
		fmt.Fprintf(&b, "    %q: (%q, %q, %s, %s, %q, %q),\n", o.Name, o.PythonName(), o.Kind, lo, hi, o.Default, o.Doc)
	}
	b.WriteString("}\n\n# Python keyword -> spec name.\nBY_KEYWORD = {v[0]: k for k, v in OPTIONS.items()}\n")
	b.WriteString("\n# The parts of a job the options decide: group: (what it decides, its options' Python keywords).\n")
	b.WriteString("GROUPS: dict[str, tuple[str, tuple[str, ...]]] = {\n")
	for _, g := range Groups {
		fmt.Fprintf(&b, "    %q: (\n        %q,\n", g.Name, g.Doc)
		line, n := "        (", 0
		for _, o := range Options {
			if o.Group != g.Name {
				continue
			}
			item := fmt.Sprintf("%q, ", o.PythonName())
			if len(line)+len(item) > 120 {
				b.WriteString(strings.TrimRight(line, " ") + "\n")
				line = "         "
			}
			line += item
			n++
		}
		line = strings.TrimSuffix(line, ", ")
		if n == 1 {
			line += ","
		}
		b.WriteString(line + ")),\n")
	}
	b.WriteString("}\n")
	// The sampler kinds, so that the client's messages, docs and tests
	// name the kinds the daemon knows; which order a job reads is the
	// daemon's answer (an opened reply's order), not worked out of these.
	b.WriteString("\n# The sampler kinds, from Go's one table of them (sampler.Kinds), the first the default; sampler \"auto\" picks\n")
	b.WriteString("# the global or the block order. What a job's order is, and how its places resume, its opened reply says\n")
	b.WriteString("# (Loader.order): a client never works it out from these.\n")
	b.WriteString("# name: (positional, packed, uniform, windows)\nSAMPLERS: dict[str, tuple[bool, bool, bool, bool]] = {\n")
	py := map[bool]string{true: "True", false: "False"}
	for _, name := range sampler.Kinds {
		k, _ := sampler.KindOf(name)
		fmt.Fprintf(&b, "    %q: (%s, %s, %s, %s),\n", k.Name, py[k.Positional], py[k.Packed], py[k.Uniform], py[k.Windows])
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// Table markers in docs/protocol.md.
const (
	TableBegin = "<!-- job options: generated from job.Options by `go generate ./job` -->"
	TableEnd   = "<!-- end of job options -->"
)

// RenderTable is docs/protocol.md's table of job options.
func RenderTable() string {
	var b strings.Builder
	b.WriteString("| field | Python | group | meaning | bounds | default |\n|---|---|---|---|---|---|\n")
	for _, o := range Options {
		bounds := ""
		if o.int != nil {
			bounds = fmt.Sprintf("%d to %d", o.Min, o.Max)
			if o.Name == "memory_bytes" {
				bounds = fmt.Sprintf("%d to half the daemon's memory limit", minMemory)
			}
		} else if o.Max > 0 {
			bounds = fmt.Sprintf("at most %d", o.Max)
		}
		py := o.PythonName()
		if py == o.Name {
			py = ""
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", o.Name, py, o.Group, o.Doc, bounds, o.Default)
	}
	return b.String()
}

// SpliceTable puts the table between the markers of doc.
func SpliceTable(doc string) (string, error) {
	i, j := strings.Index(doc, TableBegin), strings.Index(doc, TableEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("the protocol doc has no %q ... %q markers", TableBegin, TableEnd)
	}
	return doc[:i+len(TableBegin)] + "\n" + RenderTable() + doc[j:], nil
}
