package dataset

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"strings"

	"github.com/riffle-ml/riffle/storage"
)

func init() {
	RegisterFormat(Format{Name: "dir", OpenDir: openTree})
}

// tree is a directory of one file per record, labelled by the first-level
// sub-directory it sits in: torchvision's ImageFolder convention, classes
// sorted by name so label k is the k-th class. Files sit in class order, so
// a record's label is found from class start ids, not stored per record.
//
// Files are found by the store's Walk, which follows symlinked files (as
// ImageFolder does) but, in a confined store, only to files beneath its
// roots; each is opened through the store when it is first read.
type tree struct {
	inf    Info
	set    *storage.FileSet
	paths  []string
	sizes  []int64
	starts []int // starts[k] is the first id of class k; one extra at the end; nil when unlabelled
}

func openTree(ctx context.Context, root string, opts Options) (Dataset, error) {
	store := opts.Store
	rootInfo, err := store.Stat(ctx, root)
	if err != nil {
		return nil, err
	}
	t := &tree{inf: Info{Format: "dir", Paths: []string{root}, Versions: []string{rootInfo.Version}}}
	var classes []string
	loose := 0
	err = store.Walk(ctx, root, func(p string, info storage.ObjectInfo) error {
		// Only the first level: classes are its directories.
		if info.Dir {
			classes = append(classes, filepath.Base(p))
			return storage.SkipDir
		}
		loose++
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(classes)
	var only map[string]bool
	if opts.Only != nil {
		only = make(map[string]bool, len(opts.Only))
		for _, p := range opts.Only {
			only[p] = true
		}
	}
	add := func(p string, info storage.ObjectInfo) error {
		if info.Dir || !HasExtension(p, opts.Extensions) || (only != nil && !only[p]) {
			return nil
		}
		t.paths = append(t.paths, p)
		t.sizes = append(t.sizes, info.Size)
		t.inf.Bytes += info.Size
		return nil
	}
	if len(classes) == 0 {
		if err := store.Walk(ctx, root, add); err != nil {
			return nil, err
		}
	} else {
		if loose > 0 {
			slog.Warn("files directly under a class tree are not records", "root", root, "files", loose)
		}
		t.inf.Classes = classes
		for _, c := range classes {
			t.starts = append(t.starts, len(t.paths))
			dir := filepath.Join(root, c)
			info, err := store.Stat(ctx, dir)
			if err != nil {
				return nil, err
			}
			t.inf.Versions = append(t.inf.Versions, info.Version)
			if err := store.Walk(ctx, dir, add); err != nil {
				return nil, err
			}
		}
		t.starts = append(t.starts, len(t.paths))
	}
	if len(t.paths) == 0 {
		return nil, fmt.Errorf("%s: no files: %w", root, ErrEmpty)
	}
	t.set = storage.NewFileSet(store, t.paths, t.sizes, 0)
	return t, nil
}

func (t *tree) Len() int   { return len(t.sizes) }
func (t *tree) Info() Info { return t.inf }
func (t *tree) Locate(id int) Loc {
	return Loc{Object: id, Off: 0, Len: int(t.sizes[id])}
}
func (t *tree) Object(i int) storage.Reader { return t.set.Object(i) }
func (t *tree) Objects() int                { return len(t.sizes) }
func (t *tree) Close() error                { return t.set.Close() }

func (t *tree) Label(id int) int {
	if t.starts == nil {
		return -1
	}
	return sort.SearchInts(t.starts, id+1) - 1
}

// Path returns the file of record id, for error messages and clients that
// map a record back to its source.
func (t *tree) Path(id int) string { return t.paths[id] }

// HasExtension reports whether path ends in one of exts (case-insensitive);
// every path does when exts is empty.
func HasExtension(path string, exts []string) bool {
	if len(exts) == 0 {
		return true
	}
	ext := strings.ToLower(filepath.Ext(path))
	for _, e := range exts {
		if strings.ToLower(e) == ext {
			return true
		}
	}
	return false
}
