package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
)

// quality measures a dataset's own orders: an ImageFolder tree and a
// JSONL file, with their records and places.
func TestQualityOfADataset(t *testing.T) {
	dir := t.TempDir()
	tree := filepath.Join(dir, "imgs")
	synth.WriteTree(tree, []string{"a", "b", "c"}, 40)
	lines := filepath.Join(dir, "d.jsonl")
	synth.WriteLines(lines, "jsonl", 600, false)
	for _, c := range []struct{ path, want string }{{tree, "120 records (dir"}, {lines, "600 records (jsonl"}} {
		out, err := run(t, qualityCmd(), c.path, "--sampler", "global,sequential,block", "--batch-size", "16", "--epochs", "2")
		if err != nil || !strings.Contains(out, c.want) || !strings.Contains(out, "100.0%") || !strings.Contains(out, "  0.0%") {
			t.Fatalf("quality %s: %v\n%s", c.path, err, out)
		}
	}
}
