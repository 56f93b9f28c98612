package job

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/riffle-ml/riffle/corpus"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
)

// sources shares opened datasets between jobs: jobs on the same files with
// the same options use one Dataset, its index loaded once. An unused
// dataset stays open for keepOpen, so a client that opens a job per epoch
// does not reload its index each time.
//
// Opening happens outside the registry's lock, one open per dataset: a
// second job on a dataset being opened (a long index build) waits for that
// open, and jobs on other datasets wait for nothing. A dataset reused from
// the registry is checked first against its objects' versions now (size,
// inode, mtime, ctime): a file rewritten in place is opened anew, never served
// stale.
type sources struct {
	store storage.Store
	opts  dataset.Options // defaults every job's options start from

	mu   sync.Mutex
	open map[sourceKey]*source

	opener func(ctx context.Context, opts dataset.Options, paths ...string) (dataset.Dataset, error)
}

// sourceKey is a source's identity: its files and every option that
// decides its records' bytes. A struct, not a string to parse back.
// direct is how they are read: sources apart, the same records (one
// String, so one cache space and one share group).
type sourceKey struct {
	paths  string // the files, quoted
	opts   string // the options
	direct bool
}

// pathsKey is a source key's files.
func pathsKey(paths []string) string { return fmt.Sprintf("%q", paths) }

// String is the whole identity, for naming the source's records.
func (k sourceKey) String() string { return k.paths + " " + k.opts }

// Options is the identity's options part: with one file's version, it
// names that file's records, so jobs whose file lists overlap share them.
func (k sourceKey) Options() string { return k.opts }

// source is one opened dataset and the jobs using it.
type source struct {
	key   sourceKey
	paths []string // the files it was opened with (expanded)
	ds    dataset.Dataset
	err   error
	ready chan struct{} // closed once the open finished
	refs  int
	timer *time.Timer
	stale bool // replaced by a newer open; closed when its last job ends
	// maxBatch remembers maxBatchBytes per batch size: a scan of every
	// record's length, once per dataset.
	maxBatch sync.Map
	// samples keeps a token corpus's samples per sequence.Options, made
	// once (samplesOf): an epoch's table is a pass over every document,
	// which a job's check, its open and the jobs after it reading the
	// corpus alike would each make again.
	samples sync.Map
	// parts, for a mixture, are its sources, each held in the registry as
	// any dataset is (so jobs on a source and mixtures of it share it),
	// and ds puts them one after another; the mixture itself is not in
	// the registry.
	parts []*source
	// union, for parts of rows, is all their files opened as one dataset:
	// ds reads through it.
	union *source
	// pages numbers ds's pages for the share groups over it, once
	// (Env.pages).
	pagesOnce sync.Once
	pages     *share.Pages
	// steward keeps the pages the jobs reading ds each in its own order
	// read soonest (Env.steward), made with the first of them.
	stewardOnce sync.Once
	steward     *share.Steward
}

const keepOpen = 30 * time.Second

func newSources(store storage.Store, opts dataset.Options, open func(context.Context, dataset.Options, ...string) (dataset.Dataset, error)) *sources {
	return &sources{store: store, opts: opts, open: map[sourceKey]*source{}, opener: open}
}

func (d *sources) get(ctx context.Context, paths []string, opts dataset.Options) (*source, error) {
	opts.Store, opts.IndexDir, opts.IndexInDirOnly, opts.Progress = d.store, d.opts.IndexDir, d.opts.IndexInDirOnly, nil
	key := sourceKey{paths: pathsKey(paths), opts: opts.Key(), direct: opts.Direct}
	return d.getKey(ctx, key, paths, func(ctx context.Context) (dataset.Dataset, error) { return d.opener(ctx, opts, paths...) })
}

// getWith is get of a dataset that open makes (a token corpus's
// documents) under its own options key: the registry's sharing, versions
// and keeping open, with another opener.
func (d *sources) getWith(ctx context.Context, paths []string, opts string, open func(context.Context) (dataset.Dataset, error)) (*source, error) {
	return d.getKey(ctx, sourceKey{paths: pathsKey(paths), opts: opts}, paths, open)
}

// getKey is the dataset of key from the registry, opened by open if none
// is (or if the one there is stale).
func (d *sources) getKey(ctx context.Context, key sourceKey, paths []string, open func(context.Context) (dataset.Dataset, error)) (*source, error) {
	for {
		d.mu.Lock()
		e, ok := d.open[key]
		if !ok {
			e = &source{key: key, paths: paths, ready: make(chan struct{}), refs: 1}
			d.open[key] = e
			d.mu.Unlock()
			e.ds, e.err = d.safeOpen(ctx, paths, open)
			d.mu.Lock()
			if e.err != nil {
				delete(d.open, key)
			}
			close(e.ready)
			d.mu.Unlock()
			if e.err != nil {
				return nil, e.err
			}
			return e, nil
		}
		e.refs++
		if e.timer != nil {
			e.timer.Stop()
			e.timer = nil
		}
		d.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			d.put(e)
			return nil, ctx.Err()
		}
		if e.err != nil {
			d.put(e)
			if isCanceled(e.err) && ctx.Err() == nil {
				continue // its opener gave up, this job has not: open again
			}
			return nil, e.err
		}
		if d.current(ctx, e) {
			return e, nil
		}
		d.retire(e)
		d.put(e)
	}
}

