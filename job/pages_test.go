package job

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// residentPages counts the pages of file p the page cache holds (mincore).
func residentPages(t *testing.T, p string) int {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, (len(m)+4095)/4096)
	// x/sys has no wrapper for mincore(2).
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// Jobs sharing a local file's records through the page cache keep no more
// of its pages there than the room they are given (a set PageCacheBytes,
// as a cgroup's limit would) and the pages each job took and may not have
// read yet, dropping the others: the kernel, with memory to spare, would
// keep every page read. Every record's bytes are still its own, each once
// an epoch.
func TestSharedPagesKeptWithinRoom(t *testing.T) {
	const n, size, room = 16384, 4096, 2 << 20
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
	f, err := storage.OpenFile(p, storage.FileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Drop(0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if r := residentPages(t, p); r > n/8 {
		// tmpfs keeps its pages whatever it is told: there is no device
		// to read them again from.
		t.Skipf("the file system under %s keeps pages a drop names (%d of %d cached): nothing to keep by need", p, r, n)
	}

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
