// Package privdirtest makes directories that package privdir must refuse,
// for the tests of everything that keeps its files in one.
package privdirtest

import (
	"os"
	"path/filepath"
	"testing"
)

// UnsafeDirs returns directories no one may trust as private: one anyone
// may write (0777, whatever the umask), and, when the test runs as root,
// one another user (65534, nobody) owns.
func UnsafeDirs(t testing.TB) []string {
	t.Helper()
	world := filepath.Join(t.TempDir(), "world")
	if err := os.Mkdir(world, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(world, 0o777); err != nil {
		t.Fatal(err)
	}
	dirs := []string{world}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(t.TempDir(), "foreign")
		if err := os.Mkdir(foreign, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(foreign, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, foreign)
	}
	return dirs
}
