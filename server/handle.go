package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/wire"
)

// handle is a client's hold on one job: the transport around it. The job
// (package job) decides what the batches are; the handle puts them in the
// arena the client maps, writes their frames, keeps the batches the
// client holds until it releases them, and serves the client's next
// requests in order on a goroutine of its own, so that a job waiting for
// memory or reads never stalls another job's requests on the connection,
// nor the reading of the connection (and so of its releases).
type handle struct {
	s      *Server
	id     int // on its connection
	j      *job.Job
	arena  *Arena
	inline bool
	// inMemoryOrder: a batch's records are delivered in the order they
	// lie in its memory (loader.Batch.PackedOrder), which is then a
	// function of the plan as the batch's own order is (the job's order
	// says so: wire.OrderInfo.Packed).
	inMemoryOrder bool
	perm          []int // PackedOrder's, reused by next (one goroutine)
	ctx           context.Context
	cancel        context.CancelFunc

	reqs chan uint64 // tags of next requests, served in order
	done chan struct{}

	// hold is the arena's part of the daemon's budget (budget.go), given
	// back after the arena is closed.
	hold *hold

	mu   sync.Mutex
	seq  uint64
	held map[uint64]heldBatch // handed to the client, not yet released
	// heldBytes is the bytes of the batches in held, largest the largest
	// batch handed out so far.
	heldBytes, largest int64
	once               sync.Once

	records, bytes atomic.Int64
}

// maxQueued bounds a job's next requests waiting to be served.
const maxQueued = 64

// openHandle opens spec's job with its batches in an arena: shared memory
// passed to the client with shm, else bytes sent inline.
func (s *Server) openHandle(ctx context.Context, spec *wire.JobSpec, shm bool) (*handle, error) {
	h := &handle{s: s, inline: !shm, held: map[uint64]heldBatch{}, reqs: make(chan uint64, maxQueued), done: make(chan struct{})}
	h.ctx, h.cancel = context.WithCancel(context.Background())
	alloc := func(ask job.Ask) (loader.Allocator, int64, error) {
		// The arena is all the memory the job's batches may take, reserved
		// before any of it is made, waiting for room if need be: all of
		// it, or while memory is short as much as the job's share, at
		// least two batches (budget.go). Its pages past what was reserved
		// are never written, and so never charged.
		hd, err := s.budget.reserve(ctx, ask.Want, ask.Floor)
		if err != nil {
			return nil, 0, err
		}
		h.hold = hd
		a, err := NewArena("riffle-job", ask.Want)
		if err != nil {
			return nil, 0, err
		}
		h.arena = a
		a.setLimit(hd.size, nil) // not resized before it is attached: hd.size is what it was granted
		return a, hd.size, nil
	}
	var err error
	if h.j, err = s.env.Open(ctx, spec, alloc); err != nil {
		h.cancel()
		if h.arena != nil {
			h.arena.Close()
		}
		if h.hold != nil {
			s.budget.release(h.hold)
		}
		return nil, err
	}
	h.inMemoryOrder = h.j.Order().Packed
	s.budget.attach(h.hold, h.resize)
	return h, nil
}

// resize moves the job's memory to size bytes of its arena (the budget
// bent it): the loader's bound, and the arena's limit. It reports whether
// the arena holds nothing above size now; else fit is called once it does.
func (h *handle) resize(size int64, fit func()) bool {
	h.j.Resize(size)
	return h.arena.setLimit(size, fit)
}

func pad8(n int) int { return (n + 7) &^ 7 }

// opened is the job's "opened" frame.
func (h *handle) opened() *wire.Msg {
	m := openedMsg(h.j.Describe())
	m.Job = h.id
	if !h.inline {
		m.ArenaSize = h.arena.Size()
	}
	return m
}

