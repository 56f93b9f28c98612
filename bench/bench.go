// Package bench measures riffle against the baselines it must beat, side by
// side in one run on one dataset, because on a shared machine only a ratio
// measured in the same run means anything:
//
//   - riffle: a global shuffle loaded with many concurrent reads per batch;
//   - pread: the same permutation read one record at a time, as a map-style
//     PyTorch Dataset does in each DataLoader worker;
//   - sequential: the dataset's objects read whole, in order, the device's
//     streaming rate;
//   - fio: random reads at about the record size and a deep queue over the
//     dataset's objects, the device's random-read ceiling.
//
// Every baseline reads the dataset's own objects (Objects), whatever its
// format: a directory tree's files, a pack's shards, a Hugging Face
// directory's Arrow files. Cold runs drop the page cache first; every run
// reports the bytes it fetched from storage (a Meter: this process's
// read_bytes from /proc/self/io, which other processes' I/O does not touch
// and page-cache hits do not add to, or an object store's bytes), so read
// amplification shows next to speed.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// Result is one measurement.
type Result struct {
	Name    string `json:"name"`
	Records int64  `json:"records"`
	// Bytes are the bytes read: for riffle every byte its loader read from
	// storage (loader.Stats Bytes and Staged: alignment, coalesced gaps and
	// read-ahead for a staging sampler included, and for a dataset of rows
	// each row's cells); for the baselines the bytes they read.
	Bytes int64 `json:"bytes"`
	Reads int64 `json:"reads"` // reads issued
	// DevBytes are the bytes the measurement fetched from storage, as
	// Meter says (not the whole device's count, which other processes'
	// I/O adds to); -1 if unknown.
	DevBytes int64 `json:"dev_bytes"`
	// Meter says what DevBytes counts.
	Meter   string  `json:"meter,omitempty"`
	Seconds float64 `json:"seconds"`
	// CPU is the CPU time the reader spent, user and system, in seconds
	// (riffle's: this process's over the measurement; fio's: its own);
	// 0 if unknown.
	CPU float64 `json:"cpu_seconds,omitempty"`
	// Depth is the reads in flight: fio's queue depth, or the depth
	// riffle's engine had chosen at the end.
	Depth int `json:"depth,omitempty"`
	// Direct says riffle read with O_DIRECT (a job's choice, or asked).
	Direct bool `json:"direct,omitempty"`
}

// CoresPerMIOPS is the CPU the reads cost in cores per million reads/s
// (CPU seconds per million reads); 0 if unknown.
func (r Result) CoresPerMIOPS() float64 {
	if r.CPU <= 0 || r.Reads <= 0 {
		return 0
	}
	return r.CPU / (float64(r.Reads) / 1e6)
}

// cpuSelf is this process's CPU time so far, user and system, in seconds.
func cpuSelf() float64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// SamplesPerSec is records delivered per second.
func (r Result) SamplesPerSec() float64 { return float64(r.Records) / r.Seconds }

// MBPerSec is bytes read per second, in MB.
func (r Result) MBPerSec() float64 { return float64(r.Bytes) / r.Seconds / 1e6 }

// IOPS is reads issued per second.
func (r Result) IOPS() float64 { return float64(r.Reads) / r.Seconds }

// Limit bounds one measurement: whichever comes first.
type Limit struct {
	Records  int
	Duration time.Duration
}

func (l Limit) done(n int, start time.Time) bool {
	return (l.Records > 0 && n >= l.Records) || (l.Duration > 0 && time.Since(start) >= l.Duration)
}

// Objects names the objects ds's records live in, in the order of their
// indexes: what a sequential read reads whole and fio reads at random. A
// directory tree's Info().Paths is its root and a pack's is its
// directory; these are the files themselves. It visits every record once.
func Objects(ds dataset.Dataset) []string {
	n := 0
	for id := range ds.Len() {
		n = max(n, ds.Locate(id).Object+1)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = ds.Object(i).Name()
	}
	return names
}

// Riffle loads ds in the order of s with opts until lim.
func Riffle(ctx context.Context, ds dataset.Dataset, s sampler.Sampler, opts loader.Options, lim Limit) (Result, error) {
	opts.Epochs = -1
	m := startMeasure(ds.Info().Paths[0])
	l, err := loader.New(ctx, ds, s, opts)
	if err != nil {
		return Result{}, err
	}
	defer l.Close()
	r := Result{Name: "riffle", Meter: m.meter.What}
	err = m.take(ctx, l, &r, lim)
	return r, err
}

