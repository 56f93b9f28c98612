// Package wire is riffle's client-daemon protocol, version 2: the messages
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
	"reflect"
	"strings"
)

// Version is the protocol version a hello carries.
const Version = 2

// MaxHeader bounds the size of a request's header, which the daemon
// reads from any client; a larger length means a broken peer.
const MaxHeader = 16 << 20

// MaxReply bounds the size of a reply's header, which a client reads from
// its own daemon: an "opened" lists every file of its dataset, and a glob
// may name a million.
const MaxReply = 1 << 30

// MaxHelloHeader bounds a header before the peer has authenticated: a
// hello is small, and an unauthenticated peer must not make the daemon
// hold memory.
const MaxHelloHeader = 4 << 10

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
	OpStatus  = "status"
	OpLocate  = "locate"
	OpState   = "state"
	OpError   = "error"
	// OpCheck asks what an open would answer, without a job: the spec is
	// checked and the dataset opened, and the reply is an "opened" with
	// job 0 (or the error the open would give). A client checks its
	// arguments when it is built, not at its first batch.
	OpCheck = "check"
)

// Error kinds: what an error frame is about.
const (
	KindSpec     = "spec"      // the request asked for something invalid (a bad option, a bound)
	KindNotFound = "not_found" // a path names nothing
	KindData     = "data"      // the data is bad: corrupt, truncated, a CRC mismatch, a record a transform refused
	KindChanged  = "changed"   // the data changed since the job opened it
	KindClosed   = "closed"    // the job or the daemon is closing
	KindMemory   = "memory"    // the job does not fit the daemon's memory budget (now, or at all)
	KindInternal = "internal"  // anything else: the daemon's own failure
)

// Msg is every message: Op says which fields matter.
type Msg struct {
	Op string `json:"op"`
	// Tag is chosen by the client for each request and echoed in its
	// reply: replies to requests of different jobs may come out of order.
	Tag uint64 `json:"tag,omitempty"`

	// hello
	Version int    `json:"version,omitempty"`
	Token   string `json:"token,omitempty"`
	Server  string `json:"server,omitempty"`

	// open
	Spec *JobSpec `json:"spec,omitempty"`

	// opened, next, batch, release, close
	Job int `json:"job,omitempty"`

	// opened
	Records   int `json:"records,omitempty"`   // records in the dataset
	Positions int `json:"positions,omitempty"` // positions per epoch for this job (its shard)
	Batches   int `json:"batches,omitempty"`   // batches per epoch this job delivers
	// Left is how many batches the job delivers of the epoch it opened at,
	// from the batch it opened at: a client counts by it and Batches, and
	// never works them out again.
	Left int `json:"left,omitempty"`
	// Samples is the records the job reads per epoch over every rank (its
	// subset's size, or the dataset's): len() of a PyTorch dataset.
	Samples int `json:"samples,omitempty"`
	// Generations, for a growing dataset (refresh), are the generations
	// of files the job reads.
	Generations int `json:"generations,omitempty"`
	// Auto is the order sampler "auto" chose.
	Auto *AutoOrder `json:"auto,omitempty"`
	// Order is what the job's order is, as the daemon decided it: a
	// client reads it instead of working it out from the spec.
	Order *OrderInfo `json:"order,omitempty"`
	// Direct says the job reads its files with O_DIRECT, past the page
	// cache (asked, or chosen for a shuffle it would answer few reads of).
	Direct bool `json:"direct,omitempty"`
	// Delivered, for the rest of a shared order's epoch, is every record
	// its spec's states delivered, as one state: the rest's own states
	// carry it instead of theirs.
	Delivered []byte `json:"delivered,omitempty"`
	// DatasetVersion names the version of the dataset's files the job reads: a
	// client that sees another version on a later open knows the data
	// changed under it.
	DatasetVersion string `json:"dataset_version,omitempty"`
	Info           *Info  `json:"info,omitempty"`
	ArenaSize      int64  `json:"arena_size,omitempty"`   // bytes of the shared arena; 0 means batches come inline
	MemoryBytes    int64  `json:"memory_bytes,omitempty"` // the job's bound on batches in flight and held
	// Epochs is how many epochs the job delivers from its epoch, 0 without
	// end: a job asked for more reads fewer when its order changes after
	// them (a mixture's weights, best_fit's samples), and a client opens
	// the next epoch as a job of its own.
	Epochs int `json:"epochs,omitempty"`
	// Tokens, for a job of a token corpus's samples, says what the
	// corpus is, how its samples are cut, and the arrays a batch holds.
	Tokens *Tokens `json:"tokens,omitempty"`
	// Stream says the job's sampler has a state to save that batches do
	// not carry: ask for it with a "state" request.
	Stream bool     `json:"stream,omitempty"`
	Seqs   []uint64 `json:"seqs,omitempty"` // release: the batches given back

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
	// Arrow, for a dataset of rows, says the batch is an Arrow record batch.
	Arrow *Arrow `json:"arrow,omitempty"`
	// Arrays, for a batch of a token corpus's samples, are its arrays:
	// each one's name, dtype, shape and bytes from data_off (Tokens).
	Arrays []Array `json:"arrays,omitempty"`
	// State is the job's place after this batch: what a checkpoint saves
	// and a resumed job's spec gives back (epoch, batch, sampler_state, skip).
	State *State `json:"state,omitempty"`

	// stats
	Jobs    int `json:"jobs,omitempty"`
	Clients int `json:"clients,omitempty"`

	// status: the daemon's groups, jobs and cache
	Status *Status `json:"status,omitempty"`

	// locate: records of a job (IDs) and where they are (Paths, Offsets)
	IDs     []int    `json:"ids,omitempty"`
	Paths   []string `json:"paths,omitempty"`
	Offsets []int64  `json:"offsets,omitempty"`

	// error
	Message string `json:"message,omitempty"`
	// Kind says what an error is about, so a client raises the exception
	// its user catches: one of the Kind constants.
	Kind   string `json:"kind,omitempty"`
	Path   string `json:"path,omitempty"`
	Offset int64  `json:"offset,omitempty"`
}

