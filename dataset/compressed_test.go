package dataset_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// compressedArrow writes an LZ4 IPC file, a ZSTD stream and an
// uncompressed file with arrow-go's writers, and returns their paths and
// rows as arrow-go reads them.
func compressedArrow(t *testing.T) ([]string, []string) {
	dir := t.TempDir()
	var paths, want []string
	for i, c := range []struct {
		stream bool
		opts   []ipc.Option
	}{{false, []ipc.Option{ipc.WithLZ4()}}, {true, []ipc.Option{ipc.WithZstd()}}, {false, nil}} {
		p := filepath.Join(dir, fmt.Sprintf("part%d.arrow", i))
		paths = append(paths, p)
		want = append(want, writeArrowWith(t, p, c.stream, []int{37, 0, 200, 1, 64}, uint64(i+7), c.opts...)...)
	}
	return paths, want
}

// readEpoch reads one epoch of ds with smp and checks every row against
// want; it returns how many it saw.
func readEpoch(t *testing.T, ds dataset.Dataset, smp sampler.Sampler, bs int, want []string, cols []string) error {
	return readEpochWith(t, ds, smp, loader.Options{BatchSize: bs, Epochs: 1}, want, cols)
}

// readEpochWith is readEpoch with the loader's options; a row delivered
// twice fails it.
func readEpochWith(t *testing.T, ds dataset.Dataset, smp sampler.Sampler, opts loader.Options, want []string, cols []string) error {
	l, err := loader.New(context.Background(), ds, smp, opts)
	if err != nil {
		return err
	}
	defer l.Close()
	seen := 0
	once := map[int]bool{}
	for {
		b, err := l.Next(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		got := batchRows(t, ds.Info().Schema, b)
		for i, id := range b.IDs {
			if g, w := canon(t, got[i]), project(t, want[id], cols); g != w {
				b.Release()
				return fmt.Errorf("row %d:\n got %s\nwant %s", id, g, w)
			}
			if once[id] {
				b.Release()
				return fmt.Errorf("row %d twice in an epoch", id)
			}
			once[id] = true
		}
		seen += len(b.IDs)
		b.Release()
	}
	if seen != len(want) {
		return fmt.Errorf("saw %d rows of %d", seen, len(want))
	}
	return nil
}

// Rows of compressed Arrow files (LZ4 and ZSTD, file and stream, beside an
// uncompressed file in one dataset) equal what arrow-go's reader gives,
// over shuffled epochs whose batches cross record batches, from loaders
// reading one dataset (one cache of decompressed batches) at once, and
// from the saved index.
func TestCompressedArrowRowsMatchArrowGo(t *testing.T) {
	paths, want := compressedArrow(t)
	for _, cols := range [][]string{nil, {"words", "id", "cat"}} {
		for pass := range 2 { // the second opens the saved index
			ds, err := dataset.Open(context.Background(), dataset.Options{Columns: cols}, paths...)
			if err != nil {
				t.Fatal(err)
			}
			if ds.Len() != len(want) {
				t.Fatalf("%d rows, want %d", ds.Len(), len(want))
			}
			blocks := ds.(dataset.Blocker).Blocks()
			if len(blocks) != 13 || blocks[len(blocks)-1] != len(want) {
				t.Fatalf("record batch blocks %v", blocks)
			}
			bl, err := sampler.NewBlock(blocks, uint64(pass), 3)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i, smp := range []sampler.Sampler{sampler.Global{N: ds.Len(), Seed: uint64(pass)}, sampler.Global{N: ds.Len(), Seed: 9}, bl, sampler.Sequential{N: ds.Len()}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = readEpoch(t, ds, smp, []int{50, 64, 33, 7}[i], want, cols)
				}()
			}
			wg.Wait()
			ds.Close()
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("columns %v pass %d: %v", cols, pass, err)
			}
		}
	}
}

// An uncompressed Arrow dataset keeps its order: it has no blocks.
func TestUncompressedArrowHasNoBlocks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "plain.arrow")
	writeArrow(t, p, false, []int{10, 10}, 1)
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if _, ok := ds.(dataset.Blocker); ok {
		t.Fatal("an uncompressed Arrow dataset has blocks")
	}
}

// A compressed batch damaged on disk (a frame's bytes, its stated
// length, its body cut short) is a FormatError naming the file and the
// byte where the buffer at fault starts, when indexed and when read after
// indexing; never a panic.
func TestCompressedArrowCorrupt(t *testing.T) {
	for _, codec := range []ipc.Option{ipc.WithLZ4(), ipc.WithZstd()} {
		dir := t.TempDir()
		p := filepath.Join(dir, "z.arrow")
		writeArrowWith(t, p, false, []int{300}, 3, codec)
		good, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		// The first record batch's body: after the schema message, found
		// as where its footer says the batch's message is.
		ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
		if err != nil {
			t.Fatal(err)
		}
		body := ds.Locate(0).Off
		ds.Close()
		for _, c := range []struct {
			name   string
			damage func(b []byte) []byte
		}{
			{"frame", func(b []byte) []byte { // a byte inside the first buffer's frame, past its magic
				for i := body + 8 + 6; i < body+8+40; i++ {
					b[i] ^= 0x5A
				}
				return b
			}},
			{"length", func(b []byte) []byte { b[body] += 3; return b }},
			{"huge", func(b []byte) []byte { copy(b[body:], []byte{0, 0, 0, 0, 0, 0, 0, 0x40}); return b }},
		} {
			for _, indexed := range []bool{false, true} {
				q := filepath.Join(dir, fmt.Sprintf("%s-%v.arrow", c.name, indexed))
				bad := c.damage(append([]byte(nil), good...))
				var err error
				if indexed {
					// Index the sound file, then damage it in place while
					// the dataset is open: the read of the batch finds it.
					err = func() error {
						if err := os.WriteFile(q, good, 0o644); err != nil {
							return err
						}
						ds, err := dataset.Open(context.Background(), dataset.Options{}, q)
						if err != nil {
							return err
						}
						defer ds.Close()
						if err := os.WriteFile(q, bad, 0o644); err != nil { // truncates and rewrites: the same inode
							return err
						}
						return readEpoch(t, ds, sampler.Global{N: ds.Len(), Seed: 1}, 64, make([]string, ds.Len()), nil)
					}()
				} else {
					if err := os.WriteFile(q, bad, 0o644); err != nil {
						t.Fatal(err)
					}
					_, err = dataset.Open(context.Background(), dataset.Options{}, q)
				}
				var fe *dataset.FormatError
				if indexed && errors.Is(err, storage.ErrChanged) {
					// The read saw the file rewritten since the dataset
					// opened it (its ctime moved), before decoding the
					// damaged frame: the stronger error of the two. Within
					// the file system's timestamp tick of the open it cannot
					// see that, and decoding must find the damage instead.
					if !strings.Contains(err.Error(), q) {
						t.Fatalf("%s: %v does not name the file", c.name, err)
					}
					continue
				}
				if !errors.As(err, &fe) || !errors.Is(err, dataset.ErrCorrupt) || fe.Path != q || fe.Offset != body {
					t.Fatalf("%s (indexed %v): %v, want a FormatError at %d", c.name, indexed, err, body)
				}
				if !strings.Contains(err.Error(), q) {
					t.Fatalf("%s: %v does not name the file", c.name, err)
				}
			}
		}
	}
}
