package order

import (
	"cmp"
	"slices"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/share"
)

// Groups holds a process's share groups: the orders over one source (its
// files and options, Source.Group) naming the same transform, that asked
// to share, sample dependently in one group (package share) and read each
// record once for all of them into the one cache. Safe for concurrent use.
type Groups struct {
	mu  sync.Mutex
	all map[string]*groupEntry
}

type groupEntry struct {
	key     string
	g       *share.Group
	source  string
	records int
	owners  map[any]int // the members each owner holds
}

// NewGroups makes an empty registry of share groups.
func NewGroups() *Groups { return &Groups{all: map[string]*groupEntry{}} }

// membership is an order's place in a share group: a job's order joins
// its source's group, a mixture's the group of each of its sources.
type membership struct {
	m     *share.Member
	ge    *groupEntry
	owner any
}

// join puts a member of owner's in src's group, making the group of opts
// if need be.
func (gs *Groups) join(owner any, src *Source, opts share.Options, subset *roaring.Bitmap, epoch int) (*share.Member, membership, error) {
	k := src.Group
	records := src.DS.Len()
	if src.Tokens != nil {
		records = src.Tokens.Len(epoch) // a token corpus's samples; Group keys best_fit's by epoch
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	ge, ok := gs.all[k]
	if !ok {
		opts.Records = records
		ge = &groupEntry{key: k, source: src.Name, records: records, owners: map[any]int{}, g: share.NewGroup(opts)}
		gs.all[k] = ge
	}
	m, err := ge.g.Join(subset, epoch)
	if err != nil {
		if len(ge.owners) == 0 && ge.g.Stats().Members == 0 {
			delete(gs.all, k)
		}
		return nil, membership{}, err
	}
	ge.owners[owner]++
	return m, membership{m, ge, owner}, nil
}

// leave takes members out of their groups, and a group away after its
// last member.
func (gs *Groups) leave(ms []membership) {
	if len(ms) == 0 {
		return
	}
	for _, s := range ms {
		s.m.Leave()
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, s := range ms {
		ge := s.ge
		if ge.owners[s.owner]--; ge.owners[s.owner] <= 0 {
			delete(ge.owners, s.owner)
		}
		if ge.g.Stats().Members == 0 && gs.all[ge.key] == ge {
			delete(gs.all, ge.key)
		}
	}
}

// GroupStatus is a share group: its source, its counts and the owners of
// its members (the jobs).
type GroupStatus struct {
	Source  string
	Records int
	Stats   share.Stats
	Owners  []any
}

// Status lists the groups, by source.
func (gs *Groups) Status() []GroupStatus {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var out []GroupStatus
	for _, ge := range gs.all {
		g := GroupStatus{Source: ge.source, Records: ge.records, Stats: ge.g.Stats()}
		for o := range ge.owners {
			g.Owners = append(g.Owners, o)
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b GroupStatus) int { return cmp.Compare(a.Source, b.Source) })
	return out
}
