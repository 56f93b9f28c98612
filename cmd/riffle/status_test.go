package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/server"
)

// status counts the clients besides itself, says how many reads sharing
// avoided, what holds the memory budget and the daemon's resident memory
// by kind, and a socket whose directory is missing is "no daemon", not a
// system call's error.
func TestStatus(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s := &server.Server{Socket: filepath.Join(dir, "s.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	<-s.Ready()
	out, err := run(t, statusCmd(), "--socket", s.Addr())
	if err != nil || !strings.Contains(out, "clients: 0\n") || !strings.Contains(out, "reads sharing avoided: 0 records") ||
		!strings.Contains(out, "held by 0 jobs, 0 waiting, 0 refused") || !strings.Contains(out, "\nresident: ") {
		t.Fatalf("status: %v\n%s", err, out)
	}
	missing := filepath.Join(t.TempDir(), "gone", "s.sock")
	if _, err := run(t, statusCmd(), "--socket", missing); err == nil || !strings.Contains(err.Error(), "no riffle daemon at "+missing) {
		t.Fatalf("status of a missing socket directory: %v", err)
	}
}
