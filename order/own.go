package order

import (
	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// DefaultPageWindow is the block window of a dataset's own blocks.
const DefaultPageWindow = 16

// ownOrder is cfg's order over ds's records, or over its subset (of ds's
// ids) if not nil: the order of the subset's positions, naming its ids,
// with ds's own blocks cut to the subset's.
func ownOrder(cfg sampler.Config, ds dataset.Dataset, subset *roaring.Bitmap) (sampler.Sampler, error) {
	if subset == nil {
		smp, _, err := cfg.Build(ds.Len(), dataset.Locator(ds))
		return smp, err
	}
	ids := subset.ToArray()
	if len(cfg.Bounds) > 0 {
		cfg.Bounds = subsetBounds(cfg.Bounds, ids)
	}
	base, _, err := cfg.Build(len(ids), func(i int) (int, int64, int) {
		l := ds.Locate(int(ids[i]))
		return l.Object, l.Off, l.Len
	})
	if err != nil {
		return nil, err
	}
	return &subsetSampler{base: base, ids: ids}, nil
}

// ownBlocks fits cfg to ds: its record size and device block, and, for a
// dataset with blocks of its own (Parquet pages), a block order over them
// unless a job asks for another order. By default the rows of 16 blocks
// are spread over 16 batches, so a batch mixes 16 pages while each page
// is still read and unpacked once.
func ownBlocks(cfg sampler.Config, ds dataset.Dataset) sampler.Config {
	cfg.RecordSize = ds.Info().RecordSize
	cfg.Align = storage.HintsOf(ds.Object(0)).BlockSize
	if b, ok := ds.(dataset.Blocker); ok && cfg.BlockSize == 0 && (cfg.Kind == "" || cfg.Kind == "block") {
		cfg.Kind, cfg.Bounds = "block", b.Blocks()
		if cfg.Window == 0 {
			cfg.Window = DefaultPageWindow
			if bs, ok := ds.(dataset.BlockSizer); ok && bs.BlockBytes() > 0 {
				// The window's blocks stay unpacked while its batches take
				// their rows: at most half the unpacked budget, or each is
				// unpacked again for every batch that misses it (a Feather
				// file's 64K-row batches, 6 MiB each decompressed: window
				// 16 read 351 MB/s where window 4 read 20).
				cfg.Window = int(min(int64(DefaultPageWindow), max(1, dataset.UnpackedBudget/2/bs.BlockBytes())))
			}
		}
	}
	return cfg
}

// subsetBounds are a dataset's own blocks (bounds: each block's first id,
// and the records at the end) over the positions of its subset ids
// (sorted): a block of the subset is its ids in one of the dataset's, so
// a page is still read once for all of its rows the subset keeps.
func subsetBounds(bounds []int, ids []uint32) []int {
	out := []int{0}
	b := 0
	for i, id := range ids {
		for b+1 < len(bounds) && int(id) >= bounds[b+1] {
			b++
			if i > out[len(out)-1] {
				out = append(out, i)
			}
		}
	}
	if len(ids) > out[len(out)-1] {
		out = append(out, len(ids))
	}
	return out
}

// subsetSampler is a sampler over a subset of records: base orders
// positions 0..|ids|-1, which name ids.
type subsetSampler struct {
	base sampler.Sampler
	ids  []uint32
}

func (s *subsetSampler) Len() int { return s.base.Len() }
func (s *subsetSampler) Fill(epoch, pos int, dst []int) int {
	n := s.base.Fill(epoch, pos, dst)
	for i := range n {
		dst[i] = int(s.ids[dst[i]])
	}
	return n
}
