package order

import (
	"context"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/zeebo/xxh3"

	"github.com/riffle-ml/riffle/dataset"
)

// dedup keeps, of the records of in (every record if nil), the first by
// id of each set whose bytes are equal. Equal means an equal 128-bit hash
// (xxh3) of the bytes: a collision among 10^9 records has odds under
// 10^-20. The hashes come from one sequential read of the dataset, kept
// beside its index (dataset.RecordHashes), so a later job on the same
// files reads nothing.
func dedup(ctx context.Context, ds dataset.Dataset, indexDir string, in *roaring.Bitmap) (*roaring.Bitmap, error) {
	if _, rows := ds.(dataset.Rows); rows {
		return nil, specErr("dedup on a dataset of rows (%s): its rows have no bytes of their own (yet)", ds.Info().Format)
	}
	hashes, _, err := dataset.RecordHashes(ctx, ds, indexDir)
	if err != nil {
		return nil, err
	}
	seen := make(map[xxh3.Uint128]struct{}, ds.Len())
	return keep(ds, in, func(id int) bool {
		h := hashes[id]
		if _, dup := seen[h]; dup {
			return false
		}
		seen[h] = struct{}{}
		return true
	}), nil
}
