package job

import (
	"fmt"
	"hash/fnv"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/wire"
)

// subsetOf builds a job's subset of a dataset: the union of its ranges,
// ids and the records whose label is listed. nil means every record.
func subsetOf(s *wire.Subset, ds dataset.Dataset) (*roaring.Bitmap, error) {
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
	for _, id := range s.IDs {
		if id >= n {
			return nil, specErr("subset id %d is not below the dataset's %d records", id, n)
		}
		b.Add(uint32(id))
	}
	if len(s.Labels) > 0 {
		if ds.Label(0) < 0 {
			return nil, specErr("subset by label, but the dataset has no labels")
		}
		want := map[int]bool{}
		for _, l := range s.Labels {
			want[l] = true
		}
		for id := range n {
			if want[ds.Label(id)] {
				b.Add(uint32(id))
			}
		}
	}
	if b.IsEmpty() {
		return nil, fmt.Errorf("%w: the subset holds no record", dataset.ErrEmpty)
	}
	return b, nil
}

// part keeps the ids of subset (all n records if nil) that fall to part
// k of parts, by a hash of the id: how shared jobs split among ranks and
// DataLoader workers, whose orders are not functions of position to cut.
func part(subset *roaring.Bitmap, n, k, parts int) *roaring.Bitmap {
	if parts <= 1 {
		return subset
	}
	out := roaring.New()
	keep := func(id uint32) {
		if int(mixID(id)%uint64(parts)) == k {
			out.Add(id)
		}
	}
	if subset == nil {
		for id := range n {
			keep(uint32(id))
		}
		return out
	}
	it := subset.Iterator()
	for it.HasNext() {
		keep(it.Next())
	}
	return out
}

func mixID(id uint32) uint64 {
	z := uint64(id) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// subsetSampler is a sampler over a subset of records: base orders
// positions 0..|ids|-1, which name ids.
type subsetSampler struct {
	base sampler.Sampler
	ids  []int32
}

func newSubsetSampler(base func(n int) (sampler.Sampler, error), subset *roaring.Bitmap) (sampler.Sampler, error) {
	ids := make([]int32, 0, subset.GetCardinality())
	it := subset.Iterator()
	for it.HasNext() {
		ids = append(ids, int32(it.Next()))
	}
	b, err := base(len(ids))
	if err != nil {
		return nil, err
	}
	return &subsetSampler{base: b, ids: ids}, nil
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
