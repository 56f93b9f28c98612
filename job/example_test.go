package job_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/job"
	"github.com/riffle-ml/riffle/wire"
)

// Two jobs sharing their reads over a subset of one file, from Go with no
// daemon and no socket: each reads records [0, 600) once per epoch, in its
// own uniform order, and the records both want at once are read once.
func Example() {
	dir, _ := os.MkdirTemp("", "riffle-example")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "records.bin")
	synth.WriteFixed(path, 1000, 256, 0) // 1000 records of 256 bytes, each carrying its id

	env, err := job.NewEnv(job.EnvOptions{})
	if err != nil {
		panic(err)
	}
	defer env.Close()
	yes := true
	var wg sync.WaitGroup
	seen := make([]map[int]int, 2)
	for k := range 2 {
		spec := &wire.JobSpec{Paths: []string{path}, RecordSize: 256, BatchSize: 50, Shuffle: true,
			Seed: uint64(k), Share: &yes, Subset: &wire.Subset{Ranges: [][2]int{{0, 600}}}, Epochs: 2}
		j, err := env.Open(context.Background(), spec, nil) // nil: batches on the Go heap
		if err != nil {
			panic(err)
		}
		seen[k] = map[int]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer j.Close()
			for {
				b, err := j.Next(context.Background())
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					panic(err)
				}
				for i, id := range b.IDs {
					if synth.CheckRecord(b.Record(i), id) != nil {
						panic(fmt.Sprintf("record %d: wrong bytes", id))
					}
					seen[k][id]++
				}
				b.Release()
			}
		}()
		fmt.Println("job", k, "shared:", j.Describe().Shared)
	}
	wg.Wait()
	for k := range 2 {
		twice := 0
		for _, n := range seen[k] {
			if n == 2 {
				twice++
			}
		}
		fmt.Printf("job %d: %d records, each in both epochs: %d\n", k, len(seen[k]), twice)
	}
	// Output:
	// job 0 shared: true
	// job 1 shared: true
	// job 0: 600 records, each in both epochs: 600
	// job 1: 600 records, each in both epochs: 600
}

// A weighted mixture of two files from Go: each batch takes its records
// from the sources in proportion to their weights, each source in its own
// shuffle, and an epoch ends where the schedule first names a source that
// is used up.
func Example_mixture() {
	dir, _ := os.MkdirTemp("", "riffle-example")
	defer os.RemoveAll(dir)
	a, b := filepath.Join(dir, "a.bin"), filepath.Join(dir, "b.bin")
	synth.WriteFixed(a, 1000, 64, 0)
	synth.WriteFixed(b, 300, 64, 0)

	env, err := job.NewEnv(job.EnvOptions{})
	if err != nil {
		panic(err)
	}
	defer env.Close()
	j, err := env.Open(context.Background(), &wire.JobSpec{RecordSize: 64, BatchSize: 100, Shuffle: true, Epochs: 1,
		Mixture: []wire.MixSource{{Paths: []string{a}, Weight: 3}, {Paths: []string{b}, Weight: 1}}}, nil)
	if err != nil {
		panic(err)
	}
	defer j.Close()
	offsets := j.Describe().Offsets // source k's record i is id offsets[k]+i
	count := make([]int, 2)
	for {
		bt, err := j.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			panic(err)
		}
		for _, id := range bt.IDs {
			if id >= offsets[1] {
				count[1]++
			} else {
				count[0]++
			}
		}
		bt.Release()
	}
	// b's 300 at a quarter of the weight: the epoch ends where the schedule
	// names b's 301st record (priority 300.5), when a has drawn 902 (a's
	// k-th draw has priority (k+0.5)/3; ties go to the earlier source).
	fmt.Println("a:", count[0], "b:", count[1])
	// Output:
	// a: 902 b: 300
}
