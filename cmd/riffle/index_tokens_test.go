package main

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/corpus"
)

// index --token-dtype --eod makes a flat token file a Megatron corpus:
// the documents its EOD tokens end, each read back equal to the stream's
// run (the tokens after the last EOD a document too); an index that exists
// is kept, and a file not named PREFIX.bin or flags given alone are refused
// with the fix.
func TestIndexFlatTokens(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "train.bin")
	stream := []uint16{1, 2, 0, 3, 4, 5, 0, 6, 0, 7, 8}
	want := [][]int64{{1, 2, 0}, {3, 4, 5, 0}, {6, 0}, {7, 8}}
	var raw []byte
	for _, v := range stream {
		raw = binary.LittleEndian.AppendUint16(raw, v)
	}
	if err := os.WriteFile(bin, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, indexCmd(), bin, "--token-dtype", "uint16", "--eod", "0")
	if err != nil || !strings.Contains(out, "4 documents, 11 tokens (uint16)") {
		t.Fatalf("index: %v\n%s", err, out)
	}
	c, err := corpus.Open(context.Background(), corpus.Options{}, filepath.Join(dir, "train"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Docs() != len(want) {
		t.Fatalf("%d documents, want %d", c.Docs(), len(want))
	}
	for d, w := range want {
		got := make([]int64, c.Len(d))
		if err := c.Read(context.Background(), d, 0, got); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, w) {
			t.Errorf("document %d: %v, want %v", d, got, w)
		}
	}
	if _, err := run(t, indexCmd(), bin, "--token-dtype", "uint16", "--eod", "0"); err == nil || !strings.Contains(err.Error(), "exists: remove it") {
		t.Errorf("indexing again: %v", err)
	}
	other := filepath.Join(dir, "tokens.u16")
	os.WriteFile(other, raw, 0o644)
	if _, err := run(t, indexCmd(), other, "--token-dtype", "uint16", "--eod", "0"); err == nil || !strings.Contains(err.Error(), "PREFIX.bin") {
		t.Errorf("a file not named .bin: %v", err)
	}
	if _, err := run(t, indexCmd(), bin, "--token-dtype", "uint16"); err == nil || !strings.Contains(err.Error(), "--eod") {
		t.Errorf("--token-dtype alone: %v", err)
	}
}