// batches are a loader's or a job's.
type batches interface {
	Next(context.Context) (*loader.Batch, error)
	Stats() loader.Stats
	Depth() int
}

// measure is a riffle run's start: the clock, the CPU and the device's
// bytes read.
type measure struct {
	meter  Meter
	before int64
	start  time.Time
	cpu    float64
}

func startMeasure(path string) measure {
	m := measure{meter: MeterOf(Store(), path)}
	m.before, m.start, m.cpu = m.meter.Bytes(), time.Now(), cpuSelf()
	return m
}

// take takes src's batches until lim or their end, and fills r with what
// was read since the start.
func (m measure) take(ctx context.Context, src batches, r *Result, lim Limit) error {
	for !lim.done(int(r.Records), m.start) {
		b, err := src.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		r.Records += int64(len(b.IDs))
		b.Release()
	}
	// What the loader read, not the batches' payload: a batch of rows has
	// no per-record lengths, and the bytes read (alignment and the
	// batches read ahead included) are what the device served.
	st := src.Stats()
	r.Seconds = time.Since(m.start).Seconds()
	r.CPU = cpuSelf() - m.cpu
	r.Depth = src.Depth()
	r.Reads = st.Reads
	r.Bytes = st.Bytes + st.Staged
	r.DevBytes = m.meter.Since(m.before)
	return nil
}

// Pread reads the same global permutation one record at a time with one
// read each, as a map-style Dataset's __getitem__ does (a pread locally,
// one ranged GET from an object store). A row of a dataset of rows is
// read one cell (one column's range) at a time.
func Pread(ctx context.Context, ds dataset.Dataset, seed uint64, lim Limit) (Result, error) {
	store := Store()
	meter := MeterOf(store, ds.Info().Paths[0])
	before := meter.Bytes()
	rows, isRows := ds.(dataset.Rows)
	s := sampler.Global{N: ds.Len(), Seed: seed}
	r := Result{Name: "pread", Meter: meter.What}
	if storage.IsS3(ds.Info().Paths[0]) {
		r.Name = "one GET at a time"
	}
	var (
		buf   []byte
		cells []dataset.Loc
	)
	start := time.Now()
	for pos := 0; !lim.done(int(r.Records), start) && ctx.Err() == nil; pos++ {
		id := s.At(pos/ds.Len(), pos%ds.Len())
		cells = cells[:0]
		if isRows {
			plan, err := rows.BatchOf([]int{id})
			if err != nil {
				return r, err
			}
			cells = plan.Cells(0, cells)
			plan.Release()
		} else {
			cells = append(cells, ds.Locate(id))
		}
		for _, c := range cells {
			if c.Len == 0 {
				continue
			}
			if cap(buf) < c.Len {
				buf = make([]byte, c.Len)
			}
			if err := ds.Object(c.Object).ReadAt(ctx, buf[:c.Len], c.Off); err != nil {
				return r, err
			}
			r.Reads++
			r.Bytes += int64(c.Len)
		}
		r.Records++
	}
	r.Seconds = time.Since(start).Seconds()
	r.DevBytes = meter.Since(before)
	return r, ctx.Err()
}

// Sequential reads paths (a dataset's Objects) from start to end, one
// after another, in 1 MiB reads (or until lim's duration) and counts
// records as bytes over recordSize: the device's streaming rate, or one
// GET of each whole object from an object store.
func Sequential(ctx context.Context, paths []string, recordSize int, lim Limit) (Result, error) {
	store := Store()
	meter := MeterOf(store, paths[0])
	before := meter.Bytes()
	r := Result{Name: "sequential", Meter: meter.What}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for _, path := range paths {
		if lim.Duration > 0 && time.Since(start) >= lim.Duration {
			break
		}
		if err := sequentialOne(ctx, store, path, buf, &r, lim, start); err != nil {
			return r, err
		}
	}
	r.Seconds = time.Since(start).Seconds()
	r.Records = r.Bytes / int64(max(1, recordSize))
	r.DevBytes = meter.Since(before)
	return r, ctx.Err()
}

