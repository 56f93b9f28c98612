// Command goload runs one job in this process, as the daemon would, and
// reports its rate and CPU: the Go side of bench/torch_go.py's comparison.
//
// The job is a JSON spec, the one a Python client sends in its open (so
// both sides run the same job: files, batch size, seed, transform). Each
// batch is taken and released, nothing more, as a training loop that
// hands the batch on without touching it; the loop runs whole epochs
// until --seconds have passed after --skip batches (the job's start, its
// read-ahead filling). It prints one JSON object: records, batches,
// seconds, and the process's CPU seconds over the same span.
//
//	goload -spec '{"paths":["/data/r4k.bin"],"record_size":4096,"batch_size":256,"seed":1,"epochs":-1}' -seconds 3
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/server"
	"github.com/riffle-ml/riffle/wire"
)

type report struct {
	Records    int     `json:"records"`
	Batches    int     `json:"batches"`
	Seconds    float64 `json:"seconds"`
	CPUSeconds float64 `json:"cpu_seconds"`
}

func cpu() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func run(specJSON, indexDir string, seconds float64, skip int, arena bool) (report, error) {
	var spec wire.JobSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return report{}, fmt.Errorf("-spec: %w", err)
	}
	env, err := job.NewEnv(job.EnvOptions{IndexDir: indexDir})
	if err != nil {
		return report{}, err
	}
	defer env.Close()
	ctx := context.Background()
	var alloc job.Alloc
	if arena {
		// Batches in shared memory, as the daemon's are.
		alloc = func(ask job.Ask) (loader.Allocator, int64, error) {
			a, err := server.NewArena("goload", ask.Want)
			return a, ask.Want, err
		}
	}
	j, err := env.Open(ctx, &spec, alloc)
	if err != nil {
		return report{}, err
	}
	defer j.Close()
	var r report
	var start time.Time
	var c0 float64
	for i := 0; ; i++ {
		if i == skip {
			start, c0 = time.Now(), cpu()
		}
		b, err := j.Next(ctx)
		if err != nil {
			return r, err
		}
		if i >= skip {
			r.Records += len(b.IDs)
			r.Batches++
		}
		b.Release()
		if i >= skip && time.Since(start).Seconds() >= seconds {
			break
		}
	}
	r.Seconds, r.CPUSeconds = time.Since(start).Seconds(), cpu()-c0
	return r, nil
}

func main() {
	specJSON := flag.String("spec", "", "the job's spec, as JSON (the protocol's JobSpec)")
	indexDir := flag.String("index-dir", "", "where indexes of read-only data go")
	seconds := flag.Float64("seconds", 3, "seconds to measure")
	skip := flag.Int("skip", 20, "batches taken before measuring")
	arena := flag.Bool("arena", false, "batches in a shared-memory arena, as the daemon's (default the Go heap)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the measurement to this file")
	flag.Parse()
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "goload:", err)
			os.Exit(1)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	r, err := run(*specJSON, *indexDir, *seconds, *skip, *arena)
	if err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "goload:", err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(r)
}
