package server

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/wire"
)

// A job spec crosses the socket from any client, careless or hostile, so
// every field is checked against bounds here, once, before any arithmetic
// on it; and here, once, each field becomes an option with the daemon's
// defaults (docs/protocol.md lists both).
const (
	maxPaths      = 1 << 17
	maxPathLen    = 4096
	maxRecordSize = 1 << 30
	maxHeader     = 1 << 40
	maxWorld      = 1 << 16
	maxEpoch      = 1 << 40
	maxEpochs     = 1 << 30
	maxBuffer     = 1 << 26
	maxBlockSize  = 1 << 30
	maxSubsetIDs  = 1 << 24
	maxColumns    = 1 << 12
	maxName       = 1 << 12 // a column's or a split's
	// minMemory is the least memory_bytes a client may ask for.
	minMemory = 1 << 16
)

// jobConfig is a checked spec: what to open, in which order, how loaded.
type jobConfig struct {
	paths     []string
	ds        dataset.Options
	smp       sampler.Config
	ld        loader.Options
	subset    *wire.Subset
	transform string
	share     bool
	memory    int64 // 0: the daemon picks
}

func specErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errSpec}, args...)...)
}

// configure checks spec and fills in the daemon's defaults.
func configure(spec *wire.JobSpec) (jobConfig, error) {
	var c jobConfig
	if spec == nil {
		return c, specErr("open without a spec")
	}
	if len(spec.Paths) == 0 || len(spec.Paths) > maxPaths {
		return c, specErr("paths: %d given, want 1 to %d", len(spec.Paths), maxPaths)
	}
	for _, p := range spec.Paths {
		if p == "" || len(p) > maxPathLen || strings.ContainsRune(p, 0) {
			return c, specErr("path %.80q: empty, longer than %d bytes or holding a NUL", p, maxPathLen)
		}
	}
	check := []struct {
		name        string
		v, min, max int64
	}{
		{"record_size", int64(spec.RecordSize), 0, maxRecordSize},
		{"header_bytes", spec.HeaderBytes, 0, maxHeader},
		{"batch_size", int64(spec.BatchSize), 0, loader.MaxBatchSize},
		{"block_size", int64(spec.BlockSize), 0, maxBlockSize},
		{"window", int64(spec.Window), 0, loader.MaxWindow},
		{"buffer", int64(spec.Buffer), 0, maxBuffer},
		{"reservoir", int64(spec.Reservoir), 0, maxBuffer},
		{"opportunistic", int64(spec.Opportunistic), 0, loader.MaxWindow},
		{"world", int64(spec.World), 0, maxWorld},
		{"rank", int64(spec.Rank), 0, maxWorld - 1},
		{"prefetch", int64(spec.Prefetch), 0, loader.MaxPrefetch},
		{"depth", int64(spec.Depth), 0, loader.MaxDepth},
		{"memory_bytes", spec.MemoryBytes, 0, maxJobMemory()},
		{"epoch", int64(spec.Epoch), 0, maxEpoch},
		{"batch", int64(spec.Batch), 0, maxEpoch},
		{"epochs", int64(spec.Epochs), math.MinInt64, maxEpochs},
		{"batch_stride", int64(spec.BatchStride), 0, maxWorld},
		{"batch_offset", int64(spec.BatchOffset), 0, maxWorld},
	}
	for _, f := range check { // epochs may be negative: without end
		if f.v < f.min || f.v > f.max {
			return c, specErr("%s is %d, want %d to %d", f.name, f.v, max(f.min, 0), f.max)
		}
	}
	if spec.BatchSize < 1 {
		return c, specErr("batch_size is %d, want at least 1", spec.BatchSize)
	}
	if spec.World < 0 {
		return c, specErr("world is %d, want at least 1 (0 means 1)", spec.World)
	}
	world := max(1, spec.World)
	if spec.Rank >= world {
		return c, specErr("rank %d of world %d: want 0 <= rank < world", spec.Rank, world)
	}
	if spec.MemoryBytes != 0 && spec.MemoryBytes < minMemory {
		return c, specErr("memory_bytes is %d, want at least %d (or 0 for the daemon's choice)", spec.MemoryBytes, minMemory)
	}
	if len(spec.Columns) > maxColumns {
		return c, specErr("columns: %d given, at most %d", len(spec.Columns), maxColumns)
	}
	for _, name := range append(slices.Clone(spec.Columns), spec.Split) {
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
		c.subset = spec.Subset
	}
	if spec.Format != "" && !containsFormat(spec.Format) {
		return c, specErr("format %q (known: %s)", spec.Format, strings.Join(dataset.Formats(), ", "))
	}
	kind := spec.Sampler
	if kind == "" && !spec.Shuffle {
		kind = "sequential"
	}
	if kind != "" && !containsKind(kind) {
		return c, specErr("sampler %q (known: %s)", kind, strings.Join(sampler.Kinds, ", "))
	}
	c.paths = spec.Paths
	c.ds = dataset.Options{
		Format: spec.Format, RecordSize: spec.RecordSize, HeaderBytes: spec.HeaderBytes, CSVHeader: spec.CSVHeader,
		SkipCRC: spec.SkipCRC, DropPartialTail: spec.DropPartial, Direct: spec.Direct,
		Columns: spec.Columns, Split: spec.Split,
	}
	c.smp = sampler.Config{Kind: kind, Seed: spec.Seed, BlockSize: spec.BlockSize, Window: spec.Window,
		Buffer: spec.Buffer, Reservoir: spec.Reservoir, Rank: spec.Rank, World: world,
		ShardDropLast: spec.ShardDropLast, BatchSize: spec.BatchSize}
	ordered := kind == "sequential"
	if spec.Ordered != nil {
		ordered = *spec.Ordered
	}
	c.ld = loader.Options{
		BatchSize: spec.BatchSize, DropLast: spec.DropLast, Depth: spec.Depth, Prefetch: spec.Prefetch,
		Ordered: ordered, Seed: spec.Seed, Epoch: spec.Epoch, Batch: spec.Batch, Epochs: spec.Epochs,
		SamplerState: spec.SamplerState, Skip: spec.Skip, Opportunistic: spec.Opportunistic,
		BatchStride: spec.BatchStride, BatchOffset: spec.BatchOffset,
	}
	if spec.BatchOffset > 0 && spec.BatchOffset >= max(1, spec.BatchStride) {
		return c, specErr("batch_offset %d of batch_stride %d: want offset < stride", spec.BatchOffset, spec.BatchStride)
	}
	c.memory = spec.MemoryBytes
	c.transform = spec.Transform
	c.share = spec.Share != nil && *spec.Share
	return c, nil
}

func containsFormat(f string) bool {
	for _, n := range dataset.Formats() {
		if n == f {
			return true
		}
	}
	return false
}

func containsKind(k string) bool {
	for _, n := range sampler.Kinds {
		if n == k {
			return true
		}
	}
	return false
}

// maxJobMemory bounds one job's memory: half the machine's memory.
func maxJobMemory() int64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 1 << 34
	}
	return int64(si.Totalram) * int64(si.Unit) / 2
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
