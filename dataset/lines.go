package dataset

import (
	"bytes"
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/storage"
)

// Newline-delimited formats (LIBSVM/SVMlight, JSONL, CSV, plain text) share
// one scanner: a record is a line without its '\n', and the offset table
// holds each line's start plus the end of the last one. CSV differs only in
// that a newline inside double quotes does not end a record, and in an
// optional header line.

// offsetPart is a file whose records are found through an offset table:
// record i spans offs[i]+head .. offs[i+1]-tail.
type offsetPart struct {
	offs       []int64
	head, tail int
	inf        Info
}

func (p *offsetPart) count() int { return len(p.offs) - 1 }
func (p *offsetPart) locate(i int) (int64, int) {
	return p.offs[i] + int64(p.head), int(p.offs[i+1]-p.offs[i]) - p.head - p.tail
}
func (p *offsetPart) bytes() int64 {
	return p.offs[len(p.offs)-1] - p.offs[0] - int64((p.head+p.tail)*p.count())
}
func (p *offsetPart) info() Info { return p.inf }

// lineScanner finds line starts in a stream of chunks.
type lineScanner struct {
	offs    []int64
	quotes  bool // CSV: newlines inside quotes do not end a record
	inQuote bool
}

func (s *lineScanner) feed(off int64, b []byte) {
	if !s.quotes {
		for i := 0; ; {
			j := bytes.IndexByte(b[i:], '\n')
			if j < 0 {
				return
			}
			i += j + 1
			s.offs = append(s.offs, off+int64(i))
		}
	}
	for i := 0; i < len(b); {
		if s.inQuote {
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				return
			}
			i += j + 1
			s.inQuote = false // a doubled quote "" re-enters at once below
			continue
		}
		q := bytes.IndexByte(b[i:], '"')
		n := bytes.IndexByte(b[i:], '\n')
		switch {
		case n >= 0 && (q < 0 || n < q):
			i += n + 1
			s.offs = append(s.offs, off+int64(i))
		case q >= 0:
			i += q + 1
			s.inQuote = true
		default:
			return
		}
	}
}

// ScanLines returns the offset table of newline-delimited data starting at
// start: line starts plus the end of the last complete line, and whether the
// scan ended inside an open quote. It is the heart of the index build and
// exported for its fuzz test and benchmark.
func ScanLines(ctx context.Context, r storage.Reader, start int64, quotes bool, progress func(done, total int64)) (offs []int64, openQuote bool, err error) {
	s := &lineScanner{offs: make([]int64, 1, 1024), quotes: quotes}
	s.offs[0] = start
	err = scanSeq(ctx, r, start, progress, func(off int64, b []byte) error {
		s.feed(off, b)
		return nil
	})
	return s.offs, s.inQuote, err
}

func openLines(ctx context.Context, f *storage.File, opts Options, format string, csv bool) (part, error) {
	inf := Info{}
	var start int64
	if csv && opts.CSVHeader {
		n := min(f.Size(), 1<<20)
		b := make([]byte, n)
		if err := f.ReadAt(ctx, b, 0); err != nil {
			return nil, err
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return nil, &FormatError{Path: f.Name(), Offset: 0, Err: fmt.Errorf("CSV header line has no newline in its first %d bytes: %w", n, ErrPartial)}
		}
		inf.Header = string(bytes.TrimRight(b[:i], "\r"))
		start = int64(i + 1)
	}
	variant := uint32(1)
	if csv {
		variant = 2
		if opts.CSVHeader {
			variant = 3
		}
	}
	if opts.DropPartialTail {
		variant |= 1 << 8
	}
	offs, err := loadOrBuild(f.Name(), variant, opts, func() ([]int64, error) {
		offs, open, err := ScanLines(ctx, f, start, csv, opts.Progress)
		if err != nil {
			return nil, err
		}
		last := offs[len(offs)-1]
		if open {
			return nil, &FormatError{Path: f.Name(), Offset: last, Err: fmt.Errorf("CSV record has an unterminated quote: %w", ErrCorrupt)}
		}
		if last < f.Size() && !opts.DropPartialTail {
			return nil, &FormatError{Path: f.Name(), Offset: last,
				Err: fmt.Errorf("last line (%d bytes) has no newline, the file looks truncated (DropPartialTail drops it): %w", f.Size()-last, ErrPartial)}
		}
		return offs, nil
	})
	if err != nil {
		return nil, err
	}
	return &offsetPart{offs: offs, tail: 1, inf: inf}, nil
}
