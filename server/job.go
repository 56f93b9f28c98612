package server

import (
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/transform"
	"github.com/riffle-ml/riffle/wire"
)

// job is one client's loader over one dataset. Its next requests are
// served in order by a goroutine of its own, so that a job waiting for
// memory or reads never stalls another job's requests on the connection,
// nor the reading of the connection (and so of its releases).
type job struct {
	s    *Server
	id   int   // on its connection
	gid  int64 // in the daemon
	cfg  jobConfig
	ds   *dsEntry
	sets *datasets
	// persisted says the job reads its transform's outputs from a pack.
	persisted bool
	unfuture  func()         // stops telling the disk tier when blocks are next used
	objects   map[string]int // the dataset's objects by name, for nextUse
	smp       sampler.Sampler
	l         *loader.Loader
	arena     *Arena
	inline    bool
	ctx       context.Context
	cancel    context.CancelFunc
	memory    int64

	reqs chan uint64 // tags of next requests, served in order
	done chan struct{}

	transform string        // canonical, with version; "" for none
	member    *share.Member // set when the job samples dependently in a group
	group     *groupEntry
	subset    int // records this job reads per epoch (before sharding)

	mu   sync.Mutex
	seq  uint64
	held map[uint64]heldBatch // handed to the client, not yet released
	once sync.Once

	started        time.Time
	records, bytes atomic.Int64
	epoch, batch   atomic.Int64 // the next batch, for status
}

// maxQueued bounds a job's next requests waiting to be served.
const maxQueued = 64

// sharedPrefetch is how many batches a sharing job reads ahead by default.
const sharedPrefetch = 2

// jobMemory is a job's bound on batches in flight and held when the client
// does not give one: room for 16 batches of meanRecord-byte records and
// two of the largest, at least 64 MiB, at most what one job may have.
func jobMemory(meanRecord int64, batch int, maxBatch int64) int64 {
	m := max(64<<20, mulSat(16, mulSat(int64(batch), meanRecord)), mulSat(2, maxBatch))
	return min(m, maxJobMemory())
}

// metaBytes is the room for a batch's ids, offsets, lengths and labels:
// four int64 arrays.
func metaBytes(batch int) int64 { return 32 * int64(batch) }

// maxBatchBytes is the size of the largest batch the dataset can make:
// the sum of its batch largest records, each padded to the alignment and
// with its frame.
func (e *dsEntry) maxBatchBytes(batch int) int64 {
	if v, ok := e.maxBatch.Load(batch); ok {
		return v.(int64)
	}
	n := maxBatchBytes(e.ds, batch)
	e.maxBatch.Store(batch, n)
	return n
}

func maxBatchBytes(ds dataset.Dataset, batch int) int64 {
	head, tail := 0, 0
	if f, ok := ds.(dataset.Framed); ok {
		head, tail = f.Frame()
	}
	align := int64(storage.AlignmentOf(ds.Object(0)))
	pad := func(n int) int64 { return (int64(n+head+tail) + 2*align - 2) / align * align }
	if rs := ds.Info().RecordSize; rs > 0 {
		return mulSat(int64(min(batch, ds.Len())), pad(rs))
	}
	h := &int64Heap{}
	for id := range ds.Len() {
		n := pad(ds.Locate(id).Len)
		if h.Len() < batch {
			heap.Push(h, n)
		} else if n > (*h)[0] {
			(*h)[0] = n
			heap.Fix(h, 0)
		}
	}
	var sum int64
	for _, n := range *h {
		sum += n
	}
	return sum
}

type int64Heap []int64

