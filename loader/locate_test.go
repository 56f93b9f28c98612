package loader_test

import (
	"context"
	"errors"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
)

// widthless wraps a dataset whose record bad has a length of -1, as an
// index not its file's said of a record of no bytes.
type widthless struct {
	dataset.Dataset
	bad int
}

func (d widthless) Locate(id int) dataset.Loc {
	loc := d.Dataset.Locate(id)
	if id == d.bad {
		loc.Len = -1
	}
	return loc
}

// A record of a negative length, shuffled into a batch, is an error
// naming its file and offset, never a read into a slice out of range (the
// daemon panicked).
func TestNegativeLengthIsAnError(t *testing.T) {
	ds := fixedDataset(t, 1000, 100, 0, false)
	l, err := loader.New(context.Background(), widthless{ds, 617}, sampler.Global{N: 1000, Seed: 1}, loader.Options{BatchSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for {
		b, err := l.Next(context.Background())
		if err == nil {
			b.Release()
			continue
		}
		var fe *dataset.FormatError
		if !errors.Is(err, dataset.ErrCorrupt) || !errors.As(err, &fe) || fe.Path != ds.Info().Paths[0] || fe.Offset != 617*100 {
			t.Fatalf("error %v: want a FormatError naming %s at %d", err, ds.Info().Paths[0], 617*100)
		}
		return
	}
}
