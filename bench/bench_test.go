package bench_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/bench"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/wire"
)

// BenchmarkShuffle compares, in one run on one warm file, riffle's global
// shuffle against the same permutation read one record at a time and
// against a sequential read, and reports the ratios. Cold runs, fio and
// larger files are `riffle bench`'s job (see BENCHMARKS.md).
func BenchmarkShuffle(b *testing.B) {
	for _, size := range []int{4096, 128 << 10} {
		b.Run(byteSize(size), func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "d.bin")
			n := (256 << 20) / size
			if err := synth.WriteFixed(path, n, size, 0); err != nil {
				b.Fatal(err)
			}
			ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size}, path)
			if err != nil {
				b.Fatal(err)
			}
			defer ds.Close()
			ctx := context.Background()
			// Several epochs, so buffers are reused and the figure is steady state.
			lim := bench.Limit{Records: 8 * n, Duration: 3 * time.Second}
			bench.Sequential(ctx, []string{path}, size, bench.Limit{}) // warm the cache
			var rf, pr, sq bench.Result
			for b.Loop() {
				if rf, err = bench.Riffle(ctx, ds, sampler.Global{N: ds.Len(), Seed: 1}, loader.Options{}, lim); err != nil {
					b.Fatal(err)
				}
				if pr, err = bench.Pread(ctx, ds, 1, lim); err != nil {
					b.Fatal(err)
				}
				if sq, err = bench.Sequential(ctx, []string{path}, size, bench.Limit{Duration: time.Minute}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(rf.SamplesPerSec(), "samples/s")
			b.ReportMetric(rf.SamplesPerSec()/pr.SamplesPerSec(), "x-pread")
			b.ReportMetric(rf.MBPerSec()/sq.MBPerSec(), "x-sequential")
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<10 {
		return strconv.Itoa(n>>10) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}

// The meter counts this process's reads from storage: it is known on
// Linux and never goes back.
func TestMeter(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x")
	synth.WriteFixed(p, 64, 4096, 0)
	m := bench.MeterOf(bench.Store(), p)
	if m.What != bench.MeterProcess {
		t.Fatalf("a local file's meter counts %q", m.What)
	}
	a := m.Bytes()
	if a < 0 {
		t.Skip("no /proc/self/io (a kernel without task I/O accounting)")
	}
	if _, err := bench.Sequential(context.Background(), []string{p}, 4096, bench.Limit{}); err != nil {
		t.Fatal(err)
	}
	if d := m.Since(a); d < 0 {
		t.Fatalf("the meter went back by %d bytes", -d)
	}
}

// fio's block size is a multiple of the device's logical block and 4 KiB
// at least, whatever the mean record size: O_DIRECT refuses anything else.
func TestFioBlockSize(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x")
	synth.WriteFixed(p, 1, 8, 0)
	for _, mean := range []int{0, 1, 61, 511, 4096, 4097, 5000, 1 << 20} {
		bs := bench.FioBlockSize(p, mean)
		if bs < 4096 || bs%512 != 0 || bs < mean { // every logical block is a multiple of 512
			t.Errorf("mean record %d: block size %d", mean, bs)
		}
	}
}

// A directory tree's objects are its files, not its root.
func TestObjectsOfATree(t *testing.T) {
	root := filepath.Join(t.TempDir(), "big")
	if err := synth.WriteTree(root, []string{"a", "b"}, 5); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{}, root)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	objs := bench.Objects(ds)
	if len(objs) != 10 || objs[0] != filepath.Join(root, "a", "00000.bin") {
		t.Fatalf("objects of a tree: %q", objs)
	}
	r, err := bench.Sequential(context.Background(), objs, 50, bench.Limit{})
	if err != nil || r.Bytes != ds.Info().Bytes {
		t.Fatalf("sequential read of a tree: %d bytes of %d, %v", r.Bytes, ds.Info().Bytes, err)
	}
}

// fio runs on a dataset of variable-size records (a JSONL file whose mean
// record is no multiple of a block) and counts its reads.
func TestFioOnVariableSize(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("no fio")
	}
	dir := t.TempDir()
	var fs unix.Statfs_t
	if unix.Statfs(dir, &fs) == nil && fs.Type == unix.TMPFS_MAGIC {
		t.Skip("tmpfs has no O_DIRECT")
	}
	p := filepath.Join(dir, "d.jsonl")
	if err := synth.WriteLines(p, "jsonl", 3000, false); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	mean := int(ds.Info().Bytes / int64(ds.Len()))
	objs := bench.Objects(ds)
	r, err := bench.Fio(context.Background(), objs, bench.FioBlockSize(objs[0], mean), 4, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r.Reads == 0 || r.Bytes == 0 || r.Meter != bench.MeterFio {
		t.Fatalf("fio: %+v", r)
	}
}

// fio's failure says why, in fio's words.
func TestFioShowsItsErrors(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("no fio")
	}
	p := filepath.Join(t.TempDir(), "d.bin")
	synth.WriteFixed(p, 64, 4096, 0)
	_, err := bench.Fio(context.Background(), []string{p}, 61, 4, time.Second) // no O_DIRECT size
	if err == nil || !strings.Contains(err.Error(), "Invalid argument") {
		t.Fatalf("fio at an unaligned block size: %v", err)
	}
}

// The depth benchmark's riffle side is a job with only the dataset named:
// it reads, and reports how, the job's own choice (here the page cache,
// for a file it keeps), or what the spec asked.
func TestDepthRunsAJob(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("no fio")
	}
	if bench.DropCaches() != nil {
		t.Skip("dropping the page cache needs root")
	}
	p := filepath.Join(t.TempDir(), "d.bin")
	const n = 1024
	if err := synth.WriteFixed(p, n, 4096, 0); err != nil {
		t.Fatal(err)
	}
	yes := true
	for _, direct := range []*bool{nil, &yes} {
		cfg := bench.DepthConfig{
			Open: func() (dataset.Dataset, error) {
				return dataset.Open(context.Background(), dataset.Options{RecordSize: 4096}, p)
			},
			Spec:   wire.JobSpec{Paths: []string{p}, RecordSize: 4096, Direct: direct},
			Depths: []int{4}, Rounds: 1, Time: time.Second,
		}
		rs, err := bench.Depth(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0].Riffle
		if r.Records != n || r.Reads == 0 || r.Direct != (direct != nil) {
			t.Fatalf("direct %v: riffle's run %+v: want an epoch of %d records, read with O_DIRECT %v", direct != nil, r, n, direct != nil)
		}
	}
}
