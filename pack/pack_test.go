package pack_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/pack"
)

// A pack's directory is made 0700 and its files 0600 whatever the umask;
// a manifest that is a symlink is refused, not read through; a pack of the
// same source resumes from its whole shards.
func TestPackIsPrivate(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "d.bin")
	if err := os.WriteFile(src, make([]byte, 64*1000), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(ctx, dataset.Options{RecordSize: 64, IndexDir: t.TempDir()}, src)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	dir := filepath.Join(t.TempDir(), "out", "packed")
	sum, err := pack.Pack(ctx, ds, dir, pack.Options{ShardBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records != 1000 || sum.Shards < 2 {
		t.Fatalf("packed %+v", sum)
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want mode 0700", d, st.Mode(), err)
		}
	}
	files, _ := os.ReadDir(dir)
	for _, f := range files {
		if info, err := f.Info(); err != nil || info.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want mode 0600", f.Name(), info.Mode(), err)
		}
	}
	if sum, err = pack.Pack(ctx, ds, dir, pack.Options{ShardBytes: 16 << 10}); err != nil || sum.Resumed != sum.Shards {
		t.Fatalf("packing again: %+v %v, want every shard found whole", sum, err)
	}

	// Someone else's file behind a link in the manifest's place.
	other := filepath.Join(t.TempDir(), "planted.json")
	man := filepath.Join(dir, dataset.PackManifest)
	b, _ := os.ReadFile(man)
	os.WriteFile(other, b, 0o600)
	os.Remove(man)
	if err := os.Symlink(other, man); err != nil {
		t.Fatal(err)
	}
	if _, err := pack.Pack(ctx, ds, dir, pack.Options{ShardBytes: 16 << 10}); err == nil {
		t.Fatal("a pack resumed from a manifest that is a symlink")
	}
	if after, _ := os.ReadFile(other); string(after) != string(b) {
		t.Fatal("the link's target was written")
	}
}
