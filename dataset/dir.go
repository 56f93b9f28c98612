package dataset

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/riffle-ml/riffle/storage"
)

// tree is a directory of one file per record, labelled by the first-level
// sub-directory it sits in: torchvision's ImageFolder convention, classes
// sorted by name so label k is the k-th class. Files sit in class order, so
// a record's label is found from class start ids, not stored per record.
type tree struct {
	inf    Info
	set    *storage.FileSet
	sizes  []int64
	starts []int // starts[k] is the first id of class k; one extra at the end; nil when unlabelled
}

func openTree(ctx context.Context, root string, opts Options) (Dataset, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, &storage.Error{Op: "open", Object: root, Err: err}
	}
	var classes []string
	loose := 0
	for _, e := range entries {
		if hidden(e.Name()) {
			continue
		}
		if e.IsDir() {
			classes = append(classes, e.Name())
		} else {
			loose++
		}
	}
	sort.Strings(classes)
	t := &tree{inf: Info{Format: "dir", Paths: []string{root}}}
	var paths []string
	walk := func(dir string) error {
		return filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return &storage.Error{Op: "open", Object: p, Err: err}
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if p != dir && hidden(e.Name()) {
				if e.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			if e.IsDir() {
				return nil
			}
			st, err := os.Stat(p) // follows symlinks, as ImageFolder does
			if err != nil {
				return &storage.Error{Op: "stat", Object: p, Err: err}
			}
			if !st.Mode().IsRegular() {
				return nil
			}
			paths = append(paths, p)
			t.sizes = append(t.sizes, st.Size())
			t.inf.Bytes += st.Size()
			return nil
		})
	}
	if len(classes) == 0 {
		if err := walk(root); err != nil {
			return nil, err
		}
	} else {
		if loose > 0 {
			slog.Warn("files directly under a class tree are not records", "root", root, "files", loose)
		}
		t.inf.Classes = classes
		for _, c := range classes {
			t.starts = append(t.starts, len(paths))
			if err := walk(filepath.Join(root, c)); err != nil {
				return nil, err
			}
		}
		t.starts = append(t.starts, len(paths))
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("%s: no files: %w", root, ErrEmpty)
	}
	t.set = storage.NewFileSet(paths, t.sizes, storage.FileOptions{Direct: opts.Direct}, 0)
	return t, nil
}

func hidden(name string) bool { return strings.HasPrefix(name, ".") }

func (t *tree) Len() int   { return len(t.sizes) }
func (t *tree) Info() Info { return t.inf }
func (t *tree) Locate(id int) Loc {
	return Loc{Object: id, Off: 0, Len: int(t.sizes[id])}
}
func (t *tree) Object(i int) storage.Reader { return t.set.Object(i) }
func (t *tree) Close() error                { return t.set.Close() }

func (t *tree) Label(id int) int {
	if t.starts == nil {
		return -1
	}
	return sort.SearchInts(t.starts, id+1) - 1
}