func (h int64Heap) Len() int           { return len(h) }
func (h int64Heap) Less(i, j int) bool { return h[i] < h[j] }
func (h int64Heap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *int64Heap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *int64Heap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// openJob makes a job of spec: its batches in shared memory with shm, and
// reading nothing until its first batch is asked with lazy.
func (s *Server) openJob(ctx context.Context, spec *wire.JobSpec, shm, lazy bool) (*job, error) {
	cfg, err := configure(spec)
	if err != nil {
		return nil, err
	}
	paths, err := dataset.ExpandPaths(ctx, s.store, cfg.paths)
	if err != nil {
		return nil, err
	}
	e, err := s.sets.get(ctx, paths, cfg.ds)
	if err != nil {
		return nil, err
	}
	j := &job{s: s, gid: s.jobSeq.Add(1), cfg: cfg, ds: e, sets: s.sets, inline: !shm, held: map[uint64]heldBatch{},
		reqs: make(chan uint64, maxQueued), done: make(chan struct{}), started: time.Now()}
	fail := func(err error) (*job, error) {
		s.groups.leave(j)
		s.sets.put(e)
		return nil, err
	}
	ds := e.ds
	inf := ds.Info()
	var tf transform.Transform
	if cfg.transform != "" {
		if tf, j.transform, err = transform.New(cfg.transform); err != nil {
			return fail(fmt.Errorf("%w: %w", errSpec, err))
		}
		// Outputs persisted for this source and transform, current: read
		// them instead of transforming (OneAccess §3).
		if dir, ok := s.catalogue.Lookup(inf.Paths, inf.Versions, j.transform); ok {
			if pe, err := s.outputs.get(ctx, []string{dir}, dataset.Options{}); err == nil && pe.ds.Len() == ds.Len() {
				s.sets.put(e)
				e, j.ds, j.sets, j.persisted = pe, pe, s.outputs, true
				ds, inf, tf = pe.ds, pe.ds.Info(), nil
				fail = func(err error) (*job, error) {
					s.groups.leave(j)
					s.outputs.put(pe)
					return nil, err
				}
			} else if err == nil {
				s.outputs.put(pe)
			} else {
				slog.Warn("persisted outputs not read", "dir", dir, "err", err)
			}
		}
	}
	subset, err := subsetOf(cfg.subset, ds)
	if err != nil {
		return fail(err)
	}
	j.subset = ds.Len()
	if subset != nil {
		j.subset = int(subset.GetCardinality())
	}
	lopts := cfg.ld
	key := s.cacheKey(e, j.transform)
	if j.smp, err = s.order(j, cfg, subset, key, tf); err != nil {
		return fail(err)
	}
	if j.member != nil {
		// A member covers its own part (rank and worker): no stride.
		lopts.BatchStride, lopts.BatchOffset = 1, 0
		if lopts.Prefetch == 0 {
			// A shared job reads ahead little, and not before it is asked:
			// records it is given while ahead of its consumer, before
			// others join or while they lag, are records it reads alone.
			lopts.Prefetch = sharedPrefetch
		}
		lopts.Lazy = true
	}
	_, rows := ds.(dataset.Rows)
	if rows && (tf != nil || j.member != nil || cfg.ld.Opportunistic > 1) {
		return fail(specErr("a dataset of rows (%s) is read without transform=, share= or opportunistic=: "+
			"its rows are put together per batch, not cached or transformed one by one (yet)", inf.Format))
	}
	mean := max(1, inf.Bytes/int64(max(1, ds.Len())))
	biggest := e.maxBatchBytes(cfg.ld.BatchSize)
	if rows {
		// Cells land in a staging buffer before the rows are put together,
		// with offsets and validity bits added: twice the bytes, and some.
		biggest = mulSat(2, biggest) + mulSat(int64(cfg.ld.BatchSize), 64) + 1<<16
		mean = 2*mean + 64
	}
	if tf != nil {
		// Outputs of the transform, and the records read for them.
		mean += int64(tf.Size())
		biggest += mulSat(int64(cfg.ld.BatchSize), int64(tf.Size()))
	}
	mem := cfg.memory
	if mem == 0 {
		mem = jobMemory(mean, cfg.ld.BatchSize, biggest)
	}
	if mem < biggest {
		return fail(specErr("memory_bytes %d is smaller than one batch (up to %d bytes for batch_size %d of this dataset): raise memory_bytes or lower batch_size",
			mem, biggest, cfg.ld.BatchSize))
	}
	j.memory = mem
	// The arena holds twice the memory bound, so fragmentation never
	// blocks the loader for long, plus the metadata of as many batches as
	// the bound lets the client hold.
	batches := mem/max(1, mulSat(int64(cfg.ld.BatchSize), mean)) + 16
	size := mulSat(2, mem) + mulSat(batches, metaBytes(cfg.ld.BatchSize)+64)
	if j.arena, err = NewArena("riffle-job", size); err != nil {
		return fail(err)
	}
	lopts.MemoryBytes = mem
	lopts.Alloc = j.arena
	lopts.Lazy = lopts.Lazy || lazy
	lopts.Engine = s.engineFor(ds.Object(0))
	lopts.Cache, lopts.CacheKey = s.cache, key
	if tf != nil {
		lopts.Transform, lopts.Workers = tf, s.workers
	}
	j.ctx, j.cancel = context.WithCancel(context.Background())
	if j.l, err = loader.New(j.ctx, ds, j.smp, lopts); err != nil {
		j.cancel()
		j.arena.Close()
		s.groups.leave(j)
		return fail(fmt.Errorf("%w: %w", errSpec, err))
	}
	if t := s.tier.Load(); t != nil {
		// Tell the disk tier when this job next wants each block.
		// (nextUse runs under the tier's lock for every block it touches:
		// find the object by name once per job, not per block.)
		j.objects = map[string]int{}
		for i, p := range j.ds.ds.Info().Paths {
			j.objects[p] = i
		}
		j.unfuture = t.AddFuture(j.nextUse)
	}
	return j, nil
}

// defaultPageWindow is the block window of a dataset's own blocks.
const defaultPageWindow = 16

// order makes the job's sampler: a member of its source's group when it
// asks to share a global shuffle, else its own sampler, over its subset if
// it has one.
func (s *Server) order(j *job, cfg jobConfig, subset *roaring.Bitmap, key func(int) cache.Key, tf transform.Transform) (sampler.Sampler, error) {
	ds := j.ds.ds
	smpCfg := cfg.smp
	smpCfg.RecordSize = ds.Info().RecordSize
	smpCfg.Align = storage.HintsOf(ds.Object(0)).BlockSize
	if b, ok := ds.(dataset.Blocker); ok && smpCfg.BlockSize == 0 && (smpCfg.Kind == "" || smpCfg.Kind == "block") {
		// A dataset with blocks of its own (Parquet pages) is read a block
		// at a time unless a job asks for another order; by default the
		// rows of 16 blocks are spread over 16 batches, so a batch mixes
		// 16 pages while each page is still read and decoded once.
		smpCfg.Kind, smpCfg.Bounds = "block", b.Blocks()
		if smpCfg.Window == 0 {
			smpCfg.Window = defaultPageWindow
		}
	}
	if cfg.share && (smpCfg.Kind == "" || smpCfg.Kind == "global") {
		// Ranks and DataLoader workers split the subset by a hash of the
		// id: a shared order is no function of position to cut.
		stride := max(1, cfg.ld.BatchStride)
		mine := part(subset, ds.Len(), smpCfg.Rank*stride+cfg.ld.BatchOffset, max(1, smpCfg.World)*stride)
		// Whoever holds the bytes states their size: a shared record's
		// item is the record's own length (its locator's), or the
		// transform's output size; never a mean, which cuts the longer
		// records of a variable-size dataset.
		size := func(id int) int { return ds.Locate(id).Len }
		mean := int(ds.Info().Bytes / int64(max(1, ds.Len())))
		if tf != nil {
			out := tf.Size()
			size, mean = func(int) int { return out }, out
		}
		m, ge, err := s.groups.join(j, s.cache, key, size, mean, mine, cfg.ld.Epoch)
		if err == nil {
			j.member, j.group = m, ge
			if mine != nil && mine.IsEmpty() {
				return nil, fmt.Errorf("%w: this rank's part of the subset holds no record", dataset.ErrEmpty)
			}
			return m, nil
		}
		slog.Info("job not shared", "reason", err)
	}
	if subset == nil {
		smp, _, err := smpCfg.Build(ds.Len(), dataset.Locator(ds))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errSpec, err)
		}
		return smp, nil
	}
	ids := subset.ToArray()
	locate := func(i int) (int, int64, int) {
		l := ds.Locate(int(ids[i]))
		return l.Object, l.Off, l.Len
	}
	smp, err := newSubsetSampler(func(n int) (sampler.Sampler, error) {
		b, _, err := smpCfg.Build(n, locate)
		return b, err
	}, subset)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSpec, err)
	}
	return smp, nil
}

