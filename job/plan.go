package job

import (
	"fmt"
	"math"
	"math/bits"
	"path/filepath"
	"slices"
	"strings"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/sequence"
	"github.com/riffle-ml/riffle/wire"
)

//go:generate go run ./gen

// A spec crosses the socket from any client, careless or hostile, so every
// field is checked against its bounds here, once, before any arithmetic on
// it; and here, once, the defaults are filled in. Options is the one table
// of job options: python/riffle/spec.py and docs/protocol.md's table are
// generated from it (go generate ./job), and a test fails when either is
// stale.

// Option is one job option.
type Option struct {
	// Name is the option's name in a spec (JSON) and, unless Python says
	// otherwise, the Python keyword.
	Name   string
	Python string
	// Kind is its type: int, bool, string, strings, ids, subset, bytes,
	// mixture, weights.
	Kind string
	// Min and Max bound an int.
	Min, Max int64
	// Default is what the daemon uses when the option is left out.
	Default string
	// Doc says what it means.
	Doc string
	// Group is the part of a job it decides: one of Groups.
	Group string
	// int reads an int option's value from a spec.
	int func(*wire.JobSpec) int64
}

// PythonName is the option's Python keyword.
func (o Option) PythonName() string {
	if o.Python != "" {
		return o.Python
	}
	return o.Name
}

// Bounds on what a spec may ask.
const (
	maxPaths      = 1 << 17
	maxPathLen    = 4096
	maxRecordSize = 1 << 30
	maxHeader     = 1 << 40
	maxWorld      = 1 << 16
	maxEpoch      = sampler.MaxEpoch
	maxEpochs     = 1 << 30
	maxBuffer     = 1 << 26
	maxBlockSize  = 1 << 30
	maxSubsetIDs  = order.MaxSubsetIDs
	maxColumns    = 1 << 12
	maxSources    = 1 << 14 // a mixture's
	maxWeights    = 1 << 10 // weight changes a mixture remembers
	maxName       = 1 << 12 // a column's or a split's
	maxSeqLen     = 1 << 20 // a sample's tokens: 32 MiB of arrays a sample
	maxVocab      = 1 << 40
	maxPackWindow = 1 << 20 // best_fit's documents a window
	// maxTokenBatch bounds a batch of samples' bytes (batch_size x
	// seq_len x 32): a bound of a few of them is a job's memory.
	maxTokenBatch = 1 << 38
	// defaultMinRandomness is sampler auto's RL target: LIRS's and DeepIO's
	// partial shuffles train as well as a full one at about this level.
	defaultMinRandomness = 0.9
	// minMemory is the least memory_bytes a client may ask for.
	minMemory = 1 << 16
	// DefaultBatchSize is a client's batch size when it names none.
	DefaultBatchSize = loader.DefaultBatchSize
)

// Groups are the parts of a job an option decides, in the order a client
// lists them (the Python Loader's keywords follow them).
var Groups = []struct{ Name, Doc string }{
	{"dataset", "what the records are: the files, their format, which of them are read, a transform of each"},
	{"order", "which records in which order each epoch"},
	{"sharing", "how an epoch is split over ranks and DataLoader workers, and shared with other jobs"},
	{"batches", "how batches are made and loaded: their size, what is read ahead, their memory"},
	{"place", "where in the epochs a job starts, and what it carries on from: a client sets them from a state"},
}

