package job

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/internal/mincore"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// residentPages counts the pages of file p the page cache holds (mincore).
func residentPages(t *testing.T, p string) int {
	t.Helper()
	n := 0
	for _, in := range pagesCached(t, p) {
		if in {
			n++
		}
	}
	return n
}

// pagesCached says which pages of file p the page cache holds (mincore).
func pagesCached(t *testing.T, p string) []bool {
	t.Helper()
	in, err := mincore.File(p)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// droppedFile writes n records of size bytes, each's words naming its
// id and place, synced and dropped from the page cache; it skips the test
// on a file system that keeps pages a drop names (tmpfs).
func droppedFile(t *testing.T, n, size int) (string, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "records.bin")
	data := make([]byte, n*size)
	for id := range n {
		for k := 0; k < size; k += 8 {
			binary.LittleEndian.PutUint64(data[id*size+k:], uint64(id)<<32|uint64(k))
		}
	}
	// Written pages are dirty until written back (Sync); clean ones drop.
	w, err := os.Create(p)
	if err == nil {
		_, err = w.Write(data)
	}
	if err == nil {
		err = w.Sync()
	}
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	dropCached(t, p)
	if r := residentPages(t, p); r > n/8 {
		// tmpfs keeps its pages whatever it is told: there is no device
		// to read them again from.
		t.Skipf("the file system under %s keeps pages a drop names (%d of %d cached): nothing to keep by need", p, r, n)
	}
	return p, data
}

// dropCached asks the kernel to drop file p's cached pages (written back
// first: dirty pages stay).
func dropCached(t *testing.T, p string) {
	t.Helper()
	f, err := storage.OpenFile(p, storage.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Drop(0, f.Size()); err != nil {
		t.Fatal(err)
	}
}

// Jobs sharing a local file's records through the page cache keep no more
// of its pages there than the room they are given (a set PageCacheBytes,
// as a cgroup's limit would) and the pages each job took and may not have
// read yet, dropping the others: the kernel, with memory to spare, would
// keep every page read. Every record's bytes are still its own, each once
// an epoch.
func TestSharedPagesKeptWithinRoom(t *testing.T) {
	const n, size, room = 16384, 4096, 2 << 20
	p, data := droppedFile(t, n, size)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: room})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	no, yes := false, true
	const epochs = 2
	var jobs []*Job
	fresh := 0 // pages each job may have taken and not read
	for seed := range 3 {
		j := openJob(t, env, &wire.JobSpec{Paths: []string{p}, RecordSize: size, BatchSize: 64, Epochs: epochs, Shuffle: true,
			Seed: uint64(seed + 1), Share: &yes, Direct: &no})
		defer j.Close()
		jobs = append(jobs, j)
		fresh += 2 * j.readAhead()
	}
	seen := make([][]map[int]int, len(jobs))
	inTurn(t, jobs, func(k int, b *loader.Batch) {
		for len(seen[k]) <= b.Epoch {
			seen[k] = append(seen[k], map[int]int{})
		}
		for i, id := range b.IDs {
			if got := b.Record(i); string(got) != string(data[id*size:(id+1)*size]) {
				t.Fatalf("job %d: record %d's bytes are not its own", k, id)
			}
			seen[k][b.Epoch][id]++
		}
	})
	for k, es := range seen {
		if len(es) != epochs {
			t.Fatalf("job %d read %d epochs, want %d", k, len(es), epochs)
		}
		for e, ids := range es {
			for id := range n {
				if ids[id] != 1 {
					t.Fatalf("job %d's epoch %d has record %d %d times", k, e, id, ids[id])
				}
			}
		}
	}
	st := env.Groups()
	if len(st) != 1 || st[0].Stats.Saved == 0 {
		t.Fatalf("the three jobs shared nothing: %+v", st)
	}
	most := room/4096 + fresh + 512 // and what it takes between two looks at the room
	if most > n/2 {
		t.Fatalf("the test's file (%d pages) is too small to tell %d pages kept from every page", n, most)
	}
	if ps := st[0].Stats; ps.PagesDropped < int64(n-most) || ps.PagesKept > int64(most) {
		t.Fatalf("the group says it keeps %d pages and dropped %d, with room for %d of %d and %d taken and not read", ps.PagesKept, ps.PagesDropped, room/4096, n, fresh)
	}
	if r := residentPages(t, p); r > most {
		t.Fatalf("%d pages of %d of the file are cached after the jobs, with room for %d and %d taken and not read", r, n, room/4096, fresh)
	} else {
		t.Logf("%d of %d pages cached after three shared jobs, with room for %d and %d taken and not read", r, n, room/4096, fresh)
	}
}