// cacheKey names the dataset's records in the cache by the file each
// lives in and its index there, so jobs whose file lists overlap share the
// files they have in common.
func (s *Server) cacheKey(e *dsEntry, tf string) func(int) cache.Key {
	ds := e.ds
	inf := ds.Info()
	o, ok := ds.(dataset.Originer)
	if !ok || len(inf.Versions) != len(inf.Paths) {
		space := spaceOf(inf, e.key, tf)
		return func(id int) cache.Key { return cache.Key{Space: space, ID: int64(id)} }
	}
	spaces := make([]uint64, len(inf.Paths))
	for k := range spaces {
		fi := inf
		fi.Versions = inf.Versions[k : k+1]
		spaces[k] = spaceOf(fi, optsKey(e.key), tf)
	}
	return func(id int) cache.Key {
		k, idx := o.Origin(id)
		return cache.Key{Space: spaces[k], ID: int64(idx)}
	}
}

// status describes the job for `riffle status`.
func (j *job) status() wire.JobStatus {
	el := time.Since(j.started).Seconds()
	return wire.JobStatus{ID: fmt.Sprint(j.gid), Subset: j.subset, Epoch: int(j.epoch.Load()), Position: int(j.batch.Load()) * j.cfg.ld.BatchSize,
		SamplesSec: float64(j.records.Load()) / max(el, 1e-9), Transform: j.transform}
}

