package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/internal/tokgen"
)

// inspect of a Megatron prefix shows a token corpus: documents, tokens,
// dtype and the lengths' histogram; with --vocab it reads every token.
func TestInspectTokenCorpus(t *testing.T) {
	p := filepath.Join(t.TempDir(), "synth")
	spec := tokgen.Spec{Docs: 1000, Tokens: 300_000, Vocab: 1000, Seed: 2}
	if err := tokgen.WriteMegatron(context.Background(), p, spec); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{p, p + ".idx", p + ".bin"} {
		out, err := run(t, inspectCmd(), name, "--first", "2")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"format:    megatron (token corpus)", "documents: 1000 (Megatron sequences", "tokens:    300000", "dtype:     uint16", "document 1: " + p + ".bin offset "} {
			if !strings.Contains(out, want) {
				t.Fatalf("inspect %s: no %q in\n%s", name, want, out)
			}
		}
	}
	out, err := run(t, inspectCmd(), p, "--vocab-size", "1000", "--first", "0")
	if err != nil || !strings.Contains(out, "checked:   every token below the vocabulary of 1000") {
		t.Fatalf("inspect --vocab-size 1000: %v\n%s", err, out)
	}
	_, err = run(t, inspectCmd(), p, "--vocab-size", "900", "--first", "0")
	if err == nil || !strings.Contains(err.Error(), p+".bin at offset") || !strings.Contains(err.Error(), "outside the vocabulary [0, 900)") {
		t.Fatalf("inspect --vocab-size 900: %v", err)
	}
	// A flat token file is a token corpus when given its dtype.
	flat := filepath.Join(t.TempDir(), "train.bin")
	os.WriteFile(flat, []byte{1, 0, 2, 0, 0, 0, 3, 0}, 0o644)
	out, err = run(t, inspectCmd(), flat, "--token-dtype", "uint16", "--eod", "0")
	if err != nil || !strings.Contains(out, "documents: 1 files, whose documents end at EOD tokens") || !strings.Contains(out, "[1 2 0 3]") {
		t.Fatalf("inspect of a flat token file: %v\n%s", err, out)
	}
}