// openedMsg describes a job as an "opened" frame: for an open, and for a
// check, which has no handle.
func openedMsg(d job.Description) *wire.Msg {
	inf := d.Info
	m := &wire.Msg{
		Op: wire.OpOpened, Records: d.Records, Positions: d.Positions, Batches: d.Batches, Left: d.Left,
		Samples: d.Samples, DatasetVersion: d.Version, MemoryBytes: d.Memory, Stream: d.Stream, Generations: d.Generations,
		Auto: d.Auto, Order: &d.Order, Delivered: d.Delivered, Direct: d.Direct, Tokens: d.Tokens, Epochs: d.Epochs,
		Info: &wire.Info{Format: inf.Format, RecordSize: inf.RecordSize, Dtype: inf.Dtype, Shape: inf.Shape,
			Classes: inf.Classes, Header: inf.Header, Paths: inf.Paths, Shared: d.Shared,
			Columns: wireColumns(d.Columns), Schema: inf.Schema, Offsets: d.Offsets},
	}
	if inf.Features != "" {
		m.Info.Features = json.RawMessage(inf.Features)
	}
	if d.Transform != "" {
		m.Info.Transform, m.Info.Persisted = d.Transform, d.Persisted
		m.Info.RecordSize, m.Info.Dtype, m.Info.Shape = d.OutputSize, d.OutputDtype, d.OutputShape
	}
	return m
}

