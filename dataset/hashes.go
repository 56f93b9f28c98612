package dataset

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/riffle-ml/riffle/internal/privdir"
)

const hashesMagic = "RFHASH1\x00"

// RecordHashes is every record's 128-bit hash (xxh3) of its bytes, for
// deduplication: from the sidecar in cacheDir (CacheDir's default if
// empty) if it is there and of these files' versions, else read in one
// pass over the dataset, each object's records in offset order, and
// saved there. fresh says it was read now.
func RecordHashes(ctx context.Context, ds Dataset, cacheDir string) (hashes []xxh3.Uint128, fresh bool, err error) {
	if _, rows := ds.(Rows); rows {
		return nil, false, fmt.Errorf("%s: a dataset of rows (%s) has no bytes per row to hash (yet)", ds.Info().Paths[0], ds.Info().Format)
	}
	inf := ds.Info()
	k := fnv.New64a()
	fmt.Fprintf(k, "%s|%d|%d|%d|%q|%q", inf.Format, inf.RecordSize, ds.Len(), inf.Bytes, inf.Paths, inf.Versions)
	// The sidecar is kept as the indexes of read-only data are, through
	// privdir: in a directory only this user may write (a hash file
	// another user planted would make dedup drop every record but one),
	// or not at all.
	name := fmt.Sprintf("%016x.rfhash", k.Sum64())
	d, err := privdir.Open(CacheDir(cacheDir))
	if err != nil {
		slog.Warn("record hashes not kept", "dir", CacheDir(cacheDir), "err", err)
	} else {
		defer d.Close()
		if b, err := d.ReadFile(name, int64(len(hashesMagic)+16*ds.Len())); err == nil && len(b) == len(hashesMagic)+16*ds.Len() && bytes.HasPrefix(b, []byte(hashesMagic)) {
			b = b[len(hashesMagic):]
			out := make([]xxh3.Uint128, ds.Len())
			for i := range out {
				out[i] = xxh3.Uint128{Hi: binary.LittleEndian.Uint64(b[16*i:]), Lo: binary.LittleEndian.Uint64(b[16*i+8:])}
			}
			return out, false, nil
		}
	}
	start := time.Now()
	out, err := hashRecords(ctx, ds)
	if err != nil {
		return nil, false, err
	}
	if d != nil {
		b := make([]byte, 0, len(hashesMagic)+16*len(out))
		b = append(b, hashesMagic...)
		for _, h := range out {
			b = binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(b, h.Hi), h.Lo)
		}
		if err := d.WriteFile(name, b); err != nil {
			slog.Warn("record hashes not kept", "dir", d.Path(), "err", err)
		}
	}
	slog.Info("hashed records for dedup", "records", len(out), "bytes", inf.Bytes, "took", time.Since(start))
	return out, true, nil
}

// hashRecords reads every record once, each object's in offset order,
// in runs of up to 8 MiB.
func hashRecords(ctx context.Context, ds Dataset) ([]xxh3.Uint128, error) {
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
		byOff := func(a, b int) int { return cmp.Compare(ds.Locate(a).Off, ds.Locate(b).Off) }
		if !slices.IsSortedFunc(ids, byOff) { // ids are in file order in most formats
			slices.SortFunc(ids, byOff)
		}
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
