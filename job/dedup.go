package job

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/RoaringBitmap/roaring/v2"
	"github.com/zeebo/xxh3"

	"github.com/riffle-ml/riffle/dataset"
)

// dedup keeps, of the records of in (every record if nil), the first by
// id of each set whose bytes are equal. Equal means an equal 128-bit hash
// (xxh3) of the bytes: a collision among 10^9 records has odds under
// 10^-20. The hashes come from one sequential read of the dataset, kept
// beside its index, so a later job on the same files reads nothing.
func (env *Env) dedup(ctx context.Context, ds dataset.Dataset, in *roaring.Bitmap) (*roaring.Bitmap, error) {
	if _, rows := ds.(dataset.Rows); rows {
		return nil, specErr("dedup on a dataset of rows (%s): its rows have no bytes of their own (yet)", ds.Info().Format)
	}
	hashes, err := env.recordHashes(ctx, ds)
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

const hashesMagic = "RFHASH1\x00"

// recordHashes is every record's hash, from the sidecar if it is there
// and of these files' versions, else read and saved.
func (env *Env) recordHashes(ctx context.Context, ds dataset.Dataset) ([]xxh3.Uint128, error) {
	inf := ds.Info()
	k := fnv.New64a()
	fmt.Fprintf(k, "%s|%d|%d|%d|%q|%q", inf.Format, inf.RecordSize, ds.Len(), inf.Bytes, inf.Paths, inf.Versions)
	side := filepath.Join(dataset.CacheDir(env.opts.IndexDir), fmt.Sprintf("%016x.rfhash", k.Sum64()))
	if b, err := os.ReadFile(side); err == nil && len(b) == len(hashesMagic)+16*ds.Len() && bytes.HasPrefix(b, []byte(hashesMagic)) {
		b = b[len(hashesMagic):]
		out := make([]xxh3.Uint128, ds.Len())
		for i := range out {
			out[i] = xxh3.Uint128{Hi: binary.LittleEndian.Uint64(b[16*i:]), Lo: binary.LittleEndian.Uint64(b[16*i+8:])}
		}
		return out, nil
	}
	start := time.Now()
	out, err := hashRecords(ctx, ds)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(hashesMagic)+16*len(out))
	b = append(b, hashesMagic...)
	for _, h := range out {
		b = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(b, h.Hi), h.Lo)
	}
	if err := os.MkdirAll(filepath.Dir(side), 0o755); err == nil {
		tmp := side + ".tmp"
		if err = os.WriteFile(tmp, b, 0o644); err == nil {
			err = os.Rename(tmp, side)
		}
		if err != nil {
			slog.Warn("record hashes not kept", "path", side, "err", err)
		}
	}
	slog.Info("hashed records for dedup", "records", len(out), "bytes", inf.Bytes, "took", time.Since(start))
	return out, nil
}

// hashRecords reads every record once, each object's in offset order,
// in runs of up to 8 MiB.
func hashRecords(ctx context.Context, ds dataset.Dataset) ([]xxh3.Uint128, error) {
	const run = 8 << 20
	out := make([]xxh3.Uint128, ds.Len())
	byObj := map[int][]int{}
	for id := range ds.Len() {
		o := ds.Locate(id).Object
		byObj[o] = append(byObj[o], id)
	}
	objs := make([]int, 0, len(byObj))
	for o := range byObj {
		objs = append(objs, o)
	}
	slices.Sort(objs)
	var buf []byte
	for _, o := range objs {
		ids := byObj[o]
		slices.SortFunc(ids, func(a, b int) int { return int(ds.Locate(a).Off - ds.Locate(b).Off) })
		r := ds.Object(o)
		for i := 0; i < len(ids); {
			first := ds.Locate(ids[i])
			end := first.Off + int64(first.Len)
			j := i + 1
			for j < len(ids) {
				l := ds.Locate(ids[j])
				if l.Off+int64(l.Len)-first.Off > run || l.Off < first.Off {
					break
				}
				end = max(end, l.Off+int64(l.Len))
				j++
			}
			buf = slices.Grow(buf[:0], int(end-first.Off))[:end-first.Off]
			if err := r.ReadAt(ctx, buf, first.Off); err != nil {
				return nil, err
			}
			for _, id := range ids[i:j] {
				l := ds.Locate(id)
				out[id] = xxh3.Hash128(buf[l.Off-first.Off : l.Off-first.Off+int64(l.Len)])
			}
			i = j
		}
	}
	return out, nil
}
