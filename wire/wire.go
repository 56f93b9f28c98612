// Package wire is riffle's client-daemon protocol, version 1: the messages
// and their framing, and nothing else, so that the Python client
// (python/riffle/wire.py) mirrors it line by line. docs/protocol.md is its
// specification.
//
// A frame is a 4-byte little-endian length, that many bytes of a JSON
// header, and then Payload bytes if the header says so. Batch bytes do not
// travel in frames on a Unix socket: they sit in a shared-memory arena (a
// memfd the daemon passes with SCM_RIGHTS along the "opened" frame) and the
// "batch" header says where. Over TCP, where descriptors cannot travel, a
// batch's bytes follow its header as the payload.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Version is the protocol version a hello carries.
const Version = 1

// MaxHeader bounds a header's size; a larger length means a broken peer.
const MaxHeader = 16 << 20

// Ops.
const (
	OpHello   = "hello"
	OpOpen    = "open"
	OpOpened  = "opened"
	OpNext    = "next"
	OpBatch   = "batch"
	OpEnd     = "end"
	OpRelease = "release"
	OpClose   = "close"
	OpClosed  = "closed"
	OpStats   = "stats"
	OpError   = "error"
)

// Msg is every message: Op says which fields matter.
type Msg struct {
	Op string `json:"op"`

	// hello
	Version int    `json:"version,omitempty"`
	Token   string `json:"token,omitempty"`
	Server  string `json:"server,omitempty"`

	// open
	Spec *JobSpec `json:"spec,omitempty"`

	// opened, next, batch, release, close
	Job int `json:"job,omitempty"`

	// opened
	Records     int      `json:"records,omitempty"`   // records in the dataset
	Positions   int      `json:"positions,omitempty"` // positions per epoch for this job (its shard)
	Batches     int      `json:"batches,omitempty"`   // batches per epoch
	Info        *Info    `json:"info,omitempty"`
	ArenaSize   int64    `json:"arena_size,omitempty"`   // bytes of the shared arena; 0 means batches come inline
	MemoryBytes int64    `json:"memory_bytes,omitempty"` // the job's bound on batches in flight and held
	Seqs        []uint64 `json:"seqs,omitempty"`         // release: the batches given back

	// batch
	Seq     uint64 `json:"seq,omitempty"`
	Epoch   int    `json:"epoch"`
	Index   int    `json:"index"`
	Last    bool   `json:"last,omitempty"`
	N       int    `json:"n,omitempty"`
	DataOff int64  `json:"data_off,omitempty"` // arena offset of the batch's bytes (or 0 in the payload)
	DataLen int64  `json:"data_len,omitempty"`
	MetaOff int64  `json:"meta_off,omitempty"` // arena offset of int64 ids[N], off[N], len[N] and, if Labels, labels[N]
	Labels  bool   `json:"labels,omitempty"`
	Payload int64  `json:"payload,omitempty"` // bytes that follow the header in this frame

	// stats
	Jobs    int `json:"jobs,omitempty"`
	Clients int `json:"clients,omitempty"`

	// error
	Message string `json:"message,omitempty"`
	Path    string `json:"path,omitempty"`
	Offset  int64  `json:"offset,omitempty"`
}

// JobSpec is what a client asks the daemon to load.
type JobSpec struct {
	Paths         []string `json:"paths"`
	Format        string   `json:"format,omitempty"`
	RecordSize    int      `json:"record_size,omitempty"`
	HeaderBytes   int64    `json:"header_bytes,omitempty"`
	CSVHeader     bool     `json:"csv_header,omitempty"`
	SkipCRC       bool     `json:"skip_crc,omitempty"`
	DropPartial   bool     `json:"drop_partial,omitempty"`
	Direct        bool     `json:"direct,omitempty"`
	Shuffle       bool     `json:"shuffle"`
	Sampler       string   `json:"sampler,omitempty"` // "global", "sequential", "block", "buffered", "reservoir"; default by Shuffle
	BlockSize     int      `json:"block_size,omitempty"`
	Window        int      `json:"window,omitempty"`
	Buffer        int      `json:"buffer,omitempty"`
	Reservoir     int      `json:"reservoir,omitempty"`
	Opportunistic int      `json:"opportunistic,omitempty"`
	Seed          uint64   `json:"seed"`
	Rank          int      `json:"rank"`
	World         int      `json:"world"`
	DropLast      bool     `json:"drop_last,omitempty"`
	BatchSize     int      `json:"batch_size"`
	Prefetch      int      `json:"prefetch,omitempty"`
	Depth         int      `json:"depth,omitempty"`
	MemoryBytes   int64    `json:"memory_bytes,omitempty"`
	Ordered       bool     `json:"ordered,omitempty"`
	Epoch         int      `json:"epoch"`
	Batch         int      `json:"batch"`
	Epochs        int      `json:"epochs,omitempty"`
}

// Info describes the dataset a job reads.
type Info struct {
	Format     string   `json:"format"`
	RecordSize int      `json:"record_size,omitempty"`
	Dtype      string   `json:"dtype,omitempty"`
	Shape      []int    `json:"shape,omitempty"`
	Classes    []string `json:"classes,omitempty"`
	Header     string   `json:"header,omitempty"`
	Paths      []string `json:"paths"`
}

// ErrFrame says a frame was malformed.
var ErrFrame = errors.New("malformed frame")

// Write writes m as one frame, followed by payload if any.
func Write(w io.Writer, m *Msg, payload ...[]byte) error {
	b, err := Encode(m)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return err
	}
	for _, p := range payload {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// Encode returns m's frame header: length and JSON.
func Encode(m *Msg) ([]byte, error) {
	j, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 4, 4+len(j))
	binary.LittleEndian.PutUint32(b, uint32(len(j)))
	return append(b, j...), nil
}

// Read reads one frame's header. The caller reads m.Payload bytes after it.
func Read(r io.Reader) (*Msg, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > MaxHeader {
		return nil, fmt.Errorf("%w: header of %d bytes", ErrFrame, size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFrame, err)
	}
	return Decode(b)
}

// Decode parses a frame's JSON header.
func Decode(b []byte) (*Msg, error) {
	m := &Msg{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFrame, err)
	}
	if m.Op == "" {
		return nil, fmt.Errorf("%w: no op", ErrFrame)
	}
	return m, nil
}