// Options is the table of job options, in the order the docs list them.
var Options = []Option{
	{Name: "paths", Kind: "strings", Group: "dataset", Max: maxPaths, Default: "(required, or mixture)",
		Doc: "files, globs, directories or s3:// URLs making one dataset"},
	{Name: "mixture", Kind: "mixture", Group: "dataset", Max: maxSources, Default: "none",
		Doc: "instead of paths: sources mixed by weight, [(paths, weight), ...]; each batch's records come from them in proportion, each source in its own order (global, block, sequential, buffered or reservoir)"},
	{Name: "mixture_stop", Kind: "string", Group: "dataset", Default: "first_exhausted",
		Doc: "a mixture's epoch ends when the first source's epoch is used up (first_exhausted) or every source's is, the sooner ones going on into their next epochs (all_exhausted)"},
	{Name: "mixture_history", Kind: "weights", Group: "place", Max: maxWeights, Default: "none",
		Doc: "a mixture's weights before its current ones, [{until: epoch, position: p, weights: [...]}, ...], each until position p (default 0) of the epoch's order over every rank: where each source had got when they changed"},
	{Name: "mixture_schedule", Kind: "schedule", Group: "dataset", Max: maxWeights, Default: "none",
		Doc: "weights a mixture changes to after its current ones, [{epoch: e, step: s, weights: [...]}, ...], each from global step s of epoch e (position s x batch_size x world of its order); all_exhausted's at an epoch's start (step 0) only"},
	{Name: "format", Kind: "string", Group: "dataset", Default: "by extension or content",
		Doc: "the dataset's format: " + strings.Join(dataset.Formats(), ", ")},
	{Name: "record_size", Kind: "int", Group: "dataset", Max: maxRecordSize, Default: "0 (from the format)",
		Doc: "bytes per record of a fixed-size file", int: func(s *wire.JobSpec) int64 { return int64(s.RecordSize) }},
	{Name: "header_bytes", Kind: "int", Group: "dataset", Max: maxHeader, Default: "0",
		Doc: "bytes before the first fixed-size record", int: func(s *wire.JobSpec) int64 { return s.HeaderBytes }},
	{Name: "csv_header", Kind: "bool", Group: "dataset", Default: "false", Doc: "a CSV's first line is its header"},
	{Name: "skip_crc", Kind: "bool", Group: "dataset", Default: "false", Doc: "skip TFRecord data CRCs on read"},
	{Name: "drop_partial", Kind: "bool", Group: "dataset", Default: "false", Doc: "drop a fixed-size file's partial last record instead of refusing the file"},
	{Name: "direct", Kind: "bool", Group: "dataset", Default: "true for a shuffle (global or auto) of local files, or of a subset of their records (not a mixture), whose reads the page cache, keeping half the memory (riffle serve --page-cache), would answer under 1 in 8 of; else false",
		Doc: "read with O_DIRECT, past the page cache"},
	{Name: "columns", Kind: "strings", Group: "dataset", Max: maxColumns, Default: "every column", Doc: "the columns of a rows dataset (Arrow, Parquet, Hugging Face) to read"},
	{Name: "split", Kind: "string", Group: "dataset", Default: "the only one", Doc: "the split of a Hugging Face DatasetDict"},
	{Name: "extensions", Kind: "strings", Group: "dataset", Max: maxColumns, Default: "every file (riffle.torch with decode=\"image\": torchvision's IMG_EXTENSIONS)",
		Doc: "the only file endings a directory dataset takes as records, as ImageFolder's extensions"},
	{Name: "subset", Kind: "subset", Group: "dataset", Max: maxSubsetIDs, Default: "every record",
		Doc: "part of the dataset: ranges, ids and labels (a range, a list of ids, or a dict in Python)"},
	{Name: "filter", Kind: "filter", Group: "dataset", Default: "none",
		Doc: "keep the records (of the subset) whose label is one of labels, whose bytes are within min_size..max_size, whose file matches glob, whose column's value is in in or within min..max"},
	{Name: "dedup", Kind: "bool", Group: "dataset", Default: "false",
		Doc: "records of equal bytes count once (the first by id), by a hash of each record kept beside the index"},
	{Name: "refresh", Kind: "string", Group: "dataset", Default: "none (the files as first opened)",
		Doc: "epoch: a glob or directory dataset grows at each epoch's start by the files found since, after the old ones, whose ids stay"},
	{Name: "generations", Kind: "int", Group: "place", Max: maxEpoch, Default: "0 (as the node's log of the files says)",
		Doc: "with refresh: the generations of files the epoch read, from a state", int: func(s *wire.JobSpec) int64 { return int64(s.Generations) }},
	{Name: "transform", Kind: "string", Group: "dataset", Default: "none",
		Doc: "a transform the daemon runs on each record, once for every job naming it (image:size=256,crop=224; random_resized_crop:size=224; libsvm_dense:n_features=N); on rows, on one column (column=NAME, by default the only Image or binary column)"},
	{Name: "seq_len", Kind: "int", Group: "dataset", Max: maxSeqLen, Default: "0 (records: not a token corpus)",
		Doc: "inputs of a sample: the paths are a token corpus (Megatron .idx/.bin, flat token files, a 1-D token .npy, a tokenized column of Arrow, Parquet or a Hugging Face dataset) whose records are each epoch's samples, arrays of this many tokens (docs/tokens.md)",
		int: func(s *wire.JobSpec) int64 { return int64(s.SeqLen) }},
	{Name: "packing", Kind: "string", Group: "dataset", Default: "concat",
		Doc: "with seq_len, how documents become samples: concat (concatenated in the epoch's document order and cut, each sample sharing its last token with the next), best_fit (packed by best-fit decreasing over windows of documents, padded; one epoch a job), pad (one document a sample, truncated or padded)"},
	{Name: "pad_last", Kind: "bool", Group: "dataset", Default: "false", Doc: "with packing concat: keep the epoch's last partial sample, padded, instead of dropping it"},
	{Name: "eod", Kind: "int", Group: "dataset", Max: maxVocab - 1, Default: "none",
		Doc: "with seq_len, the end-of-document token: a flat corpus's documents end at it, and in every corpus a document's segment ends after it",
		int: func(s *wire.JobSpec) int64 {
			if s.EOD == nil {
				return 0
			}
			return *s.EOD
		}},
	{Name: "vocab_size", Kind: "int", Group: "dataset", Max: maxVocab, Default: "0 (not checked)",
		Doc: "with seq_len, the vocabulary's size: a token at or above it is an error naming its file and offset", int: func(s *wire.JobSpec) int64 { return s.VocabSize }},
	{Name: "pad_id", Kind: "int", Group: "dataset", Max: maxVocab - 1, Default: "0",
		Doc: "with seq_len, the input id of padding (its labels are -100 and its loss_mask 0)", int: func(s *wire.JobSpec) int64 { return s.PadID }},
	{Name: "token_dtype", Kind: "string", Group: "dataset", Default: "the files' (a flat file says none: required)",
		Doc: "with seq_len, a flat token file's dtype: uint8, int8, int16, uint16, int32, uint32, int64 or uint64 (nanoGPT's .bin: uint16)"},
	{Name: "token_column", Kind: "string", Group: "dataset", Default: "input_ids",
		Doc: "with seq_len, the column of an Arrow, Parquet or Hugging Face corpus holding each row's list of token ids"},
	{Name: "pack_window", Kind: "int", Group: "dataset", Max: maxPackWindow, Default: fmt.Sprint(sequence.DefaultWindow),
		Doc: "with packing best_fit, the documents of the epoch's order packed together", int: func(s *wire.JobSpec) int64 { return int64(s.PackWindow) }},
	{Name: "shuffle", Kind: "bool", Group: "order", Default: "true in clients (false: sequential)", Doc: "a global shuffle each epoch"},
	{Name: "sampler", Kind: "string", Group: "order", Default: "global (Parquet: block over pages)",
		Doc: "the order: " + strings.Join(sampler.Kinds, ", ") + "; or auto: the global or block order (block_size, window) of least device time per epoch, on the device's measured rate by read size, whose randomization level reaches min_randomness (opened says which)"},
	{Name: "min_randomness", Kind: "float", Group: "order", Default: fmt.Sprint(defaultMinRandomness),
		Doc: "with sampler auto: the least randomization level (DeepIO's RL, 0 to 1; a global shuffle is 1) of the order it picks"},
	{Name: "auto_order", Kind: "order", Group: "place", Default: "none (choose)",
		Doc: "with sampler auto: the order it chose before ({sampler, block_size, window}, from opened or a state), read again without choosing"},
	{Name: "block_size", Kind: "int", Group: "order", Max: maxBlockSize, Default: "the device's block",
		Doc: "bytes per block of the block and buffered orders", int: func(s *wire.JobSpec) int64 { return int64(s.BlockSize) }},
	{Name: "window", Kind: "int", Group: "order", Max: loader.MaxWindow, Default: "16 (pages: 16)",
		Doc: "blocks whose records the block order spreads over as many batches", int: func(s *wire.JobSpec) int64 { return int64(s.Window) }},
	{Name: "buffer", Kind: "int", Group: "order", Max: maxBuffer, Default: "the sampler's",
		Doc: "records in each window the buffered order shuffles (its memory)", int: func(s *wire.JobSpec) int64 { return int64(s.Buffer) }},
	{Name: "reservoir", Kind: "int", Group: "order", Max: maxBuffer, Default: "the sampler's",
		Doc: "records of the reservoir order's reservoir", int: func(s *wire.JobSpec) int64 { return int64(s.Reservoir) }},
	{Name: "opportunistic", Kind: "int", Group: "order", Max: loader.MaxWindow, Default: "1 (off)",
		Doc: "batches of whichever records of that many batches arrive first", int: func(s *wire.JobSpec) int64 { return int64(s.Opportunistic) }},
	{Name: "seed", Kind: "int", Group: "order", Min: 0, Max: math.MaxInt64, Default: "0 (riffle.torch: drawn from torch's generator)",
		Doc: "the order's seed: epochs are functions of (seed, epoch)", int: func(s *wire.JobSpec) int64 { return int64(s.Seed >> 1) }},
	{Name: "rank", Kind: "int", Group: "sharing", Max: maxWorld - 1, Default: "0", Doc: "this rank, as DistributedSampler's",
		int: func(s *wire.JobSpec) int64 { return int64(s.Rank) }},
	{Name: "world", Python: "world_size", Kind: "int", Group: "sharing", Max: maxWorld, Default: "1", Doc: "ranks sharing each epoch",
		int: func(s *wire.JobSpec) int64 { return int64(s.World) }},
	{Name: "rank_drop_last", Kind: "bool", Group: "sharing", Default: "false", Doc: "DistributedSampler's drop_last: ranks drop the tail instead of padding"},
	{Name: "share", Kind: "bool", Group: "sharing", Default: "false",
		Doc: "sample dependently with the other sharing jobs on this source: reads, transforms and the cache shared (a global shuffle's: another order reads alone)"},
	{Name: "batch_size", Kind: "int", Group: "batches", Min: 1, Max: loader.MaxBatchSize, Default: fmt.Sprint(DefaultBatchSize),
		Doc: "records per batch", int: func(s *wire.JobSpec) int64 { return int64(s.BatchSize) }},
	{Name: "drop_last", Kind: "bool", Group: "batches", Default: "false", Doc: "DataLoader's drop_last: drop the last short batch"},
	{Name: "prefetch", Kind: "int", Group: "batches", Max: loader.MaxPrefetch, Default: "adaptive (sharing: 2)",
		Doc: "batches read ahead", int: func(s *wire.JobSpec) int64 { return int64(s.Prefetch) }},
	{Name: "depth", Kind: "int", Group: "batches", Max: loader.MaxDepth, Default: "chosen per device from its rate and latency as it reads",
		Doc: "reads in flight; set, it pins them (the job then reads through its own queue)", int: func(s *wire.JobSpec) int64 { return int64(s.Depth) }},
	{Name: "memory_bytes", Python: "memory", Kind: "int", Group: "batches", Max: math.MaxInt64, Default: "room for 16 batches, at least 64 MiB (in a small memory budget, a 32nd of its part for jobs)",
		Doc: "the bound on batches in flight and held", int: func(s *wire.JobSpec) int64 { return s.MemoryBytes }},
	{Name: "ordered", Kind: "bool", Group: "batches", Default: "false when shuffling", Doc: "keep the sampler's order inside batches"},
	{Name: "batch_stride", Kind: "int", Group: "sharing", Max: maxWorld, Default: "1",
		Doc: "deliver only batches offset, offset+stride, ... (DataLoader workers)", int: func(s *wire.JobSpec) int64 { return int64(s.BatchStride) }},
	{Name: "batch_offset", Kind: "int", Group: "sharing", Max: maxWorld - 1, Default: "0",
		Doc: "see batch_stride", int: func(s *wire.JobSpec) int64 { return int64(s.BatchOffset) }},
	{Name: "epoch", Kind: "int", Group: "place", Max: maxEpoch, Default: "0", Doc: "the epoch to start at",
		int: func(s *wire.JobSpec) int64 { return int64(s.Epoch) }},
	{Name: "start", Kind: "int", Group: "place", Max: maxEpoch, Default: "0",
		Doc: "positions of epoch's order delivered by another topology: the job is the rest of that epoch (one epoch of an order that is a function of position: not shared)",
		int: func(s *wire.JobSpec) int64 { return int64(s.Start) }},
	{Name: "batch", Kind: "int", Group: "place", Max: maxEpoch, Default: "0", Doc: "the batch to start at",
		int: func(s *wire.JobSpec) int64 { return int64(s.Batch) }},
	{Name: "epochs", Kind: "int", Group: "place", Min: -1, Max: maxEpochs, Default: "1 (negative: without end)",
		Doc: "epochs to load", int: func(s *wire.JobSpec) int64 { return max(-1, int64(s.Epochs)) }},
	{Name: "sampler_state", Kind: "bytes", Group: "place", Max: 1 << 28, Default: "none", Doc: "a stream order's saved state (from a batch's state)"},
	{Name: "skip", Kind: "ids", Group: "place", Max: loader.MaxWindow * loader.MaxBatchSize, Default: "none",
		Doc: "records of the opportunistic window already delivered"},
	{Name: "delivered", Kind: "states", Group: "place", Max: maxDelivered, Default: "none",
		Doc: "the places in epoch of every part (rank, worker) of a shared or opportunistic order's run, of any topology: the job is the rest of that epoch without the records they delivered (one epoch)"},
}

