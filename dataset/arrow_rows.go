package dataset

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
)

// batchKey names a record batch: its file and its index there.
type batchKey struct{ file, batch int }

// cacheKey is k as the unpacked cache names it. The cache belongs to the
// dataset, which read one version of each file.
func (k batchKey) cacheKey() cache.Key {
	return cache.Key{Space: uint64(uint32(k.file)), ID: int64(k.batch)}
}

// unpacked is a compressed record batch's decompressed body.
type unpacked struct{ body []byte }

type arrowRows struct {
	d       *arrowSet
	ids     []int
	batches []batchKey
	refs    []columnar.RowRef
	msg     *columnar.BatchMessage
	// Compressed batches the rows lie in: pinned, and those claimed
	// read (their whole body, as the cells of their first row here) and
	// decompressed by this batch. nil when none is.
	holds *holds[batchKey, *unpacked]
	first map[batchKey]int // the first slot of each claimed batch
	done  bool
}

func (d *arrowSet) BatchOf(ids []int) (RowBatch, error) {
	b := &arrowRows{d: d, ids: ids, refs: make([]columnar.RowRef, len(ids)), batches: make([]batchKey, len(ids))}
	for i, id := range ids {
		k, bi, row := d.row(id)
		ab := &d.files[k].batches[bi]
		b.refs[i], b.batches[i] = columnar.RowRef{S: &ab.src, Row: row}, batchKey{k, bi}
		if ab.compressed() {
			if b.holds == nil {
				b.holds, b.first = newHolds[batchKey, *unpacked](d.unpacked), map[batchKey]int{}
			}
			key := batchKey{k, bi}
			b.holds.add(key, key.cacheKey())
			if _, ok := b.first[key]; !ok && b.holds.claimed(key) {
				b.first[key] = i
			}
		}
	}
	var err error
	if b.msg, err = d.lay.Message(b.refs); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

func (b *arrowRows) Size() int                     { return b.msg.Size }
func (b *arrowRows) Buffers() []columnar.BufferLoc { return b.msg.Buffers }

// Release gives up the batch's claims if it is not to be assembled.
func (b *arrowRows) Release() {
	if !b.done && b.holds != nil {
		b.holds.abandon()
		b.holds.unpin()
	}
	b.done = true
}

// Cells are a row's slice of each buffer; for a row of a compressed
// batch, the batch's whole body in the first cell of the first of its
// rows, if this batch claimed it, and nothing else.
func (b *arrowRows) Cells(slot int, dst []Loc) []Loc {
	key := b.batches[slot]
	ab := &b.d.files[key.file].batches[key.batch]
	if !ab.compressed() {
		return b.d.cells(ab, b.refs[slot].Row, dst, key.file)
	}
	n := b.d.lay.NumCells
	if s, ok := b.first[key]; ok && s == slot {
		dst = append(dst, Loc{Object: key.file, Off: ab.body, Len: int(ab.bodyLen)})
		n--
	}
	for range n {
		dst = append(dst, Loc{})
	}
	return dst
}

func (b *arrowRows) Assemble(ctx context.Context, cell func(slot, k int) []byte, out []byte) (int, error) {
	values, err := b.open(ctx, cell)
	if b.holds != nil {
		defer b.holds.unpin()
	}
	if err != nil {
		return 0, err
	}
	n, err := b.msg.Assemble(b.refs, values, out)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", describe(b.d.inf.Paths), err)
	}
	return n, nil
}

// open unpacks the compressed batches the rows lie in (those this batch
// claimed, or waits for the others) and returns each row's cells as they
// lie: read from the file, or slices of a decompressed body. The caller
// unpins the holds once it has used them.
func (b *arrowRows) open(ctx context.Context, cell func(slot, k int) []byte) (func(slot, k int) []byte, error) {
	b.done = true
	if b.holds == nil {
		return cell, nil
	}
	have, err := b.unpack(ctx, cell)
	if err != nil {
		b.holds.abandon()
		return nil, err
	}
	// A compressed row's cells are slices of its decompressed body.
	var ranges []columnar.Range
	cur := -1
	return func(slot, k int) []byte {
		key := b.batches[slot]
		u, ok := have[key]
		if !ok {
			return cell(slot, k)
		}
		if slot != cur {
			cur, ranges = slot, b.d.lay.Cells(b.refs[slot].S, int(b.refs[slot].Row), ranges[:0])
		}
		r := ranges[k]
		return u.body[r.Off : r.Off+r.Len]
	}, nil
}

// unpack decompresses each compressed batch this batch claimed, once,
// and publishes it; then waits for those other batches decompress.
func (b *arrowRows) unpack(ctx context.Context, cell func(slot, k int) []byte) (map[batchKey]*unpacked, error) {
	d := b.d
	for key, slot := range b.first {
		f := d.files[key.file]
		ab := &f.batches[key.batch]
		body, err := f.unpack(ab, cell(slot, 0))
		u := &unpacked{body: body}
		b.holds.publish(key, u, body, err)
		if err != nil {
			return nil, err
		}
	}
	return b.holds.await(ctx, func(key batchKey) (*unpacked, error) {
		f := d.files[key.file]
		body, err := f.readUnpacked(ctx, &f.batches[key.batch])
		if err != nil {
			return nil, err
		}
		return &unpacked{body: body}, nil
	})
}

func (b *arrowRows) Table() (nodes [][2]int64, buffers [][2]int64, body int) { return tableOf(b.msg) }