// Jobs that read a local file's records each in its own order (alone, as
// DataLoader workers' parts, as ranks' parts) keep no more of its pages in
// the page cache than their room, the pages their loaders read ahead and
// what is read between two looks at the room: their source's steward drops
// the pages they read again last, where the kernel, with memory to spare,
// would keep every page read. Beside a job that shares, whose next reads
// the steward cannot tell, it drops none, nor does the shared job's group,
// which cannot weigh the other's. Every record's bytes are its own, each
// once an epoch of its order.
func TestPagesKeptForJobsEachInItsOrder(t *testing.T) {
	const n, size, room, epochs = 16384, 4096, 8 << 20, 2
	p, data := droppedFile(t, n, size)
	no, yes := false, true
	spec := func(mod func(*wire.JobSpec)) *wire.JobSpec {
		s := &wire.JobSpec{Paths: []string{p}, RecordSize: size, BatchSize: 64, Epochs: epochs, Shuffle: true, Seed: 7, Direct: &no}
		mod(s)
		return s
	}
	for _, c := range []struct {
		name  string
		specs []*wire.JobSpec
		order []int // the order each job reads a part of
		drops bool  // the steward drops pages
		// passes: the steward has records read past the page cache (a
		// job alone, told of its whole order's reads)
		passes bool
	}{
		{"alone", []*wire.JobSpec{spec(func(*wire.JobSpec) {})}, []int{0}, true, true},
		{"workers", []*wire.JobSpec{spec(func(s *wire.JobSpec) { s.BatchStride = 2 }), spec(func(s *wire.JobSpec) { s.BatchStride, s.BatchOffset = 2, 1 })}, []int{0, 0}, true, false},
		{"ranks", []*wire.JobSpec{spec(func(s *wire.JobSpec) { s.World = 2 }), spec(func(s *wire.JobSpec) { s.World, s.Rank = 2, 1 })}, []int{0, 0}, true, false},
		{"beside a shared job", []*wire.JobSpec{spec(func(*wire.JobSpec) {}), spec(func(s *wire.JobSpec) { s.Share, s.Seed = &yes, 8 })}, []int{0, 1}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := storage.OpenFile(p, storage.FileOptions{})
			if err != nil {
				t.Fatal(err)
			}
			f.Drop(0, int64(len(data)))
			f.Close()
			env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: room})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			var jobs []*Job
			ahead := 0
			for _, s := range c.specs {
				j := openJob(t, env, s)
				defer j.Close()
				jobs = append(jobs, j)
				ahead += j.readAhead()
			}
			seen := map[[3]int]int{} // order, epoch, id
			inTurn(t, jobs, func(k int, b *loader.Batch) {
				for i, id := range b.IDs {
					if got := b.Record(i); string(got) != string(data[id*size:(id+1)*size]) {
						t.Fatalf("job %d: record %d's bytes are not its own", k, id)
					}
					seen[[3]int{c.order[k], b.Epoch, id}]++
				}
			})
			for o := range slices.Max(c.order) + 1 {
				for e := range epochs {
					for id := range n {
						if got := seen[[3]int{o, e, id}]; got != 1 {
							t.Fatalf("order %d's epoch %d has record %d %d times", o, e, id, got)
						}
					}
				}
			}
			st := jobs[0].Status(0)
			if !c.drops {
				if st.PagesDropped != 0 {
					t.Fatalf("the steward dropped %d pages while a shared job read the file", st.PagesDropped)
				}
				// Nor does the shared job's group drop the pages of a job
				// whose next reads it cannot weigh.
				gs := env.Groups()
				if len(gs) != 1 || gs[0].Stats.PagesDropped != 0 {
					t.Fatalf("the share group dropped pages while a job not sharing read the file: %+v", gs)
				}
				return
			}
			most := room/4096 + ahead + 2*512 // and what is read between two looks at the room
			if most > n/2 {
				t.Fatalf("the test's file (%d pages) is too small to tell %d pages kept from every page", n, most)
			}
			// A record a page read past the cache is a page not kept.
			if st.PagesDropped+st.RecordsPassed < int64(n-most) || st.PagesKept > int64(most) {
				t.Fatalf("the steward says it keeps %d pages, dropped %d and had %d read past the cache, with room for %d of %d and %d read ahead",
					st.PagesKept, st.PagesDropped, st.RecordsPassed, room/4096, n, ahead)
			}
			if got := st.RecordsPassed > 0; got != c.passes {
				t.Fatalf("the steward had %d records read past the page cache; want some: %v", st.RecordsPassed, c.passes)
			}
			if r := residentPages(t, p); r > most {
				t.Fatalf("%d pages of %d of the file are cached after the jobs, with room for %d and %d read ahead", r, n, room/4096, ahead)
			} else {
				t.Logf("%d of %d pages cached after the jobs, with room for %d and %d read ahead; %d dropped, %d records read past the cache",
					r, n, room/4096, ahead, st.PagesDropped, st.RecordsPassed)
			}
		})
	}
}

