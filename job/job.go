package job

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/transform"
	"github.com/riffle-ml/riffle/wire"
)

// Job is one training job: a Plan's batches, epoch after epoch. Next and
// Close may be called from different goroutines; Next from one at a time.
type Job struct {
	ID   int64 // in its Env
	env  *Env
	plan Plan
	src  *source
	// sets is the registry src came from: the Env's datasets, or its
	// persisted outputs.
	sets *sources
	// persisted says the job reads its transform's outputs from a pack.
	persisted bool
	// tf is the transform the job runs (nil for none, or when it reads
	// its persisted outputs); out the plan's transform, parsed once, whose
	// outputs the job delivers either way (their size and shape).
	tf        transform.Transform
	out       transform.Transform
	transform string // canonical, with version; "" for none
	unfuture  func() // stops telling the disk tier when blocks are next used
	objects   map[string]int
	// ord is the job's order (package order): its sampler, smp, and its
	// places in share groups (dependent sampling), its source's or each
	// of its mixture's sources'.
	ord *order.Order
	smp sampler.Sampler
	l   *loader.Loader
	// tokens, of a token corpus, plans batches of its samples (samples,
	// or a mixture's sources'): the records the order shuffles (tokens.go).
	tokens  *sequence.Batcher
	samples []sequence.Samples
	// memory is the job's full memory bound, floor the least it may be
	// given (0 unless its memory bends), arenaOf the allocator's bytes for
	// a bound (memory.go).
	memory  int64
	floor   int64
	arenaOf func(bound int64) int64
	// pages is the job's place with its source's page steward (Env.steward)
	// if it reads raw records of local files through the page cache in
	// an order with an inverse; blind are its places where its reads
	// cannot be told (a shared job's, a mixture's sources'), which keep
	// the steward from dropping.
	pages  atomic.Pointer[share.Reader]
	blind  []*share.Reader
	subset int // records this job reads per epoch (before the ranks split them)
	// generations, of a growing dataset, are the generations of files the
	// job reads.
	generations int
	// epochs the job reads (0: one; negative: without end), as its loader.
	epochs  int
	started time.Time
	once    sync.Once
	closed  atomic.Bool // Close was called: Next gives no more batches
	epoch   int         // of the last batch Next gave, -1 before the first
}

// Alloc gives a job the memory its batches live in, once Open knows how
// much: between ask.Floor and ask.Want bytes (memory.go). It returns the
// allocator and the bytes it was given; Resize tells the job of a change
// later. A daemon gives shared memory (an arena a client maps); nil gives
// the Go heap, all the job wants.
type Alloc func(ask Ask) (loader.Allocator, int64, error)

