package job

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/wire"
)

// A growing dataset's log of files says which files, and so which ids,
// each epoch read: it is kept only in a directory privdir trusts, like
// an index. An index directory another user may write refuses the job,
// saying why; a private one keeps the log, mode 0600.
func TestGrowLogIsPrivate(t *testing.T) {
	root := filepath.Join(t.TempDir(), "tree")
	if err := synth.WriteTree(root, []string{"a", "b"}, 3); err != nil {
		t.Fatal(err)
	}
	spec := func() *wire.JobSpec {
		return &wire.JobSpec{Paths: []string{root}, BatchSize: 2, Shuffle: true, Refresh: "epoch", Epochs: 1}
	}

	world := filepath.Join(t.TempDir(), "world")
	if err := os.Mkdir(world, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(world, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	env, err := NewEnv(EnvOptions{IndexDir: world})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	plan, err := Check(spec())
	if err != nil {
		t.Fatal(err)
	}
	_, err = env.open(context.Background(), plan, nil)
	if !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "not private") {
		t.Fatalf("a growing dataset over an index directory anyone may write: %v, want a spec error saying it is not private", err)
	}

	private := t.TempDir()
	env2, err := NewEnv(EnvOptions{IndexDir: private})
	if err != nil {
		t.Fatal(err)
	}
	defer env2.Close()
	j := openJob(t, env2, spec())
	defer j.Close()
	logs, _ := filepath.Glob(filepath.Join(private, "*", "*.rfgrow"))
	if more, _ := filepath.Glob(filepath.Join(private, "*.rfgrow")); len(more) > 0 {
		logs = append(logs, more...)
	}
	if len(logs) != 1 {
		t.Fatalf("logs kept: %q, want one", logs)
	}
	if st, err := os.Stat(logs[0]); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the log %s: %v, mode %v, want 0600", logs[0], err, st.Mode().Perm())
	}
}
