package job

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/alignbuf"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/quality"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// The cheapest order that reaches a requested randomness (sampler "auto").
// DeepIO's randomization level (deepio.txt §III-C; quality.RL) prices an
// order's randomness and LIRS (lirs.txt §5) the epochs a partial shuffle
// costs; what an order costs the device is its reads: a global shuffle
// reads each record alone, a block order blocks of block_size bytes. A
// device's rate grows with the read size, so the device is measured once,
// by size (a curve of random-read rates, O_DIRECT so the page cache does
// not answer), and the order picked is the one with the least expected
// device time per epoch among those whose RL reaches min_randomness and
// whose window fits in the job's memory (memory_bytes): a global shuffle
// or a block order of some block size and window (see minMix for why
// neither RL alone nor a buffered order).

// curve is a device's random-read rate by read size.
type curve struct {
	sizes []int     // ascending
	rates []float64 // bytes per second at each size
}

// rate interpolates the curve (log-linearly in the size), flat beyond it.
func (c curve) rate(size int) float64 {
	if size <= c.sizes[0] {
		return c.rates[0] * float64(size) / float64(c.sizes[0]) // reads of at least a page take as long
	}
	for i := 1; i < len(c.sizes); i++ {
		if size <= c.sizes[i] {
			f := math.Log(float64(size)/float64(c.sizes[i-1])) / math.Log(float64(c.sizes[i])/float64(c.sizes[i-1]))
			return c.rates[i-1] + f*(c.rates[i]-c.rates[i-1])
		}
	}
	return c.rates[len(c.rates)-1]
}

// curveSizes are the read sizes a device is measured at.
var curveSizes = []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}

// probeDepth is the reads in flight while measuring: enough to fill a
// device's queues at every size measured.
const probeDepth = 128

// probeTime bounds each size's measurement (and probeBytes its bytes).
const (
	probeTime  = 120 * time.Millisecond
	probeBytes = 128 << 20
)

// measureCurve reads path at random aligned offsets through riffle's own
// read engine (io_uring where it runs) with O_DIRECT, as the loader
// reads: for each size, probeDepth reads in flight for probeTime or
// probeBytes, whichever comes first, after a warm-up round.
func measureCurve(ctx context.Context, path string) (curve, error) {
	dir, name := filepath.Split(path)
	st, err := storage.NewLocal(true, []string{dir})
	if err != nil {
		return curve{}, err
	}
	defer st.Close()
	r, err := st.Open(ctx, filepath.Join(dir, name))
	if err != nil {
		return curve{}, err
	}
	if c, ok := r.(io.Closer); ok {
		defer c.Close()
	}
	size := r.Size()
	eng := storage.NewEngine(storage.EngineOptions{Depth: probeDepth})
	defer eng.Close()
	rnd := rand.New(rand.NewPCG(uint64(size), 7))
	// run keeps probeDepth reads of n bytes in flight until d or max bytes
	// have passed; it returns the bytes read and the time taken.
	run := func(n int, d time.Duration, max int64) (int64, time.Duration, error) {
		var (
			mu    sync.Mutex
			done  int64
			first error
			wg    sync.WaitGroup
		)
		t0 := time.Now()
		off := func() int64 { return rnd.Int64N(size-int64(n)+1) / 4096 * 4096 } // under mu
		var submit func(buf []byte, at int64)
		submit = func(buf []byte, at int64) {
			req := &storage.Request{Ctx: ctx, R: r, P: buf, Off: at}
			req.Done = func(err error) {
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("%s at offset %d: %w", path, at, err)
				}
				done += int64(n)
				again := first == nil && time.Since(t0) < d && done < max
				next := int64(0)
				if again {
					next = off()
				}
				mu.Unlock()
				if again {
					submit(buf, next)
					return
				}
				wg.Done()
			}
			eng.Submit(req)
		}
		wg.Add(probeDepth)
		for range probeDepth {
			mu.Lock()
			at := off()
			mu.Unlock()
			submit(alignbuf.Make(n, 4096), at)
		}
		wg.Wait()
		return done, time.Since(t0), first
	}
	var c curve
	if _, _, err := run(4096, probeTime/4, 1<<20); err != nil { // warm-up: the engine's threads and the device's queues
		return curve{}, err
	}
	for _, n := range curveSizes {
		if int64(n) > size {
			break
		}
		got, took, err := run(n, probeTime, probeBytes)
		if err != nil {
			return curve{}, err
		}
		rate := float64(got) / max(took.Seconds(), 1e-9)
		if k := len(c.rates); k > 0 {
			// Larger reads move at least as many bytes: a dip is another
			// reader's noise on the device, not the device.
			rate = max(rate, c.rates[k-1])
		}
		c.sizes = append(c.sizes, n)
		c.rates = append(c.rates, rate)
	}
	if len(c.sizes) == 0 {
		return curve{}, fmt.Errorf("%s: %d bytes, too small to measure its device", path, size)
	}
	return c, nil
}