// JobSpec is what a client asks the daemon to load. Fields left out take
// the daemon's defaults (docs/protocol.md lists them); the daemon checks
// every field against its bounds before using it.
type JobSpec struct {
	// The dataset.
	Paths       []string `json:"paths"`
	Format      string   `json:"format,omitempty"`
	RecordSize  int      `json:"record_size,omitempty"`
	HeaderBytes int64    `json:"header_bytes,omitempty"`
	CSVHeader   bool     `json:"csv_header,omitempty"`
	SkipCRC     bool     `json:"skip_crc,omitempty"`
	DropPartial bool     `json:"drop_partial,omitempty"`
	// Direct reads with O_DIRECT, past the page cache; unset, the job
	// does so for a shuffle whose reads the page cache would seldom answer.
	Direct  *bool    `json:"direct,omitempty"`
	Columns []string `json:"columns,omitempty"`
	Split   string   `json:"split,omitempty"`
	// Extensions are the only file endings a directory dataset takes.
	Extensions []string `json:"extensions,omitempty"`
	// Subset, if set, is the part of the dataset the job reads.
	Subset *Subset `json:"subset,omitempty"`
	// Filter keeps the records (of the subset, if one is given) that pass
	// its tests.
	Filter *Filter `json:"filter,omitempty"`
	// Dedup counts records of equal bytes once: the first of them (by id)
	// stays, by a hash of every record's bytes kept beside the index.
	Dedup bool `json:"dedup,omitempty"`
	// Refresh "epoch" lets a glob or directory dataset grow: each epoch
	// reads the files found by then, new files after the old (job/grow.go).
	Refresh string `json:"refresh,omitempty"`
	// Generations, with Refresh, is how many generations of files the
	// epoch reads, from a state (0: as the node's log says, or all found
	// now).
	Generations int `json:"generations,omitempty"`
	// Mixture, given instead of Paths, mixes datasets by weight: each
	// source its files, read with the dataset options above, and its
	// weight from MixtureHistory's last epoch on.
	Mixture []MixSource `json:"mixture,omitempty"`
	// MixtureStop is "first_exhausted" (the default: an epoch ends when
	// the first source's epoch is used up) or "all_exhausted" (when every
	// source's is, the sooner ones going on into their next epochs).
	MixtureStop string `json:"mixture_stop,omitempty"`
	// MixtureHistory are the weights before Mixture's, in order, each
	// until a place (an epoch, and a position of its order): weights
	// changed at a place carry the sources on from where the old ones
	// left them.
	MixtureHistory []MixWeights `json:"mixture_history,omitempty"`
	// MixtureSchedule are weights the mixture changes to after Mixture's,
	// in order, each from a global step (a batch index of the global
	// batch, batch_size x world positions of the epoch's order).
	MixtureSchedule []MixChange `json:"mixture_schedule,omitempty"`
	// Transform names a transform the daemon runs on each record
	// ("name" or "name:key=value,..."), shared by jobs asking the same.
	Transform string `json:"transform,omitempty"`

	// A token corpus (docs/tokens.md). With SeqLen, Paths are a corpus's
	// files (Megatron .idx/.bin prefixes, flat token files, 1-D token
	// .npy, a tokenized column of Arrow files or a Hugging Face
	// directory) and the records are each epoch's samples of SeqLen
	// tokens, cut as Packing says ("concat", the default, "best_fit" or
	// "pad"); PadLast keeps concat's last partial sample, padded. EOD is
	// the end-of-document token, VocabSize the vocabulary (a token at or
	// above it is an error), PadID the input id of padding; TokenDtype is
	// a flat file's dtype and TokenColumn an Arrow corpus's column;
	// PackWindow is best_fit's documents per window.
	SeqLen      int    `json:"seq_len,omitempty"`
	Packing     string `json:"packing,omitempty"`
	PadLast     bool   `json:"pad_last,omitempty"`
	EOD         *int64 `json:"eod,omitempty"`
	VocabSize   int64  `json:"vocab_size,omitempty"`
	PadID       int64  `json:"pad_id,omitempty"`
	TokenDtype  string `json:"token_dtype,omitempty"`
	TokenColumn string `json:"token_column,omitempty"`
	PackWindow  int    `json:"pack_window,omitempty"`

	// The order.
	Shuffle   bool   `json:"shuffle"`
	Sampler   string `json:"sampler,omitempty"` // "global", "sequential", "block", "buffered", "reservoir"; default by Shuffle
	BlockSize int    `json:"block_size,omitempty"`
	Window    int    `json:"window,omitempty"`
	// MinRandomness is the randomization level sampler "auto" must reach
	// (AutoOrder says what it chose).
	MinRandomness float64 `json:"min_randomness,omitempty"`
	// AutoOrder is the order an earlier open of sampler "auto" chose (its
	// sampler, block size and window, from opened or a state): the job
	// reads it, and reports it, without choosing again.
	AutoOrder     *AutoOrder `json:"auto_order,omitempty"`
	Buffer        int        `json:"buffer,omitempty"`
	Reservoir     int        `json:"reservoir,omitempty"`
	Opportunistic int        `json:"opportunistic,omitempty"`
	Seed          uint64     `json:"seed"`
	Rank          int        `json:"rank"`
	World         int        `json:"world"`
	// RankDropLast is DistributedSampler's drop_last: ranks drop the
	// epoch's tail instead of padding it, so their shares are equal.
	RankDropLast bool `json:"rank_drop_last,omitempty"`
	// Share makes the job join the other sharing jobs on its source in
	// dependent sampling: reads, transforms and the cache shared, each
	// job's epoch still a uniform permutation of its records, but no
	// longer a function of (seed, epoch). Default false.
	Share *bool `json:"share,omitempty"`

	// The batches.
	BatchSize int `json:"batch_size"`
	// DropLast is DataLoader's drop_last: the last short batch is dropped.
	DropLast    bool  `json:"drop_last,omitempty"`
	Prefetch    int   `json:"prefetch,omitempty"`
	Depth       int   `json:"depth,omitempty"`
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Ordered keeps the sampler's order inside batches (default: a random
	// order of each batch's own when shuffling).
	Ordered *bool `json:"ordered,omitempty"`
	// BatchStride and BatchOffset deliver only batches offset,
	// offset+stride, ... of each epoch: DataLoader workers' split of one
	// rank's share.
	BatchStride int `json:"batch_stride,omitempty"`
	BatchOffset int `json:"batch_offset,omitempty"`

	// Where to start and for how long. Start, if not 0, is how many
	// positions of Epoch's order were delivered by ranks of another
	// topology: the job is the rest of that epoch, split over this one's.
	Epoch        int    `json:"epoch"`
	Start        int    `json:"start,omitempty"`
	Batch        int    `json:"batch"`
	Epochs       int    `json:"epochs,omitempty"`
	SamplerState []byte `json:"sampler_state,omitempty"`
	Skip         []int  `json:"skip,omitempty"`
	// Delivered, if not empty, are the places in Epoch of the parts of a
	// shared order's run (its ranks' and workers' states, of any
	// topology): the job is the rest of that epoch, every record they
	// delivered left out.
	Delivered []State `json:"delivered,omitempty"`
}