func pad8(n int) int { return (n + 7) &^ 7 }

func (j *job) opened() *wire.Msg {
	inf := j.ds.ds.Info()
	m := &wire.Msg{
		Op: wire.OpOpened, Job: j.id, Records: j.ds.ds.Len(), Positions: j.smp.Len(),
		Batches: j.l.Count(), Left: j.l.Left(j.cfg.ld.Batch), MemoryBytes: j.memory,
		Info: &wire.Info{Format: inf.Format, RecordSize: inf.RecordSize, Dtype: inf.Dtype, Shape: inf.Shape,
			Classes: inf.Classes, Header: inf.Header, Paths: inf.Paths, Shared: j.member != nil,
			Columns: wireColumns(inf.Columns), Schema: inf.Schema},
	}
	if inf.Features != "" {
		m.Info.Features = json.RawMessage(inf.Features)
	}
	if tf := j.cfg.transform; tf != "" {
		t, _, _ := transform.New(tf)
		m.Info.Transform = j.transform
		m.Info.Persisted = j.persisted
		m.Info.RecordSize = t.Size()
		m.Info.Dtype, m.Info.Shape = t.Shape()
	}
	if !j.inline {
		m.ArenaSize = j.arena.Size()
	}
	_, stream := j.l.Place()
	m.Stream = stream && !sampler.SmallState(j.smp)
	return m
}

