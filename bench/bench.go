// Package bench measures riffle against the baselines it must beat, side by
// side in one run on one file, because on a shared machine only a ratio
// measured in the same run means anything:
//
//   - riffle: a global shuffle loaded with many concurrent reads per batch;
//   - pread: the same permutation read one record at a time, as a map-style
//     PyTorch Dataset does in each DataLoader worker;
//   - sequential: the whole file read in order, the device's streaming rate;
//   - fio: random reads at the record size and a deep queue, the device's
//     random-read ceiling.
//
// Cold runs drop the page cache first; every run reports the bytes the
// device really read (from /sys/dev/block/*/stat), so read amplification
// shows next to speed.
package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// Result is one measurement.
type Result struct {
	Name     string  `json:"name"`
	Records  int64   `json:"records"`
	Bytes    int64   `json:"bytes"`     // record bytes delivered
	Reads    int64   `json:"reads"`     // reads issued
	DevBytes int64   `json:"dev_bytes"` // bytes the device read, -1 if unknown
	Seconds  float64 `json:"seconds"`
}

// SamplesPerSec is records delivered per second.
func (r Result) SamplesPerSec() float64 { return float64(r.Records) / r.Seconds }

// MBPerSec is record bytes delivered per second, in MB.
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

// Riffle loads ds in the order of s with opts until lim.
func Riffle(ctx context.Context, ds dataset.Dataset, s sampler.Sampler, opts loader.Options, lim Limit) (Result, error) {
	opts.Epochs = -1
	meter := MeterOf(Store(), ds.Info().Paths[0])
	before := meter()
	start := time.Now()
	l, err := loader.New(ctx, ds, s, opts)
	if err != nil {
		return Result{}, err
	}
	r := Result{Name: "riffle"}
	for !lim.done(int(r.Records), start) {
		b, err := l.Next(ctx)
		if err != nil {
			l.Close()
			return r, err
		}
		r.Records += int64(len(b.IDs))
		for _, n := range b.Len {
			r.Bytes += int64(n)
		}
		b.Release()
	}
	r.Seconds = time.Since(start).Seconds()
	l.Close()
	r.Reads = l.Stats().Reads
	r.DevBytes = since(meter, before)
	return r, nil
}

// Pread reads the same global permutation one record at a time with one
// read each, as a map-style Dataset's __getitem__ does (a pread locally,
// one ranged GET from an object store).
func Pread(ctx context.Context, ds dataset.Dataset, seed uint64, lim Limit) (Result, error) {
	store := Store()
	meter := MeterOf(store, ds.Info().Paths[0])
	before := meter()
	objs := make([]storage.Reader, len(ds.Info().Paths))
	for i, p := range ds.Info().Paths {
		r, err := store.Open(ctx, p)
		if err != nil {
			return Result{}, err
		}
		defer r.Close()
		objs[i] = r
	}
	s := sampler.Global{N: ds.Len(), Seed: seed}
	r := Result{Name: "pread"}
	if storage.IsS3(ds.Info().Paths[0]) {
		r.Name = "one GET at a time"
	}
	buf := []byte{}
	start := time.Now()
	for pos := 0; !lim.done(int(r.Records), start) && ctx.Err() == nil; pos++ {
		id := s.At(pos/ds.Len(), pos%ds.Len())
		loc := ds.Locate(id)
		if cap(buf) < loc.Len {
			buf = make([]byte, loc.Len)
		}
		if err := objs[loc.Object].ReadAt(ctx, buf[:loc.Len], loc.Off); err != nil {
			return r, err
		}
		r.Records++
		r.Reads++
		r.Bytes += int64(loc.Len)
	}
	r.Seconds = time.Since(start).Seconds()
	r.DevBytes = since(meter, before)
	return r, ctx.Err()
}

