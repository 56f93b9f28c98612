package corpus

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzMegatronIndex opens any bytes as an .idx beside a .bin of 4 KiB:
// an error names its kind, and an index opened reads every document
// inside its .bin.
func FuzzMegatronIndex(f *testing.F) {
	for _, lens := range [][]int64{{1}, {3, 5, 7}, {100, 900, 1000}, {2048}} {
		for _, d := range []Dtype{Uint8, Uint16, Int32, Int64} {
			var b bytes.Buffer
			WriteIndex(&b, d, lens)
			f.Add(b.Bytes())
			f.Add(append(b.Bytes(), make([]byte, len(lens))...)) // multimodal
		}
	}
	bin := make([]byte, 4096)
	for i := range bin {
		bin[i] = byte(i % 7)
	}
	f.Fuzz(func(t *testing.T, idx []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "f")
		os.WriteFile(p+".bin", bin, 0o644)
		os.WriteFile(p+".idx", idx, 0o644)
		c, err := Open(context.Background(), Options{}, p)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupported) && !errors.Is(err, ErrEmpty) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v is of no known kind", err)
			}
			return
		}
		defer c.Close()
		for d := range c.Docs() {
			l := c.Locate(d, 0, c.Len(d))
			if l.Off < 0 || l.Off+l.Len > int64(len(bin)) || c.Len(d) <= 0 {
				t.Fatalf("document %d at %+v, outside the .bin", d, l)
			}
			if err := c.Read(context.Background(), d, 0, make([]int64, c.Len(d))); err != nil {
				t.Fatal(err)
			}
		}
	})
}