// devices keeps each device's curve for the process's life: measured once.
var devices curves

// curves keeps each device's curve: measured once.
type curves struct {
	mu  sync.Mutex
	dev map[uint64]curve
}

// of is the curve of the device path lives on, measured on path if new
// and measure is set.
func (cs *curves) of(ctx context.Context, path string, measure bool) (curve, bool, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return curve{}, false, err
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if c, ok := cs.dev[st.Dev]; ok || !measure {
		return c, ok, nil
	}
	c, err := measureCurve(ctx, path)
	if err != nil {
		return curve{}, false, err
	}
	if cs.dev == nil {
		cs.dev = map[uint64]curve{}
	}
	cs.dev[st.Dev] = c
	return c, true, nil
}

// Auto is the order sampler auto chose (wire.AutoOrder): a sampler kind
// and its block size and window, its randomization level and the records
// per second the device curve expects of it and of a sequential read.
type Auto = wire.AutoOrder

// minMix is the fewest blocks a block order's window may hold (unless
// the dataset has fewer): a batch's records come from its window's blocks,
// and over data sorted by label, time or source a batch of a few regions
// is a biased sample however random the order's RL says it is. On the
// label-sorted training check (200,000 examples, 40 MB), a block order of
// 8 MiB blocks in windows of 2 has RL 0.938 and reached 0.58 accuracy in
// 20 epochs, a buffered order of 65,536 records RL 0.900 and 0.52; 1 MiB
// blocks in windows of 16, RL 0.909, reached 0.883, the global shuffle's
// 0.885. RL counts orders, not the regions a batch mixes: auto asks both.
const minMix = 16

// chooseOrder is the order with the least expected device time for an
// epoch of n records of total bytes whose RL is at least minRL, and whose
// window fits in memory bytes: a global shuffle (a read per record, of
// whole pages) or a block order (reads of a block, the records of a window
// of at least minMix blocks spread over as many batches). A buffered
// order is never chosen: each of its batches is one region of the files.
// Ties go to the higher RL, then to the smaller block (more mixing).
func chooseOrder(c curve, n int, total int64, minRL float64, memory int64) Auto {
	mean := max(1, total/int64(max(n, 1)))
	best := expect(c, Auto{Sampler: "global"}, n, total)
	for b := 8 << 10; b <= 16<<20 && int64(b) <= total; b *= 2 {
		if int64(b) < 2*mean {
			continue // a block holds at least two records, or it is the global order
		}
		blocks := int(max(1, total/int64(b)))
		for w := min(minMix, blocks); w <= loader.MaxWindow && int64(w)*int64(b) <= memory; w *= 2 {
			a := expect(c, Auto{Sampler: "block", BlockSize: b, Window: w}, n, total)
			if a.RL >= minRL && (a.Rate > best.Rate*1.001 || (a.Rate >= best.Rate*0.999 && a.RL > best.RL)) {
				best = a
			}
			if w >= blocks {
				break // one window holds them all
			}
		}
	}
	return best
}

