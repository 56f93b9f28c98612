package dataset_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
)

// countingStore is the local file system, counting the bytes read from
// every object after it was opened (the device's reads: the loader's, and
// those a batch of rows makes itself).
type countingStore struct {
	storage.Store
	bytes atomic.Int64
}

func newCountingStore(t testing.TB) *countingStore {
	l, err := storage.NewLocal(false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &countingStore{Store: l}
}

func (s *countingStore) Open(ctx context.Context, name string) (storage.Reader, error) {
	r, err := s.Store.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return &storage.Faulty{Reader: r, Inject: func(_ int64, n int) error {
		s.bytes.Add(int64(n))
		return nil
	}}, nil
}

// lockstep lets n goroutines pass together, batch after batch; one that
// ends leaves it.
type lockstep struct {
	mu      sync.Mutex
	cond    *sync.Cond
	n, at   int
	advance int
}

func newLockstep(n int) *lockstep {
	s := &lockstep{n: n}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *lockstep) wait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	gen := s.advance
	if s.at++; s.at >= s.n {
		s.at, s.advance = 0, s.advance+1
		s.cond.Broadcast()
		return
	}
	for gen == s.advance {
		s.cond.Wait()
	}
}

func (s *lockstep) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n--; s.at >= s.n && s.at > 0 {
		s.at, s.advance = 0, s.advance+1
		s.cond.Broadcast()
	}
}

// runRows runs one loader per sampler over ds at one pace (each takes its
// batch k, then waits for the others), for epochs epochs, and checks every
// row against want and that each epoch holds every row once.
func runRows(t *testing.T, ds dataset.Dataset, smps []sampler.Sampler, opts loader.Options, want []string) error {
	step := newLockstep(len(smps))
	var g errgroup.Group
	for k, smp := range smps {
		g.Go(func() error {
			defer step.leave()
			l, err := loader.New(context.Background(), ds, smp, opts)
			if err != nil {
				return err
			}
			defer l.Close()
			seen := map[int]int{}
			epoch := opts.Epoch
			check := func() error {
				if len(seen) != len(want) {
					return fmt.Errorf("job %d epoch %d: %d rows of %d", k, epoch, len(seen), len(want))
				}
				for id, c := range seen {
					if c != 1 {
						return fmt.Errorf("job %d epoch %d: row %d came %d times", k, epoch, id, c)
					}
				}
				clear(seen)
				return nil
			}
			for {
				b, err := l.Next(context.Background())
				if err == io.EOF {
					return check()
				}
				if err != nil {
					return err
				}
				if b.Epoch != epoch {
					if err := check(); err != nil {
						b.Release()
						return err
					}
					epoch = b.Epoch
				}
				got := batchRows(t, ds.Info().Schema, b)
				for i, id := range b.IDs {
					if g, w := canon(t, got[i]), canon(t, want[id]); g != w {
						b.Release()
						return fmt.Errorf("job %d row %d:\n got %s\nwant %s", k, id, g, w)
					}
					seen[id]++
				}
				b.Release()
				step.wait()
			}
		})
	}
	return g.Wait()
}

