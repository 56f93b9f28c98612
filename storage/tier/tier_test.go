package tier_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/internal/privdir"
	"github.com/riffle-ml/riffle/internal/privdir/privdirtest"
	"github.com/riffle-ml/riffle/internal/s3test"
	"github.com/riffle-ml/riffle/internal/synth"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/storage/tier"
)

// epochOver reads every record of an object once in a global order's
// epoch, through r, checking each record against data.
func epochOver(t testing.TB, r storage.Reader, data []byte, g sampler.Global, epoch, size int, now func(int)) {
	t.Helper()
	ctx := context.Background()
	p := make([]byte, size)
	for pos := range g.N {
		if now != nil {
			now(epoch*g.N + pos)
		}
		id := g.At(epoch, pos)
		if err := r.ReadAt(ctx, p, int64(id*size)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(p, data[id*size:(id+1)*size]) {
			t.Fatalf("record %d differs", id)
		}
	}
}

// The tier in front of a real S3 server: the second epoch of a global
// shuffle reads at most 5% of its bytes from the store when the tier holds
// the dataset; and the blocks outlive the tier (a restarted daemon).
func TestTierHoldsTheDataset(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	const size, n = 4096, 2048 // 8 MiB
	data := synth.RandomBytes(size*n, 3)
	if err := srv.Put(ctx, "bkt", "r.bin", data); err != nil {
		t.Fatal(err)
	}
	s3, err := storage.NewS3(storage.S3Options{Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr, err := tier.New(s3, tier.Options{Dir: dir, Budget: 16 << 20, Block: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	r, err := tr.Open(ctx, "s3://bkt/r.bin")
	if err != nil {
		t.Fatal(err)
	}
	g := sampler.Global{N: n, Seed: 4}
	epochOver(t, r, data, g, 0, size, nil)
	first := tr.Stats().Fetched
	epochOver(t, r, data, g, 1, size, nil)
	second := tr.Stats().Fetched - first
	if first < int64(len(data)) || second > int64(len(data))/20 {
		t.Fatalf("epoch 1 fetched %d bytes, epoch 2 %d, of %d", first, second, len(data))
	}
	t.Logf("bytes from the object store: epoch 1 %.2f of the dataset, epoch 2 %.3f", float64(first)/float64(len(data)), float64(second)/float64(len(data)))
	again, err := tier.New(s3, tier.Options{Dir: dir, Budget: 16 << 20, Block: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := again.Open(ctx, "s3://bkt/r.bin")
	epochOver(t, r2, data, g, 2, size, nil)
	if f := again.Stats().Fetched; f > int64(len(data))/20 {
		t.Fatalf("after a restart the tr fetched %d bytes of %d", f, len(data))
	}
}

// nextUseOf is the oracle a job gives the tier: when the order g, now at
// position *now, next reads a byte of a range of its one object of
// records of size bytes.
func nextUseOf(g sampler.Global, size int64, now *int) func(object string, off, ln int64) int64 {
	return func(object string, off, ln int64) int64 {
		best := int64(cache.Never)
		for id := off / size; id < (off+ln)/size; id++ {
			nu, _ := sampler.NextUse(g, *now, int(id))
			best = min(best, nu)
		}
		return best
	}
}

// With room for half the dataset, Belady's MIN (told each block's next use
// by the inverse of the order) misses less than LRU over the same epochs.
func TestTierBeladyBeatsLRU(t *testing.T) {
	ctx := context.Background()
	const size, n, block = 1024, 8192, 16 << 10
	data := synth.RandomBytes(size*n, 5)
	path := filepath.Join(t.TempDir(), "d.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	local, _ := storage.NewLocal(false, nil)
	g := sampler.Global{N: n, Seed: 9}
	misses := map[string]int64{}
	for _, pol := range []cache.Policy{cache.Belady{}, cache.LRU{}} {
		tr, err := tier.New(local, tier.Options{Dir: t.TempDir(), Budget: int64(len(data)) / 2, Block: block, Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		var now int
		tr.AddFuture(nextUseOf(g, size, &now))
		r, err := tr.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		for e := range 3 {
			epochOver(t, r, data, g, e, size, func(t int) { now = t })
		}
		misses[pol.Name()] = tr.Stats().Misses
	}
	t.Logf("block misses over 3 epochs, room for half: belady %d, lru %d", misses["belady"], misses["lru"])
	if misses["belady"] >= misses["lru"] {
		t.Fatalf("belady missed %d blocks, lru %d", misses["belady"], misses["lru"])
	}
}

// A tier killed with SIGKILL while it writes blocks leaves none that is
// served torn: after a restart every read equals the object.
func TestTierSurvivesKill(t *testing.T) {
	if os.Getenv("RIFFLE_TIER_CHILD") != "" {
		// The child: read everything through the tier, over and over.
		local, _ := storage.NewLocal(false, nil)
		tr, err := tier.New(local, tier.Options{Dir: os.Getenv("RIFFLE_TIER_DIR"), Budget: 1 << 30, Block: 64 << 10})
		if err != nil {
			os.Exit(3)
		}
		r, err := tr.Open(context.Background(), os.Getenv("RIFFLE_TIER_SRC"))
		if err != nil {
			os.Exit(4)
		}
		p := make([]byte, 100<<10)
		for off := int64(0); ; off = (off + 333333) % (r.Size() - int64(len(p))) {
			r.ReadAt(context.Background(), p, off)
		}
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src.bin")
	data := synth.RandomBytes(32<<20, 6)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	tierDir := filepath.Join(dir, "tr")
	for round := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run", "TestTierSurvivesKill")
		cmd.Env = append(os.Environ(), "RIFFLE_TIER_CHILD=1", "RIFFLE_TIER_DIR="+tierDir, "RIFFLE_TIER_SRC="+src)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(150+100*round) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}
	// Tear some blocks by hand too: cut one short, flip a byte of another.
	var blocks []string
	filepath.Walk(tierDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && filepath.Ext(p) == ".blk" {
			blocks = append(blocks, p)
		}
		return nil
	})
	if len(blocks) < 2 {
		t.Fatalf("the killed tiers kept %d blocks", len(blocks))
	}
	b0, _ := os.ReadFile(blocks[0])
	os.WriteFile(blocks[0], b0[:len(b0)/2], 0o600)
	b1, _ := os.ReadFile(blocks[1])
	b1[len(b1)/2] ^= 0xff
	os.WriteFile(blocks[1], b1, 0o600)
	local, _ := storage.NewLocal(false, nil)
	tr, err := tier.New(local, tier.Options{Dir: tierDir, Budget: 1 << 30, Block: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	r, err := tr.Open(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := r.ReadAt(context.Background(), got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("a torn block was served")
	}
	if st := tr.Stats(); st.Hits == 0 {
		t.Fatalf("no block survived the kills: %+v", st)
	}
	tmps, _ := filepath.Glob(filepath.Join(tierDir, "*", "*.tmp"))
	if len(tmps) > 0 {
		t.Fatalf("%d temporary files left", len(tmps))
	}
}

// BenchmarkTierPolicies: the hit rate of a disk tier holding half a
// dataset over three epochs of a global shuffle, Belady's MIN (told each
// block's next use by the inverse of the order) against LRU, with one and
// with sixteen records per block.
//
//	go test ./tier -run '^$' -bench TierPolicies -benchtime 1x
func BenchmarkTierPolicies(b *testing.B) {
	ctx := context.Background()
	const block = 16 << 10
	for _, perBlock := range []int{1, 16} {
		b.Run(fmt.Sprintf("records-per-block=%d", perBlock), func(b *testing.B) {
			size := block / perBlock
			n := (32 << 20) / size
			data := synth.RandomBytes(size*n, 5)
			path := filepath.Join(b.TempDir(), "d.bin")
			if err := os.WriteFile(path, data, 0o644); err != nil {
				b.Fatal(err)
			}
			local, _ := storage.NewLocal(false, nil)
			g := sampler.Global{N: n, Seed: 9}
			rate := map[string]float64{}
			for b.Loop() {
				for _, pol := range []cache.Policy{cache.Belady{}, cache.LRU{}} {
					tr, err := tier.New(local, tier.Options{Dir: b.TempDir(), Budget: int64(len(data)) / 2, Block: block, Policy: pol})
					if err != nil {
						b.Fatal(err)
					}
					var now int
					tr.AddFuture(nextUseOf(g, int64(size), &now))
					r, err := tr.Open(ctx, path)
					if err != nil {
						b.Fatal(err)
					}
					for e := range 3 {
						epochOver(b, r, data, g, e, size, func(t int) { now = t })
					}
					st := tr.Stats()
					rate[pol.Name()] = float64(st.Hits) / float64(st.Hits+st.Misses)
				}
			}
			b.ReportMetric(rate["belady"], "belady-hit-rate")
			b.ReportMetric(rate["lru"], "lru-hit-rate")
			b.Logf("%d records per block, room for half, 3 epochs: hit rate belady %.3f, lru %.3f", perBlock, rate["belady"], rate["lru"])
		})
	}
}

// countingStore is a real store (the local file system) whose reads are
// counted, and held at a gate until the test opens it.
type countingStore struct {
	storage.Store
	reads atomic.Int64
	gate  chan struct{}
}

// countingReader counts and gates the reads of the reader it wraps. It
// must see every read, so it does not unwrap (storage.Wrapper).
type countingReader struct {
	storage.Reader
	s *countingStore
}

var _ storage.Reader = (*countingReader)(nil)

func (s *countingStore) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := s.Store.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &countingReader{r, s}, nil
}

func (r *countingReader) ReadAt(ctx context.Context, p []byte, off int64) error {
	r.s.reads.Add(1)
	select {
	case <-r.s.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return r.Reader.ReadAt(ctx, p, off)
}

// gatedTier is a tier of blocks of block bytes over a file of size random
// bytes (from seed), in front of a local store that counts its reads and
// holds each until the test opens its gate.
func gatedTier(t *testing.T, size int, block int64, seed uint64) ([]byte, string, *countingStore, *tier.Tier) {
	t.Helper()
	data := synth.RandomBytes(size, seed)
	path := filepath.Join(t.TempDir(), "d.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	local, _ := storage.NewLocal(false, nil)
	st := &countingStore{Store: local, gate: make(chan struct{})}
	tr, err := tier.New(st, tier.Options{Dir: t.TempDir(), Budget: 1 << 20, Block: block})
	if err != nil {
		t.Fatal(err)
	}
	return data, path, st, tr
}

// Readers that miss one block at once fetch it once: the first fetches,
// the others wait for its fill (the store's read is held until they all
// do), and every one gets the block's bytes.
func TestTierFetchesAMissOnce(t *testing.T) {
	ctx := context.Background()
	const block = 64 << 10
	data, path, st, tr := gatedTier(t, 4*block+100, block, 8)
	r, err := tr.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	const readers = 16
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for i := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each reads a different range of block 2.
			off, n := int64(2*block+i*100), 1000+i
			p := make([]byte, n)
			if err := r.ReadAt(ctx, p, off); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(p, data[off:off+int64(n)]) {
				errs <- fmt.Errorf("reader %d: bytes differ", i)
			}
		}()
	}
	// Hold the store's read until every other reader waits on it (or,
	// were they not coalesced, until a second read reaches the store).
	for deadline := time.Now().Add(10 * time.Second); tr.Stats().Shared < readers-1 && st.reads.Load() < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("readers waiting %d, store reads %d", tr.Stats().Shared, st.reads.Load())
		}
		runtime.Gosched()
	}
	close(st.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := st.reads.Load(); n != 1 {
		t.Fatalf("%d readers of one missing block read the store %d times, want once", readers, n)
	}
	// The block is on disk now: another reader reads no store.
	if err := r.ReadAt(ctx, make([]byte, 10), 2*block+5); err != nil || st.reads.Load() != 1 {
		t.Fatalf("a read after the fill: %v, %d store reads", err, st.reads.Load())
	}
}

// A reader waiting on another's fetch that fails (its context cancelled)
// fetches the block itself and gets it.
func TestTierWaiterRetriesAFailedFetch(t *testing.T) {
	const block = 64 << 10
	data, path, st, tr := gatedTier(t, 2*block, block, 9)
	r, _ := tr.Open(context.Background(), path)
	first, cancel := context.WithCancel(context.Background())
	firstErr := make(chan error, 1)
	go func() { firstErr <- r.ReadAt(first, make([]byte, 10), 0) }()
	for st.reads.Load() < 1 {
		runtime.Gosched()
	}
	second := make(chan error, 1)
	p := make([]byte, 100)
	go func() { second <- r.ReadAt(context.Background(), p, 50) }()
	for tr.Stats().Shared < 1 {
		runtime.Gosched()
	}
	cancel() // the fetcher gives up; the waiter must not take its error
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled reader: %v", err)
	}
	close(st.gate)
	if err := <-second; err != nil || !bytes.Equal(p, data[50:150]) {
		t.Fatalf("the waiter: %v", err)
	}
}

// The tier's directory is the daemon user's own: another user's, or one
// anyone may write, is refused; blocks are files of mode 0600 in
// directories of 0700; a symlink planted in a block's place is not read
// through (the block is fetched again and the link's target left alone).
func TestTierDirPrivate(t *testing.T) {
	old := unix.Umask(0)
	defer unix.Umask(old)
	ctx := context.Background()
	const block = 16 << 10
	data := synth.RandomBytes(4*block, 10)
	path := filepath.Join(t.TempDir(), "d.bin")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	local, _ := storage.NewLocal(false, nil)
	for _, d := range privdirtest.UnsafeDirs(t) {
		if _, err := tier.New(local, tier.Options{Dir: d, Budget: 1 << 20, Block: block}); !errors.Is(err, privdir.ErrNotPrivate) ||
			!strings.Contains(err.Error(), d) {
			t.Fatalf("a tier in %s: %v", d, err)
		}
	}

	dir := filepath.Join(t.TempDir(), "tier")
	tr, err := tier.New(local, tier.Options{Dir: dir, Budget: 1 << 20, Block: block})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := tr.Open(ctx, path)
	if err := r.ReadAt(ctx, make([]byte, len(data)), 0); err != nil {
		t.Fatal(err)
	}
	var blocks []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		want := os.FileMode(0o600)
		if info.IsDir() {
			want = 0o700 | os.ModeDir
		} else {
			blocks = append(blocks, p)
		}
		if info.Mode() != want {
			t.Fatalf("%s: mode %v, want %v", p, info.Mode(), want)
		}
		return nil
	})
	if len(blocks) != 4 {
		t.Fatalf("%d blocks kept, want 4", len(blocks))
	}
	// Plant a symlink to a forged block (a valid CRC of other bytes) in
	// place of a kept one, for this tier and for one started afresh.
	forged := filepath.Join(t.TempDir(), "forged")
	fb := make([]byte, 4+block)
	binary.LittleEndian.PutUint32(fb, crc32.Checksum(fb[4:], crc32.MakeTable(crc32.Castagnoli)))
	os.WriteFile(forged, fb, 0o644)
	for _, b := range blocks[:2] {
		os.Remove(b)
		if err := os.Symlink(forged, b); err != nil {
			t.Fatal(err)
		}
	}
	again, err := tier.New(local, tier.Options{Dir: dir, Budget: 1 << 20, Block: block})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range []*tier.Tier{tr, again} {
		r, _ := tr.Open(ctx, path)
		got := make([]byte, len(data))
		if err := r.ReadAt(ctx, got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("a planted block was served")
		}
		for _, b := range blocks[:2] {
			os.Remove(b)
			os.Symlink(forged, b)
		}
	}
	if b, _ := os.ReadFile(forged); !bytes.Equal(b, fb) {
		t.Fatal("a block was written through a symlink")
	}
}

// A local file edited in place with its size and mtime put back is not
// read from the blocks of its old bytes.
func TestTierSeesInPlaceEdit(t *testing.T) {
	ctx := context.Background()
	const block = 16 << 10
	before, after := synth.RandomBytes(4*block, 11), synth.RandomBytes(4*block, 12)
	path := filepath.Join(t.TempDir(), "d.bin")
	if err := os.WriteFile(path, before, 0o644); err != nil {
		t.Fatal(err)
	}
	local, _ := storage.NewLocal(false, nil)
	tr, err := tier.New(local, tier.Options{Dir: t.TempDir(), Budget: 1 << 20, Block: block})
	if err != nil {
		t.Fatal(err)
	}
	r, _ := tr.Open(ctx, path)
	if err := r.ReadAt(ctx, make([]byte, len(before)), 0); err != nil {
		t.Fatal(err)
	}
	r.Close()
	info, _ := os.Stat(path)
	var st unix.Stat_t
	unix.Stat(path, &st)
	f, _ := os.OpenFile(path, os.O_WRONLY, 0)
	f.WriteAt(after, 0)
	f.Close()
	for deadline := time.Now().Add(5 * time.Second); ; {
		os.Chtimes(path, info.ModTime(), info.ModTime())
		var now unix.Stat_t
		unix.Stat(path, &now)
		if now.Ctim != st.Ctim {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ctime did not change")
		}
	}
	r, _ = tr.Open(ctx, path)
	got := make([]byte, len(after))
	if err := r.ReadAt(ctx, got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, after) {
		t.Fatal("the old bytes were served from the tr")
	}
}