func sequentialOne(ctx context.Context, store *storage.Router, path string, buf []byte, r *Result, lim Limit, start time.Time) error {
	f, err := store.Stream(ctx, path)
	if err != nil {
		return err
	}
	defer f.Close()
	for ctx.Err() == nil && (lim.Duration == 0 || time.Since(start) < lim.Duration) {
		n, err := f.Read(buf)
		r.Bytes += int64(n)
		r.Reads++
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// store is the one store the benchmarks read through, so that an object
// store's counters see every baseline's GETs.
var (
	storeMu sync.Mutex
	store   *storage.Router
)

// Store is the store the benchmarks and the datasets they open share: by
// default the local file system and the object store the environment names.
func Store() *storage.Router {
	storeMu.Lock()
	defer storeMu.Unlock()
	if store == nil {
		l, _ := storage.NewLocal(false, nil)
		store = storage.NewRouter(l, storage.S3Options{}, nil)
	}
	return store
}

// SetStore makes r the store the measurements read through and count
// (an object store behind a latency proxy, say).
func SetStore(r *storage.Router) {
	storeMu.Lock()
	defer storeMu.Unlock()
	store = r
}

// A Meter counts the bytes fetched from where the data lives.
type Meter struct {
	// What says what it counts, for a report.
	What string
	read func() int64
}

// Meters' descriptions.
const (
	MeterProcess = "this process's read_bytes (/proc/self/io): bytes fetched from storage, page-cache hits not counted"
	MeterS3      = "bytes fetched from the object store"
	MeterFio     = "fio's read_bytes (its rusage)"
)

// Bytes is the count so far, -1 if unknown.
func (m Meter) Bytes() int64 {
	if m.read == nil {
		return -1
	}
	return m.read()
}

// Since is the count since an earlier Bytes, -1 if unknown.
func (m Meter) Since(before int64) int64 {
	now := m.Bytes()
	if before < 0 || now < 0 {
		return -1
	}
	return now - before
}

// MeterOf returns the meter of reads of path: for an s3:// path the bytes
// the object store served, otherwise this process's read_bytes, which
// counts what its reads made the storage layer fetch (read-ahead
// included) and nothing of other processes'. It counts every goroutine
// of the process, so measurements must not overlap.
func MeterOf(store *storage.Router, path string) Meter {
	if storage.IsS3(path) {
		return Meter{What: MeterS3, read: func() int64 {
			s3, err := store.Remote()
			if err != nil {
				return -1
			}
			return s3.Stats().Bytes
		}}
	}
	return Meter{What: MeterProcess, read: processReadBytes}
}

// processReadBytes is read_bytes of /proc/self/io, -1 if unknown (a
// kernel without task I/O accounting).
func processReadBytes() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "read_bytes:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// fioFiles is the most objects fio is given: enough to spread its reads
// over a dataset, few enough that it holds them all open.
const fioFiles = 64

// FioBlockSize is the block size fio reads records of mean size
// meanRecord at: rounded up to a multiple of the logical block size of
// path's device, and 4 KiB at least, because an O_DIRECT read of any
// other size fails with EINVAL.
func FioBlockSize(path string, meanRecord int) int {
	lb := logicalBlock(path)
	if lb <= 0 {
		lb = 4096
	}
	return max(4096, (meanRecord+lb-1)/lb*lb)
}

// logicalBlock is the logical block size of the device holding path
// (sysfs's queue/logical_block_size, a partition's from its disk), 0 if
// unknown.
func logicalBlock(path string) int {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	dev := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, p := range []string{dev + "/queue/logical_block_size", dev + "/../queue/logical_block_size"} {
		if b, err := os.ReadFile(p); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}

// Fio runs fio's random-read test for d over the files named (a dataset's
// Objects: at most fioFiles of them, evenly spaced, each at least bs
// long) at block size bs (FioBlockSize) and queue depth iodepth with
// O_DIRECT, and returns its reads as a Result. Its DevBytes are fio's own
// read_bytes. A failure carries what fio wrote on stderr.
func Fio(ctx context.Context, paths []string, bs, iodepth int, d time.Duration) (Result, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return Result{}, fmt.Errorf("fio is not installed (scripts/install-deps.sh installs it): %w", err)
	}
	var files []string
	step := max(1, len(paths)/fioFiles)
	for i := 0; i < len(paths) && len(files) < fioFiles; i += step {
		if st, err := os.Stat(paths[i]); err == nil && st.Mode().IsRegular() && st.Size() >= int64(bs) {
			files = append(files, strings.ReplaceAll(paths[i], ":", `\:`)) // fio separates names with ':'
		}
	}
	if len(files) == 0 {
		return Result{}, fmt.Errorf("no file of the dataset holds a block of %d bytes to read", bs)
	}
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, "fio", "--name=randread", "--filename="+strings.Join(files, ":"), "--rw=randread",
		"--bs="+strconv.Itoa(bs), "--direct=1", "--ioengine=libaio", "--iodepth="+strconv.Itoa(iodepth),
		"--time_based", fmt.Sprintf("--runtime=%.0fs", max(1, d.Seconds())), "--readonly", "--output-format=json",
		// fio's offsets repeat from run to run unless told otherwise, and a
		// virtual disk's host keeps what was read before in its memory: a
		// repeated sequence measured the host's cache (60k reads/s on this
		// VM where fresh offsets read 8k), not the device.
		"--randrepeat=0")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Result{}, fmt.Errorf("fio over %d files at bs=%d: %w%s", len(files), bs, err, firstLines(stderr.String(), 5))
	}
	var rep struct {
		Jobs []struct {
			Error int `json:"error"`
			Read  struct {
				IOBytes int64   `json:"io_bytes"`
				IOs     int64   `json:"total_ios"`
				Runtime float64 `json:"runtime"` // ms
			} `json:"read"`
			UsrCPU float64 `json:"usr_cpu"` // % of the job's time
			SysCPU float64 `json:"sys_cpu"`
		} `json:"jobs"`
	}
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:] // fio may print notes before its JSON
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Jobs) == 0 {
		return Result{}, fmt.Errorf("fio output: %v%s", err, firstLines(stderr.String(), 5))
	}
	if e := rep.Jobs[0].Error; e != 0 {
		return Result{}, fmt.Errorf("fio over %d files at bs=%d: %w%s", len(files), bs, unix.Errno(e), firstLines(stderr.String(), 5))
	}
	j := rep.Jobs[0].Read
	r := Result{Name: fmt.Sprintf("fio bs=%d qd=%d", bs, iodepth), Records: j.IOs, Reads: j.IOs, Bytes: j.IOBytes,
		Seconds: j.Runtime / 1000, DevBytes: -1, Meter: MeterFio, Depth: iodepth,
		CPU: (rep.Jobs[0].UsrCPU + rep.Jobs[0].SysCPU) / 100 * j.Runtime / 1000}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.DevBytes = ru.Inblock * 512 // Linux counts read_bytes in 512-byte units here
	}
	return r, nil
}

