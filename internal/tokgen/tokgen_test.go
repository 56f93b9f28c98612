package tokgen

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/corpus"
)

func TestWriteMegatron(t *testing.T) {
	s := Spec{Docs: 1000, Tokens: 300_000, Seed: 5}
	lens := Lengths(s)
	total, longest := int64(0), int64(0)
	for _, l := range lens {
		if l < 1 {
			t.Fatalf("a document of %d tokens", l)
		}
		total += l
		longest = max(longest, l)
	}
	if total != s.Tokens || longest < 5*s.Tokens/int64(s.Docs) {
		t.Fatalf("%d tokens, the longest document %d", total, longest)
	}
	p := filepath.Join(t.TempDir(), "synth")
	if err := WriteMegatron(context.Background(), p, s); err != nil {
		t.Fatal(err)
	}
	c, err := corpus.Open(context.Background(), corpus.Options{Vocab: 50257}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Docs() != s.Docs || c.Tokens() != s.Tokens {
		t.Fatalf("%d documents, %d tokens", c.Docs(), c.Tokens())
	}
	for _, d := range []int{0, 1, 500, 999} {
		got := make([]int64, c.Len(d))
		if err := c.Read(context.Background(), d, 0, got); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if v != Token(s, d, int64(i)) {
				t.Fatalf("document %d token %d: %d, want %d", d, i, v, Token(s, d, int64(i)))
			}
		}
	}
}
