// Command tokgen writes a synthetic token corpus in Megatron's .bin/.idx
// layout (internal/tokgen) for bench/tokens.py: a prefix, a number of
// documents and of tokens.
//
//	go run ./bench/tokgen -prefix /tmp/tok/synth -docs 1000000 -tokens 1000000000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/riffle-ml/riffle/internal/tokgen"
)

func main() {
	prefix := flag.String("prefix", "", "write PREFIX.bin and PREFIX.idx")
	docs := flag.Int("docs", 1_000_000, "documents")
	tokens := flag.Int64("tokens", 1_000_000_000, "tokens in all")
	seed := flag.Uint64("seed", 1, "seed of the lengths and tokens")
	flag.Parse()
	if *prefix == "" || *docs < 1 || *tokens < int64(*docs) {
		fmt.Fprintln(os.Stderr, "tokgen: -prefix, and -tokens at least -docs (each document has a token)")
		os.Exit(2)
	}
	s := tokgen.Spec{Docs: *docs, Tokens: *tokens, Seed: *seed}
	if err := tokgen.WriteMegatron(context.Background(), *prefix, s); err != nil {
		fmt.Fprintf(os.Stderr, "tokgen: %s: %v\n", *prefix, err)
		os.Exit(1)
	}
}