// SpecFields lists JobSpec's fields by their JSON names, for the tables
// that must name each of them (job.Options).
func SpecFields() []string {
	t := reflect.TypeFor[JobSpec]()
	out := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

// State is a job's place: the next batch it delivers.
type State struct {
	Epoch   int    `json:"epoch"`
	Batch   int    `json:"batch"`
	Sampler []byte `json:"sampler_state,omitempty"`
	Skip    []int  `json:"skip,omitempty"`
	// Part, in a place of a shared order's run (JobSpec.Delivered), says
	// whose place it is. A place past the epoch the rest opens at
	// delivered the whole of its part of that epoch, which only its part
	// names: such a place carries no sampler state of that epoch.
	Part *Part `json:"part,omitempty"`
}

// Part is a rank's DataLoader worker's part of a shared or opportunistic
// order (Workers is 1 with none); DropLast is the run's rank_drop_last,
// which sizes it. An opportunistic order's place is in batches of
// BatchSize, loaded in windows of Window batches.
type Part struct {
	Rank      int  `json:"rank"`
	World     int  `json:"world"`
	Worker    int  `json:"worker"`
	Workers   int  `json:"workers"`
	DropLast  bool `json:"drop_last,omitempty"`
	BatchSize int  `json:"batch_size,omitempty"`
	Window    int  `json:"window,omitempty"`
}

// MixSource is one source of a mixture: its files and weight.
type MixSource struct {
	Paths  []string `json:"paths"`
	Weight float64  `json:"weight"`
}

// MixWeights are a mixture's weights until position Position of epoch
// Until (from the place of the weights before them): positions of the
// epoch's order over every rank, so a place is the same on any topology.
type MixWeights struct {
	Until    int       `json:"until"`
	Position int       `json:"position,omitempty"`
	Weights  []float64 `json:"weights"`
}

// MixChange is a mixture's weights from global step Step of epoch Epoch.
type MixChange struct {
	Epoch   int       `json:"epoch"`
	Step    int       `json:"step"`
	Weights []float64 `json:"weights"`
}

// Subset is a part of a dataset: the union of ranges of ids [lo, hi), a
// list of ids, and the records whose label is one of Labels.
type Subset struct {
	Ranges [][2]int `json:"ranges,omitempty"`
	IDs    []int    `json:"ids,omitempty"`
	Labels []int    `json:"labels,omitempty"`
	// IDsFile names a file of ids the daemon reads: a one-dimensional
	// integer .npy, or text of one id per line.
	IDsFile string `json:"ids_file,omitempty"`
}

// Filter keeps the records that pass every test it sets, on what the
// index knows of each: its label, its size and its file.
type Filter struct {
	Labels  []int `json:"labels,omitempty"`   // the label is one of these
	MinSize int   `json:"min_size,omitempty"` // bytes, at least
	MaxSize int   `json:"max_size,omitempty"` // bytes, at most (0: no bound)
	// Glob matches the record's file (filepath.Match) in as many of its
	// last parts as the pattern has: "*.jpg" its name, "c2/*" its folder
	// and name; an absolute pattern its whole path.
	Glob string `json:"glob,omitempty"`
	// Column, of a dataset of rows, is tested by In (its value equals
	// one of them: strings, numbers or booleans) and Min and Max (a
	// number within them); a null passes no test.
	Column string   `json:"column,omitempty"`
	In     []any    `json:"in,omitempty"`
	Min    *float64 `json:"min,omitempty"`
	Max    *float64 `json:"max,omitempty"`
}

// Status is what `riffle status` shows.
type Status struct {
	Groups  []GroupStatus `json:"groups"`
	Cache   CacheStatus   `json:"cache"`
	Clients int           `json:"clients"`
	// ReadBytes were read from storage, ServedBytes handed to jobs.
	ReadBytes   int64 `json:"read_bytes"`
	ServedBytes int64 `json:"served_bytes"`
	// Remote is what came from the object store; Disk the disk cache of
	// its blocks (serve --cache-dir), if there is one.
	Remote *RemoteStatus `json:"remote,omitempty"`
	Disk   *DiskStatus   `json:"disk,omitempty"`
	// Peers is the cluster's memory tier (serve --peers), if there is one.
	Peers *PeersStatus `json:"peers,omitempty"`
	// Memory is the daemon's memory budget and what holds it.
	Memory *MemoryStatus `json:"memory,omitempty"`
}

// MemoryStatus is how the daemon divides its memory limit, and what holds
// the part for jobs: each open job's shared memory (arena), reserved when
// it opens, less than its full size while memory is short (bent), down to
// two batches in flight; opens whose least does not fit wait in a queue.
type MemoryStatus struct {
	Limit   int64        `json:"limit"`   // the memory cgroup's limit, or the machine's memory
	Cache   int64        `json:"cache"`   // the record cache's budget
	Heap    int64        `json:"heap"`    // kept for the rest of the Go heap
	Decode  int64        `json:"decode"`  // of Heap, the most image decodes take at once
	Jobs    int64        `json:"jobs"`    // for the jobs' arenas
	Held    int64        `json:"held"`    // of Jobs, reserved by open jobs
	Holders int          `json:"holders"` // the jobs holding it
	Bent    int          `json:"bent"`    // of them, those holding less than their full arena now
	Waiting []MemoryWait `json:"waiting,omitempty"`
	Refused int64        `json:"refused"` // opens refused for memory, since start
	// Shrunk and Grown count the times a job was told to give memory
	// back for another, and to take more as memory freed, since start.
	Shrunk int64 `json:"shrunk"`
	Grown  int64 `json:"grown"`
	// GoLimit is the Go runtime's memory limit now, GoHeap its heap in
	// use (objects, live or not yet collected; the record cache is among
	// them), GoRuntime all the runtime holds and has not given back to
	// the system (heap, stacks, its own structures).
	GoLimit   int64 `json:"go_limit"`
	GoHeap    int64 `json:"go_heap"`
	GoRuntime int64 `json:"go_runtime"`
	// Decoding is what the image decodes hold of Decode now, DecodePeak
	// the most they held at once.
	Decoding   int64 `json:"decoding"`
	DecodePeak int64 `json:"decode_peak"`
	// What the kernel counts resident for the daemon (/proc/self/status;
	// docs/memory.md): RSS is RSSAnon + RSSFile + RSSShmem, RSSPeak its
	// most. RSSAnon is anonymous memory: the Go runtime's (GoRuntime, the
	// cache among it) and libjpeg's. RSSShmem is the jobs' arenas' pages
	// the daemon has written (within Held). RSSFile is pages of files the
	// daemon maps: its binary, and the data files whose cached pages it
	// copies from a mapping (storage/mapped.go): the page cache, shared
	// with every process and dropped by the kernel under pressure, not
	// memory the daemon allocated.
	RSS      int64 `json:"rss"`
	RSSPeak  int64 `json:"rss_peak"`
	RSSAnon  int64 `json:"rss_anon"`
	RSSFile  int64 `json:"rss_file"`
	RSSShmem int64 `json:"rss_shmem"`
}

// MemoryWait is an open waiting for room: the bytes it needs, and for how
// long it has waited.
type MemoryWait struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// PeersStatus is the cluster's memory tier seen from this node.
type PeersStatus struct {
	Node      int   `json:"node"`
	Nodes     int   `json:"nodes"`
	Local     int64 `json:"local"`      // owned blocks read here
	FromPeers int64 `json:"from_peers"` // blocks read from their owners
	Served    int64 `json:"served"`     // blocks served to other nodes
	Fallbacks int64 `json:"fallbacks"`  // blocks read from the store because an owner failed
	Fetched   int64 `json:"fetched"`    // bytes this node read from the object store
	Bytes     int64 `json:"bytes"`      // owned blocks in memory
}

// RemoteStatus counts the object store's GETs, bytes and retries.
type RemoteStatus struct {
	Gets    int64 `json:"gets"`
	Bytes   int64 `json:"bytes"`
	Retries int64 `json:"retries"`
}

// DiskStatus is the disk cache of remote blocks.
type DiskStatus struct {
	Bytes  int64 `json:"bytes"`
	Blocks int   `json:"blocks"`
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
}

// GroupStatus is one group of jobs over one source.
type GroupStatus struct {
	Source  string      `json:"source"`
	Records int         `json:"records"`
	Jobs    []JobStatus `json:"jobs"`
	Shared  int64       `json:"shared"` // records one read served several jobs
	Rounds  int64       `json:"rounds"` // rounds of dependent sampling
	Given   int64       `json:"given"`  // records given to jobs
	Saved   int64       `json:"saved"`  // reads sharing saved
	// PagesKept and PagesDropped, for a group whose records wait in the
	// page cache: its pages there, and those it had the kernel drop; for
	// a job outside any group, its source's steward's, which keeps the
	// pages the jobs reading the source each in its own order read soonest.
	PagesKept    int64 `json:"pages_kept,omitempty"`
	PagesDropped int64 `json:"pages_dropped,omitempty"`
	// RecordsPassed, for a job alone, are the records its source's
	// steward had read past the page cache (O_DIRECT): their pages would
	// have been dropped before their next reads.
	RecordsPassed int64 `json:"records_passed,omitempty"`
}

// JobStatus is one job.
type JobStatus struct {
	ID         string  `json:"id"`
	Subset     int     `json:"subset"`
	Epoch      int     `json:"epoch"`
	Position   int     `json:"position"`
	SamplesSec float64 `json:"samples_per_sec"`
	Transform  string  `json:"transform,omitempty"`
	Memory     int64   `json:"memory,omitempty"` // its shared memory, reserved from the daemon's budget now
	// MemoryFull is its shared memory with every batch it reads ahead:
	// more than Memory while the daemon's memory is short.
	MemoryFull int64 `json:"memory_full,omitempty"`
	// Auto is the order sampler "auto" chose.
	Auto *AutoOrder `json:"auto,omitempty"`
	// Direct says the job reads its files with O_DIRECT, past the page
	// cache (asked, or chosen for a shuffle it would answer few reads of).
	Direct bool `json:"direct,omitempty"`
}

// CacheStatus is the daemon's record cache.
type CacheStatus struct {
	Bytes     int64 `json:"bytes"`
	Budget    int64 `json:"budget"`
	Items     int   `json:"items"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
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
	// Transform is the job's transform, canonical; RecordSize, Dtype and
	// Shape then describe its outputs.
	Transform string `json:"transform,omitempty"`
	// Shared says the job samples dependently with others in a group.
	Shared bool `json:"shared,omitempty"`
	// Offsets, for a mixture, are each source's first id: source k's
	// record i is id Offsets[k]+i.
	Offsets []int `json:"offsets,omitempty"`
	// Persisted says the transform's outputs are read from where riffle
	// pack --transform persisted them, not computed.
	Persisted bool `json:"persisted,omitempty"`
	// Columns and Schema describe a dataset of rows (Arrow, Parquet):
	// its batches are Arrow record batches of this schema (an IPC stream
	// of the schema alone), whose columns are laid out as Columns say.
	Columns []Column `json:"columns,omitempty"`
	Schema  []byte   `json:"schema,omitempty"`
	// Features are a Hugging Face dataset's features (dataset_info.json).
	Features json.RawMessage `json:"features,omitempty"`
}

// Column describes a column of a batch of rows for a reader without an
// Arrow library: how its buffers hold its elements.
type Column struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`            // Arrow's name of the type
	Layout   string   `json:"layout"`          // null, fixed, bool, binary, utf8, list, fixed_list, struct
	Dtype    string   `json:"dtype,omitempty"` // fixed: numpy dtype of an element
	Width    int      `json:"width,omitempty"` // fixed: bytes per element; binary, utf8, list: bytes per offset
	Size     int      `json:"size,omitempty"`  // fixed_list: elements per element
	Nullable bool     `json:"nullable"`
	Children []Column `json:"children,omitempty"`
}

// Arrow says a batch is one Arrow IPC message (data_len bytes at
// data_off): its body starts Body bytes in, and after the batch's ids,
// offsets, lengths and labels at meta_off follow Nodes (length, null
// count) and Buffers (offset from the body, length) pairs of int64.
type Arrow struct {
	Body    int64 `json:"body"`
	Nodes   int   `json:"nodes"`
	Buffers int   `json:"buffers"`
}

// Tokens describes a job of a token corpus's samples (docs/tokens.md): the
// corpus, how its samples are cut, the epoch's rates, and the arrays of a
// whole batch.
type Tokens struct {
	// SeqLen is a sample's inputs, in tokens.
	SeqLen int `json:"seq_len"`
	// Packing is how documents become samples: concat, best_fit or pad.
	Packing string `json:"packing"`
	// Documents is the corpus's documents.
	Documents int `json:"documents"`
	// Tokens is the corpus's tokens.
	Tokens int64 `json:"tokens"`
	// Dtype is the corpus's token dtype (numpy's name), or "mixed" for a
	// mixture of corpora of different dtypes.
	Dtype string `json:"dtype"`
	// PadID is the input id of padding.
	PadID int64 `json:"pad_id"`
	// EOD is the end-of-document token, -1 if none.
	EOD int64 `json:"eod"`
	// Vocab is the vocabulary's size every token is checked against; 0:
	// unchecked.
	Vocab int64 `json:"vocab_size,omitempty"`
	// Padding is the share of the epoch's input positions that are
	// padding.
	Padding float64 `json:"padding"`
	// Cut is the share of documents cut (concat: a sample boundary falls
	// inside; best_fit: split into pieces; pad: truncated).
	Cut float64 `json:"cut"`
	// Dropped is the share of tokens in no sample, neither input nor
	// label.
	Dropped float64 `json:"dropped"`
	// PerEpoch says the number of samples differs by epoch (best_fit): a
	// job reads one epoch.
	PerEpoch bool `json:"per_epoch,omitempty"`
	// Arrays are the arrays of a whole batch of batch_size samples, in
	// the order they lie (cu_seqlens's shape [-1]: each batch's own, its
	// length the most it may be).
	Arrays []Array `json:"arrays"`
}

// Array is one array of a batch: its name, numpy dtype and shape (a 0-d
// array's is []), and its Len bytes at Off from the batch's data_off.
type Array struct {
	Name  string `json:"name"`  // input_ids, labels, position_ids, cu_seqlens, ...
	Dtype string `json:"dtype"` // numpy's name
	Shape []int  `json:"shape"` // [] for a 0-d array
	Off   int64  `json:"off"`   // bytes from the batch's data_off
	Len   int64  `json:"len"`   // bytes
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
	n, err := ReadLength(r, MaxHeader)
	if err != nil {
		return nil, err
	}
	return ReadBody(r, n)
}

// ReadLength reads a frame's length prefix and checks it against max.
func ReadLength(r io.Reader, max int) (int, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return 0, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > uint32(max) {
		return 0, fmt.Errorf("%w: header of %d bytes, at most %d", ErrFrame, size, max)
	}
	return int(size), nil
}

// ReadBody reads and parses a header of n bytes.
func ReadBody(r io.Reader, n int) (*Msg, error) {
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFrame, err)
	}
	return Decode(b)
}

