package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/internal/tokgen"
)

// riffle load of a token corpus: each epoch its own job (best_fit's
// samples are its epoch's), every sample exactly once, with its tokens
// per second and its padding and cut rates; inspect --seq-len says the
// same epoch's samples and rates.
func TestLoadTokenCorpus(t *testing.T) {
	p := filepath.Join(t.TempDir(), "synth")
	if err := tokgen.WriteMegatron(context.Background(), p, tokgen.Spec{Docs: 2000, Tokens: 400_000, Vocab: 1000, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	for _, packing := range []string{"concat", "best_fit", "pad"} {
		out, err := run(t, loadCmd(), p+".idx", "--seq-len", "256", "--packing", packing, "--epochs", "2", "--batch-size", "16", "--vocab-size", "1000", "--json")
		if err != nil {
			t.Fatalf("%s: %v", packing, err)
		}
		var reps []loadReport
		if err := json.Unmarshal([]byte(out), &reps); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if len(reps) != 2 {
			t.Fatalf("%s: %d epochs reported", packing, len(reps))
		}
		for _, r := range reps {
			if r.Samples == 0 || r.Repeats != 0 || r.Missing != 0 || r.TokensSec <= 0 {
				t.Fatalf("%s: epoch %+v", packing, r)
			}
			if packing != "concat" && r.Padding <= 0 {
				t.Fatalf("%s: no padding reported: %+v", packing, r)
			}
		}
	}
	out, err := run(t, loadCmd(), p, "--seq-len", "256", "--packing", "best_fit")
	if err != nil || !strings.Contains(out, "tokens/s; padding") || !strings.Contains(out, "0 repeated, 0 missing") {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err = run(t, inspectCmd(), p, "--seq-len", "256", "--packing", "best_fit", "--first", "0")
	if err != nil || !strings.Contains(out, "samples:") || !strings.Contains(out, "of seq_len 256 (best_fit") {
		t.Fatalf("inspect --seq-len: %v\n%s", err, out)
	}
	// Without seq_len a Megatron corpus is refused, saying what to give.
	if _, err := run(t, loadCmd(), p+".idx"); err == nil || !strings.Contains(err.Error(), "give seq_len") {
		t.Fatalf("load without --seq-len: %v", err)
	}
}
