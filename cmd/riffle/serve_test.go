package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A flag the daemon could not honour stops serve before it starts,
// saying what to give. (Each was quietly ignored, or replaced by its
// default.) The socket's directory is one serve would refuse: a flag
// that is not refused first ends in that error instead of serving.
func TestServeRefusesFlagsItCannotHonour(t *testing.T) {
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	sock := filepath.Join(dir, "s.sock")
	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"--cache-dir-bytes", "1GiB"}, "give --cache-dir too"},
		{[]string{"--peer-bytes", "1GiB"}, "give --peers too"},
		{[]string{"--node", "1"}, "give --peers too"},
		{[]string{"--max-conns", "0"}, "--max-conns 0: want at least 1"},
		{[]string{"--idle-exit", "-1s"}, "--idle-exit -1s"},
		{[]string{"--memory-wait", "0s"}, "--memory-wait 0s"},
	} {
		_, err := run(t, serveCmd(), append([]string{"--socket", sock, "--quiet"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("serve %s: %v, want an error saying %q", strings.Join(c.args, " "), err, c.says)
		}
	}
}