// deviceReadBytes is what this process has read from devices, page cache
// misses included (/proc/self/io).
func deviceReadBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		t.Skipf("no /proc/self/io: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "read_bytes: "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Skip("/proc/self/io has no read_bytes")
	return 0
}

// readsPastRoom runs one job of spec over a dropped file of n records of
// size bytes for epochs, its page cache room bytes, checking every
// record's bytes and that each epoch has want records, each once; it
// returns the share of the file read from the device an epoch after the
// first.
func readsPastRoom(t *testing.T, spec wire.JobSpec, n, size, epochs, want int, room int64) float64 {
	t.Helper()
	p, data := droppedFile(t, n, size)
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: room})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	no := false
	spec.Paths, spec.RecordSize, spec.BatchSize, spec.Epochs, spec.Shuffle, spec.Direct = []string{p}, size, 64, epochs, true, &no
	j := openJob(t, env, &spec)
	defer j.Close()
	var from int64 = -1
	seen := map[[2]int]int{}
	inTurn(t, []*Job{j}, func(_ int, b *loader.Batch) {
		if b.Epoch == 1 && from < 0 {
			from = deviceReadBytes(t)
		}
		for i, id := range b.IDs {
			if string(b.Record(i)) != string(data[id*size:(id+1)*size]) {
				t.Fatalf("record %d's bytes are not its own", id)
			}
			seen[[2]int{b.Epoch, id}]++
		}
	})
	for e := range epochs {
		k := 0
		for id := range n {
			if c := seen[[2]int{e, id}]; c > 1 {
				t.Fatalf("epoch %d has record %d %d times", e, id, c)
			} else {
				k += c
			}
		}
		if k != want {
			t.Fatalf("epoch %d has %d records, want %d", e, k, want)
		}
	}
	return float64(deviceReadBytes(t)-from) / float64((epochs-1)*n*size)
}

// A job alone whose page cache keeps half its file reads about half the
// file from the device each epoch after the first: its steward keeps the
// pages not yet read this epoch and drops those read, which are read
// again only next epoch. Dropping at random would read 0.72 of it (a model
// of uniform epochs), the kernel's LRU 0.85.
func TestPagesKeptReadHalfAtHalf(t *testing.T) {
	const n, size = 16384, 4096
	read := readsPastRoom(t, wire.JobSpec{Seed: 3}, n, size, 3, n, n*size/2)
	t.Logf("%.2f of the file read from the device an epoch after the first, with room for half of it", read)
	if read > 0.6 {
		t.Fatalf("%.2f of the file read from the device an epoch after the first, with room for half: want about 0.5", read)
	}
}

// A rank alone on its node reads half the records an epoch, a part
// another each epoch: with room for a quarter of the file its steward
// keeps the pages the rank itself reads soonest, and it reads about 0.30
// of the file from the device an epoch after the first (a model of 8
// looks a drop); kept by the whole order's next reads (the other rank's,
// elsewhere) it read 0.37-0.38.
func TestPagesKeptForARankAlone(t *testing.T) {
	const n, size = 16384, 4096
	read := readsPastRoom(t, wire.JobSpec{Seed: 4, World: 2, Rank: 1}, n, size, 4, n/2, n*size/4)
	t.Logf("%.2f of the file read from the device an epoch after the first by a rank of two, with room for a quarter", read)
	if read > 0.35 {
		t.Fatalf("%.2f of the file read from the device an epoch after the first by a rank of two, with room for a quarter: want about 0.30", read)
	}
}

// locateCounter counts its dataset's Locate calls and sends one record past
// its file, as a corrupt index would.
type locateCounter struct {
	dataset.Dataset
	calls, past int
}

func (c *locateCounter) Locate(id int) dataset.Loc {
	c.calls++
	l := c.Dataset.Locate(id)
	if id == c.past {
		l.Off = c.Dataset.Object(0).Size()
	}
	return l
}

func (c *locateCounter) Objects() int { return 1 }

