package job

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/wire"
)

// A compressed Arrow file's record batches are decompressed whole and kept
// while a window of them is spread over batches: the default window is cut
// so that it fits half the unpacked budget, else each batch would be
// decompressed again for each batch that misses it.
func TestDefaultWindowFitsUnpackedBlocks(t *testing.T) {
	const rows = 400_000 // 3.2 MB of int64 per record batch, decompressed
	path := filepath.Join(t.TempDir(), "big.feather")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := arrow.NewSchema([]arrow.Field{{Name: "x", Type: arrow.PrimitiveTypes.Int64}}, nil)
	w, err := ipc.NewFileWriter(f, ipc.WithSchema(sc), ipc.WithLZ4())
	if err != nil {
		t.Fatal(err)
	}
	b := array.NewInt64Builder(memory.NewGoAllocator())
	for range 3 {
		for i := range rows {
			b.Append(int64(i))
		}
		arr := b.NewArray()
		rec := array.NewRecord(sc, []arrow.Array{arr}, rows)
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
		arr.Release()
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	env, err := NewEnv(EnvOptions{IndexDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	j := openJob(t, env, &wire.JobSpec{Paths: []string{path}, BatchSize: 256, Shuffle: true, Epochs: 1})
	defer j.Close()
	blk, ok := j.smp.(*sampler.Block)
	if !ok {
		t.Fatalf("order %T, want the block order over record batches", j.smp)
	}
	bb := j.src.ds.(dataset.BlockSizer).BlockBytes()
	if bb < rows*8 || int64(blk.Window)*bb > dataset.UnpackedBudget/2 || blk.Window < 1 {
		t.Fatalf("window %d of blocks of %d bytes: want the most that fit %d bytes", blk.Window, bb, dataset.UnpackedBudget/2)
	}
	if int64(blk.Window+1)*bb <= dataset.UnpackedBudget/2 && blk.Window < order.DefaultPageWindow {
		t.Fatalf("window %d: one more block of %d bytes still fits", blk.Window, bb)
	}
}
