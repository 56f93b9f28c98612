package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/riffle-ml/riffle/corpus"
)

// indexTokens makes a flat token file (nanoGPT's PREFIX.bin) a Megatron
// corpus: it reads the tokens once, finds the documents by their EOD
// token, and writes PREFIX.idx beside it, whose pointers are byte offsets
// into the .bin as it is (a Megatron .bin is the bare token stream, as a
// flat file is). best_fit and pad need documents' lengths, which a flat
// file does not hold; this is the one pass that finds them, made once, by
// the user's choice, not before every job's first step.
func indexTokens(ctx context.Context, out io.Writer, bin, dtype string, eod int64) error {
	if !strings.HasSuffix(bin, ".bin") {
		return fmt.Errorf("%s: a flat token file to index must be named PREFIX.bin, so that PREFIX.idx beside it makes a Megatron pair", bin)
	}
	idx := strings.TrimSuffix(bin, ".bin") + ".idx"
	if _, err := os.Stat(idx); err == nil {
		return fmt.Errorf("%s exists: remove it to index %s again", idx, bin)
	}
	d, err := corpus.ParseDtype(dtype)
	if err != nil {
		return err
	}
	start := time.Now()
	c, err := corpus.Open(ctx, corpus.Options{Format: "flat", Dtype: d, EOD: eod, HasEOD: true}, bin)
	if err != nil {
		return err
	}
	defer c.Close()
	lens, err := corpus.EODLengths(ctx, c)
	if err != nil {
		return err
	}
	// Written aside and renamed: a reader never sees half an index.
	f, err := os.CreateTemp(filepath.Dir(idx), filepath.Base(idx)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := corpus.WriteIndex(f, d, lens); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", idx, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), idx); err != nil {
		return err
	}
	fmt.Fprintf(out, "%s -> %s: %d documents, %d tokens (%s), indexed in %v\n", bin, idx, len(lens), c.Tokens(), d,
		time.Since(start).Round(time.Millisecond))
	return nil
}
