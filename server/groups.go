package server

import (
	"fmt"
	"hash/fnv"
	"slices"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/wire"
)

// groups holds the daemon's share groups: jobs on the same source (files
// and options) naming the same transform, that asked to share, sample
// dependently in one group (package share) and read each record once for
// all of them into the one cache.
type groups struct {
	mu  sync.Mutex
	all map[string]*groupEntry
}

type groupEntry struct {
	key    string
	g      *share.Group
	space  uint64
	source string
	jobs   map[*job]bool
}

func newGroups() *groups { return &groups{all: map[string]*groupEntry{}} }

// join puts j in its source's group, making the group if need be.
func (gs *groups) join(j *job, c *cache.Cache, key func(int) cache.Key, size func(int) int, mean int, subset *roaring.Bitmap, epoch int) (*share.Member, *groupEntry, error) {
	k := fmt.Sprintf("%s|%s", j.ds.key, j.transform)
	gs.mu.Lock()
	defer gs.mu.Unlock()
	ge, ok := gs.all[k]
	if !ok {
		ge = &groupEntry{key: k, source: j.ds.desc(), jobs: map[*job]bool{},
			g: share.NewGroup(share.Options{Records: j.ds.ds.Len(), Cache: c, Key: key, Size: size, MeanSize: mean})}
		gs.all[k] = ge
	}
	m, err := ge.g.Join(subset, epoch)
	if err != nil {
		if len(ge.jobs) == 0 && ge.g.Stats().Members == 0 {
			delete(gs.all, k)
		}
		return nil, nil, err
	}
	return m, ge, nil
}

// show lists j among its group's jobs, once it is open.
func (gs *groups) show(j *job) {
	if j.group == nil {
		return
	}
	gs.mu.Lock()
	j.group.jobs[j] = true
	gs.mu.Unlock()
}

// leave takes j out of its group, and the group away after its last job.
func (gs *groups) leave(j *job) {
	if j.member == nil {
		return
	}
	j.member.Leave()
	gs.mu.Lock()
	defer gs.mu.Unlock()
	ge := j.group
	delete(ge.jobs, j)
	if ge.g.Stats().Members == 0 && gs.all[ge.key] == ge {
		delete(gs.all, ge.key)
	}
}

// status describes the groups and their jobs.
func (gs *groups) status() []wire.GroupStatus {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var out []wire.GroupStatus
	for _, ge := range gs.all {
		st := ge.g.Stats()
		g := wire.GroupStatus{Source: ge.source, Shared: st.Shared, Rounds: st.Rounds, Given: st.Given, Saved: st.Saved}
		for j := range ge.jobs {
			g.Records = j.ds.ds.Len()
			g.Jobs = append(g.Jobs, j.status())
		}
		slices.SortFunc(g.Jobs, func(a, b wire.JobStatus) int { return compareStrings(a.ID, b.ID) })
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b wire.GroupStatus) int { return compareStrings(a.Source, b.Source) })
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

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
