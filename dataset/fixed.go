package dataset

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/storage"
)

func init() {
	RegisterFormat(Format{Name: "fixed", Extensions: []string{".bin", ".raw", ".dat"}, OpenPart: openFixed})
}

// fixedPart is a file of equal-sized records after a header: record i is at
// header + i*size, so the location generator needs no table (LIRS §4.1).
type fixedPart struct {
	header int64
	size   int
	n      int
	inf    Info
}

func (p *fixedPart) Count() int                { return p.n }
func (p *fixedPart) Locate(i int) (int64, int) { return p.header + int64(i)*int64(p.size), p.size }
func (p *fixedPart) Bytes() int64              { return int64(p.n) * int64(p.size) }
func (p *fixedPart) Info() Info                { return p.inf }

// records are the records a byte range touches.
func (p *fixedPart) records(off, n int64) (lo, hi int) {
	s := int64(p.size)
	lo = int(max(0, (off-p.header)/s))
	hi = int(min(int64(p.n), (off+n-p.header+s-1)/s))
	return lo, max(lo, hi)
}

func openFixed(_ context.Context, f storage.Reader, opts Options) (Part, error) {
	if opts.RecordSize <= 0 {
		return nil, fmt.Errorf("%s: a fixed-size dataset needs a record size (--record-size, record_size=)", f.Name())
	}
	return newFixedPart(f, opts.HeaderBytes, opts.RecordSize, opts.DropPartialTail, Info{RecordSize: opts.RecordSize})
}

func newFixedPart(f storage.Reader, header int64, size int, dropPartial bool, inf Info) (Part, error) {
	if size <= 0 {
		return nil, &FormatError{Path: f.Name(), Offset: header, Err: fmt.Errorf("record size %d: %w", size, ErrCorrupt)}
	}
	body := f.Size() - header
	if body < 0 {
		return nil, &FormatError{Path: f.Name(), Offset: f.Size(), Err: fmt.Errorf("file is shorter than its %d-byte header: %w", header, ErrPartial)}
	}
	n := body / int64(size)
	if rem := body % int64(size); rem != 0 && !dropPartial {
		return nil, &FormatError{Path: f.Name(), Offset: header + n*int64(size),
			Err: fmt.Errorf("%d bytes after %d whole %d-byte records (file size %d is not header %d + a multiple of the record size; --drop-partial or drop_partial=True drops them): %w",
				rem, n, size, f.Size(), header, ErrPartial)}
	}
	return &fixedPart{header: header, size: size, n: int(n), inf: inf}, nil
}