// Numbering a source's pages reads its files' sizes, not its records: a
// Locate a record at open cost 8.7 s for 10^9 records, on every job of a
// local file. A record past its file has no pages, rather than another
// file's or none at all (a page past the table).
func TestPagesNumberedWithoutWalkingRecords(t *testing.T) {
	const n, size = 1 << 14, 100
	p := filepath.Join(t.TempDir(), "records.bin")
	if err := os.WriteFile(p, make([]byte, n*size), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := dataset.Open(context.Background(), dataset.Options{RecordSize: size}, p)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	c := &locateCounter{Dataset: ds, past: 7}
	pg := env.pages(c)
	if pg == nil {
		t.Fatal("no pages numbered for a local file of fixed-size records")
	}
	if c.calls != 0 {
		t.Errorf("numbering the pages of %d records located %d of them", n, c.calls)
	}
	if want := (n*size + 4095) / 4096; pg.Count != want {
		t.Errorf("%d pages, want %d", pg.Count, want)
	}
	for _, id := range []int{0, 40, 41, n - 1} {
		f, k := pg.Span(id)
		if wf, wk := id*size/4096, (id*size+size-1)/4096-id*size/4096+1; f != wf || k != wk {
			t.Errorf("record %d: pages %d+%d, want %d+%d", id, f, k, wf, wk)
		}
	}
	if _, k := pg.Span(c.past); k != 0 {
		t.Errorf("a record past its file spans %d pages, want none", k)
	}
}

// A steward keeps the pages of records that lie about one or two to a page,
// and leaves pages of many records to the kernel: those are read many times
// an epoch, the LRU already keeps them about as well, and weighing each by
// its records' next reads cost the job half its rate at 64-byte records. A
// directory's files, a page each, are the kernel's too: a drop would open
// a file a page. Either way every record is read once an epoch with its
// own bytes.
func TestStewardOnlyForPagesOfFewRecords(t *testing.T) {
	for _, c := range []struct {
		size      int
		dir       bool // a file a record
		stewarded bool
	}{{64, false, false}, {1024, false, false}, {2048, false, true}, {4096, false, true}, {300, true, false}, {5000, true, false}} {
		name := fmt.Sprintf("%d-byte records", c.size)
		n := (4 << 20) / c.size
		var spec wire.JobSpec
		var record func(id int) []byte
		if c.dir {
			name, n = fmt.Sprintf("files of %d bytes", c.size), 1024
			p, files := droppedDir(t, n, c.size)
			spec.Paths, record = []string{p}, func(id int) []byte { return files[id] }
		} else {
			p, data := droppedFile(t, n, c.size)
			spec.Paths, spec.RecordSize = []string{p}, c.size
			record = func(id int) []byte { return data[id*c.size : (id+1)*c.size] }
		}
		env, err := NewEnv(EnvOptions{IndexDir: t.TempDir(), PageCacheBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		no := false
		spec.BatchSize, spec.Epochs, spec.Shuffle, spec.Direct = 64, 2, true, &no
		j := openJob(t, env, &spec)
		seen := make([]int, 2*n)
		inTurn(t, []*Job{j}, func(_ int, b *loader.Batch) {
			for i, id := range b.IDs {
				if string(b.Record(i)) != string(record(id)) {
					t.Fatalf("%s: record %d's bytes are not its own", name, id)
				}
				seen[b.Epoch*n+id]++
			}
		})
		if k := slices.IndexFunc(seen, func(v int) bool { return v != 1 }); k >= 0 {
			t.Fatalf("%s: epoch %d has record %d %d times", name, k/n, k%n, seen[k])
		}
		st := j.Status(0)
		if got := st.PagesDropped > 0; got != c.stewarded {
			t.Errorf("%s: the steward dropped %d pages, want a steward %v", name, st.PagesDropped, c.stewarded)
		}
		j.Close()
		env.Close()
	}
}

// droppedDir writes n files of size bytes each, each's bytes its own,
// synced and dropped from the page cache, and returns the directory and
// the files' bytes in name order; it skips the test where drops keep the
// pages (tmpfs), as droppedFile does.
func droppedDir(t *testing.T, n, size int) (string, [][]byte) {
	t.Helper()
	dir := t.TempDir()
	files := make([][]byte, n)
	for i := range n {
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(i*7 + k*13 + i>>8)
		}
		files[i] = b
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%05d.bin", i)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unix.Sync() // written pages are dirty until written back; clean ones drop
	for i := range n {
		dropCached(t, filepath.Join(dir, fmt.Sprintf("%05d.bin", i)))
	}
	if r := residentPages(t, filepath.Join(dir, "00000.bin")); r > 0 {
		t.Skipf("the file system under %s keeps pages a drop names: nothing to keep by need", dir)
	}
	return dir, files
}