// expect is order a over n records of total bytes with its RL, and the
// records per second curve c expects of it and of a sequential read (none
// with no curve): a global shuffle reads each record alone, in whole
// pages; a block order reads whole blocks.
func expect(c curve, a Auto, n int, total int64) Auto {
	mean := max(1, total/int64(max(n, 1)))
	read := int((mean + 4095) / 4096 * 4096)
	a.RL, a.Rate, a.Sequential = 1, 0, 0
	if a.Sampler == "block" {
		a.RL = quality.BlockRL(n, int(max(1, total/int64(a.BlockSize))), a.Window)
		read = a.BlockSize
	}
	if len(c.sizes) > 0 {
		per := max(int64(read), mean) // a global shuffle's page holds less than one record's share of bandwidth
		if a.Sampler == "block" {
			per = mean
		}
		a.Rate = c.rate(read) / float64(per)
		a.Sequential = c.rate(c.sizes[len(c.sizes)-1]) / float64(mean)
	}
	return a
}

// ChooseOrder is sampler auto's choice for ds: the order of least expected
// device time per epoch whose randomization level reaches minRL, with a
// window of at most memory bytes, on the measured rate of the device ds's
// largest file is on (measured once per process).
func ChooseOrder(ctx context.Context, ds dataset.Dataset, minRL float64, memory int64) (Auto, error) {
	c, _, err := deviceOf(ctx, ds, true)
	if err != nil {
		return Auto{}, err
	}
	inf := ds.Info()
	return chooseOrder(c, ds.Len(), inf.Bytes, minRL, memory), nil
}

// deviceOf is the curve of the device ds's largest file is on, measured
// if it is new and measure is set; false if it is not known.
func deviceOf(ctx context.Context, ds dataset.Dataset, measure bool) (curve, bool, error) {
	inf := ds.Info()
	if _, ok := ds.(dataset.Blocker); ok {
		return curve{}, false, specErr("sampler auto: a %s dataset's own blocks (its pages) make its order; name the window", inf.Format)
	}
	biggest, size := "", int64(-1)
	for _, p := range inf.Paths {
		st, err := os.Stat(p)
		if err != nil {
			return curve{}, false, specErr("sampler auto measures a local device, and %s is not a local file (%v): name the order", p, err)
		}
		if st.Mode().IsRegular() && st.Size() > size {
			biggest, size = p, st.Size()
		}
	}
	if biggest == "" {
		return curve{}, false, specErr("sampler auto measures the device the files are on: this dataset names none")
	}
	c, ok, err := devices.of(ctx, biggest, measure)
	if err != nil {
		return curve{}, false, fmt.Errorf("sampler auto: measuring the device: %w", err)
	}
	return c, ok, nil
}

// autoOrder resolves sampler auto for the job: cfg with the order chosen
// within the job's memory, or the one chosen before (auto_order), and the
// choice.
func (j *Job) autoOrder(ctx context.Context, cfg sampler.Config, ds dataset.Dataset) (sampler.Config, *Auto, error) {
	var a Auto
	if o := j.plan.AutoOrder; o != nil {
		// Read again as chosen: its level is the order's, its rate the
		// device's if this process has measured it.
		a = *o
		if c, ok, _ := deviceOf(ctx, ds, false); ok {
			a = expect(c, a, ds.Len(), ds.Info().Bytes)
		} else {
			a = expect(curve{}, a, ds.Len(), ds.Info().Bytes) // not measured here: no rate to say
		}
	} else {
		var err error
		if a, err = ChooseOrder(ctx, ds, j.plan.MinRandomness, j.memory); err != nil {
			return cfg, nil, err
		}
	}
	cfg.Kind, cfg.BlockSize, cfg.Window = a.Sampler, a.BlockSize, a.Window
	return cfg, &a, nil
}