// writePayloads writes n rows (an id, 200 bytes of payload, a label) to a
// Parquet file of row groups of 3000 rows and pages of 4 KiB, and returns
// them as arrow-go's reader gives them back: a file whose pages outgrow a
// small cache of unpacked pages.
func writePayloads(t testing.TB, path string, n int) []string {
	t.Helper()
	mem := memory.DefaultAllocator
	sc := arrow.NewSchema([]arrow.Field{{Name: "id", Type: arrow.PrimitiveTypes.Int64},
		{Name: "payload", Type: arrow.BinaryTypes.Binary}, {Name: "label", Type: arrow.PrimitiveTypes.Int32}}, nil)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	r := rand.New(rand.NewPCG(4, 4))
	p := make([]byte, 200)
	for i := range n {
		b.Field(0).(*array.Int64Builder).Append(int64(i))
		for k := range p {
			p[k] = byte(r.Uint32())
		}
		b.Field(1).(*array.BinaryBuilder).Append(p)
		b.Field(2).(*array.Int32Builder).Append(int32(i % 10))
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	props := parquet.NewWriterProperties(parquet.WithCompression(compress.Codecs.Snappy), parquet.WithDataPageSize(4096),
		parquet.WithMaxRowGroupLength(3000), parquet.WithDictionaryDefault(false), parquet.WithBatchSize(16))
	w, err := pqarrow.NewFileWriter(sc, f, props, pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := file.OpenParquetFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	fr, err := pqarrow.NewFileReader(rd, pqarrow.ArrowReadProperties{}, mem)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tab.Release()
	tr := array.NewTableReader(tab, 1<<20)
	defer tr.Release()
	var rows []string
	for tr.Next() {
		var out bytes.Buffer
		if err := array.RecordToJSON(tr.RecordBatch(), &out); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, strings.Split(strings.TrimSpace(out.String()), "\n")...)
	}
	return rows
}

// Jobs sharing a dataset of rows (dependent sampling, Joader §3.1: a group
// gives jobs choosing at the same time the same rows) read each block of
// them once for all: the batches that take the same rows at about the same
// time find their Parquet pages (or compressed Arrow record batches)
// claimed, read and unpacked by the first, in the dataset's cache of
// unpacked blocks, or still kept there. Independent jobs read each its own.
// With an unpacked cache smaller than the file's blocks (as a large file's
// are), three shared jobs read about what one job alone does, where three
// independent ones read about three times that; each job's every row
// equals arrow-go's reading of it, once per epoch.
func TestSharedRowsReadBlocksOnce(t *testing.T) {
	dir := t.TempDir()
	pq := filepath.Join(dir, "t.parquet")
	pqWant := writePayloads(t, pq, 10000)
	var arrowPaths []string
	var arrowWant []string
	for i := range 2 {
		p := filepath.Join(dir, fmt.Sprintf("c%d.arrow", i))
		arrowPaths = append(arrowPaths, p)
		sizes := make([]int, 120)
		for k := range sizes {
			sizes[k] = 10 + k%20
		}
		arrowWant = append(arrowWant, writeArrowWith(t, p, i == 1, sizes, uint64(i+3), ipc.WithLZ4())...)
	}
	for _, c := range []struct {
		name   string
		paths  []string
		want   []string
		budget int64
	}{{"parquet", []string{pq}, pqWant, 1 << 20}, {"compressed arrow", arrowPaths, arrowWant, 512 << 10}} {
		t.Run(c.name, func(t *testing.T) {
			defer dataset.SetUnpackedBudget(c.budget)()
			const jobs, epochs = 3, 2
			opts := loader.Options{BatchSize: 23, Epochs: epochs, Prefetch: 2, Lazy: true}
			// Each run opens the dataset anew: a cache of its own, cold.
			run := func(smps func(n int) []sampler.Sampler) int64 {
				st := newCountingStore(t)
				ds, err := dataset.Open(context.Background(), dataset.Options{Store: st}, c.paths...)
				if err != nil {
					t.Fatal(err)
				}
				defer ds.Close()
				st.bytes.Store(0) // the index was read or built: count the loaders' reads only
				if err := runRows(t, ds, smps(ds.Len()), opts, c.want); err != nil {
					t.Fatal(err)
				}
				return st.bytes.Load()
			}
			fi, err := os.Stat(c.paths[0])
			if err != nil {
				t.Fatal(err)
			}
			solo := run(func(n int) []sampler.Sampler { return []sampler.Sampler{sampler.Global{N: n, Seed: 1}} })
			shared := run(func(n int) []sampler.Sampler {
				g := share.NewGroup(share.Options{Records: n, Seed: 5})
				var out []sampler.Sampler
				for range jobs {
					m, err := g.Join(nil, 0)
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, m)
				}
				return out
			})
			apart := run(func(n int) []sampler.Sampler {
				var out []sampler.Sampler
				for k := range jobs {
					out = append(out, sampler.Global{N: n, Seed: uint64(10 + k)})
				}
				return out
			})
			t.Logf("%s (%d bytes): bytes read for %d epochs: one job %d, %d shared %d (%.2fx one), %d independent %d (%.2fx)",
				c.name, fi.Size(), epochs, solo, jobs, shared, float64(shared)/float64(solo), jobs, apart, float64(apart)/float64(solo))
			if float64(shared) > 1.3*float64(solo) {
				t.Fatalf("%d shared jobs read %d bytes, one job alone %d: they did not share their blocks", jobs, shared, solo)
			}
			if float64(apart) < 2*float64(solo) {
				t.Fatalf("%d independent jobs read %d bytes, one job alone %d: the cache is too large for this test to tell", jobs, apart, solo)
			}
		})
	}
}
