package dataset

import (
	"context"
	"fmt"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
)

// pageKey names a page group in the cache of unpacked pages.
type pageKey struct{ file, rg, col, page int }

// cacheKey is k as the cache names it, exactly: each number fits 32 bits.
func (k pageKey) cacheKey() cache.Key {
	return cache.Key{Space: uint64(uint32(k.file))<<32 | uint64(uint32(k.rg)), ID: int64(uint32(k.col))<<32 | int64(uint32(k.page))}
}

// unpackedPage is a page group decoded and laid out as a one-column
// record batch: its body, and where its buffers and rows are in it.
type unpackedPage struct {
	src  *columnar.Source
	body []byte
}

// pqRows is one batch of Parquet rows. Each page group it needs is one of
// three: unpacked in the cache already; being read and unpacked by
// another batch (it waits for that one); or its own to read and unpack (it
// claimed it, and publishes the result for the others).
type pqRows struct {
	d     *parquetSet
	n     int
	keys  [][]pageKey // [slot][projected column]
	rows  [][]int64   // [slot][projected column]: the row in its page
	pages *holds[pageKey, *unpackedPage]
	msg   *columnar.BatchMessage
	done  bool
}

func (d *parquetSet) BatchOf(ids []int) (RowBatch, error) {
	b := &pqRows{d: d, n: len(ids), keys: make([][]pageKey, len(ids)), rows: make([][]int64, len(ids)),
		pages: newHolds[pageKey, *unpackedPage](d.pages)}
	refs := make([]columnar.RowRef, len(ids))
	for slot, id := range ids {
		k, rg, row := d.where(id)
		b.keys[slot] = make([]pageKey, len(d.cols))
		b.rows[slot] = make([]int64, len(d.cols))
		refs[slot].Cols = make([]columnar.ColRef, len(d.cols))
		for i, c := range d.cols {
			pi, p := d.page(k, rg, c, row)
			key := pageKey{k, rg, c, pi}
			b.keys[slot][i], b.rows[slot][i] = key, row-p.first
			b.pages.add(key, key.cacheKey())
			refs[slot].Cols[i] = columnar.ColRef{S: p.skel, Row: row - p.first}
		}
	}
	var err error
	if b.msg, err = d.lay.Message(refs); err != nil {
		b.Release()
		return nil, err
	}
	return b, nil
}

func (b *pqRows) Size() int                     { return b.msg.Size }
func (b *pqRows) Buffers() []columnar.BufferLoc { return b.msg.Buffers }

// Cells are a row's dictionary page and page group in each column, for
// the pages this batch claimed; none for the others.
func (b *pqRows) Cells(slot int, dst []Loc) []Loc {
	for _, key := range b.keys[slot] {
		if !b.pages.claimed(key) {
			dst = append(dst, Loc{}, Loc{})
			continue
		}
		ch := b.d.files[key.file].chunks[key.rg][key.col]
		p := &ch.pages[key.page]
		dst = append(dst, Loc{Object: key.file, Off: ch.dictOff, Len: int(ch.dictLen)}, Loc{Object: key.file, Off: p.off, Len: int(p.length)})
	}
	return dst
}

// unpack decodes page group key from its dictionary and page bytes and
// lays it out.
func (b *pqRows) unpack(key pageKey, dict, pages []byte) (*unpackedPage, int, error) {
	d := b.d
	ch := d.files[key.file].chunks[key.rg][key.col]
	p := &ch.pages[key.page]
	c := d.all[key.col]
	bad := func(err error) error {
		return &FormatError{Path: d.files[key.file].r.Name(), Offset: p.off, Err: fmt.Errorf("column %q page: %v: %w", c.name, err, ErrCorrupt)}
	}
	// The pages as read now, not as indexed: their CRCs, where written
	// (a column of several leaves is a row group's span of chunks, not
	// pages back to back).
	if c.group == nil {
		at, err := checkPages(dict, ch.dictOff)
		if err == nil {
			at, err = checkPages(pages, p.off)
		}
		if err != nil {
			return nil, 0, &FormatError{Path: d.files[key.file].r.Name(), Offset: at, Err: fmt.Errorf("column %q page: %v: %w", c.name, err, ErrCorrupt)}
		}
	}
	var arr arrow.Array
	var err error
	if c.group != nil {
		arr, err = decodeGroup(c, d.files[key.file].meta.RowGroup(key.rg), pages, p.off)
	} else {
		arr, err = decodePage(c, ch.codec, dict, pages, p.values)
	}
	if err != nil {
		return nil, 0, bad(err)
	}
	src, body, err := pageSource(c, arr)
	arr.Release()
	if err == nil && src.Meta.Rows != p.rows {
		err = fmt.Errorf("%d rows, the index says %d", src.Meta.Rows, p.rows)
	}
	if err != nil {
		return nil, 0, bad(err)
	}
	return &unpackedPage{src: src, body: body}, len(body), nil
}