// Plan is a checked spec: what to open, in which order, how loaded.
type Plan struct {
	Paths   []string
	Dataset dataset.Options
	Sampler sampler.Config
	Loader  loader.Options
	Subset  *wire.Subset
	Filter  *wire.Filter
	Dedup   bool
	// Refresh: the dataset grows by epochs (job/grow.go); Generations is
	// how many generations of files the epoch reads (0: as the log says).
	Refresh     bool
	Generations int
	// Mixture, if set, is the sources mixed instead of Paths.
	Mixture   *Mixture
	Transform string
	Share     bool
	Memory    int64 // 0: Open picks
	// MinRandomness is the RL sampler "auto" must reach (order/auto.go);
	// AutoOrder, the order it chose before, read again.
	MinRandomness float64
	AutoOrder     *wire.AutoOrder
	// DirectUnset: the spec left direct to the job (Open's readsDirect).
	DirectUnset bool
	// Delivered are the places of the parts of a shared order's run in
	// the epoch the job opens at: the job is that epoch's rest.
	Delivered []wire.State
	// Tokens, if set, says Paths are a token corpus, whose records are
	// each epoch's samples (tokens.go).
	Tokens *Tokens
}

// Order is the order's part of the plan: what package order opens.
func (p Plan) Order() order.Plan {
	o := order.Plan{Sampler: p.Sampler, Share: p.Share, Delivered: p.Delivered, Epoch: p.Loader.Epoch,
		BatchSize: p.Loader.BatchSize, BatchStride: p.Loader.BatchStride, BatchOffset: p.Loader.BatchOffset,
		Opportunistic: p.Loader.Opportunistic, DropLast: p.Loader.DropLast, Ordered: p.Loader.Ordered,
		MinRandomness: p.MinRandomness, AutoOrder: p.AutoOrder, Subset: p.Subset, Filter: p.Filter, Dedup: p.Dedup}
	if p.Mixture != nil {
		o.Mixture = &order.Mixture{Segments: p.Mixture.Segments, Cycle: p.Mixture.Cycle}
	}
	return o
}