// open opens a job of plan in env: the dataset (shared with other jobs on
// it), its order (shared with a group, with share), and a loader reading
// ahead within the job's memory bound, into memory from alloc. ctx bounds
// the open only; the job runs until Close.
func (env *Env) open(ctx context.Context, plan Plan, alloc Alloc) (*Job, error) {
	src, generations, err := env.source(ctx, plan)
	if err != nil {
		return nil, err
	}
	j := &Job{ID: env.seq.Add(1), env: env, plan: plan, src: src, sets: env.sets, started: time.Now(), epoch: -1, generations: generations}
	fail := func(err error) (*Job, error) {
		j.leaveSteward()
		if j.ord != nil {
			j.ord.Close()
		}
		j.sets.put(j.src)
		return nil, err
	}
	if plan.Tokens != nil {
		if err := j.tokenSamples(); err != nil {
			return fail(err)
		}
	}
	ds := src.ds
	inf := ds.Info()
	if plan.Transform != "" {
		if j.tf, j.transform, err = transform.New(plan.Transform); err != nil {
			return fail(fmt.Errorf("%w: %w", errSpec, err))
		}
		j.tf = transform.WithMemory(j.tf, env.decode)
		if rs, ok := ds.(dataset.Rows); ok {
			// A transform of rows reads one column (loader/rowtf.go), named
			// in its canonical spelling: the default is chosen here.
			col, err := loader.RowsColumn(rs, transform.Column(plan.Transform))
			if err == nil {
				var spec string
				if spec, err = transform.WithColumn(plan.Transform, col); err == nil {
					if j.tf, j.transform, err = transform.New(spec); err == nil {
						j.tf = transform.WithMemory(j.tf, env.decode)
					}
				}
			}
			if err != nil {
				return fail(fmt.Errorf("%w: %w", errSpec, err))
			}
		} else if col := transform.Column(plan.Transform); col != "" {
			return fail(specErr("transform %s: column=%q names a column of a dataset of rows (Arrow, Parquet, Hugging Face); %s has records",
				plan.Transform, col, inf.Format))
		}
		j.out = j.tf
		if _, rows := ds.(dataset.Rows); !rows && src.parts == nil && !transform.IsRandom(j.tf) {
			j.usePersisted(ctx)
			ds, inf = j.src.ds, j.src.ds.Info()
		}
	}
	// The memory first: an alloc may wait for room in a daemon's budget,
	// and a job waiting there must not yet be a member of its group, to
	// which records would be given that it cannot take.
	_, rows := ds.(dataset.Rows)
	var ask Ask
	if j.tokens != nil {
		ask, err = j.tokenSize()
	} else {
		ask, err = j.size(rows)
	}
	if err != nil {
		return fail(err)
	}
	lopts := plan.Loader
	lopts.MemoryBytes = j.memory
	if alloc != nil {
		var given int64
		if lopts.Alloc, given, err = alloc(ask); err != nil {
			return fail(err)
		}
		if given < ask.Want {
			lopts.MemoryStart = j.boundOf(given)
		}
		if j.floor > 0 && j.floor < j.memory {
			// Its memory may bend from now on: a job that reads nothing
			// before its first batch is asked leaves its memory untouched,
			// to be given to the opens after it, while its process opens
			// them before reading any (jobs read in turn).
			lopts.Lazy = true
		}
	}
	if j.ord, err = j.order(ctx); err != nil {
		return fail(err)
	}
	j.smp, j.subset = j.ord.Sampler, j.ord.Samples
	if t := j.ord.Through; t >= 0 {
		// The order serves epochs up to t (a mixture whose weights change
		// after): the job reads to it, and says so (Description.Epochs).
		if last := t - plan.Loader.Epoch + 1; lopts.Epochs < 0 || lopts.Epochs > last {
			lopts.Epochs = last
		}
	}
	j.epochs = lopts.Epochs
	if j.ord.Direct {
		// A selection that misses the page cache: its records are what
		// the shuffle reads, past it.
		j.src = env.reopenDirect(ctx, plan, j.src)
		ds, inf = j.src.ds, j.src.ds.Info()
	}
	key := cacheKey(j.src, j.cached())
	if j.ord.OwnPart {
		// A member (or a shared rest) covers its own part (rank and worker): no stride.
		lopts.BatchStride, lopts.BatchOffset = 1, 0
	}
	if j.ord.Shared() {
		if lopts.Prefetch == 0 {
			// A shared job reads ahead little, and not before it is asked:
			// records it is given while ahead of its consumer, before
			// others join or while they lag, are records it reads alone.
			lopts.Prefetch = sharedPrefetch
		}
		lopts.Lazy = true
	}
	if lopts.Depth == 0 {
		lopts.Engine = env.engineFor(ds.Object(0))
	} // else an explicit depth pins the job's own engine's, outside the device's shared queue
	lopts.Cache, lopts.CacheKey = env.cache, key
	if j.tf != nil {
		lopts.Transform, lopts.Workers = j.tf, env.workers
		if rows {
			lopts.Column = transform.Column(j.plan.Transform) // "": the default RowsColumn chose above
		}
	}
	if j.tokens != nil {
		// Samples' ids are no records of the dataset (its documents): no
		// steward or disk tier is told of them.
		lopts.Samples = j.tokens
	} else {
		lopts.PastCache = j.pastCache()
	}
	if j.l, err = loader.New(context.Background(), ds, j.smp, lopts); err != nil {
		return fail(fmt.Errorf("%w: %w", errSpec, err))
	}
	if j.tokens == nil {
		j.steward()
	}
	if env.opts.Tier != nil && j.tokens == nil {
		if t := env.opts.Tier(); t != nil {
			j.objects = map[string]int{}
			for i, p := range inf.Paths {
				j.objects[p] = i
			}
			j.unfuture = t.AddFuture(j.nextUse)
		}
	}
	env.jobsMu.Lock()
	if env.closed {
		env.jobsMu.Unlock()
		j.Close()
		return nil, fmt.Errorf("%w: the environment is closed", ErrClosed)
	}
	if env.jobs == nil {
		env.jobs = map[*Job]bool{}
	}
	env.jobs[j] = true
	env.jobsMu.Unlock()
	return j, nil
}