// readUnpacked reads and unpacks a page group itself: when the batch
// that claimed it gave up before unpacking it.
func (b *pqRows) readUnpacked(ctx context.Context, key pageKey) (*unpackedPage, error) {
	f := b.d.files[key.file]
	ch := f.chunks[key.rg][key.col]
	p := &ch.pages[key.page]
	dict := make([]byte, ch.dictLen)
	pages := make([]byte, p.length)
	if err := f.r.ReadAt(ctx, dict, ch.dictOff); err != nil {
		return nil, err
	}
	if err := f.r.ReadAt(ctx, pages, p.off); err != nil {
		return nil, err
	}
	u, _, err := b.unpack(key, dict, pages)
	return u, err
}

func (b *pqRows) Assemble(ctx context.Context, cell func(slot, k int) []byte, out []byte) (int, error) {
	d := b.d
	have, valueCell, err := b.open(ctx, cell)
	defer b.pages.unpin()
	if err != nil {
		return 0, err
	}
	refs := make([]columnar.RowRef, b.n)
	for slot := range refs {
		refs[slot].Cols = make([]columnar.ColRef, len(d.cols))
		for i, key := range b.keys[slot] {
			refs[slot].Cols[i] = columnar.ColRef{S: have[key].src, Row: b.rows[slot][i]}
		}
	}
	n, err := b.msg.Assemble(refs, valueCell, out)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", describe(d.inf.Paths), err)
	}
	return n, nil
}

// open unpacks each page group this batch claimed, once, and publishes
// it; waits for those other batches unpack (or unpacks them here); and
// returns them with each row's cells as they lie in them. The caller
// unpins the pages once it has used them.
func (b *pqRows) open(ctx context.Context, cell func(slot, k int) []byte) (map[pageKey]*unpackedPage, func(slot, k int) []byte, error) {
	d := b.d
	b.done = true
	published := map[pageKey]bool{}
	for slot, keys := range b.keys {
		for i, key := range keys {
			if !b.pages.claimed(key) || published[key] {
				continue
			}
			published[key] = true
			u, _, err := b.unpack(key, cell(slot, 2*i), cell(slot, 2*i+1))
			b.pages.publish(key, u, bodyOf(u), err)
			if err != nil {
				b.pages.abandon()
				return nil, nil, err
			}
		}
	}
	have, err := b.pages.await(ctx, func(key pageKey) (*unpackedPage, error) { return b.readUnpacked(ctx, key) })
	if err != nil {
		return nil, nil, err
	}
	bases := make([]int, len(d.cols)+1)
	for i, c := range d.cols {
		bases[i+1] = bases[i] + d.all[c].lay.NumCells
	}
	var ranges [][]columnar.Range // [column] for the current slot
	cur := -1
	return have, func(slot, k int) []byte {
		if slot != cur {
			cur = slot
			ranges = make([][]columnar.Range, len(d.cols))
			for i, c := range d.cols {
				ranges[i] = d.all[c].lay.Cells(have[b.keys[slot][i]].src, int(b.rows[slot][i]), nil)
			}
		}
		i := sort.SearchInts(bases[1:], k+1)
		r := ranges[i][k-bases[i]]
		return have[b.keys[slot][i]].body[r.Off : r.Off+r.Len]
	}, nil
}

// bodyOf is an unpacked page group's bytes, or none.
func bodyOf(u *unpackedPage) []byte {
	if u == nil {
		return nil
	}
	return u.body
}

// Release gives up the batch's claims if it is not to be assembled.
func (b *pqRows) Release() {
	if !b.done {
		b.done = true
		b.pages.abandon()
		b.pages.unpin()
	}
}

func (b *pqRows) Table() (nodes [][2]int64, buffers [][2]int64, body int) { return tableOf(b.msg) }
