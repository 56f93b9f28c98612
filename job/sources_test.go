package job

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

// A job's paths are expanded once, and the files found are what it reads
// (and filters by column, and reopens past the page cache): a glob's
// a[1].bin is that file, not a pattern globbed again into a1.bin, which
// was read twice and a[1].bin never.
func TestPathsExpandedOnce(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, first int) {
		var b []byte
		for id := first; id < first+10; id++ {
			b = append(b, synth.Record(id, 64)...)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a1.bin", 0)
	write("a[1].bin", 100)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	var got []int
	for _, b := range batches(t, env, &wire.JobSpec{Paths: []string{filepath.Join(dir, "*.bin")}, RecordSize: 64, BatchSize: 8, Epochs: 1}) {
		for _, r := range b {
			got = append(got, synth.IDOf(r))
			if err := synth.CheckRecord(r, synth.IDOf(r)); err != nil {
				t.Fatal(err)
			}
		}
	}
	slices.Sort(got)
	want := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109}
	if !slices.Equal(got, want) {
		t.Fatalf("read %v, want each record of both files once", got)
	}
}
