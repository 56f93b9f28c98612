package job

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/transform"
)

// EnvOptions configures an Env. The zero value works: local files only,
// a 256 MiB record cache, no persisted outputs.
type EnvOptions struct {
	// Store is where paths are read from; default local files, with no
	// root.
	Store storage.Store
	// CacheBytes is the record cache's budget (shared records, and the
	// stages of buffered and reservoir orders); default 256 MiB.
	CacheBytes int64
	// JobMemory, if set, is the most memory a job is given when its plan
	// names none beyond room for 16 of its batches: a daemon sets it to a
	// fair share of its budget for jobs, so that several default jobs fit
	// at once. 0 leaves the default at 64 MiB or 16 batches.
	JobMemory int64
	// IndexDir is where indexes go when a dataset's own directory is
	// read-only; IndexInDirOnly keeps them there always.
	IndexDir       string
	IndexInDirOnly bool
	// Catalogue, if set, is where persisted transform outputs are found
	// (riffle pack --transform): a job naming a transform reads them
	// instead of transforming. Outputs is the store they are read from.
	Catalogue Catalogue
	Outputs   storage.Store
	// Tier, if set, returns the disk tier in front of the object store,
	// or nil while there is none: each job tells it when it next reads
	// each block.
	Tier func() Futures
	// PageCacheBytes is what the page cache may keep of a job's files:
	// a shuffle it would answer few reads of reads with O_DIRECT when its
	// spec leaves direct unset (job/direct.go). Default half the memory
	// the process may use. Set, it also bounds the pages a share group
	// keeps in the page cache (share.Pages), which by default fill what
	// the cgroup's limit, or the machine, leaves (memoryRoom).
	PageCacheBytes int64
	// Open opens a dataset of expanded names (dataset.ExpandPaths's: a
	// job expands its paths once); default dataset.OpenExpanded (a test
	// holds an open with its own).
	Open func(ctx context.Context, opts dataset.Options, paths ...string) (dataset.Dataset, error)
	// DecodeBytes bounds the memory the jobs' image decodes take at once
	// (transform.Memory); a record whose decode alone would take more is
	// refused, naming it. Default a sixteenth of the memory the process
	// may use.
	DecodeBytes int64
}

// Futures is told when a job next reads each range of an object: the
// daemon's disk tier, which evicts the block next used farthest away.
// fn(object, off, n) is the position of the job's order at which it next
// reads a byte of that range, cache.Never if it will not. The returned
// function removes fn.
type Futures interface {
	AddFuture(fn func(object string, off, n int64) int64) (remove func())
}

// Catalogue finds the persisted outputs of a transform over a source at
// its versions: the directory of their pack, if they are there and
// current.
type Catalogue interface {
	Lookup(paths, versions []string, transform string) (dir string, ok bool)
}

// Env is what the jobs of one process share: the opened datasets, the
// record cache, the share groups, the read engines (one queue per device)
// and the transform workers. A daemon has one; a Go program that loads
// without a daemon makes its own. It is safe for concurrent use.
type Env struct {
	opts    EnvOptions
	store   storage.Store
	cache   *cache.Cache
	sets    *sources
	outputs *sources
	groups  *order.Groups
	workers *loader.Workers
	decode  *transform.Memory // the image decodes' memory, shared by every job's transform
	engMu   sync.Mutex
	engines map[uint64]*storage.Engine
	seq     atomic.Int64
	owned   []func() error
	growMu  sync.Mutex // over the logs of growing datasets

	jobsMu sync.Mutex
	jobs   map[*Job]bool // open, for Close to close
	closed bool
}