// Open checks spec (Check) and opens its job: the dataset (shared with
// other jobs on it), its order (shared with a group, with share), and a
// loader reading ahead within the job's memory bound, into memory from
// alloc. ctx bounds the open only; the job runs until Close. It is the one
// call a request to open a job makes.
func (env *Env) Open(ctx context.Context, spec *wire.JobSpec, alloc Alloc) (*Job, error) {
	plan, err := Check(spec)
	if err != nil {
		return nil, err
	}
	return env.open(ctx, plan, alloc)
}

// Check says what an open of spec would: the job is made lazy, so that it
// reads and allocates nothing (its batches would be on the Go heap),
// described and closed. The error is the one the open would give.
func (env *Env) Check(ctx context.Context, spec *wire.JobSpec) (Description, error) {
	plan, err := Check(spec)
	if err != nil {
		return Description{}, err
	}
	plan.Loader.Lazy = true
	j, err := env.open(ctx, plan, nil)
	if err != nil {
		return Description{}, err
	}
	defer j.Close()
	return j.Describe(), nil
}

// source opens the plan's dataset: its files, or its mixture's sources
// one after another. Its paths are expanded here, once (a glob, a
// directory's root, an object store's prefix): every open after keys the
// source by, and reads, the names found now.
func (env *Env) source(ctx context.Context, plan Plan) (*source, int, error) {
	if plan.Tokens != nil {
		src, err := env.tokenSource(ctx, plan)
		return src, 0, err
	}
	lists := [][]string{plan.Paths}
	if plan.Mixture != nil {
		lists = plan.Mixture.Sources
	}
	expanded := make([][]string, len(lists))
	for k, paths := range lists {
		if err := env.refuseCorpus(ctx, plan, paths); err != nil {
			return nil, 0, err
		}
		var err error
		if expanded[k], err = dataset.ExpandPaths(ctx, env.store, paths); err != nil {
			if plan.Mixture != nil {
				err = fmt.Errorf("mixture source %d: %w", k, err)
			}
			return nil, 0, err
		}
	}
	if plan.Mixture != nil && plan.Refresh {
		// Each source grows by its own log; their generations are the
		// node's log's for the epoch (a state names none for a mixture).
		var parts []*source
		for k, paths := range plan.Mixture.Sources {
			one := plan
			one.Paths, one.Mixture = paths, nil
			src, _, err := env.grown(ctx, one, expanded[k])
			if err != nil {
				for _, p := range parts {
					env.sets.put(p)
				}
				return nil, 0, fmt.Errorf("mixture source %d: %w", k, err)
			}
			parts = append(parts, src)
		}
		src, err := env.sets.concatOpen(ctx, "growing mixture", parts, plan.Dataset)
		return src, 0, err
	}
	if plan.Mixture != nil {
		src, err := env.sets.mix(ctx, expanded, plan.Dataset)
		return src, 0, err
	}
	if plan.Refresh {
		return env.grown(ctx, plan, expanded[0])
	}
	paths := expanded[0]
	opts := plan.Dataset
	opts.Direct = opts.Direct || readsDirect(plan, paths, env.pageCacheBytes(), env.readingNow(paths, plan))
	src, err := env.sets.get(ctx, paths, opts)
	if err == nil && opts.Direct && !plan.Dataset.Direct {
		// Chosen before the open, which says what they are: a dataset of
		// rows reads its pages through readers of its own (job/direct.go).
		if _, rows := src.ds.(dataset.Rows); rows {
			env.sets.put(src)
			src, err = env.sets.get(ctx, paths, plan.Dataset)
		}
	}
	return src, 0, err
}