// next loads the next batch, writes its metadata into a region of its own
// (the batches cut from one opportunistic window share their bytes, and a
// pipelining client has several batches in flight) and returns its header
// and, inline, the bytes to send after it.
func (h *handle) next(ctx context.Context) (*wire.Msg, [][]byte, error) {
	b, err := h.nextBatch(ctx)
	if errors.Is(err, io.EOF) {
		return &wire.Msg{Op: wire.OpEnd, Job: h.id}, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	n := len(b.IDs)
	metaLen := 8 * n * 3
	if b.Labels != nil {
		metaLen += 8 * n
	}
	data := b.Used()
	var arrow *wire.Arrow
	if c := b.Columns; c != nil {
		// A batch of rows: one Arrow message, and its table after the ids.
		arrow = &wire.Arrow{Body: int64(c.Body), Nodes: len(c.Nodes), Buffers: len(c.Buffers)}
		metaLen += 16 * (len(c.Nodes) + len(c.Buffers))
	}
	var meta []byte
	if h.inline {
		meta = make([]byte, metaLen)
	} else if meta, err = h.arena.Alloc(ctx, metaLen, 64); err != nil {
		b.Release()
		return nil, nil, err
	}
	var perm []int
	if h.inMemoryOrder && b.Columns == nil {
		perm = b.PackedOrder(h.perm[:0])
		if perm != nil {
			h.perm = perm
		}
	}
	put := func(k int, vals []int) {
		if perm != nil {
			for i, p := range perm {
				binary.LittleEndian.PutUint64(meta[8*(k*n+i):], uint64(vals[p]))
			}
			return
		}
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
	st, _ := h.j.Place() // a stream's state (a shared job's) is asked for when a checkpoint wants it
	h.mu.Lock()
	h.seq++
	seq := h.seq
	h.held[seq] = heldBatch{b, meta}
	h.heldBytes += int64(len(b.Data))
	h.largest = max(h.largest, int64(len(b.Data)))
	h.mu.Unlock()
	h.records.Add(int64(n))
	h.bytes.Add(int64(len(data)))
	m := &wire.Msg{Op: wire.OpBatch, Job: h.id, Seq: seq, Epoch: b.Epoch, Index: b.Index, Last: b.Last, N: n,
		DataLen: int64(len(data)), Labels: b.Labels != nil, Arrow: arrow, Arrays: wireArrays(b.Arrays),
		State: &wire.State{Epoch: st.Epoch, Batch: st.Batch, Sampler: st.Sampler, Skip: st.Skip}}
	if h.inline {
		// Bytes and metadata follow the header; the caller releases the
		// batch once they are written, since the client keeps a copy.
		metaAt := pad8(len(data))
		m.DataOff, m.MetaOff = 0, int64(metaAt)
		m.Payload = int64(metaAt + metaLen)
		return m, [][]byte{data, make([]byte, metaAt-len(data)), meta}, nil
	}
	m.DataOff = h.arena.Offset(b.Data)
	m.MetaOff = h.arena.Offset(meta)
	return m, nil, nil
}

// locate says where records are: their object (file) and offset, for
// errors a client reports about a record.
func (h *handle) locate(ids []int) (*wire.Msg, error) {
	locs, err := h.j.Locate(ids)
	if err != nil {
		return nil, err
	}
	m := &wire.Msg{Op: wire.OpLocate, Job: h.id, IDs: ids}
	for _, l := range locs {
		m.Paths = append(m.Paths, l.Path)
		m.Offsets = append(m.Offsets, l.Offset)
	}
	return m, nil
}

// heldBatch is a batch handed to the client and the region of its metadata.
type heldBatch struct {
	b    *loader.Batch
	meta []byte
}

func (hb heldBatch) release(a *Arena, inline bool) {
	hb.b.Release()
	if !inline {
		a.Free(hb.meta)
	}
}

// release gives back batches the client is done with.
func (h *handle) release(seqs []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range seqs {
		if hb, ok := h.held[s]; ok {
			h.heldBytes -= int64(len(hb.b.Data))
			hb.release(h.arena, h.inline)
			delete(h.held, s)
		}
	}
}

// heldGrace is how long a next request waits for a batch when the batches
// its client holds leave the job no memory for another (Server.heldWait
// in tests).
const heldGrace = 5 * time.Second

// nextBatch is the job's next batch. A client that holds so many batches
// that its job's memory bound leaves no room for another would wait for
// ever: its releases come with its next request, after this one's reply
// (a pipelining client's too). So when the held batches fill the bound,
// the request waits heldGrace for a batch read ahead (or a release from
// another thread), then fails with ErrMemory saying why; the job stays
// where it was, and goes on once the client releases batches.
func (h *handle) nextBatch(ctx context.Context) (*loader.Batch, error) {
	h.mu.Lock()
	held, n, largest := h.heldBytes, len(h.held), h.largest
	h.mu.Unlock()
	mem := h.j.Memory()
	// Twice the largest: the loader counts a batch with its padding and
	// alignment, a little more than its bytes.
	if largest == 0 || held+2*largest <= mem {
		return h.j.Next(ctx)
	}
	grace := h.s.heldWait
	if grace == 0 {
		grace = heldGrace
	}
	bent := ""
	if full := h.j.FullMemory(); mem < full {
		// The daemon's memory is short and the job runs in less than all
		// it may (budget.go): a client pipelining within all of it waits
		// for its own releases, or for the job to grow, as an open waits.
		grace = max(grace, h.s.budget.wait)
		bent = fmt.Sprintf(" (bent from %s while the daemon's memory is short)", humanize.IBytes(uint64(full)))
	}
	wctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	b, err := h.j.Next(wctx)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return nil, fmt.Errorf("%w: the client holds %d batches (%s) of this job's %s of memory_bytes%s, which leave no room for the next; "+
			"drop the batches you are done with, or open the job with a larger memory_bytes (or a smaller batch_size)",
			job.ErrMemory, n, humanize.IBytes(uint64(held)), humanize.IBytes(uint64(mem)), bent)
	}
	return b, err
}

// close stops the handle's worker and the job, then frees the arena: the
// loader's reads must end before the memory they write into goes.
func (h *handle) close() {
	h.once.Do(func() {
		h.cancel()
		h.arena.stop() // wakes a loader waiting for space
		<-h.done
		h.j.Close()
		h.mu.Lock()
		if !h.inline {
			// Its reservation goes back to the budget below; the pages
			// the client may still read stay, the others go now.
			keep := make([][]byte, 0, 2*len(h.held))
			for _, hb := range h.held {
				keep = append(keep, hb.b.Data, hb.meta)
			}
			if err := h.arena.dropExcept(keep); err != nil {
				slog.Warn("closing a job", "err", err)
			}
		}
		for s, hb := range h.held {
			hb.release(h.arena, h.inline)
			delete(h.held, s)
		}
		h.heldBytes = 0
		h.mu.Unlock()
		h.arena.Close()
		h.s.budget.release(h.hold)
		h.s.retire(h)
	})
}

// wireArrays copies a batch's arrays into the wire's form.
func wireArrays(as []sequence.Array) []wire.Array {
	if as == nil {
		return nil
	}
	out := make([]wire.Array, len(as))
	for i, a := range as {
		out[i] = wire.Array{Name: a.Name, Dtype: a.Dtype, Shape: a.Shape, Off: int64(a.Off), Len: int64(a.Len)}
	}
	return out
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