// ErrSpec marks an error in what a spec asked for.
var ErrSpec = errSpec

func specErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errSpec}, args...)...)
}

// Check checks spec against the table and fills in the defaults: the one
// place a job's options become a Plan.
func Check(spec *wire.JobSpec) (Plan, error) {
	var c Plan
	var err error
	if spec == nil {
		return c, specErr("open without a spec")
	}
	if len(spec.Mixture) > 0 {
		if len(spec.Paths) > 0 {
			return c, specErr("both paths and a mixture: give one")
		}
		mix, err := checkMixture(spec)
		if err != nil {
			return c, err
		}
		c.Mixture = mix
	} else if err := checkPaths(spec.Paths); err != nil {
		return c, err
	} else if spec.MixtureStop != "" || len(spec.MixtureHistory) > 0 {
		return c, specErr("mixture_stop or mixture_history without a mixture")
	}
	for _, o := range Options {
		if o.int == nil {
			continue
		}
		v, hi := o.int(spec), o.Max
		if o.Name == "memory_bytes" {
			hi = MaxMemory()
		}
		if v < o.Min || v > hi {
			return c, specErr("%s is %d, want %d to %d", o.Name, v, o.Min, hi)
		}
	}
	world := max(1, spec.World)
	if spec.Rank >= world {
		return c, specErr("rank %d of world %d: want 0 <= rank < world", spec.Rank, world)
	}
	if spec.MemoryBytes != 0 && spec.MemoryBytes < minMemory {
		return c, specErr("memory_bytes is %d, want at least %d (or 0 for the daemon's choice)", spec.MemoryBytes, minMemory)
	}
	if len(spec.Columns) > maxColumns || len(spec.Extensions) > maxColumns {
		return c, specErr("columns or extensions: %d and %d given, at most %d", len(spec.Columns), len(spec.Extensions), maxColumns)
	}
	for _, name := range append(append(slices.Clone(spec.Columns), spec.Extensions...), spec.Split) {
		if len(name) > maxName {
			return c, specErr("a column or split name of %d bytes, at most %d", len(name), maxName)
		}
	}
	if len(spec.Skip) > loader.MaxWindow*loader.MaxBatchSize || len(spec.SamplerState) > 1<<28 {
		return c, specErr("resume state too large")
	}
	if spec.Subset != nil {
		n := len(spec.Subset.IDs) + len(spec.Subset.Ranges) + len(spec.Subset.Labels)
		if n > maxSubsetIDs {
			return c, specErr("subset: %d entries, at most %d", n, maxSubsetIDs)
		}
		for _, r := range spec.Subset.Ranges {
			if r[0] < 0 || r[1] < r[0] {
				return c, specErr("subset range [%d, %d)", r[0], r[1])
			}
		}
		for _, id := range spec.Subset.IDs {
			if id < 0 {
				return c, specErr("subset id %d", id)
			}
		}
		if f := spec.Subset.IDsFile; f != "" && (len(f) > maxPathLen || strings.ContainsRune(f, 0)) {
			return c, specErr("subset ids_file %.80q: longer than %d bytes or holding a NUL", f, maxPathLen)
		}
		c.Subset = spec.Subset
	}
	if f := spec.Filter; f != nil {
		if len(f.Labels) > maxSubsetIDs || f.MinSize < 0 || f.MaxSize < 0 || (f.MaxSize > 0 && f.MaxSize < f.MinSize) || len(f.Glob) > maxPathLen {
			return c, specErr("filter: %d labels (at most %d), sizes %d to %d, a glob of %d bytes", len(f.Labels), maxSubsetIDs, f.MinSize, f.MaxSize, len(f.Glob))
		}
		if f.Glob != "" {
			if _, err := filepath.Match(f.Glob, ""); err != nil {
				return c, specErr("filter glob %q: %v", f.Glob, err)
			}
		}
		if len(f.In) > maxSubsetIDs || len(f.Column) > maxName {
			return c, specErr("filter: %d values (at most %d), a column name of %d bytes", len(f.In), maxSubsetIDs, len(f.Column))
		}
		for _, v := range f.In {
			switch v.(type) {
			case string, float64, bool:
			default:
				return c, specErr("filter in: %v is not a string, number or boolean", v)
			}
		}
		if (f.Column == "") != (len(f.In) == 0 && f.Min == nil && f.Max == nil) {
			return c, specErr("filter: a column takes in, min or max, and they take a column")
		}
		c.Filter = f
	}
	c.Dedup = spec.Dedup
	switch spec.Refresh {
	case "":
		if spec.Generations > 0 {
			return c, specErr("generations without refresh")
		}
	case "epoch":
		if len(spec.Mixture) > 0 && spec.Generations > 0 {
			return c, specErr("generations of a mixture: each source's are its log's for the epoch")
		}
		if spec.Epochs != 1 {
			return c, specErr("refresh %q takes one epoch a job (epochs 1): the next epoch may read more files", spec.Refresh)
		}
		c.Refresh, c.Generations = true, spec.Generations
	default:
		return c, specErr("refresh %q: want epoch, or none", spec.Refresh)
	}
	if spec.Format != "" && spec.SeqLen == 0 && !slices.Contains(dataset.Formats(), spec.Format) {
		return c, specErr("format %q (known: %s)", spec.Format, strings.Join(dataset.Formats(), ", "))
	}
	kind := spec.Sampler
	if kind == "" && !spec.Shuffle {
		kind = "sequential"
	}
	if kind != "" && kind != "auto" && !slices.Contains(sampler.Kinds, kind) {
		return c, specErr("sampler %q (known: %s, auto)", kind, strings.Join(sampler.Kinds, ", "))
	}
	if m := spec.MinRandomness; m < 0 || m > 1 || math.IsNaN(m) || (m > 0 && kind != "auto") {
		return c, specErr("min_randomness %g: want a level in [0, 1], with sampler auto", m)
	}
	c.MinRandomness = spec.MinRandomness
	if kind == "auto" {
		if c.MinRandomness == 0 {
			c.MinRandomness = defaultMinRandomness
		}
		if len(spec.Mixture) > 0 || spec.BlockSize > 0 || spec.Window > 0 {
			return c, specErr("sampler auto picks the order and its block_size and window, of one dataset: name them, or leave them out")
		}
	}
	if o := spec.AutoOrder; o != nil {
		ok := kind == "auto" && ((o.Sampler == "global" && o.BlockSize == 0 && o.Window == 0) ||
			(o.Sampler == "block" && o.BlockSize > 0 && o.BlockSize <= maxBlockSize && o.Window > 0 && o.Window <= loader.MaxWindow))
		if !ok {
			return c, specErr("auto_order %+v: want the global order, or a block order of block_size in [1, %d] and window in [1, %d], with sampler auto",
				*o, maxBlockSize, loader.MaxWindow)
		}
		a := *o
		c.AutoOrder = &a
	}
	// Jobs sample dependently in a global shuffle only (Joader's sampling
	// is of uniform orders): share with another order reads alone, as an
	// opened reply's order says (wire.OrderInfo.Shared).
	c.Share = spec.Share != nil && *spec.Share && sampler.Uniform(kind)
	if spec.BatchOffset > 0 && spec.BatchOffset >= max(1, spec.BatchStride) {
		return c, specErr("batch_offset %d of batch_stride %d: want offset < stride", spec.BatchOffset, spec.BatchStride)
	}
	if c.Mixture != nil {
		if !sampler.Positional(kind) {
			return c, specErr("a mixture's sources are in an order that is a function of position (sampler %q)", kind)
		}
	}
	c.Paths = spec.Paths
	c.DirectUnset = spec.Direct == nil
	c.Dataset = dataset.Options{
		Format: spec.Format, RecordSize: spec.RecordSize, HeaderBytes: spec.HeaderBytes, CSVHeader: spec.CSVHeader,
		SkipCRC: spec.SkipCRC, DropPartialTail: spec.DropPartial, Direct: spec.Direct != nil && *spec.Direct,
		Columns: spec.Columns, Split: spec.Split, Extensions: spec.Extensions,
	}
	c.Sampler = sampler.Config{Kind: kind, Seed: spec.Seed, BlockSize: spec.BlockSize, Window: spec.Window,
		Buffer: spec.Buffer, Reservoir: spec.Reservoir, Rank: spec.Rank, World: world,
		RankDropLast: spec.RankDropLast, BatchSize: spec.BatchSize, Start: spec.Start}
	ordered := kind == "sequential"
	if spec.Ordered != nil {
		ordered = *spec.Ordered
	}
	c.Loader = loader.Options{
		BatchSize: spec.BatchSize, DropLast: spec.DropLast, Depth: spec.Depth, Prefetch: spec.Prefetch,
		Ordered: ordered, Seed: spec.Seed, Epoch: spec.Epoch, Batch: spec.Batch, Epochs: spec.Epochs,
		SamplerState: spec.SamplerState, Skip: spec.Skip, Opportunistic: spec.Opportunistic,
		BatchStride: spec.BatchStride, BatchOffset: spec.BatchOffset,
	}
	c.Memory = spec.MemoryBytes
	c.Transform = spec.Transform
	// Where an epoch resumes is the order's to say (order.Plan): from a
	// position, or as the rest of an epoch from every part's places.
	o := c.Order()
	if len(spec.Delivered) > 0 {
		if err := checkDelivered(spec, o.Rest()); err != nil {
			return c, err
		}
		c.Delivered = spec.Delivered
	}
	if spec.Start > 0 && (spec.Epochs != 1 || len(spec.SamplerState) > 0 || !o.Positional()) {
		return c, specErr("start %d (the rest of an epoch begun on another topology) takes one epoch (epochs 1) of an order that is a function of position: not shared, not opportunistic, no saved stream state", spec.Start)
	}
	if spec.SeqLen > 0 || tokenOption(spec) != "" {
		if c.Tokens, err = checkTokens(spec, c); err != nil {
			return c, err
		}
		if c.Tokens.Sequence.Mode == sequence.BestFit {
			c.Loader.Epochs = 1 // its one epoch (checkTokens)
		}
	}
	return c, nil
}

