// Package synth writes datasets whose records carry their own id, so a test
// or the demo can check that a batch's bytes are exactly the file's bytes for
// the ids the batch claims to hold.
package synth

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/riffle-ml/riffle/dataset"
)

// Record returns fixed-size record id: its id as a little-endian uint64,
// then bytes that depend on id and position.
func Record(id, size int) []byte {
	b := make([]byte, size)
	FillRecord(b, id)
	return b
}

// FillRecord writes record id into b.
func FillRecord(b []byte, id int) {
	var idb [8]byte
	binary.LittleEndian.PutUint64(idb[:], uint64(id))
	copy(b, idb[:])
	x := uint32(id)*2654435761 + 1
	for i := 8; i < len(b); i++ {
		x = x*1664525 + 1013904223
		b[i] = byte(x >> 24)
	}
}

// CheckRecord reports whether b is record id.
func CheckRecord(b []byte, id int) error {
	if len(b) < 8 {
		if len(b) > 0 && b[0] != byte(id) {
			return fmt.Errorf("record of %d bytes: first byte %d, want %d", len(b), b[0], byte(id))
		}
		return nil
	}
	if got := binary.LittleEndian.Uint64(b); got != uint64(id) {
		return fmt.Errorf("record carries id %d, want %d", got, id)
	}
	want := make([]byte, len(b))
	FillRecord(want, id)
	for i := range b {
		if b[i] != want[i] {
			return fmt.Errorf("record %d differs at byte %d", id, i)
		}
	}
	return nil
}

// IDOf returns the id a fixed-size record carries.
func IDOf(b []byte) int { return int(binary.LittleEndian.Uint64(b)) }

// WriteFixed writes n records of size bytes after header zero bytes.
func WriteFixed(path string, n, size int, header int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	w.Write(make([]byte, header))
	rec := make([]byte, size)
	for id := range n {
		FillRecord(rec, id)
		w.Write(rec)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Line returns line record id (without its newline) for a text format:
// "libsvm", "jsonl", "csv" or "text". Lengths vary with id.
func Line(format string, id int) string {
	switch format {
	case "libsvm":
		var sb strings.Builder
		fmt.Fprintf(&sb, "%d", id%2)
		for k := range 1 + id%7 {
			fmt.Fprintf(&sb, " %d:%d", k*3+1, id+k)
		}
		return sb.String()
	case "jsonl":
		return fmt.Sprintf(`{"id": %d, "text": "%s"}`, id, strings.Repeat("x", id%13))
	case "csv":
		return fmt.Sprintf(`%d,"a, ""quoted""%s",%d`, id, strings.Repeat("\n", id%3), id*7)
	default:
		return fmt.Sprintf("%d %s", id, strings.Repeat("y", id%11))
	}
}

// WriteLines writes n lines of format; with header a CSV header comes first.
func WriteLines(path, format string, n int, header bool) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if header {
		w.WriteString("id,text,n\n")
	}
	for id := range n {
		w.WriteString(Line(format, id))
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteTFRecord writes n TFRecords; record id is Record(id, 8+id%50).
func WriteTFRecord(path string, n int) error {
	var b []byte
	for id := range n {
		b = dataset.AppendTFRecord(b, Record(id, 8+id%50))
	}
	return os.WriteFile(path, b, 0o644)
}

// WriteNpy writes an (n, cols) array of little-endian uint64 whose row id
// starts with id, as a .npy file.
func WriteNpy(path string, n, cols int) error {
	hdr := fmt.Sprintf("{'descr': '<u8', 'fortran_order': False, 'shape': (%d, %d), }", n, cols)
	pad := 64 - (10+len(hdr)+1)%64
	hdr += strings.Repeat(" ", pad%64) + "\n"
	b := []byte("\x93NUMPY\x01\x00")
	b = binary.LittleEndian.AppendUint16(b, uint16(len(hdr)))
	b = append(b, hdr...)
	for id := range n {
		for c := range cols {
			b = binary.LittleEndian.AppendUint64(b, uint64(id)+uint64(c)<<32)
		}
	}
	return os.WriteFile(path, b, 0o644)
}

// WriteTree writes an ImageFolder-style tree: classes sub-directories each
// holding perClass files. File k of the whole tree (in class, then name,
// order) is Record(k, 8+k%100).
func WriteTree(root string, classes []string, perClass int) error {
	id := 0
	for _, c := range classes {
		dir := root + "/" + c
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for i := range perClass {
			if err := os.WriteFile(fmt.Sprintf("%s/%05d.bin", dir, i), Record(id, 8+id%100), 0o644); err != nil {
				return err
			}
			id++
		}
	}
	return nil
}

// WriteSortedLIBSVM writes n examples of a two-class problem in dim
// features as LIBSVM lines, all of class 0 first, then all of class 1: the
// order that hurts SGD most without a shuffle. Classes differ in the means
// of their first features and overlap, so the best loss is well above 0.
func WriteSortedLIBSVM(path string, n, dim int, seed uint64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range n {
		y := 0
		if i >= n/2 {
			y = 1
		}
		fmt.Fprintf(w, "%d", 2*y-1)
		for k := range dim {
			v := r.NormFloat64()
			if k < 4 {
				v += 0.6 * float64(2*y-1)
			}
			fmt.Fprintf(w, " %d:%.4f", k+1, v)
		}
		w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// RandomBytes is n bytes of a seeded random stream: incompressible data,
// the same for the same seed.
func RandomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
