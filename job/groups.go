package job

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/share"
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
	key     string
	g       *share.Group
	source  string
	records int
	jobs    map[*Job]bool
}

func newGroups() *groups { return &groups{all: map[string]*groupEntry{}} }

// membership is a job's place in a share group: a job joins its
// source's group, a mixture the group of each of its sources.
type membership struct {
	m  *share.Member
	ge *groupEntry
}

// join puts j in src's group (jobs on src naming j's transform), making
// the group of opts if need be.
func (gs *groups) join(j *Job, src *source, opts share.Options, subset *roaring.Bitmap, epoch int) (*share.Member, error) {
	k := fmt.Sprintf("%s|%s", src.key, j.cached())
	gs.mu.Lock()
	defer gs.mu.Unlock()
	ge, ok := gs.all[k]
	if !ok {
		opts.Records = src.ds.Len()
		ge = &groupEntry{key: k, source: src.desc(), records: src.ds.Len(), jobs: map[*Job]bool{}, g: share.NewGroup(opts)}
		gs.all[k] = ge
	}
	m, err := ge.g.Join(subset, epoch)
	if err != nil {
		if len(ge.jobs) == 0 && ge.g.Stats().Members == 0 {
			delete(gs.all, k)
		}
		return nil, err
	}
	ge.jobs[j] = true
	j.shares = append(j.shares, membership{m, ge})
	return m, nil
}

// leave takes j out of its groups, and a group away after its last job.
func (gs *groups) leave(j *Job) {
	for _, s := range j.shares {
		s.m.Leave()
	}
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, s := range j.shares {
		ge := s.ge
		delete(ge.jobs, j)
		if ge.g.Stats().Members == 0 && gs.all[ge.key] == ge {
			delete(gs.all, ge.key)
		}
	}
	// j.shares stay, read by Status while the job closes: leaving twice
	// is leaving once.
}

// Groups lists the Env's share groups and their jobs, for status.
func (env *Env) Groups() []GroupStatus {
	gs := env.groups
	gs.mu.Lock()
	defer gs.mu.Unlock()
	var out []GroupStatus
	for _, ge := range gs.all {
		g := GroupStatus{Source: ge.source, Records: ge.records, Stats: ge.g.Stats()}
		for j := range ge.jobs {
			g.Jobs = append(g.Jobs, j)
		}
		slices.SortFunc(g.Jobs, func(a, b *Job) int { return cmp.Compare(a.ID, b.ID) })
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b GroupStatus) int { return cmp.Compare(a.Source, b.Source) })
	return out
}

// GroupStatus is a share group: its source, its counts and its jobs.
type GroupStatus struct {
	Source  string
	Records int
	Stats   share.Stats
	Jobs    []*Job
}
