package job

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// subsetOf builds a job's subset of a dataset: the union of its ranges,
// ids (given, or read from a file) and the records whose label is listed,
// then only those that pass the filter, then with dedup one of each set
// of records of equal bytes. nil means every record.
func (env *Env) subsetOf(ctx context.Context, plan Plan, ds dataset.Dataset) (*roaring.Bitmap, error) {
	b, err := env.union(ctx, plan.Subset, ds)
	if err != nil {
		return nil, err
	}
	if plan.Filter != nil {
		if b, err = filtered(plan.Filter, ds, b); err != nil {
			return nil, err
		}
		if plan.Filter.Column != "" {
			if b, err = env.byColumn(ctx, plan, ds, b); err != nil {
				return nil, err
			}
		}
	}
	if plan.Dedup {
		if b, err = env.dedup(ctx, ds, b); err != nil {
			return nil, err
		}
	}
	if b != nil && b.IsEmpty() {
		return nil, fmt.Errorf("%w: the subset holds no record", dataset.ErrEmpty)
	}
	return b, nil
}

func (env *Env) union(ctx context.Context, s *wire.Subset, ds dataset.Dataset) (*roaring.Bitmap, error) {
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
		if ids, err = readIDs(ctx, env.store, s.IDsFile); err != nil {
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

// maxIDsFile bounds an ids file: 2^24 ids of 8 bytes, or as many lines.
const maxIDsFile = 1 << 28

// readIDs reads a file of ids: a one-dimensional integer .npy, or text of
// one id per line (blank lines and # comments skipped).
func readIDs(ctx context.Context, store storage.Store, name string) ([]int, error) {
	b, err := store.ReadFile(ctx, name, maxIDsFile)
	if err != nil {
		return nil, fmt.Errorf("subset ids_file: %w", err)
	}
	return parseIDs(name, b)
}

// parseIDs reads the ids of the ids file name, whose bytes are b.
func parseIDs(name string, b []byte) ([]int, error) {
	if bytes.HasPrefix(b, []byte("\x93NUMPY")) {
		return npyIDs(name, b)
	}
	var ids []int
	line := 0
	for len(b) > 0 {
		var l []byte
		l, b, _ = bytes.Cut(b, []byte("\n"))
		line++
		t := strings.TrimSpace(string(l))
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		id, err := strconv.ParseInt(t, 10, 64)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%w: %s line %d: %q is not an id (want one non-negative integer per line, or an integer .npy)", errSpec, name, line, t)
		}
		if len(ids) >= maxSubsetIDs {
			return nil, specErr("%s: more than %d ids", name, maxSubsetIDs)
		}
		ids = append(ids, int(id))
	}
	return ids, nil
}

func npyIDs(name string, b []byte) ([]int, error) {
	h, err := dataset.ParseNpyHeader(b)
	if err != nil {
		return nil, &dataset.FormatError{Path: name, Err: err}
	}
	if len(h.Shape) != 1 || h.FortranOrder && len(h.Shape) > 1 {
		return nil, specErr("%s: an array of shape %v, want one dimension of ids", name, h.Shape)
	}
	kind, size := h.Descr[1:2], h.ItemSize
	big := h.Descr[0] == '>'
	if (kind != "i" && kind != "u") || size > 8 {
		return nil, specErr("%s: ids of dtype %q, want integers", name, h.Descr)
	}
	n := h.Shape[0]
	if n > maxSubsetIDs {
		return nil, specErr("%s: %d ids, at most %d", name, n, maxSubsetIDs)
	}
	data := b[h.DataOffset:]
	if len(data) < n*size {
		return nil, &dataset.FormatError{Path: name, Offset: int64(len(b)), Err: fmt.Errorf("%d ids of %d bytes need %d bytes after the header: %w", n, size, n*size, dataset.ErrPartial)}
	}
	ids := make([]int, n)
	var order binary.ByteOrder = binary.LittleEndian
	if big {
		order = binary.BigEndian
	}
	for i := range ids {
		c := data[i*size : (i+1)*size]
		var v int64
		switch size {
		case 1:
			v = int64(c[0])
			if kind == "i" {
				v = int64(int8(c[0]))
			}
		case 2:
			v = int64(order.Uint16(c))
			if kind == "i" {
				v = int64(int16(order.Uint16(c)))
			}
		case 4:
			v = int64(order.Uint32(c))
			if kind == "i" {
				v = int64(int32(order.Uint32(c)))
			}
		case 8:
			u := order.Uint64(c)
			if kind == "u" && u > 1<<62 {
				return nil, specErr("%s: id %d at index %d is not a record", name, u, i)
			}
			v = int64(u)
		default:
			return nil, specErr("%s: ids of %d bytes", name, size)
		}
		if v < 0 {
			return nil, specErr("%s: id %d at index %d is negative", name, v, i)
		}
		ids[i] = int(v)
	}
	return ids, nil
}

// subsetSampler is a sampler over a subset of records: base orders
// positions 0..|ids|-1, which name ids.
type subsetSampler struct {
	base sampler.Sampler
	ids  []uint32
}

func (s *subsetSampler) Len() int { return s.base.Len() }
func (s *subsetSampler) Fill(epoch, pos int, dst []int) int {
	n := s.base.Fill(epoch, pos, dst)
	for i := range n {
		dst[i] = int(s.ids[dst[i]])
	}
	return n
}

// spaceOf keys a source's records (through a transform) in the cache: a
// hash of the objects' versions, the options and the transform.
func spaceOf(inf dataset.Info, key, transform string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%q|%s", key, inf.Versions, transform)
	return h.Sum64()
}