// usePersisted switches the job to its transform's persisted outputs
// (OneAccess §3) when the catalogue has them for this source and they are
// current: the job then reads them instead of transforming.
func (j *Job) usePersisted(ctx context.Context) {
	env := j.env
	if env.opts.Catalogue == nil || env.outputs == nil {
		return
	}
	inf := j.src.ds.Info()
	dir, ok := env.opts.Catalogue.Lookup(inf.Paths, inf.Versions, j.transform)
	if !ok {
		return
	}
	pe, err := env.outputs.get(ctx, []string{dir}, dataset.Options{})
	if err != nil {
		slog.Warn("persisted outputs not read", "dir", dir, "err", err)
		return
	}
	if pe.ds.Len() != j.src.ds.Len() {
		env.outputs.put(pe)
		return
	}
	j.sets.put(j.src)
	j.src, j.sets, j.persisted, j.tf = pe, env.outputs, true, nil
}

// sharedPrefetch is how many batches a sharing job reads ahead by default.
const sharedPrefetch = 2

// Next returns the job's next batch, or io.EOF after its last epoch. The
// batch is the caller's until its Release.
//
// A job reads its dataset as it was when it opened. Before the first batch
// of each later epoch it checks the files' versions (the files of a glob,
// a directory's root and class folders: one stat each), and a dataset
// changed since is an error that says so, never an epoch over other
// records, or over files it still holds open after they were removed.
func (j *Job) Next(ctx context.Context) (*loader.Batch, error) {
	if j.closed.Load() {
		return nil, fmt.Errorf("%w: the job is closed", ErrClosed)
	}
	b, err := j.l.Next(ctx)
	if errors.Is(err, storage.ErrChanged) {
		// A read found a file changed (the loader reads ahead, so perhaps
		// before this epoch's check): the same advice.
		return nil, fmt.Errorf("%w; build a new loader to read the dataset as it is now", err)
	}
	if err != nil {
		return b, err
	}
	if r := j.pages.Load(); r != nil {
		r.Read(b.IDs)
	}
	if b.Epoch == j.epoch {
		return b, nil
	}
	first := j.epoch < 0
	j.epoch = b.Epoch
	if !first && !j.sets.current(ctx, j.src) {
		b.Release()
		return nil, fmt.Errorf("%s: %w: files were added, removed or rewritten since this job opened it; build a new loader to read it as it is now",
			j.src.desc(), storage.ErrChanged)
	}
	return b, nil
}

// Order is what the job's order is (package order's answer): its kind as
// resolved, how a place in it resumes, and whether a batch's records are
// delivered as they lie in its memory (Packed: loader.Batch.PackedOrder).
func (j *Job) Order() wire.OrderInfo { return j.ord.Info() }

// Memory is the job's bound on batches in flight and held now (Resize
// moves it), FullMemory the most it may be.
func (j *Job) Memory() int64     { return j.l.Memory() }
func (j *Job) FullMemory() int64 { return j.memory }

// Place is the job's place (the next batch it delivers) without the
// sampler's state; stream says whether the order has a state to save.
func (j *Job) Place() (st loader.State, stream bool) { return j.l.Place() }

// State is the job's place with the order's state, and StateAt the state
// at the place after one of the last batches delivered.
func (j *Job) State() loader.State { return j.l.State() }
func (j *Job) StateAt(epoch, batch int) (loader.State, error) {
	return j.l.StateAt(epoch, batch)
}

// Depth is the reads in flight the job's engine has chosen (or its
// depth, if the plan pinned one).
func (j *Job) Depth() int { return j.l.Depth() }

// Stats are the job's loader's counts.
func (j *Job) Stats() loader.Stats { return j.l.Stats() }

// Location is where a record is: its object (file) and byte offset.
type Location struct {
	Path   string
	Offset int64
}

