package train

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/sampler"
)

func open(t *testing.T, p string) dataset.Dataset {
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	return ds
}

// On data sorted by label a full shuffle converges; the sequential order
// ends every epoch on one class and stays far from the same loss.
func TestShuffleMattersOnSortedData(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sorted.svm")
	if err := synth.WriteSortedLIBSVM(p, 4000, 10, 1); err != nil {
		t.Fatal(err)
	}
	ds := open(t, p)
	ctx := context.Background()
	d, err := Load(ctx, ds)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Rows) != 4000 || d.Dim != 11 {
		t.Fatalf("%d rows, dim %d", len(d.Rows), d.Dim)
	}
	cfg := Config{MaxEpochs: 8}
	full, err := Run(ctx, ds, d, sampler.Global{N: ds.Len(), Seed: 1}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	seq, err := Run(ctx, ds, d, sampler.Sequential{N: ds.Len()}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	best := full.Losses[len(full.Losses)-1]
	worst := seq.Losses[len(seq.Losses)-1]
	if !(best < 0.6 && worst > best*1.2) {
		t.Fatalf("final losses: global %.3f, sequential %.3f; want global well below", best, worst)
	}
	cfg.Target = best * 1.05
	again, _ := Run(ctx, ds, d, sampler.Global{N: ds.Len(), Seed: 1}, cfg)
	if again.Epochs == 0 || again.Epochs > 8 {
		t.Fatalf("global did not reach its own loss again: %+v", again)
	}
}

func TestMalformedLineNamesFileAndOffset(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.svm")
	os.WriteFile(p, []byte("1 1:2\n0 1:x\n"), 0o644)
	_, err := Load(context.Background(), open(t, p))
	var fe *dataset.FormatError
	if !errors.As(err, &fe) || fe.Path != p || fe.Offset != 6 {
		t.Fatalf("error %v: want one naming %s at offset 6", err, p)
	}
}