// Sequential reads paths from start to end, one after another, in 1 MiB
// reads (or until lim's duration) and counts records as bytes over
// recordSize: the device's streaming rate, or one GET of each whole object
// from an object store.
func Sequential(ctx context.Context, paths []string, recordSize int, lim Limit) (Result, error) {
	store := Store()
	meter := MeterOf(store, paths[0])
	before := meter()
	r := Result{Name: "sequential"}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for _, path := range paths {
		if err := sequentialOne(ctx, store, path, buf, &r, lim, start); err != nil {
			return r, err
		}
	}
	r.Seconds = time.Since(start).Seconds()
	r.Records = r.Bytes / int64(max(1, recordSize))
	r.DevBytes = since(meter, before)
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

// MeterOf returns a counter of the bytes path's device has read (from
// /sys/dev/block), or for an s3:// path the bytes fetched from the object
// store; -1 if unknown.
func MeterOf(store *storage.Router, path string) func() int64 {
	if storage.IsS3(path) {
		return func() int64 {
			s3, err := store.Remote()
			if err != nil {
				return -1
			}
			return s3.Stats().Bytes
		}
	}
	return DeviceOf(path).ReadBytes
}

func since(meter func() int64, before int64) int64 {
	if before < 0 {
		return -1
	}
	return meter() - before
}

// Fio runs fio's random-read test on path at block size bs and queue depth
// iodepth with O_DIRECT for the given time, and returns its IOPS as a Result.
func Fio(ctx context.Context, path string, bs, iodepth int, d time.Duration) (Result, error) {
	if _, err := exec.LookPath("fio"); err != nil {
		return Result{}, fmt.Errorf("fio is not installed (scripts/install-deps.sh installs it): %w", err)
	}
	dev := DeviceOf(path)
	before := dev.ReadBytes()
	cmd := exec.CommandContext(ctx, "fio", "--name=randread", "--filename="+path, "--rw=randread",
		"--bs="+strconv.Itoa(bs), "--direct=1", "--ioengine=libaio", "--iodepth="+strconv.Itoa(iodepth),
		"--time_based", fmt.Sprintf("--runtime=%.0fs", max(1, d.Seconds())), "--readonly", "--output-format=json")
	out, err := cmd.Output()
	if err != nil {
		return Result{}, fmt.Errorf("fio: %w", err)
	}
	var rep struct {
		Jobs []struct {
			Read struct {
				IOBytes int64   `json:"io_bytes"`
				IOs     int64   `json:"total_ios"`
				Runtime float64 `json:"runtime"` // ms
			} `json:"read"`
		} `json:"jobs"`
	}
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:] // fio may print notes before its JSON
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Jobs) == 0 {
		return Result{}, fmt.Errorf("fio output: %v", err)
	}
	j := rep.Jobs[0].Read
	return Result{Name: fmt.Sprintf("fio bs=%d qd=%d", bs, iodepth), Records: j.IOs, Reads: j.IOs, Bytes: j.IOBytes,
		Seconds: j.Runtime / 1000, DevBytes: dev.Since(before)}, nil
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

// Device is a block device's statistics file.
type Device string

// DeviceOf returns the device that holds path, or "" if unknown.
func DeviceOf(path string) Device {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return ""
	}
	p := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return Device(p)
}

// ReadBytes is the bytes the device has read since boot, -1 if unknown.
func (d Device) ReadBytes() int64 {
	if d == "" {
		return -1
	}
	f, err := os.Open(string(d))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan()
	fields := strings.Fields(sc.Text())
	if len(fields) < 3 {
		return -1
	}
	sectors, err := strconv.ParseInt(fields[2], 10, 64)
	if err != nil {
		return -1
	}
	return sectors * 512 // the stat file counts 512-byte sectors whatever the device's block size
}

// Since is the bytes read since a ReadBytes reading, -1 if unknown.
func (d Device) Since(before int64) int64 {
	now := d.ReadBytes()
	if before < 0 || now < 0 {
		return -1
	}
	return now - before
}

// Index rebuilds the sidecar indexes of paths (a variable-length format)
// and reports the scan as a Result: records indexed, source bytes read.
func Index(ctx context.Context, opts dataset.Options, paths ...string) (Result, error) {
	meter := MeterOf(Store(), paths[0])
	before := meter()
	opts.Index = dataset.IndexRebuild
	start := time.Now()
	ds, err := dataset.Open(ctx, opts, paths...)
	if err != nil {
		return Result{}, err
	}
	defer ds.Close()
	r := Result{Name: "index build", Records: int64(ds.Len()), Seconds: time.Since(start).Seconds()}
	for _, p := range ds.Info().Paths {
		if st, err := Store().Stat(ctx, p); err == nil {
			r.Bytes += st.Size
		}
	}
	r.Reads = r.Bytes / (4 << 20)
	r.DevBytes = since(meter, before)
	return r, nil
}