// maxDelivered bounds the places a rest of an epoch is given: 8 ranks of
// 64 workers each, and the set the rest before it delivered.
const maxDelivered = 8*64 + 1

// checkDelivered checks the places a rest of an epoch leaves out: of one
// epoch of an order that resumes so (rest, order.Plan.Rest: a shared or an
// opportunistic global order), each small enough.
func checkDelivered(spec *wire.JobSpec, rest string) error {
	total := 0
	for k, st := range spec.Delivered {
		total += len(st.Sampler) + 8*len(st.Skip)
		if p := st.Part; p != nil && (p.World < 1 || p.World > maxWorld || p.Rank < 0 || p.Rank >= p.World ||
			p.Workers < 1 || p.Workers > maxWorld || p.Worker < 0 || p.Worker >= p.Workers ||
			p.BatchSize < 0 || p.BatchSize > loader.MaxBatchSize || p.Window < 0 || p.Window > loader.MaxWindow) {
			return specErr("delivered: place %d's part (%+v) is out of bounds (at most %d ranks of %d workers, batches of %d in windows of %d)",
				k, *p, maxWorld, maxWorld, loader.MaxBatchSize, loader.MaxWindow)
		}
	}
	switch {
	case len(spec.Delivered) > maxDelivered || total > 1<<28:
		return specErr("delivered: %d places of %d bytes, at most %d places of 256 MiB", len(spec.Delivered), total, maxDelivered)
	case rest == "" || spec.Start > 0:
		return specErr("delivered (the places of the parts of a run) takes a shared, or an opportunistic, global order of one dataset: a mixture resumes on the topology it was saved on, and an order that is a function of position resumes from its position (start)")
	case spec.Epochs != 1:
		return specErr("delivered: the rest of one epoch (epochs 1); the next is a job of its own")
	}
	return nil
}

