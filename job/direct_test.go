package job

import (
	"container/list"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/riffle-ml/riffle/loader"
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

// pageCacheHits against an LRU cache of pages fed three epochs of
// shuffled records: pages of one aligned record, of four records, and of
// records at any offset.
func TestPageCacheHits(t *testing.T) {
	const pages = 4000
	r := rand.New(rand.NewPCG(3, 3))
	for _, c := range []float64{0.1, 0.3, 0.5, 0.8} {
		for _, k := range []struct {
			name    string
			mean    int64
			aligned bool
			spans   func(id int) (lo, hi int) // pages of record id
			n       int
		}{
			{"a page a record", 4096, true, func(id int) (int, int) { return id, id }, pages},
			{"four records a page", 1024, true, func(id int) (int, int) { return id / 4, id / 4 }, 4 * pages},
			{"records at any offset", 3000, false, func(id int) (int, int) { return id * 3000 / 4096, (id*3000 + 2999) / 4096 }, pages * 4096 / 3000},
		} {
			lru := newLRU(int(c * pages))
			hits, reads := 0, 0
			for e := range 3 {
				for _, id := range r.Perm(k.n) {
					lo, hi := k.spans(id)
					for pg := lo; pg <= hi; pg++ {
						hit := lru.touch(pg)
						if e > 0 {
							reads++
							if hit {
								hits++
							}
						}
					}
				}
			}
			got, want := float64(hits)/float64(reads), pageCacheHits(c, k.mean, k.aligned)
			if math.Abs(got-want) > 0.03 {
				t.Errorf("c %.1f, %s: an LRU answered %.3f of the page reads, the model says %.3f", c, k.name, got, want)
			}
		}
	}
}

// lru is a cache of n pages, least recently used out first.
type lru struct {
	n     int
	at    map[int]*list.Element
	order *list.List
}

func newLRU(n int) *lru { return &lru{n: n, at: map[int]*list.Element{}, order: list.New()} }

// touch reads page p and says whether the cache had it.
func (l *lru) touch(p int) bool {
	if e, ok := l.at[p]; ok {
		l.order.MoveToFront(e)
		return true
	}
	l.at[p] = l.order.PushFront(p)
	if l.order.Len() > l.n {
		delete(l.at, l.order.Remove(l.order.Back()).(int))
	}
	return false
}

func TestReadsDirect(t *testing.T) {
	dir := t.TempDir()
	big, small := filepath.Join(dir, "big.jsonl"), filepath.Join(dir, "small.jsonl")
	writeLines(t, big, 2000) // ~300 KB: 20x the cache below
	writeLines(t, small, 10)
	// 64 records of a page, 256 KiB.
	pages := filepath.Join(dir, "pages.bin")
	if err := os.WriteFile(pages, make([]byte, 64*4096), 0o644); err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	for _, c := range []struct {
		name  string
		spec  wire.JobSpec
		paths []string
		want  bool
		keep  int64 // what the page cache keeps; 16 KiB if 0
		// others: other jobs read the files now
		others bool
	}{
		{"a global shuffle of more than the cache keeps", wire.JobSpec{Shuffle: true}, []string{big}, true, 0, false},
		{"auto's order", wire.JobSpec{Sampler: "auto"}, []string{big}, true, 0, false},
		{"two files, more together", wire.JobSpec{Shuffle: true}, []string{small, big}, true, 0, false},
		{"what the cache keeps", wire.JobSpec{Shuffle: true}, []string{small}, false, 0, false},
		{"records of a page, 4x the cache: few hits", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, true, 64 << 10, false},
		{"records of a page, twice the cache: 15% hits", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, false, 128 << 10, false},
		{"records of a page, 2.7x the cache: the LRU's 8%, the steward's 37%", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, false, 96 << 10, false},
		{"records of a page, 2.7x the cache, auto's order, not stewarded", wire.JobSpec{Sampler: "auto", RecordSize: 4096}, []string{pages}, true, 96 << 10, false},
		{"records of a page, 3.6x the cache: under the steward's 30%", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, true, 72 << 10, false},
		{"lines, 2.5x the cache: a page's lines hit", wire.JobSpec{Shuffle: true}, []string{big}, false, 128 << 10, false},
		{"records of a page, the cache's size", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, false, 256 << 10, false},
		{"a quarter-page record each, 4x the cache", wire.JobSpec{Shuffle: true, RecordSize: 1024}, []string{pages}, false, 64 << 10, false},
		{"records of a page over ranks, 4x the cache: a rank's reads are random", wire.JobSpec{Shuffle: true, RecordSize: 4096, World: 2}, []string{pages}, false, 64 << 10, false},
		{"records of a page, 4x the cache, sharing", wire.JobSpec{Shuffle: true, RecordSize: 4096, Share: &yes}, []string{pages}, false, 64 << 10, false},
		{"records of a page, 4x the cache, another job on them", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, false, 64 << 10, true},
		{"records of a page, 16x the cache, another job on them", wire.JobSpec{Shuffle: true, RecordSize: 4096}, []string{pages}, true, 16 << 10, true},
		{"a subset", wire.JobSpec{Shuffle: true, Subset: &wire.Subset{Ranges: [][2]int{{0, 10}}}}, []string{big}, false, 0, false},
		{"direct=false asked", wire.JobSpec{Shuffle: true, Direct: &no}, []string{big}, false, 0, false},
		{"file order", wire.JobSpec{}, []string{big}, false, 0, false},
		{"a buffer's order, read in file order", wire.JobSpec{Sampler: "buffered", Buffer: 64}, []string{big}, false, 0, false},
		{"a block order named", wire.JobSpec{Sampler: "block"}, []string{big}, false, 0, false},
		{"a directory's files", wire.JobSpec{Shuffle: true}, []string{dir}, false, 0, false},
		{"an object store", wire.JobSpec{Shuffle: true}, []string{"s3://b/big.jsonl"}, false, 0, false},
	} {
		spec := c.spec
		spec.Paths, spec.BatchSize = c.paths, 64
		plan, err := Check(&spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		keep := c.keep
		if keep == 0 {
			keep = 16 << 10
		}
		if got := readsDirect(plan, c.paths, keep, c.others); got != c.want {
			t.Errorf("%s: reads direct %v, want %v", c.name, got, c.want)
		}
	}
}

// A job whose order the steward cannot ask (a subset's, the rest of an
// epoch) is weighed by the LRU's hits as before: 4 KiB records 2.7x the
// cache (the LRU's 8%) go past it, where a global shuffle of every record,
// whose pages the steward keeps, reads through it.
func TestStewardedOnlyWhereItCanTell(t *testing.T) {
	const bytes, keep = 256 << 10, 96 << 10
	for _, c := range []struct {
		name string
		spec wire.JobSpec
		want bool // reads with O_DIRECT
	}{
		{"every record", wire.JobSpec{}, false},
		{"a subset", wire.JobSpec{Subset: &wire.Subset{Ranges: [][2]int{{0, 60}}}}, true},
		{"a filter", wire.JobSpec{Filter: &wire.Filter{MinSize: 1}}, true},
		{"dedup", wire.JobSpec{Dedup: true}, true},
		{"the rest of an epoch", wire.JobSpec{Start: 10, Epochs: 1}, true},
	} {
		spec := c.spec
		spec.Paths, spec.BatchSize, spec.RecordSize, spec.Shuffle = []string{"f"}, 8, 4096, true
		plan, err := Check(&spec)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := missesCache(plan, bytes, keep, false); got != c.want {
			t.Errorf("%s: reads direct %v, want %v", c.name, got, c.want)
		}
	}
}

// Jobs that leave direct unset over files many times what the page cache keeps
// read them with O_DIRECT, and every record is a buffered solo read's:
// alone, split over ranks, and sharing a group with a job reading through
// the page cache (direct=false), the two taking turns. Each is every
// record once an epoch.
func TestDirectJobsExact(t *testing.T) {
	p := filepath.Join(t.TempDir(), "lines.jsonl")
	const n = 3000
	writeLines(t, p, n)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: 16 << 10, CacheBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	no, yes := false, true
	// A solo read in file order, through the page cache: each record's bytes by id.
	want := map[int]string{}
	for id, rec := range soloRecords(t, env, []string{p}) {
		want[id] = string(rec)
	}
	if len(want) != n {
		t.Fatalf("the solo read has %d records, want %d", len(want), n)
	}

	const epochs = 2
	// check reads jobs to their end, a batch each in turn, and holds each
	// job's epochs (over its ranks: jobs of one name) to every record below
	// upTo once, and no other.
	check := func(name string, jobs []*Job, names []string, upTo int) {
		t.Helper()
		seen := map[string][]map[int]int{}
		inTurn(t, jobs, func(k int, b *loader.Batch) {
			for len(seen[names[k]]) <= b.Epoch {
				seen[names[k]] = append(seen[names[k]], map[int]int{})
			}
			for i, id := range b.IDs {
				if got := string(b.Record(i)); got != want[id] {
					t.Fatalf("%s: record %d is %q, a solo read's is %q", name, id, got, want[id])
				}
				seen[names[k]][b.Epoch][id]++
			}
		})
		for who, es := range seen {
			if len(es) != epochs {
				t.Fatalf("%s: %s read %d epochs, want %d", name, who, len(es), epochs)
			}
			for e, ids := range es {
				if len(ids) != upTo {
					t.Fatalf("%s: %s's epoch %d has %d records, want %d", name, who, e, len(ids), upTo)
				}
				for id := range upTo {
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
	check("alone", []*Job{j}, []string{"alone"}, n)
	j.Close()

	r0, r1 := open(wire.JobSpec{Seed: 2, Rank: 0, World: 2}, true), open(wire.JobSpec{Seed: 2, Rank: 1, World: 2}, true)
	check("two ranks", []*Job{r0, r1}, []string{"ranks", "ranks"}, n)
	r0.Close()
	r1.Close()

	a, b := open(wire.JobSpec{Seed: 3, Share: &yes}, true), open(wire.JobSpec{Seed: 4, Share: &yes, Direct: &no}, false)
	if g := env.Groups(); len(g) != 1 {
		t.Fatalf("a job reading with O_DIRECT and one through the page cache make %d share groups, want 1", len(g))
	}
	check("sharing", []*Job{a, b}, []string{"direct", "cached"}, n)

	// A subset is decided once the files are open: two thirds of the
	// lines, 20x what the cache keeps, past it, each of them once; 50
	// lines, which it keeps, through it.
	sub := func(k int) *wire.Subset { return &wire.Subset{Ranges: [][2]int{{0, k}}} }
	s := open(wire.JobSpec{Seed: 6, Subset: sub(2000)}, true)
	check("a subset", []*Job{s}, []string{"subset"}, 2000)
	s.Close()
	s = open(wire.JobSpec{Seed: 7, Subset: sub(50)}, false)
	check("a small subset", []*Job{s}, []string{"small subset"}, 50)
	s.Close()
	a.Close()
	b.Close()

	// A second job on files a first one reads now finds the pages that
	// one reads in the page cache: it reads through it (records of a page,
	// 4x what the cache keeps: alone, past it).
	pages := filepath.Join(t.TempDir(), "pages.bin")
	if err := os.WriteFile(pages, make([]byte, 64*4096), 0o644); err != nil {
		t.Fatal(err)
	}
	sweep, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer sweep.Close()
	first := openJob(t, sweep, &wire.JobSpec{Paths: []string{pages}, RecordSize: 4096, Shuffle: true, BatchSize: 8, Epochs: 1})
	second := openJob(t, sweep, &wire.JobSpec{Paths: []string{pages}, RecordSize: 4096, Shuffle: true, BatchSize: 8, Epochs: 1, Seed: 1})
	if !first.Describe().Direct || second.Describe().Direct {
		t.Fatalf("a job alone and one beside it on the same files: direct %v and %v, want true and false",
			first.Describe().Direct, second.Describe().Direct)
	}
	first.Close()
	second.Close()
	// Two DataLoader workers' parts of one order read each page once an
	// epoch between them: both past the cache.
	var workers []*Job
	for off := range 2 {
		w := openJob(t, sweep, &wire.JobSpec{Paths: []string{pages}, RecordSize: 4096, Shuffle: true, BatchSize: 8, Epochs: 1,
			Seed: 5, BatchStride: 2, BatchOffset: off})
		defer w.Close()
		workers = append(workers, w)
	}
	if !workers[0].Describe().Direct || !workers[1].Describe().Direct {
		t.Fatal("a DataLoader worker's part reads through the cache beside another part of its order")
	}

	// Arrow files many times what the cache keeps are rows: chosen past
	// the cache before the open, read through it after (their pages have
	// readers of their own), every row once.
	hf := filepath.Join(t.TempDir(), "hf")
	writeHFDir(t, hf, 0, 9000, 2, arrow.PrimitiveTypes.Int64)
	arrows, err := filepath.Glob(filepath.Join(hf, "*.arrow"))
	if err != nil || len(arrows) != 2 {
		t.Fatalf("arrow files %v: %v", arrows, err)
	}
	rspec := &wire.JobSpec{Paths: arrows, BatchSize: 32, Shuffle: true, Seed: 2}
	if plan, err := Check(rspec); err != nil || !readsDirect(plan, arrows, env.pageCacheBytes(), false) {
		t.Fatalf("the arrow files are not chosen past the cache before the open (%v)", err)
	}
	rj := openJob(t, env, rspec)
	if rj.Describe().Direct {
		t.Fatal("a dataset of rows reads with O_DIRECT")
	}
	rows, err := rowsOf(rj)
	if err != nil || len(rows) != 1 || len(rows[0]) != 9000 {
		t.Fatalf("rows past a refused O_DIRECT: %d epochs, %v", len(rows), err)
	}
	rj.Close()

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
