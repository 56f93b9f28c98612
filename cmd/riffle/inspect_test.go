package main

import (
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/internal/synth"
)

// inspect checks every record's frame, not only the records it shows: a
// data CRC broken in the last record of a file is an error.
func TestInspectChecksEveryRecord(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.tfrecord")
	if err := synth.WriteTFRecord(p, 200); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, inspectCmd(), p)
	if err != nil || !strings.Contains(out, "checked:  every record's frame (200 records") {
		t.Fatalf("inspect of a whole TFRecord: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(p)
	// The last record's data: its last byte sits before the 4-byte CRC.
	b[len(b)-5] ^= 1
	os.WriteFile(p, b, 0o644)
	_, err = run(t, inspectCmd(), p, "--first", "2")
	if err == nil || !strings.Contains(err.Error(), "data CRC") || !strings.Contains(err.Error(), p) {
		t.Fatalf("inspect of a TFRecord with its last record corrupt: %v", err)
	}
}

// inspect of an ImageFolder counts its files, not its root.
func TestInspectCountsFiles(t *testing.T) {
	root := filepath.Join(t.TempDir(), "images")
	if err := synth.WriteTree(root, []string{"cat", "dog", "eel"}, 40); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, inspectCmd(), root, "--first", "0")
	if err != nil || !strings.Contains(out, "files:    120 (") || !strings.Contains(out, "records:  120") {
		t.Fatalf("inspect of a class tree: %v\n%s", err, out)
	}
}

// inspect of lines whose index beside them says a record of no bytes (no
// scan makes one; it panicked on a length of -1) rebuilds the index and
// shows the lines' own sizes.
func TestInspectRefusesAZeroWidthIndex(t *testing.T) {
	p := filepath.Join(t.TempDir(), "a.txt")
	if err := os.WriteFile(p, []byte(strings.Repeat("line\n", 40)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, inspectCmd(), p, "--first", "0"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p + ".ridx")
	if err != nil {
		t.Fatal(err)
	}
	// The offset table follows the 32-byte frame and two counts: record
	// 2 is made to start where record 3 does, its checksum fixed.
	copy(b[48+8*2:], b[48+8*3:48+8*4])
	n := len(b) - 4
	binary.LittleEndian.PutUint32(b[n:], crc32.Checksum(b[:n], crc32.MakeTable(crc32.Castagnoli)))
	if err := os.WriteFile(p+".ridx", b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, inspectCmd(), p, "--first", "3")
	if err != nil || !strings.Contains(out, "records:  40") || !strings.Contains(out, "sizes:    4 to 4 bytes") {
		t.Fatalf("inspect over an index of a zero-width record: %v\n%s", err, out)
	}
}
