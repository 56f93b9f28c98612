package bench_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/riffle-ml/riffle/bench"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/faultproxy"
	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// BenchmarkS3 loads one object of fixed-size records from a real
// S3-compatible server on loopback (versitygw), in one run: riffle's global
// shuffle (many ranged GETs in flight, small records read by block),
// against the same permutation read one GET at a time (what a map-style
// S3 dataset does) and one sequential GET of the whole object; then riffle
// again through a proxy that adds 20 ms to every request, as a far store
// would (and through the proxy at 0 ms, so the ratio is the latency's
// alone). It reports samples/s and the ratios; RIFFLE_S3_BENCH_BYTES sets
// the object's size (default 256 MiB).
//
//	go test ./bench -run '^$' -bench S3 -benchtime 1x
func BenchmarkS3(b *testing.B) {
	size := int64(256 << 20)
	if v := os.Getenv("RIFFLE_S3_BENCH_BYTES"); v != "" {
		fmt.Sscan(v, &size)
	}
	srv := s3test.Start(b)
	srv.SetEnv(b)
	proxy, err := faultproxy.New(srv.Endpoint)
	if err != nil {
		b.Fatal(err)
	}
	defer proxy.Close()
	ctx := context.Background()
	for _, rec := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(byteSize(rec), func(b *testing.B) {
			n := int(size) / rec
			data := make([]byte, n*rec)
			for i := range data {
				data[i] = byte(i*7 + i>>12)
			}
			key := fmt.Sprintf("rec%d.bin", rec)
			if err := srv.Put(ctx, "bench", key, data); err != nil {
				b.Fatal(err)
			}
			url := "s3://bench/" + key
			lim := bench.Limit{Records: n, Duration: 10 * time.Second}
			measure := func(endpoint string, latency time.Duration, f func(ds dataset.Dataset) (bench.Result, error)) bench.Result {
				proxy.Set(latency, 0, 0)
				l, _ := storage.NewLocal(false, nil)
				st := storage.NewRouter(l, storage.S3Options{Endpoint: endpoint}, nil)
				bench.SetStore(st)
				ds, err := dataset.Open(ctx, dataset.Options{RecordSize: rec, Store: st}, url)
				if err != nil {
					b.Fatal(err)
				}
				defer ds.Close()
				r, err := f(ds)
				if err != nil {
					b.Fatal(err)
				}
				return r
			}
			riffle := func(ds dataset.Dataset) (bench.Result, error) {
				return bench.Riffle(ctx, ds, sampler.Global{N: ds.Len(), Seed: 1}, loader.Options{}, lim)
			}
			var rf, one, seq, near, far, oneFar bench.Result
			for b.Loop() {
				rf = measure(srv.Endpoint, 0, riffle)
				one = measure(srv.Endpoint, 0, func(ds dataset.Dataset) (bench.Result, error) {
					return bench.Pread(ctx, ds, 1, bench.Limit{Records: n, Duration: 5 * time.Second})
				})
				seq = measure(srv.Endpoint, 0, func(dataset.Dataset) (bench.Result, error) {
					return bench.Sequential(ctx, []string{url}, rec, bench.Limit{})
				})
				// Through the proxy both ways, so that the ratio is the
				// latency's alone, not the proxy's own cost.
				near = measure(proxy.URL, 0, riffle)
				far = measure(proxy.URL, 20*time.Millisecond, riffle)
				oneFar = measure(proxy.URL, 20*time.Millisecond, func(ds dataset.Dataset) (bench.Result, error) {
					return bench.Pread(ctx, ds, 1, bench.Limit{Records: n, Duration: 5 * time.Second})
				})
			}
			b.ReportMetric(rf.SamplesPerSec(), "riffle-samples/s")
			b.ReportMetric(one.SamplesPerSec(), "oneGET-samples/s")
			b.ReportMetric(seq.SamplesPerSec(), "sequential-samples/s")
			b.ReportMetric(far.SamplesPerSec(), "riffle+20ms-samples/s")
			b.ReportMetric(rf.SamplesPerSec()/one.SamplesPerSec(), "riffle/oneGET")
			b.ReportMetric(rf.MBPerSec()/seq.MBPerSec(), "riffle/sequential")
			b.ReportMetric(far.SamplesPerSec()/near.SamplesPerSec(), "+20ms/0ms")
			b.ReportMetric(far.SamplesPerSec()/oneFar.SamplesPerSec(), "riffle/oneGET@20ms")
			b.ReportMetric(float64(rf.DevBytes)/float64(max(1, rf.Bytes)), "fetched/delivered")
			b.Logf("%s records: riffle %.0f/s (%.1f MB/s, fetched/delivered %.2f), one GET at a time %.0f/s, one whole GET %.1f MB/s, through the proxy riffle %.0f/s at 0ms, %.0f/s at +20ms (%.2f), one GET at a time at +20ms %.0f/s",
				byteSize(rec), rf.SamplesPerSec(), rf.MBPerSec(), float64(rf.DevBytes)/float64(max(1, rf.Bytes)),
				one.SamplesPerSec(), seq.MBPerSec(), near.SamplesPerSec(), far.SamplesPerSec(), far.SamplesPerSec()/near.SamplesPerSec(), oneFar.SamplesPerSec())
		})
	}
}