func checkPaths(paths []string) error {
	if len(paths) == 0 || len(paths) > maxPaths {
		return specErr("paths: %d given, want 1 to %d", len(paths), maxPaths)
	}
	for _, p := range paths {
		if p == "" || len(p) > maxPathLen || strings.ContainsRune(p, 0) {
			return specErr("path %.80q: empty, longer than %d bytes or holding a NUL", p, maxPathLen)
		}
	}
	return nil
}

// Mixture is a checked mixture: its sources' files, and its weights from
// epoch 0 on, each from a place (an epoch and a position of its order).
type Mixture struct {
	Sources  [][]string
	Segments []sampler.Segment
	// Cycle: all_exhausted.
	Cycle bool
}

func checkMixture(spec *wire.JobSpec) (*Mixture, error) {
	if len(spec.Mixture) > maxSources {
		return nil, specErr("mixture: %d sources, at most %d", len(spec.Mixture), maxSources)
	}
	if len(spec.MixtureHistory)+len(spec.MixtureSchedule) > maxWeights {
		return nil, specErr("mixture_history and mixture_schedule: %d changes of weights, at most %d", len(spec.MixtureHistory)+len(spec.MixtureSchedule), maxWeights)
	}
	m := &Mixture{}
	switch spec.MixtureStop {
	case "", "first_exhausted":
	case "all_exhausted":
		m.Cycle = true
	default:
		return nil, specErr("mixture_stop %q: want first_exhausted or all_exhausted", spec.MixtureStop)
	}
	weights := func(ws []float64, what string) error {
		if len(ws) != len(spec.Mixture) {
			return specErr("%s: %d weights for %d sources", what, len(ws), len(spec.Mixture))
		}
		if err := sampler.CheckWeights(ws); err != nil {
			return specErr("%s: %v", what, err)
		}
		return nil
	}
	npaths := 0
	cur := make([]float64, len(spec.Mixture))
	for i, s := range spec.Mixture {
		if npaths += len(s.Paths); npaths > maxPaths {
			return nil, specErr("mixture: more than %d paths", maxPaths)
		}
		if err := checkPaths(s.Paths); err != nil {
			return nil, fmt.Errorf("mixture source %d: %w", i, err)
		}
		m.Sources = append(m.Sources, s.Paths)
		cur[i] = s.Weight
	}
	from, at := 0, 0
	for _, h := range spec.MixtureHistory {
		if err := weights(h.Weights, fmt.Sprintf("mixture_history until epoch %d position %d", h.Until, h.Position)); err != nil {
			return nil, err
		}
		if h.Until > maxEpoch || h.Position < 0 || h.Position > sampler.MaxPositions || h.Until < from || h.Until == from && h.Position <= at {
			return nil, specErr("mixture_history: weights until epoch %d position %d after epoch %d position %d, want increasing places", h.Until, h.Position, from, at)
		}
		m.Segments = append(m.Segments, sampler.Segment{From: from, At: at, Weights: h.Weights})
		from, at = h.Until, h.Position
	}
	if err := weights(cur, "mixture"); err != nil {
		return nil, err
	}
	m.Segments = append(m.Segments, sampler.Segment{From: from, At: at, Weights: cur})
	// A schedule's steps are of this run's global batch: positions of the
	// epoch's order, as a state keeps them, the same on any topology.
	global := int64(max(1, spec.BatchSize)) * int64(max(1, spec.World))
	for _, c := range spec.MixtureSchedule {
		if err := weights(c.Weights, fmt.Sprintf("mixture_schedule from epoch %d step %d", c.Epoch, c.Step)); err != nil {
			return nil, err
		}
		if c.Epoch < 0 || c.Epoch > maxEpoch || c.Step < 0 || int64(c.Step) > sampler.MaxPositions/global {
			return nil, specErr("mixture_schedule: epoch %d step %d, want epochs 0 to %d and steps of at most 2^50 positions", c.Epoch, c.Step, maxEpoch)
		}
		m.Segments = append(m.Segments, sampler.Segment{From: c.Epoch, At: int(int64(c.Step) * global), Weights: c.Weights})
	}
	if err := sampler.CheckSegments(m.Segments, len(spec.Mixture), m.Cycle); err != nil {
		return nil, specErr("%v", err)
	}
	return m, nil
}

// mulSat multiplies non-negative numbers, saturating at MaxInt64 instead
// of wrapping.
func mulSat(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<63-1 {
		return 1<<63 - 1
	}
	return int64(lo)
}