// Locate says where records are, for errors a client reports about one.
func (j *Job) Locate(ids []int) ([]Location, error) {
	if j.tokens != nil {
		return nil, specErr("a token corpus's samples are not records of its files: sample i of an epoch is its pieces of documents, which differ by epoch; an error about a token names its file and offset itself")
	}
	ds := j.src.ds
	out := make([]Location, 0, len(ids))
	for _, id := range ids {
		if id < 0 || id >= ds.Len() {
			return nil, fmt.Errorf("%w: record %d is not in [0, %d)", errSpec, id, ds.Len())
		}
		loc := ds.Locate(id)
		out = append(out, Location{Path: ds.Object(loc.Object).Name(), Offset: loc.Off})
	}
	return out, nil
}

// Description is what a client is told when a job opens: the dataset and
// the counts it iterates by.
type Description struct {
	Records   int // in the dataset
	Positions int // per epoch for this job (its rank's part, its part of a group)
	Batches   int // it delivers per epoch
	// Left is how many batches it delivers of the epoch it opened at, from
	// the batch it opened at.
	Left    int
	Samples int // per epoch over every rank: its subset's size, or the dataset's
	// Version names the version of the dataset's files (a hash of their
	// versions).
	Version   string
	Memory    int64 // its bound on batches in flight and held
	Info      dataset.Info
	Transform string // canonical, with version
	Persisted bool
	Shared    bool
	// Stream says the order has a state batches do not carry (ask StateAt).
	Stream bool
	// Output is the transform's output record: its size, dtype and shape.
	OutputSize  int
	OutputDtype string
	OutputShape []int
	Columns     []columnar.Column
	// Offsets, for a mixture, are each source's first id.
	Offsets []int
	// Generations, of a growing dataset, are the generations of files it
	// reads.
	Generations int
	// Auto is the order sampler auto chose.
	Auto *order.Auto
	// Order is what the job's order is: its kind as resolved, how a
	// place in it resumes, whether a batch's records are delivered as
	// they lie in its memory (Order.Packed).
	Order wire.OrderInfo
	// Direct says the job reads its files with O_DIRECT (job/direct.go).
	Direct bool
	// Delivered, for the rest of a shared order's epoch, is what the
	// places it was opened with delivered, as one state.
	Delivered []byte
	// Tokens, of a token corpus, describes its samples and the arrays of
	// a batch (Records are then the epoch's samples).
	Tokens *wire.Tokens
	// Epochs is how many epochs the job reads from its epoch, 0 without
	// end: fewer than asked when its order serves fewer (a mixture whose
	// weights change, best_fit's epochs), whose next is a job of its own.
	Epochs int
}

// Describe describes the job as it opened.
func (j *Job) Describe() Description {
	inf := j.src.ds.Info()
	d := Description{Records: j.src.ds.Len(), Positions: j.smp.Len(), Batches: j.l.Count(), Left: j.l.Left(j.plan.Loader.Batch),
		Memory: j.memory, Info: inf, Transform: j.transform, Persisted: j.persisted, Shared: j.ord.Shared(),
		Columns: inf.Columns, Samples: j.subset, Version: fmt.Sprintf("%016x", spaceOf(inf, j.src.key.String(), ""))}
	if j.out != nil {
		d.OutputSize = j.out.Size()
		d.OutputDtype, d.OutputShape = j.out.Shape()
	}
	if c, ok := j.src.ds.(concatenated); ok && j.plan.Mixture != nil && j.tokens == nil {
		d.Offsets = c.Offsets()
	}
	d.Generations, d.Auto, d.Delivered, d.Direct = j.generations, j.ord.Auto, j.ord.Delivered, j.src.key.direct
	d.Epochs = max(0, j.epochs)
	if j.epochs == 0 {
		d.Epochs = 1
	}
	d.Order = j.Order()
	if j.tokens != nil {
		d.Records, d.Tokens = j.tokens.Len(j.plan.Loader.Epoch), j.tokensInfo()
		if j.plan.Mixture != nil {
			offs := j.tokens.Offsets(j.plan.Loader.Epoch)
			d.Offsets = offs[:len(offs)-1] // source k's sample i is id Offsets[k]+i, in the job's first epoch
		}
	}
	if schema, cols := j.l.RowsOutput(); schema != nil {
		// A transform of rows puts its outputs in its column's place.
		d.Info.Schema, d.Info.Columns, d.Columns = schema, cols, cols
	}
	_, stream := j.l.Place()
	d.Stream = stream
	return d
}