// Decode parses a frame's JSON header. A header that is JSON, of an op,
// with a field whose value its type cannot hold (a negative seed, a
// number past its field's range, a state that is not base64) returns the
// message with its other fields decoded and a *FieldError naming the
// field: the frame was whole, so a daemon answers it with an error and
// the connection goes on.
func Decode(b []byte) (*Msg, error) {
	m := &Msg{}
	if err := json.Unmarshal(b, m); err != nil {
		if !json.Valid(b) || m.Op == "" {
			return nil, fmt.Errorf("%w: %w", ErrFrame, err)
		}
		field, ferr := fieldOf(b, reflect.TypeFor[Msg](), "")
		if ferr == nil {
			ferr = err
		}
		return m, &FieldError{Field: field, Err: ferr}
	}
	if m.Op == "" {
		return nil, fmt.Errorf("%w: no op", ErrFrame)
	}
	return m, nil
}

// FieldError is a field of a whole frame whose JSON value does not fit
// the field's type. It is an ErrFrame too.
type FieldError struct {
	// Field is the field's path: "spec.seed", "spec.delivered[2].sampler_state".
	Field string
	Err   error // json's, or base64's
}

func (e *FieldError) Error() string {
	var te *json.UnmarshalTypeError
	if errors.As(e.Err, &te) {
		got, isNumber := strings.CutPrefix(te.Value, "number ")
		if !isNumber {
			got = "a " + got
		}
		return fmt.Sprintf("%s: %s is not %s", e.Field, got, describe(te.Type))
	}
	return fmt.Sprintf("%s: %v", e.Field, e.Err)
}