// NewEnv makes an Env; Close closes the jobs still open, then ends it.
func NewEnv(opts EnvOptions) (*Env, error) {
	e := &Env{opts: opts, store: opts.Store, engines: map[uint64]*storage.Engine{}, groups: order.NewGroups()}
	if e.store == nil {
		local, err := storage.NewLocal(false, nil)
		if err != nil {
			return nil, err
		}
		e.store = local
		e.owned = append(e.owned, local.Close)
	}
	budget := opts.CacheBytes
	if budget <= 0 {
		budget = 256 << 20
	}
	e.cache = cache.New(cache.Options{Budget: budget, DropUnreferenced: true})
	open := opts.Open
	if open == nil {
		open = dataset.OpenExpanded
	}
	e.sets = newSources(e.store, dataset.Options{IndexDir: opts.IndexDir, IndexInDirOnly: opts.IndexInDirOnly}, open)
	if opts.Catalogue != nil {
		out := opts.Outputs
		if out == nil {
			local, err := storage.NewLocal(false, nil)
			if err != nil {
				return nil, err
			}
			out = local
			e.owned = append(e.owned, local.Close)
		}
		e.outputs = newSources(out, dataset.Options{IndexDir: opts.IndexDir, IndexInDirOnly: true}, open)
	}
	e.workers = loader.NewWorkers(0)
	decode := opts.DecodeBytes
	if decode <= 0 {
		decode = AvailableMemory() / 16
	}
	e.decode = transform.NewMemory(decode)
	return e, nil
}

// Decodes is what the jobs' image decodes hold of their memory.
func (e *Env) Decodes() transform.MemoryStats { return e.decode.Stats() }

// Cache is the record cache the Env's jobs share.
func (e *Env) Cache() *cache.Cache { return e.cache }

// Close closes the datasets kept open, the engines and the workers. Jobs
// must be closed first.
func (e *Env) Close() error {
	// A job still open reads its datasets from other goroutines: it is
	// closed first (its reads end), or closing the datasets under it
	// would fail its reads at random.
	e.jobsMu.Lock()
	open := make([]*Job, 0, len(e.jobs))
	for j := range e.jobs {
		open = append(open, j)
	}
	e.closed = true
	e.jobsMu.Unlock()
	for _, j := range open {
		j.Close()
	}
	e.sets.closeAll()
	if e.outputs != nil {
		e.outputs.closeAll()
	}
	e.workers.Close()
	e.engMu.Lock()
	for k, en := range e.engines {
		en.Close()
		delete(e.engines, k)
	}
	e.engMu.Unlock()
	var first error
	for _, c := range e.owned {
		if err := c(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Device is the read engine of one device and what it has done.
type Device struct {
	// ID is the device (storage.DeviceOf): 0 for objects that are not
	// local files (an object store).
	ID    uint64
	Stats storage.EngineStats
}

// Devices reads the counts of the read engines, one per device the Env's
// jobs have read, in ID order. Safe at any time.
func (e *Env) Devices() []Device {
	e.engMu.Lock()
	out := make([]Device, 0, len(e.engines))
	for id, en := range e.engines {
		out = append(out, Device{ID: id, Stats: en.Stats()})
	}
	e.engMu.Unlock()
	slices.SortFunc(out, func(a, b Device) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// engineFor returns the read engine of the device r's object lives on:
// jobs reading one disk share one queue, whose depth the engine chooses
// from what the device does (storage's depth.go).
func (e *Env) engineFor(r storage.Reader) *storage.Engine {
	dev := storage.DeviceOf(r)
	e.engMu.Lock()
	defer e.engMu.Unlock()
	en, ok := e.engines[dev]
	if !ok {
		en = storage.NewEngine(storage.EngineOptions{})
		e.engines[dev] = en
	}
	return en
}

// Groups lists the Env's share groups and their jobs, for status.
func (env *Env) Groups() []GroupStatus {
	var out []GroupStatus
	for _, g := range env.groups.Status() {
		gs := GroupStatus{Source: g.Source, Records: g.Records, Stats: g.Stats}
		for _, o := range g.Owners {
			gs.Jobs = append(gs.Jobs, o.(*Job))
		}
		slices.SortFunc(gs.Jobs, func(a, b *Job) int { return cmp.Compare(a.ID, b.ID) })
		out = append(out, gs)
	}
	return out
}

// GroupStatus is a share group: its source, its counts and its jobs.
type GroupStatus struct {
	Source  string
	Records int
	Stats   share.Stats
	Jobs    []*Job
}