// firstLines is the first n lines of s, set off for an error message.
func firstLines(s string, n int) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("(%d more lines)", len(lines)-n))
	}
	return "\n  " + strings.Join(lines, "\n  ")
}

// DropCaches writes back dirty pages and drops the page cache, so the next
// measurement reads from the device. It needs root.
func DropCaches() error {
	unix.Sync()
	err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
	if err != nil {
		return fmt.Errorf("dropping the page cache (needs root): %w", err)
	}
	return nil
}

// Index rebuilds the sidecar indexes of the dataset paths name (a
// variable-length format) and reports the scan as a Result: records
// indexed, source bytes read.
func Index(ctx context.Context, opts dataset.Options, paths ...string) (Result, error) {
	meter := MeterOf(Store(), paths[0])
	before := meter.Bytes()
	opts.Index = dataset.IndexRebuild
	start := time.Now()
	ds, err := dataset.Open(ctx, opts, paths...)
	if err != nil {
		return Result{}, err
	}
	defer ds.Close()
	r := Result{Name: "index build", Records: int64(ds.Len()), Seconds: time.Since(start).Seconds(), Meter: meter.What}
	for _, p := range ds.Info().Paths {
		if st, err := Store().Stat(ctx, p); err == nil {
			r.Bytes += st.Size
		}
	}
	r.Reads = r.Bytes / (4 << 20)
	r.DevBytes = meter.Since(before)
	return r, nil
}