func (e *FieldError) Unwrap() []error { return []error{ErrFrame, e.Err} }

// describe says what a field of type t holds, for an error about a value
// that it does not.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer from %d to %d", int64(-1)<<(t.Bits()-1), uint64(1)<<(t.Bits()-1)-1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer from 0 to %d", ^uint64(0)>>(64-t.Bits()))
	case reflect.Float32, reflect.Float64:
		return "a finite number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "base64 text"
		}
		return "a list"
	case reflect.Array:
		return fmt.Sprintf("a list of %d", t.Len())
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return describe(t.Elem())
	}
	return t.String()
}

// fieldOf finds a field of raw, a JSON value of a t, whose value does not
// decode, by decoding its parts one at a time: its path under path, and
// the error of its value alone. Only for a header that failed: json says
// which field a type error is of, but not a base64 error's, nor the
// index in a list.
func fieldOf(raw []byte, t reflect.Type, path string) (string, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			break
		}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			for k, v := range obj {
				if strings.EqualFold(k, name) && decode(v, f.Type) != nil {
					if path != "" {
						name = path + "." + name
					}
					return fieldOf(v, f.Type, name)
				}
			}
		}
	case t.Kind() == reflect.Array || (t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.Uint8):
		var items []json.RawMessage
		if json.Unmarshal(raw, &items) != nil {
			break
		}
		for i, v := range items {
			if decode(v, t.Elem()) != nil {
				return fieldOf(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i))
			}
		}
	}
	return path, decode(raw, t)
}

