package order

import (
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// selection is the records of src a plan reads: the union of its subset's
// ranges, ids (given, or read from a file) and the records whose label is
// listed, then only those that pass the filter, then with dedup one of
// each set of records of equal bytes. nil means every record.
func selection(ctx context.Context, src *Source, plan Plan, env Env) (*roaring.Bitmap, error) {
	ds := src.DS
	b, err := union(ctx, plan.Subset, ds, env.Store)
	if err != nil {
		return nil, err
	}
	if plan.Filter != nil {
		if b, err = filtered(plan.Filter, ds, b); err != nil {
			return nil, err
		}
		if plan.Filter.Column != "" {
			if b, err = byColumn(ctx, src, plan, b); err != nil {
				return nil, err
			}
		}
	}
	if plan.Dedup {
		if b, err = dedup(ctx, ds, env.IndexDir, b); err != nil {
			return nil, err
		}
	}
	if b != nil && b.IsEmpty() {
		return nil, fmt.Errorf("%w: the subset holds no record", dataset.ErrEmpty)
	}
	return b, nil
}

func union(ctx context.Context, s *wire.Subset, ds dataset.Dataset, store storage.Store) (*roaring.Bitmap, error) {
	if s == nil {
		return nil, nil
	}
	n := ds.Len()
	b := roaring.New()
	for _, r := range s.Ranges {
		if r[1] > n {
			return nil, specErr("subset range [%d, %d) reaches past the dataset's %d records", r[0], r[1], n)
		}
		b.AddRange(uint64(r[0]), uint64(r[1]))
	}
	ids := s.IDs
	if s.IDsFile != "" {
		var err error
		if ids, err = readIDs(ctx, store, s.IDsFile); err != nil {
			return nil, err
		}
	}
	for _, id := range ids {
		if id < 0 || id >= n {
			return nil, specErr("subset id %d is not in [0, %d), the dataset's records", id, n)
		}
		b.Add(uint32(id))
	}
	if len(s.Labels) > 0 {
		if ds.Label(0) < 0 {
			return nil, specErr("subset by label, but the dataset has no labels")
		}
		b.Or(withLabels(ds, s.Labels, nil))
	}
	return b, nil
}

// withLabels is the records of in (every record if nil) whose label is
// one of labels.
func withLabels(ds dataset.Dataset, labels []int, in *roaring.Bitmap) *roaring.Bitmap {
	want := map[int]bool{}
	for _, l := range labels {
		want[l] = true
	}
	return keep(ds, in, func(id int) bool { return want[ds.Label(id)] })
}

// keep is the records of in (every record if nil) that ok takes.
func keep(ds dataset.Dataset, in *roaring.Bitmap, ok func(id int) bool) *roaring.Bitmap {
	out := roaring.New()
	if in == nil {
		for id := range ds.Len() {
			if ok(id) {
				out.Add(uint32(id))
			}
		}
		return out
	}
	it := in.Iterator()
	for it.HasNext() {
		if id := it.Next(); ok(int(id)) {
			out.Add(id)
		}
	}
	return out
}

// filtered is the records of in (every record if nil) that pass f.
func filtered(f *wire.Filter, ds dataset.Dataset, in *roaring.Bitmap) (*roaring.Bitmap, error) {
	_, rows := ds.(dataset.Rows)
	if rows && (f.MinSize > 0 || f.MaxSize > 0 || f.Glob != "") {
		return nil, specErr("filter by size or file on a dataset of rows (%s): its rows have no bytes of their own; filter by label or ids", ds.Info().Format)
	}
	if len(f.Labels) > 0 {
		if ds.Label(0) < 0 {
			return nil, specErr("filter by label, but the dataset has no labels")
		}
		in = withLabels(ds, f.Labels, in)
	}
	if f.MinSize > 0 || f.MaxSize > 0 {
		in = keep(ds, in, func(id int) bool {
			n := ds.Locate(id).Len
			return n >= f.MinSize && (f.MaxSize == 0 || n <= f.MaxSize)
		})
	}
	if f.Glob != "" {
		// A record's file is its object's name. A pattern matches as many
		// of its last parts as it has ("*.jpg" the base name, "c2/*" the
		// folder and the name), an absolute one the whole path.
		parts := strings.Count(f.Glob, "/") + 1
		match := map[int]bool{}
		in = keep(ds, in, func(id int) bool {
			obj := ds.Locate(id).Object
			m, ok := match[obj]
			if !ok {
				m, _ = filepath.Match(f.Glob, lastParts(ds.Object(obj).Name(), parts, path.IsAbs(f.Glob)))
				match[obj] = m
			}
			return m
		})
	}
	if in == nil {
		in = roaring.New()
		in.AddRange(0, uint64(ds.Len()))
	}
	return in, nil
}

// lastParts is name's last n parts (all of it, if whole).
func lastParts(name string, n int, whole bool) string {
	if whole {
		return name
	}
	i := len(name)
	for ; n > 0; n-- {
		if i = strings.LastIndexByte(name[:max(i, 0)], '/'); i < 0 {
			return name
		}
	}
	return name[i+1:]
}
