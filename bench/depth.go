package bench

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// DepthRound is one round of the depth benchmark: fio's random reads at
// each queue depth and riffle's global shuffle at its default settings
// (the engine choosing its depth), each cold.
type DepthRound struct {
	Fio    []Result `json:"fio"`
	Riffle Result   `json:"riffle"`
}

// BestFio is the round's fastest fio run.
func (r DepthRound) BestFio() Result {
	return slices.MaxFunc(r.Fio, func(a, b Result) int {
		switch {
		case a.IOPS() < b.IOPS():
			return -1
		case a.IOPS() > b.IOPS():
			return 1
		}
		return 0
	})
}

// DepthConfig says what the depth benchmark reads and how long.
type DepthConfig struct {
	// Open opens the dataset, for fio's files and block size (4 KiB
	// records: fio reads blocks of the mean record size, FioBlockSize).
	Open func() (dataset.Dataset, error)
	// Spec is riffle's side: a job of these paths and dataset options,
	// whose every other option is left to the job (its order, its depth,
	// whether it reads past the page cache), as a user's would be.
	Spec   wire.JobSpec
	Depths []int         // fio's queue depths; default 16, 32, 64, 128, 256
	Rounds int           // default 3
	Time   time.Duration // per run; default 10 s (riffle's at most an epoch)
	// Each, if set, is called after every run.
	Each func(round int, r Result)
}

// Depth runs the depth benchmark: rounds of fio at every depth and riffle
// at its defaults, cold (the page cache dropped before each run: root
// only), riffle's place in the round moving each round so that a drift in
// the device's speed (other tenants) falls on all of them alike.
func Depth(ctx context.Context, cfg DepthConfig) ([]DepthRound, error) {
	if len(cfg.Depths) == 0 {
		cfg.Depths = []int{16, 32, 64, 128, 256}
	}
	cfg.Rounds = max(1, cfg.Rounds)
	if cfg.Time <= 0 {
		cfg.Time = 10 * time.Second
	}
	ds, err := cfg.Open()
	if err != nil {
		return nil, err
	}
	objs := Objects(ds)
	inf := ds.Info()
	n := ds.Len()
	ds.Close()
	rec := inf.RecordSize
	if rec == 0 {
		rec = int(inf.Bytes / int64(max(1, n)))
	}
	bs := FioBlockSize(objs[0], rec)
	var out []DepthRound
	for round := range cfg.Rounds {
		var dr DepthRound
		at := round % (len(cfg.Depths) + 1)
		for i := 0; i <= len(cfg.Depths); i++ {
			if err := DropCaches(); err != nil {
				return out, err
			}
			var r Result
			var err error
			if i == at {
				r, err = depthRiffle(ctx, cfg, n)
				dr.Riffle = r
			} else {
				j := i
				if i > at {
					j--
				}
				r, err = Fio(ctx, objs, bs, cfg.Depths[j], cfg.Time)
				dr.Fio = append(dr.Fio, r)
			}
			if err != nil {
				return out, err
			}
			if cfg.Each != nil {
				cfg.Each(round, r)
			}
		}
		slices.SortFunc(dr.Fio, func(a, b Result) int { return a.Depth - b.Depth })
		out = append(out, dr)
	}
	return out, nil
}

// depthRiffle is one cold riffle run at its defaults over at most an
// epoch: a job in an Env of its own, so that its engine's depth search
// starts afresh as a new daemon's would.
func depthRiffle(ctx context.Context, cfg DepthConfig, n int) (Result, error) {
	spec := cfg.Spec
	// A seed of its own each run, as fio reads fresh offsets each run
	// (Fio): an order read before would be read from a virtual disk's host
	// cache.
	spec.Shuffle, spec.Seed, spec.Epochs, spec.BatchSize = true, rand.Uint64(), 1, job.DefaultBatchSize
	env, err := job.NewEnv(job.EnvOptions{})
	if err != nil {
		return Result{}, err
	}
	defer env.Close()
	m := startMeasure(spec.Paths[0])
	j, err := env.Open(ctx, &spec, nil)
	if err != nil {
		return Result{}, err
	}
	defer j.Close()
	r := Result{Name: "riffle", Meter: m.meter.What, Direct: j.Describe().Direct}
	err = m.take(ctx, j, &r, Limit{Records: n, Duration: cfg.Time})
	return r, err
}