// next loads the next batch, writes its metadata into a region of its own
// (the batches cut from one opportunistic window share their bytes, and a
// pipelining client has several batches in flight) and returns its header
// and, inline, the bytes to send after it.
func (j *job) next(ctx context.Context) (*wire.Msg, [][]byte, error) {
	b, err := j.l.Next(ctx)
	if errors.Is(err, io.EOF) {
		return &wire.Msg{Op: wire.OpEnd, Job: j.id}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	n := len(b.IDs)
	metaLen := 8 * n * 3
	if b.Labels != nil {
		metaLen += 8 * n
	}
	data := b.Data
	var arrow *wire.Arrow
	if c := b.Columns; c != nil {
		// A batch of rows: one Arrow message, and its table after the ids.
		data = b.Data[:c.Len]
		arrow = &wire.Arrow{Body: int64(c.Body), Nodes: len(c.Nodes), Buffers: len(c.Buffers)}
		metaLen += 16 * (len(c.Nodes) + len(c.Buffers))
	}
	var meta []byte
	if j.inline {
		meta = make([]byte, metaLen)
	} else if meta, err = j.arena.Alloc(ctx, metaLen, 64); err != nil {
		b.Release()
		return nil, nil, err
	}
	put := func(k int, vals []int) {
		for i, v := range vals {
			binary.LittleEndian.PutUint64(meta[8*(k*n+i):], uint64(v))
		}
	}
	put(0, b.IDs)
	put(1, b.Off)
	put(2, b.Len)
	at := 8 * 3 * n
	if b.Labels != nil {
		put(3, b.Labels)
		at += 8 * n
	}
	if c := b.Columns; c != nil {
		for _, pair := range append(slices.Clone(c.Nodes), c.Buffers...) {
			binary.LittleEndian.PutUint64(meta[at:], uint64(pair[0]))
			binary.LittleEndian.PutUint64(meta[at+8:], uint64(pair[1]))
			at += 16
		}
	}
	st, stream := j.l.Place()
	if stream && sampler.SmallState(j.smp) {
		st = j.l.State()
	}
	j.epoch.Store(int64(st.Epoch))
	j.batch.Store(int64(st.Batch))
	j.mu.Lock()
	j.seq++
	seq := j.seq
	j.held[seq] = heldBatch{b, meta}
	j.mu.Unlock()
	j.records.Add(int64(n))
	j.bytes.Add(int64(len(data)))
	m := &wire.Msg{Op: wire.OpBatch, Job: j.id, Seq: seq, Epoch: b.Epoch, Index: b.Index, Last: b.Last, N: n,
		DataLen: int64(len(data)), Labels: b.Labels != nil, Arrow: arrow,
		State: &wire.State{Epoch: st.Epoch, Batch: st.Batch, Sampler: st.Sampler, Skip: st.Skip}}
	if j.inline {
		// Bytes and metadata follow the header; the caller releases the
		// batch once they are written, since the client keeps a copy.
		metaAt := pad8(len(data))
		m.DataOff, m.MetaOff = 0, int64(metaAt)
		m.Payload = int64(metaAt + metaLen)
		return m, [][]byte{data, make([]byte, metaAt-len(data)), meta}, nil
	}
	m.DataOff = j.arena.Offset(b.Data)
	m.MetaOff = j.arena.Offset(meta)
	return m, nil, nil
}

// locate says where records are: their object (file) and offset, for
// errors a client reports about a record.
func (j *job) locate(ids []int) (*wire.Msg, error) {
	ds := j.ds.ds
	m := &wire.Msg{Op: wire.OpLocate, Job: j.id, IDs: ids}
	for _, id := range ids {
		if id < 0 || id >= ds.Len() {
			return nil, fmt.Errorf("record %d is not in [0, %d)", id, ds.Len())
		}
		loc := ds.Locate(id)
		m.Paths = append(m.Paths, ds.Object(loc.Object).Name())
		m.Offsets = append(m.Offsets, loc.Off)
	}
	return m, nil
}

// heldBatch is a batch handed to the client and the region of its metadata.
type heldBatch struct {
	b    *loader.Batch
	meta []byte
}

func (h heldBatch) release(a *Arena, inline bool) {
	h.b.Release()
	if !inline {
		a.Free(h.meta)
	}
}

// release gives back batches the client is done with.
func (j *job) release(seqs []uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, s := range seqs {
		if h, ok := j.held[s]; ok {
			h.release(j.arena, j.inline)
			delete(j.held, s)
		}
	}
}

// close stops the job's worker and loader, then frees the arena: the
// loader's reads must end before the memory they write into goes.
func (j *job) close() {
	j.once.Do(func() {
		j.cancel()
		j.arena.stop() // wakes a loader waiting for space
		<-j.done
		j.l.Close()
		j.mu.Lock()
		for s, h := range j.held {
			h.release(j.arena, j.inline)
			delete(j.held, s)
		}
		j.mu.Unlock()
		j.arena.Close()
		if j.unfuture != nil {
			j.unfuture()
		}
		j.s.groups.leave(j)
		j.s.retire(j)
		j.sets.put(j.ds)
	})
}

// where copies the file and offset an error names into an error reply.
func where(err error, m *wire.Msg) {
	var fe *dataset.FormatError
	var se *storage.Error
	switch {
	case errors.As(err, &fe):
		m.Path, m.Offset = fe.Path, fe.Offset
	case errors.As(err, &se):
		m.Path, m.Offset = se.Object, se.Offset
	}
}

// optsKey is the options part of a dataset's registry key: what, besides
// the file, decides a record's bytes.
func optsKey(key string) string {
	if i := strings.Index(key, "] "); i >= 0 {
		return key[i+2:]
	}
	return key
}

// wireColumns copies column descriptions into the wire's form.
func wireColumns(cs []columnar.Column) []wire.Column {
	if cs == nil {
		return nil
	}
	out := make([]wire.Column, len(cs))
	for i, c := range cs {
		out[i] = wire.Column{Name: c.Name, Type: c.Type, Layout: c.Layout, Dtype: c.Dtype, Width: c.Width, Size: c.Size,
			Nullable: c.Nullable, Children: wireColumns(c.Children)}
	}
	return out
}

// nextUse tells the disk tier when this job next reads a byte of a range
// of an object: the earliest next position of the records the range
// touches, from the inverse of the job's order (sampler.NextUse). Ranges of
// other objects, and orders with no inverse, are cache.Never.
func (j *job) nextUse(object string, off, n int64) int64 {
	ds := j.ds.ds
	r, ok := ds.(dataset.Ranger)
	if !ok {
		return cache.Never
	}
	obj, ok := j.objects[object]
	if !ok {
		return cache.Never
	}
	lo, hi, ok := r.RecordsIn(obj, off, n)
	if !ok {
		return cache.Never
	}
	st, _ := j.l.Place()
	now := st.Epoch*j.smp.Len() + st.Batch*j.cfg.ld.BatchSize
	best := int64(cache.Never)
	for id := lo; id < hi && id < lo+1024; id++ {
		t, ok := sampler.NextUse(j.smp, now, id)
		if !ok {
			return cache.Never
		}
		best = min(best, t)
	}
	return best
}
