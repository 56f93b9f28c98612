package stack

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/storage"
)

// Settings the stack could not honour stop Open, naming the flag of
// riffle serve to fix, before anything is made: a peer list without a
// token or without this node, a tier directory anyone may write, roots
// that are not there.
func TestOpenRefusesWhatItCannotHonour(t *testing.T) {
	defer goleak.VerifyNone(t)
	open := filepath.Join(t.TempDir(), "open")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	for _, c := range []struct {
		s    Settings
		says string
	}{
		{Settings{Peers: []string{"a:1", "b:1"}}, "--peers needs --token (or $RIFFLE_TOKEN)"},
		{Settings{Peers: []string{"a:1", "b:1"}, Node: 2, Token: "t"}, "node 2 is not in a peer list of 2"},
		{Settings{Peers: []string{"a:1"}, Node: -1, Token: "t"}, "node -1 is not in a peer list of 1"},
		{Settings{TierDir: open}, "the disk tier's directory (--cache-dir)"},
		{Settings{TierDir: open}, "chmod go-w " + open},
		{Settings{Roots: []string{filepath.Join(open, "none")}}, "none"},
		{Settings{Peers: []string{"a:1"}, Token: "t", S3: storage.S3Options{Endpoint: "not a url"}}, "--peers: the object store"},
	} {
		st, err := Open(c.s)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v, want an error saying %q", c.s, err, c.says)
		}
		if st != nil {
			t.Errorf("%+v: a stack as well as an error", c.s)
		}
	}
}

// The zero value reads local files and makes nothing else: no object
// store, no tier, no counts of them.
func TestZeroSettingsReadLocalFiles(t *testing.T) {
	defer goleak.VerifyNone(t)
	path := filepath.Join(t.TempDir(), "d.bin")
	data := synth.RandomBytes(10000, 1)
	os.WriteFile(path, data, 0o644)
	st, err := Open(Settings{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.Store().ReadFile(context.Background(), path, 1<<20)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("a local file: %v, or other bytes", err)
	}
	if s := st.Stats(); s.Remote != nil || s.Disk != nil || s.Peers != nil || st.Tier() != nil || st.Cluster() != nil {
		t.Fatalf("a stack of local files made %+v", s)
	}
}

// An s3:// object is read through the tiers in front of the object
// store, made at the first s3:// name (at Open with peers): its bytes are
// the object's, a second read is served by the disk tier without a GET,
// and Stats counts each part.
func TestTiersInFrontOfTheObjectStore(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	data := synth.RandomBytes(3<<20+5, 2)
	if err := srv.Put(ctx, "bkt", "d.bin", data); err != nil {
		t.Fatal(err)
	}
	const name = "s3://bkt/d.bin"
	for _, peered := range []bool{false, true} {
		s := Settings{S3: storage.S3Options{Endpoint: srv.Endpoint}, TierDir: filepath.Join(t.TempDir(), "tier")}
		if peered {
			s.Peers, s.Token = []string{"127.0.0.1:1"}, "t"
		}
		st, err := Open(s)
		if err != nil {
			t.Fatal(err)
		}
		if made := st.Stats(); peered != (made.Remote != nil && made.Peers != nil && st.Cluster() != nil) || made.Disk != nil && !peered {
			t.Fatalf("peered %v: before any s3:// name, the stack made %+v", peered, made)
		}
		read := func() {
			t.Helper()
			r, err := st.Store().Open(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			got := make([]byte, len(data))
			if err := r.ReadAt(ctx, got, 0); err != nil || !bytes.Equal(got, data) {
				t.Fatalf("peered %v: %v, or other bytes", peered, err)
			}
		}
		read()
		first := st.Stats()
		if first.Remote == nil || first.Disk == nil || first.Remote.Gets == 0 || first.Disk.Misses == 0 || st.Tier() == nil {
			t.Fatalf("peered %v: after a read, %+v", peered, first)
		}
		if peered && first.Peers.Local == 0 {
			t.Fatalf("a node's own blocks were not read through its memory: %+v", *first.Peers)
		}
		read()
		again := st.Stats()
		if again.Remote.Gets != first.Remote.Gets || again.Disk.Hits == first.Disk.Hits {
			t.Fatalf("peered %v: a second read made %d GETs and %d disk hits", peered, again.Remote.Gets-first.Remote.Gets, again.Disk.Hits-first.Disk.Hits)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