// decode decodes raw into a new value of type t.
func decode(raw []byte, t reflect.Type) error {
	return json.Unmarshal(raw, reflect.New(t).Interface())
}

// AutoOrder is the order sampler "auto" chose for a job: the sampler and
// its block size and window (what a resumed job names instead of auto, so
// it reads the same order), its randomization level, and the records per
// second the device's measured rate expects of it and of a sequential
// read.
type AutoOrder struct {
	Sampler    string  `json:"sampler"`              // global or block
	BlockSize  int     `json:"block_size,omitempty"` // bytes per block of the block order
	Window     int     `json:"window,omitempty"`     // blocks the block order spreads over as many batches
	RL         float64 `json:"rl"`                   // its randomization level (DeepIO's RL; a global shuffle is 1)
	Rate       float64 `json:"rate"`                 // records per second the device's measured rate expects of it
	Sequential float64 `json:"sequential"`           // records per second expected of a sequential read
}

// OrderInfo is what a job's order is (an opened reply's "order"), as the
// daemon decided it, so that a client never works it out again from the
// spec: its kind, and how a place in it resumes.
type OrderInfo struct {
	// Kind is the order as resolved: global, block, sequential, buffered
	// or reservoir (sampler auto's choice, a Parquet file's pages).
	Kind string `json:"kind"`
	// Positional says a place is a position of an order that is a
	// function of (seed, epoch, position): any topology resumes from it
	// (JobSpec.Start).
	Positional bool `json:"positional"`
	// Shared says the plan shares its order (share, of a uniform order:
	// a mixture's too): a place in it is not a position but what its
	// group dealt this rank, the rank's own. Rest is "" for a shared
	// mixture, which resumes only on the topology it was saved on.
	Shared bool `json:"shared"`
	// Rest, "shared" or "opportunistic", says an epoch resumes on another
	// topology as its rest, from the places of every part of the run that
	// saved it (JobSpec.Delivered); "" if it does not.
	Rest string `json:"rest,omitempty"`
	// Packed says a batch's records are delivered in the order they lie
	// in its memory: the order inside a batch is the batch's own, as its
	// layout is.
	Packed bool `json:"packed"`
	// Replay says the client may rebuild a place's sampler state from the
	// records it was delivered: a shared order that delivers each batch
	// whole, of one dataset, from an epoch's start.
	Replay bool `json:"replay"`
}