// Status is a job's line in `riffle status`.
type Status struct {
	ID         int64
	Source     string
	Subset     int
	Epoch      int
	Position   int
	SamplesSec float64
	Transform  string
	Shared     bool
	Records    int
	Auto       *order.Auto // the order sampler auto chose
	Direct     bool        // reads with O_DIRECT
	// PagesKept and PagesDropped are the pages of the job's source the
	// source's steward keeps in the page cache and has dropped, for the
	// jobs that read it each in its own order (a share group's are the
	// group's); RecordsPassed the records it had read past the cache,
	// whose pages it would have dropped before their next read.
	PagesKept, PagesDropped, RecordsPassed int64
}

// Status describes the job now; records is how many it delivered.
func (j *Job) Status(records int64) Status {
	st, _ := j.l.Place()
	el := time.Since(j.started).Seconds()
	s := Status{ID: j.ID, Source: j.src.desc(), Subset: j.subset, Epoch: st.Epoch, Position: st.Batch * j.plan.Loader.BatchSize,
		SamplesSec: float64(records) / max(el, 1e-9), Transform: j.transform, Shared: j.ord.Shared(), Records: j.src.ds.Len(),
		Auto: j.ord.Auto, Direct: j.src.key.direct}
	if j.src.parts == nil && (j.pages.Load() != nil || len(j.blind) > 0) {
		// Its places came from the source's steward, made by then.
		s.PagesKept, s.PagesDropped, s.RecordsPassed = j.src.steward.Stats()
	}
	return s
}

// Close stops the job's loader and leaves its group. The loader's reads
// end before Close returns, so the memory alloc gave may go after it.
func (j *Job) Close() {
	j.once.Do(func() {
		j.closed.Store(true)
		j.env.jobsMu.Lock()
		delete(j.env.jobs, j)
		j.env.jobsMu.Unlock()
		j.l.Close()
		if j.unfuture != nil {
			j.unfuture()
		}
		j.leaveSteward()
		j.ord.Close()
		j.sets.put(j.src)
	})
}

// cached names what the cache keeps of the job's records, for their keys
// and share groups: its transform's outputs, or ("") the records, with no
// transform or a random one, whose outputs differ per job and epoch.
func (j *Job) cached() string {
	if j.tf == nil || transform.IsRandom(j.tf) {
		return ""
	}
	return j.transform
}

// cacheKey names the dataset's records in the cache by the file each
// lives in and its index there, so jobs whose file lists overlap share the
// files they have in common.
func cacheKey(src *source, tf string) func(int) cache.Key {
	if src.parts != nil {
		// A mixture's records are its sources': jobs on a source share
		// them with every mixture of it.
		c := src.ds.(concatenated)
		keys := make([]func(int) cache.Key, len(src.parts))
		for k, p := range src.parts {
			keys[k] = cacheKey(p, tf)
		}
		return func(id int) cache.Key {
			k, i := c.Part(id)
			return keys[k](i)
		}
	}
	ds := src.ds
	inf := ds.Info()
	o, ok := ds.(dataset.Originer)
	if !ok || len(inf.Versions) != len(inf.Paths) {
		space := spaceOf(inf, src.key.String(), tf)
		return func(id int) cache.Key { return cache.Key{Space: space, ID: int64(id)} }
	}
	spaces := make([]uint64, len(inf.Paths))
	for k := range spaces {
		fi := inf
		fi.Versions = inf.Versions[k : k+1]
		spaces[k] = spaceOf(fi, src.key.Options(), tf)
	}
	return func(id int) cache.Key {
		k, idx := o.Origin(id)
		return cache.Key{Space: spaces[k], ID: int64(idx)}
	}
}

// concatenated is a mixture's dataset (dataset.NewConcat's).
type concatenated interface {
	Part(id int) (k, local int)
	Offsets() []int
	Parts() []dataset.Dataset
}
