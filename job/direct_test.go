package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// writeLines writes n JSON lines of 20 to 300 bytes: records of every
// alignment, none on a page's edge by design.
func writeLines(t *testing.T, p string, n int) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 7))
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"i\": %d, \"s\": %q}\n", i, strings.Repeat("x", r.IntN(280)))
	}
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadsDirect(t *testing.T) {
	dir := t.TempDir()
	big, small := filepath.Join(dir, "big.jsonl"), filepath.Join(dir, "small.jsonl")
	writeLines(t, big, 2000)
	writeLines(t, small, 10)
	no := false
	for _, c := range []struct {
		name  string
		spec  wire.JobSpec
		paths []string
		want  bool
	}{
		{"a global shuffle of more than the cache keeps", wire.JobSpec{Shuffle: true}, []string{big}, true},
		{"auto's order", wire.JobSpec{Sampler: "auto"}, []string{big}, true},
		{"two files, more together", wire.JobSpec{Shuffle: true}, []string{small, big}, true},
		{"what the cache keeps", wire.JobSpec{Shuffle: true}, []string{small}, false},
		{"direct=false asked", wire.JobSpec{Shuffle: true, Direct: &no}, []string{big}, false},
		{"file order", wire.JobSpec{}, []string{big}, false},
		{"a buffer's order, read in file order", wire.JobSpec{Sampler: "buffered", Buffer: 64}, []string{big}, false},
		{"a block order named", wire.JobSpec{Sampler: "block"}, []string{big}, false},
		{"a directory's files", wire.JobSpec{Shuffle: true}, []string{dir}, false},
		{"an object store", wire.JobSpec{Shuffle: true}, []string{"s3://b/big.jsonl"}, false},
	} {
		spec := c.spec
		spec.Paths, spec.BatchSize = c.paths, 64
		plan, err := Check(&spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := readsDirect(plan, c.paths, 64<<10); got != c.want {
			t.Errorf("%s: reads direct %v, want %v", c.name, got, c.want)
		}
	}
}

// Jobs that leave direct unset over files the page cache cannot keep
// read them with O_DIRECT, and every record is a buffered solo read's:
// alone, split over ranks, and sharing a group with a job reading through
// the page cache (direct=false), the two taking turns. Each is every
// record once an epoch.
func TestDirectJobsExact(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lines.jsonl")
	const n = 3000
	writeLines(t, p, n)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: 64 << 10, CacheBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	no, yes := false, true
	want := map[int]string{}
	solo := openJob(t, env, &wire.JobSpec{Paths: []string{p}, BatchSize: 100, Epochs: 1, Direct: &no})
	if solo.Describe().Direct {
		t.Fatal("a job asking direct=false reads with O_DIRECT")
	}
	for {
		b, err := solo.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range b.IDs {
			want[id] = string(b.Record(i))
		}
		b.Release()
	}
	solo.Close()
	if len(want) != n {
		t.Fatalf("the solo read has %d records, want %d", len(want), n)
	}

	const epochs = 2
	// check reads jobs to their end, a batch each in turn, and holds each
	// job's epochs (over its ranks: jobs of one name) to every record once.
	check := func(name string, jobs []*Job, names []string) {
		t.Helper()
		seen := map[string][]map[int]int{}
		for done := 0; done < len(jobs); {
			done = 0
			for k, j := range jobs {
				b, err := j.Next(context.Background())
				if errors.Is(err, io.EOF) {
					done++
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				for len(seen[names[k]]) <= b.Epoch {
					seen[names[k]] = append(seen[names[k]], map[int]int{})
				}
				for i, id := range b.IDs {
					if got := string(b.Record(i)); got != want[id] {
						t.Fatalf("%s: record %d is %q, a solo read's is %q", name, id, got, want[id])
					}
					seen[names[k]][b.Epoch][id]++
				}
				b.Release()
			}
		}
		for who, es := range seen {
			if len(es) != epochs {
				t.Fatalf("%s: %s read %d epochs, want %d", name, who, len(es), epochs)
			}
			for e, ids := range es {
				for id := range n {
					if ids[id] != 1 {
						t.Fatalf("%s: %s's epoch %d has record %d %d times", name, who, e, id, ids[id])
					}
				}
			}
		}
	}
	open := func(spec wire.JobSpec, direct bool) *Job {
		t.Helper()
		spec.Paths, spec.BatchSize, spec.Epochs, spec.Shuffle = []string{p}, 64, epochs, true
		j := openJob(t, env, &spec)
		if d := j.Describe().Direct; d != direct {
			t.Fatalf("%+v: direct %v, want %v", spec, d, direct)
		}
		if f, ok := j.src.ds.Object(0).(*storage.File); direct && (!ok || !f.Direct()) {
			t.Fatalf("%+v: the job's file is not open with O_DIRECT", spec)
		}
		return j
	}

	j := open(wire.JobSpec{Seed: 1}, true)
	check("alone", []*Job{j}, []string{"alone"})
	j.Close()

	r0, r1 := open(wire.JobSpec{Seed: 2, Rank: 0, World: 2}, true), open(wire.JobSpec{Seed: 2, Rank: 1, World: 2}, true)
	check("two ranks", []*Job{r0, r1}, []string{"ranks", "ranks"})
	r0.Close()
	r1.Close()

	a, b := open(wire.JobSpec{Seed: 3, Share: &yes}, true), open(wire.JobSpec{Seed: 4, Share: &yes, Direct: &no}, false)
	if g := env.Groups(); len(g) != 1 {
		t.Fatalf("a job reading with O_DIRECT and one through the page cache make %d share groups, want 1", len(g))
	}
	check("sharing", []*Job{a, b}, []string{"direct", "cached"})
	a.Close()
	b.Close()

	// Where the page cache keeps the file, it is read through it.
	keep, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	defer keep.Close()
	k := openJob(t, keep, &wire.JobSpec{Paths: []string{p}, Shuffle: true, BatchSize: 64, Epochs: 1})
	defer k.Close()
	if k.Describe().Direct {
		t.Fatal("a file the page cache keeps is read with O_DIRECT")
	}
}
