package job

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/riffle-ml/riffle/wire"
)

// The Env says when the first job with a transform opens and when the
// last closes (a daemon's spare P, EnvOptions.Transforming), and a job
// without one changes nothing.
func TestEnvSaysWhenJobsTransform(t *testing.T) {
	var said []bool
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), Transforming: func(on bool) { said = append(said, on) }})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	path := filepath.Join(t.TempDir(), "d.svm")
	if err := os.WriteFile(path, []byte("1 1:0.5\n0 2:1\n1 3:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := openJob(t, env, &wire.JobSpec{Paths: []string{path}, BatchSize: 2})
	a := openJob(t, env, &wire.JobSpec{Paths: []string{path}, BatchSize: 2, Transform: "libsvm_dense:n_features=4"})
	b := openJob(t, env, &wire.JobSpec{Paths: []string{path}, BatchSize: 2, Transform: "libsvm_dense:n_features=4"})
	a.Close()
	plain.Close()
	if !slices.Equal(said, []bool{true}) {
		t.Fatalf("with one transforming job open: told %v, want [true]", said)
	}
	b.Close()
	b.Close() // a second close tells nothing
	if !slices.Equal(said, []bool{true, false}) {
		t.Fatalf("after the last closed: told %v, want [true false]", said)
	}
}
