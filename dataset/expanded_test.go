package dataset_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
)

// Names a glob gave are opened as they are: a file whose name holds glob
// characters (a[1].bin) is itself, not a pattern matching another file
// (a1.bin), as a second glob of the expanded names would read it.
func TestOpenExpandedGlobsNothingAgain(t *testing.T) {
	dir := t.TempDir()
	plain, bracket := filepath.Join(dir, "a1.bin"), filepath.Join(dir, "a[1].bin")
	if err := os.WriteFile(plain, make([]byte, 8), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bracket, make([]byte, 12), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	opts := dataset.Options{RecordSize: 4, IndexDir: t.TempDir()}
	ds, err := dataset.OpenExpanded(ctx, opts, plain, bracket)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if got := ds.Info().Paths; !slices.Equal(got, []string{plain, bracket}) || ds.Len() != 5 {
		t.Fatalf("opened %v, %d records: want both files, 2 + 3 records", got, ds.Len())
	}
	if _, err := dataset.OpenExpanded(ctx, opts); err == nil {
		t.Fatal("opened no names")
	}
}