// concatPart is one of the datasets a source puts one after another: a
// mixture's source, or a growing dataset's generation.
type concatPart struct {
	paths []string // expanded
	opts  dataset.Options
	name  string // for errors: "mixture source 2"
}

// concat opens each part and puts them one after another, under name.
func (d *sources) concat(ctx context.Context, name string, parts []concatPart) (*source, error) {
	opened := make([]*source, 0, len(parts))
	for _, p := range parts {
		e, err := d.get(ctx, p.paths, p.opts)
		if err != nil {
			for _, o := range opened {
				d.put(o)
			}
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		opened = append(opened, e)
	}
	return d.concatOpen(ctx, name, opened, parts[0].opts)
}

// concatOpen puts sources opened already one after another, under name
// (a mixture's sources, a growing dataset's generations, or a mixture of
// growing sources). They become the new source's: putting it puts them.
// Sources of rows are read as one dataset of all their files (opened
// with opts), which puts a batch's rows together whoever's they are.
func (d *sources) concatOpen(ctx context.Context, name string, parts []*source, opts dataset.Options) (*source, error) {
	m := &source{refs: 1, ready: make(chan struct{}), parts: parts}
	close(m.ready)
	ds := make([]dataset.Dataset, len(parts))
	for i, p := range parts {
		ds[i] = p.ds
	}
	var err error
	if m.union, err = d.rowsUnion(ctx, ds, opts); err != nil {
		d.put(m)
		return nil, fmt.Errorf("%s of rows read as one: %w", name, err)
	}
	if m.union != nil {
		m.ds, err = dataset.NewRowsUnion(m.union.ds.(dataset.Rows), ds)
	} else {
		m.ds, err = dataset.NewConcat(ds)
	}
	if err != nil {
		d.put(m)
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	keys := make([]string, len(parts))
	for i, p := range parts {
		keys[i] = p.key.paths
	}
	m.key = sourceKey{paths: name + " of " + strings.Join(keys, " "), opts: parts[0].key.opts}
	return m, nil
}

// rowsUnion opens datasets of rows (every one of rows, of one format,
// from files) as one dataset of all their files; nil if they are not all
// rows. Their schemas must agree, as those of one dataset's files do. A
// Hugging Face directory is its Arrow files (state.json lists them), so
// it mixes with other directories and with Arrow files: the union opens
// the files as Arrow, with no split to pick.
func (d *sources) rowsUnion(ctx context.Context, ds []dataset.Dataset, opts dataset.Options) (*source, error) {
	files := func(inf dataset.Info) string {
		if inf.Format == "hf" {
			return "arrow"
		}
		return inf.Format
	}
	first := ds[0].Info()
	var all []string
	hf := false
	for _, p := range ds {
		if _, rows := p.(dataset.Rows); !rows {
			return nil, nil
		}
		hf = hf || p.Info().Format == "hf"
	}
	for k, p := range ds {
		inf := p.Info()
		if files(inf) != files(first) {
			return nil, fmt.Errorf("%w: source %d, %s (%s), with source 0, %s (%s): rows mix only with rows whose files are of one format "+
				"(Parquet with Parquet; Arrow files and Hugging Face directories, whose files are Arrow, together)",
				errSpec, k, rowsName(inf), inf.Format, rowsName(first), first.Format)
		}
		if !reflect.DeepEqual(inf.Columns, first.Columns) {
			return nil, fmt.Errorf("%w: source %d, %s (%s): its columns %s differ from source 0's, %s (%s): %s; mixed rows are read as one dataset, of one schema",
				errSpec, k, rowsName(inf), inf.Format, columnNames(inf), rowsName(first), first.Format, columnNames(first))
		}
		all = append(all, inf.Paths...)
	}
	if hf {
		opts.Format, opts.Split = "arrow", ""
	}
	return d.get(ctx, all, opts)
}

// rowsName names a source of rows for errors: a Hugging Face directory
// (or its split's) rather than its first Arrow file.
func rowsName(inf dataset.Info) string {
	if inf.Format == "hf" {
		return filepath.Dir(inf.Paths[0])
	}
	return inf.Paths[0]
}

// columnNames are a dataset of rows' columns with their types, for errors.
func columnNames(inf dataset.Info) string {
	names := make([]string, len(inf.Columns))
	for i, c := range inf.Columns {
		names[i] = c.Name + " " + c.Type
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// mix opens each source of a mixture (its files, expanded) and puts them
// one after another.
func (d *sources) mix(ctx context.Context, srcs [][]string, opts dataset.Options) (*source, error) {
	parts := make([]concatPart, len(srcs))
	for i, paths := range srcs {
		parts[i] = concatPart{paths: paths, opts: opts, name: fmt.Sprintf("mixture source %d", i)}
	}
	return d.concat(ctx, "mixture", parts)
}

// safeOpen opens a dataset. A parser's panic on a malformed file is a bug,
// but one job's file must not take the daemon and every other job with
// it: it becomes this job's error.
func (d *sources) safeOpen(ctx context.Context, paths []string, open func(context.Context) (dataset.Dataset, error)) (ds dataset.Dataset, err error) {
	defer func() {
		if p := recover(); p != nil {
			slog.Error("panic opening a dataset", "paths", paths, "panic", p, "stack", string(debug.Stack()))
			ds, err = nil, fmt.Errorf("riffle failed opening %s (a bug; the daemon's log has the details): %v", paths[0], p)
		}
	}()
	return open(ctx)
}

func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// current reports whether e's objects are still the versions it was
// opened from.
func (d *sources) current(ctx context.Context, e *source) bool {
	if e.parts != nil {
		for _, p := range e.parts {
			if !d.current(ctx, p) {
				return false
			}
		}
		return true
	}
	inf := e.ds.Info()
	names := inf.Paths
	if inf.Format == "dir" && len(inf.Classes) > 0 {
		root := inf.Paths[0]
		names = []string{root}
		for _, c := range inf.Classes {
			names = append(names, filepath.Join(root, c))
		}
	}
	if len(names) != len(inf.Versions) {
		return false
	}
	for i, n := range names {
		st, err := d.store.Stat(ctx, n)
		if err != nil || st.Version != inf.Versions[i] {
			return false
		}
	}
	return true
}

// retire takes a stale entry out of the registry; it is closed when its
// last job ends.
func (d *sources) retire(e *source) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open[e.key] == e {
		delete(d.open, e.key)
	}
	e.stale = true
}

func (d *sources) put(e *source) {
	if e.parts != nil || e.key.paths == "" {
		for _, p := range e.parts {
			d.put(p)
		}
		if e.union != nil {
			d.put(e.union)
		}
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	e.refs--
	if e.refs > 0 || e.ds == nil {
		return
	}
	if e.stale || d.open[e.key] != e {
		e.ds.Close()
		return
	}
	e.timer = time.AfterFunc(keepOpen, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if e.refs == 0 && d.open[e.key] == e {
			delete(d.open, e.key)
			e.ds.Close()
		}
	})
}

func (d *sources) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, e := range d.open {
		if e.timer != nil {
			e.timer.Stop()
		}
		if e.ds != nil {
			e.ds.Close()
		}
		delete(d.open, k)
	}
}

// keys lists the datasets open now, for tests.
func (d *sources) keys() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for k := range d.open {
		out = append(out, k.String())
	}
	slices.Sort(out)
	return out
}

// desc names the dataset for people: its files and format.
func (e *source) desc() string {
	inf := e.ds.Info()
	name := inf.Paths[0]
	if len(inf.Paths) > 1 {
		name = fmt.Sprintf("%s and %d more", name, len(inf.Paths)-1)
	}
	return fmt.Sprintf("%s (%s)", name, inf.Format)
}

// files are the files src's records are read from, as it was opened
// (expanded): a concatenation's, its parts' one after another (a union
// of rows, the union's).
func (e *source) files() []string {
	switch {
	case e.union != nil:
		return e.union.paths
	case e.parts != nil:
		var out []string
		for _, p := range e.parts {
			out = append(out, p.files()...)
		}
		return out
	}
	return e.paths
}

// spaceOf keys a source's records (through a transform) in the cache: a
// hash of the objects' versions, the options and the transform.
func spaceOf(inf dataset.Info, key, transform string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s|%q|%s", key, inf.Versions, transform)
	return h.Sum64()
}

type samplesOnce struct {
	once sync.Once
	s    sequence.Samples
	err  error
}

// samplesOf is corpus c's samples cut as opts says, made once for this
// source: sequence.Samples are pure functions of (epoch, i), safe for
// concurrent use, so every job reading them alike shares their tables.
func (e *source) samplesOf(c *corpus.Corpus, opts sequence.Options) (sequence.Samples, error) {
	v, _ := e.samples.LoadOrStore(opts, &samplesOnce{})
	o := v.(*samplesOnce)
	o.once.Do(func() { o.s, o.err = sequence.New(c, opts) })
	return o.s, o.err
}
