package corpus_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/internal/tokgen"
	"github.com/riffle-ml/riffle/sequence"
)

// A Megatron corpus in an object store opens by its s3:// prefix or a
// glob of its .idx objects and reads the same tokens as from files.
func TestS3Megatron(t *testing.T) {
	if _, err := s3test.Binary(); err != nil {
		t.Skip(err)
	}
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	dir := t.TempDir()
	spec := tokgen.Spec{Docs: 500, Tokens: 200_000, Seed: 9}
	for k, name := range []string{"a", "b"} {
		s := spec
		s.Seed += uint64(k)
		if err := tokgen.WriteMegatron(ctx, filepath.Join(dir, name), s); err != nil {
			t.Fatal(err)
		}
		for _, ext := range []string{".idx", ".bin"} {
			b, _ := os.ReadFile(filepath.Join(dir, name+ext))
			if err := srv.Put(ctx, "bkt", "corpus/"+name+ext, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, names := range [][]string{{"s3://bkt/corpus/a", "s3://bkt/corpus/b"}, {"s3://bkt/corpus/*.idx"}} {
		c, err := corpus.Open(ctx, corpus.Options{Vocab: 50257}, names...)
		if err != nil {
			t.Fatalf("%v: %v", names, err)
		}
		if c.Docs() != 2*spec.Docs || c.Tokens() != 2*spec.Tokens {
			t.Fatalf("%v: %d documents, %d tokens", names, c.Docs(), c.Tokens())
		}
		for _, d := range []int{0, 499, 500, 999} {
			s := spec
			if d >= spec.Docs {
				s.Seed++
			}
			got := make([]int64, c.Len(d))
			if err := c.Read(ctx, d, 0, got); err != nil {
				t.Fatal(err)
			}
			for i, v := range got {
				if want := tokgen.Token(s, d%spec.Docs, int64(i)); v != want {
					t.Fatalf("%v: document %d token %d is %d, want %d", names, d, i, v, want)
				}
			}
		}
		s, _ := sequence.New(c, sequence.Options{SeqLen: 512})
		p, _ := s.Sample(0, s.Len(0)-1, nil)
		if _, err := sequence.Read(ctx, c, p, nil); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
}
