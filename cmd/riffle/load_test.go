package main

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
)

// riffle load over a mixture: each epoch's sources in their weights'
// shares, nothing repeated; over a subset from an ids file: just those.
func TestLoadMixtureAndIDs(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.bin"), filepath.Join(dir, "b.bin")
	if err := synth.WriteFixed(a, 2000, 64, 0); err != nil {
		t.Fatal(err)
	}
	if err := synth.WriteFixed(b, 500, 64, 0); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, loadCmd(), "--mixture", a+"=3", "--mixture", b+"=1", "--record-size", "64", "--epochs", "2", "--json", "--index-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	var reps []loadReport
	if err := json.Unmarshal([]byte(out), &reps); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(reps) != 2 {
		t.Fatalf("%d epochs reported", len(reps))
	}
	for _, r := range reps {
		if r.Repeats != 0 || len(r.Sources) != 2 || r.Sources[1].Samples != 500 {
			t.Fatalf("epoch %+v: want no repeat and b's 500 whole", r)
		}
		for _, s := range r.Sources {
			if math.Abs(float64(s.Samples)-s.Weight*float64(r.Samples)) >= 1 {
				t.Fatalf("epoch %d: %+v is off its weight's share of %d", r.Epoch, s, r.Samples)
			}
		}
	}
	ids := filepath.Join(dir, "ids.txt")
	if err := os.WriteFile(ids, []byte("5\n7\n1999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, loadCmd(), a, "--record-size", "64", "--ids", ids, "--index-dir", dir)
	if err != nil || !strings.Contains(out, "epoch 0: 3 samples") || !strings.Contains(out, "0 repeated") {
		t.Fatalf("ids: %v\n%s", err, out)
	}
	if _, err := run(t, loadCmd(), "--mixture", a+"=x"); err == nil {
		t.Fatal("a weight that is no number: no error")
	}
}
