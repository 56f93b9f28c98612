package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// job is one client's loader over one dataset.
type job struct {
	spec   wire.JobSpec
	ds     *dsEntry
	sets   *datasets
	smp    sampler.Sampler
	l      *loader.Loader
	arena  *Arena
	inline bool
	cancel context.CancelFunc
	memory int64

	mu   sync.Mutex
	seq  uint64
	held map[uint64]heldBatch // handed to the client, not yet released
	once sync.Once
}

// jobMemory is a job's bound on batches in flight and held when the client
// does not give one: room for 16 batches of meanRecord-byte records,
// at least 64 MiB. Enough to keep the device busy; more only cycles cold
// memory through the shared arena.
func jobMemory(meanRecord int64, batch int) int64 {
	return max(64<<20, 16*int64(batch)*meanRecord)
}

// metaBytes is the room after a batch's bytes for its ids, offsets, lengths
// and labels: four int64 arrays.
func metaBytes(batch int) int { return 32 * batch }

func (s *Server) openJob(ctx context.Context, spec *wire.JobSpec, shm bool) (*job, error) {
	if len(spec.Paths) == 0 {
		return nil, errors.New("open: no paths")
	}
	if spec.BatchSize <= 0 {
		return nil, fmt.Errorf("open: batch size %d", spec.BatchSize)
	}
	paths, err := dataset.ExpandPaths(spec.Paths)
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		if err := s.checkPath(p); err != nil {
			return nil, err
		}
	}
	opts := dataset.Options{
		Format: spec.Format, RecordSize: spec.RecordSize, HeaderBytes: spec.HeaderBytes,
		CSVHeader: spec.CSVHeader, SkipCRC: spec.SkipCRC, DropPartialTail: spec.DropPartial, Direct: spec.Direct,
	}
	e, err := s.sets.get(ctx, paths, opts)
	if err != nil {
		return nil, err
	}
	j := &job{spec: *spec, ds: e, sets: s.sets, inline: !shm, held: map[uint64]heldBatch{}}
	kind := spec.Sampler
	if kind == "" {
		kind = "sequential"
		if spec.Shuffle {
			kind = "global"
		}
	}
	inf := e.ds.Info()
	cfg := sampler.Config{Kind: kind, Seed: spec.Seed, RecordSize: inf.RecordSize, BlockSize: spec.BlockSize,
		Window: spec.Window, Buffer: spec.Buffer, Reservoir: spec.Reservoir}
	smp, _, err := cfg.Build(e.ds.Len(), dataset.Locator(e.ds))
	if err != nil {
		s.sets.put(e)
		return nil, err
	}
	world := max(1, spec.World)
	if world > 1 || spec.Rank != 0 {
		sh, err := sampler.NewShard(smp, spec.Rank, world, spec.DropLast)
		if err != nil {
			s.sets.put(e)
			return nil, err
		}
		if kind == "block" {
			sh.Chunk = spec.BatchSize // ranks take whole batches, so blocks stay whole
		}
		smp = sh
	}
	j.smp = smp
	mean := max(1, inf.Bytes/int64(max(1, e.ds.Len())))
	mem := spec.MemoryBytes
	if mem <= 0 {
		mem = jobMemory(mean, spec.BatchSize)
	}
	j.memory = mem
	lopts := loader.Options{
		BatchSize: spec.BatchSize, DropLast: spec.DropLast, Depth: spec.Depth, Prefetch: spec.Prefetch,
		MemoryBytes: mem, Ordered: spec.Ordered, Epoch: spec.Epoch, Batch: spec.Batch, Epochs: spec.Epochs,
		Opportunistic: spec.Opportunistic,
	}
	// The arena holds twice the memory bound, so fragmentation never
	// blocks the loader for long, plus the metadata of as many batches as
	// the bound lets the client hold.
	batches := mem/(int64(spec.BatchSize)*mean) + 16
	size := 2*mem + batches*int64(metaBytes(spec.BatchSize)+64)
	if j.arena, err = NewArena("riffle-job", size); err != nil {
		s.sets.put(e)
		return nil, err
	}
	lopts.Alloc = j.arena
	lctx, cancel := context.WithCancel(context.Background())
	j.cancel = cancel
	if j.l, err = loader.New(lctx, e.ds, smp, lopts); err != nil {
		cancel()
		j.arena.Close()
		s.sets.put(e)
		return nil, err
	}
	return j, nil
}

func pad8(n int) int { return (n + 7) &^ 7 }

func (j *job) opened() *wire.Msg {
	inf := j.ds.ds.Info()
	m := &wire.Msg{
		Op: wire.OpOpened, Records: j.ds.ds.Len(), Positions: j.smp.Len(),
		Batches: j.l.Batches().Count(), MemoryBytes: j.memory,
		Info: &wire.Info{Format: inf.Format, RecordSize: inf.RecordSize, Dtype: inf.Dtype, Shape: inf.Shape,
			Classes: inf.Classes, Header: inf.Header, Paths: inf.Paths},
	}
	if !j.inline {
		m.ArenaSize = j.arena.Size()
	}
	return m
}

// next loads the next batch, writes its metadata into a region of its own
// (the batches cut from one opportunistic window share their bytes, and a
// pipelining client has several batches in flight) and returns its header
// and, inline, the bytes to send after it.
func (j *job) next(ctx context.Context) (*wire.Msg, [][]byte, error) {
	b, err := j.l.Next(ctx)
	if errors.Is(err, io.EOF) {
		return &wire.Msg{Op: wire.OpEnd}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	n := len(b.IDs)
	metaLen := 8 * n * 3
	if b.Labels != nil {
		metaLen += 8 * n
	}
	var meta []byte
	if j.inline {
		meta = make([]byte, metaLen)
	} else if meta, err = j.arena.Alloc(metaLen, 64); err != nil {
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
	if b.Labels != nil {
		put(3, b.Labels)
	}
	j.mu.Lock()
	j.seq++
	seq := j.seq
	j.held[seq] = heldBatch{b, meta}
	j.mu.Unlock()
	m := &wire.Msg{Op: wire.OpBatch, Seq: seq, Epoch: b.Epoch, Index: b.Index, Last: b.Last, N: n,
		DataLen: int64(len(b.Data)), Labels: b.Labels != nil}
	if j.inline {
		// Bytes and metadata follow the header; the caller releases the
		// batch once they are written, since the client keeps a copy.
		metaAt := pad8(len(b.Data))
		m.DataOff, m.MetaOff = 0, int64(metaAt)
		m.Payload = int64(metaAt + metaLen)
		return m, [][]byte{b.Data, make([]byte, metaAt-len(b.Data)), meta}, nil
	}
	m.DataOff = j.arena.Offset(b.Data)
	m.MetaOff = j.arena.Offset(meta)
	return m, nil, nil
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

// close stops the loader, then frees the arena: the loader's reads must
// end before the memory they write into goes.
func (j *job) close() {
	j.once.Do(func() {
		j.cancel()
		j.arena.stop() // wakes a loader waiting for space
		j.l.Close()
		j.mu.Lock()
		for s, h := range j.held {
			h.release(j.arena, j.inline)
			delete(j.held, s)
		}
		j.mu.Unlock()
		j.arena.Close()
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
