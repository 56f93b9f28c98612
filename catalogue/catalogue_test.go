package catalogue_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/catalogue"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/internal/privdir/privdirtest"
	"github.com/riffle-ml/riffle/pack"
)

// packed puts a pack of a small fixed-record dataset in the catalogue c
// and returns the dataset's paths and versions.
func packed(t *testing.T, c catalogue.Catalogue) ([]string, []string) {
	t.Helper()
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
	inf := ds.Info()
	dir, err := c.Prepare(catalogue.Key(inf.Paths, ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pack.Pack(ctx, ds, dir, pack.Options{ShardBytes: 16 << 10}); err != nil {
		t.Fatal(err)
	}
	return inf.Paths, inf.Versions
}

// The catalogue's directories are made 0700; an output is found while its
// shards are the regular files its manifest names, and not once a symlink
// stands in a shard's or the manifest's place.
func TestCatalogueSymlinkedShard(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	c := catalogue.Catalogue{Dir: filepath.Join(t.TempDir(), "cache", "outputs")}
	paths, versions := packed(t, c)
	dir, ok := c.Lookup(paths, versions, "")
	if !ok {
		t.Fatal("the output is not found")
	}
	for _, d := range []string{c.Dir, dir} {
		if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want mode 0700", d, st.Mode(), err)
		}
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "*"+dataset.ShardExt))
	if len(shards) < 2 {
		t.Fatalf("%d shards", len(shards))
	}
	// A symlink to a copy of the very same bytes: still not followed.
	elsewhere := filepath.Join(t.TempDir(), "copy")
	b, _ := os.ReadFile(shards[1])
	os.WriteFile(elsewhere, b, 0o644)
	os.Remove(shards[1])
	if err := os.Symlink(elsewhere, shards[1]); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Lookup(paths, versions, ""); ok {
		t.Fatal("an output with a symlinked shard was found")
	}
	os.Remove(shards[1])
	os.WriteFile(shards[1], b, 0o600)
	if _, ok := c.Lookup(paths, versions, ""); !ok {
		t.Fatal("the output is not found once its shard is back")
	}
	man := filepath.Join(dir, dataset.PackManifest)
	mb, _ := os.ReadFile(man)
	os.WriteFile(elsewhere, mb, 0o644)
	os.Remove(man)
	os.Symlink(elsewhere, man)
	if _, ok := c.Lookup(paths, versions, ""); ok {
		t.Fatal("an output with a symlinked manifest was found")
	}
}

// A catalogue directory another user owns, or anyone may write, is
// refused: nothing is found in it, nothing is packed into it, and the
// error says where, whose and what mode.
func TestCatalogueRefusesForeignOrWritable(t *testing.T) {
	for _, d := range privdirtest.UnsafeDirs(t) {
		// An output made while the directory was private, then the
		// directory opened to others (or given away).
		c := catalogue.Catalogue{Dir: filepath.Join(t.TempDir(), "outputs")}
		paths, versions := packed(t, c)
		st, _ := os.Stat(d)
		var sys unix.Stat_t
		unix.Stat(d, &sys)
		os.Chmod(c.Dir, st.Mode().Perm())
		os.Chown(c.Dir, int(sys.Uid), int(sys.Gid))
		if _, ok := c.Lookup(paths, versions, ""); ok {
			t.Fatalf("an output was found in %s, mode %v owner %d", c.Dir, st.Mode(), sys.Uid)
		}
		_, err := c.Prepare(catalogue.Key([]string{"x"}, ""))
		if !errors.Is(err, privdir.ErrNotPrivate) || !strings.Contains(err.Error(), c.Dir) {
			t.Fatalf("preparing an output in %s: %v", c.Dir, err)
		}
		if _, err := c.List(func(string) string { return "" }); !errors.Is(err, privdir.ErrNotPrivate) {
			t.Fatalf("listing %s: %v", c.Dir, err)
		}
	}
}

// gc removes only outputs: a directory of the catalogue not named like
// one, and what a symlink in an output leads to, stay.
func TestCatalogueGCRemovesOnlyOutputs(t *testing.T) {
	c := catalogue.Catalogue{Dir: filepath.Join(t.TempDir(), "outputs")}
	packed(t, c)
	other := filepath.Join(c.Dir, "notes")
	os.Mkdir(other, 0o700)
	outside := filepath.Join(t.TempDir(), "keep")
	os.WriteFile(outside, []byte("x"), 0o600)
	es, err := c.List(func(string) string { return "gone" })
	if err != nil || len(es) != 1 || !es[0].Stale {
		t.Fatalf("list: %+v %v", es, err)
	}
	os.Symlink(filepath.Dir(outside), filepath.Join(es[0].Dir, "link"))
	removed, err := c.GC(-1, func(string) string { return "gone" })
	if err != nil || len(removed) != 1 {
		t.Fatalf("gc removed %d: %v", len(removed), err)
	}
	if _, err := os.Stat(es[0].Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale output is still there: %v", err)
	}
	for _, p := range []string{other, outside} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("gc removed %s: %v", p, err)
		}
	}
}
