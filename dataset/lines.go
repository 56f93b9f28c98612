package dataset

import (
	"bytes"
	"context"
	"fmt"
	"sort"

	"github.com/riffle-ml/riffle/storage"
)

// Newline-delimited formats (LIBSVM/SVMlight, JSONL, CSV, plain text) share
// one scanner: a record is a line without its '\n', and the offset table
// holds each record's start plus the end of the last one. They differ in
// which lines are records, as their usual readers have it:
//
//   - text: every line, an empty one too (a zero-length record);
//   - jsonl, csv: every line but blank ones (only whitespace), as
//     JSON-lines readers and pandas skip them;
//   - libsvm: every line but blank and comment-only ones ('#' first), as
//     scikit-learn's load_svmlight_file skips them (dump_svmlight_file
//     writes such comments).
//
// CSV differs also in that a newline inside double quotes does not end a
// record, and in an optional header line. A last line without its newline
// is a record, as every reader of these formats takes it.

func init() {
	for _, f := range []struct {
		name string
		ext  []string
	}{
		{"libsvm", []string{".libsvm", ".svm", ".svmlight"}},
		{"jsonl", []string{".jsonl", ".ndjson"}},
		{"csv", []string{".csv"}},
		{"text", []string{".txt"}},
	} {
		name := f.name
		RegisterFormat(Format{Name: name, Extensions: f.ext, Indexed: true,
			OpenPart: func(ctx context.Context, r storage.Reader, opts Options) (Part, error) {
				return openLines(ctx, r, opts, name)
			}})
	}
}

// lineRule says which lines of a format are records.
type lineRule struct {
	quotes   bool // CSV: newlines inside quotes do not end a record
	blank    bool // blank lines are not records
	comments bool // lines whose first non-blank byte is '#' are not records
}

func ruleOf(format string) lineRule {
	switch format {
	case "libsvm":
		return lineRule{blank: true, comments: true}
	case "jsonl":
		return lineRule{blank: true}
	case "csv":
		return lineRule{blank: true, quotes: true}
	}
	return lineRule{}
}

// offsetPart is a file whose records are found through an offset table:
// record i spans offs[i]+head .. offs[i+1]-tail, or to its listed end.
type offsetPart struct {
	t          table
	head, tail int
	inf        Info
}

func (p *offsetPart) Count() int { return max(0, len(p.t.offs)-1) } // a file of no records has no offsets
func (p *offsetPart) Locate(i int) (int64, int) {
	start := p.t.offs[i] + int64(p.head)
	if e, ok := p.t.end(i); ok {
		return start, int(e - start)
	}
	return start, int(p.t.offs[i+1] - int64(p.tail) - start)
}
func (p *offsetPart) Bytes() int64 {
	var n int64
	for i := range p.Count() {
		_, l := p.Locate(i)
		n += int64(l)
	}
	return n
}
func (p *offsetPart) Info() Info { return p.inf }

// records are the records a byte range touches.
func (p *offsetPart) records(off, n int64) (lo, hi int) {
	offs := p.t.offs
	lo = sort.Search(len(offs)-1, func(i int) bool { return offs[i+1] > off })
	hi = sort.Search(len(offs)-1, func(i int) bool { return offs[i] >= off+n })
	return lo, max(lo, hi)
}

// lineScanner finds the records of newline-delimited data in a stream of
// chunks: starts of record lines, and the ends of records not followed
// directly by the next one.
type lineScanner struct {
	rule    lineRule
	starts  []int64
	ends    []recordEnd
	inQuote bool

	lineStart int64 // where the current line starts
	known     bool  // the current line's first non-blank byte has been seen
	first     byte  // and is this
	lastEnd   int64 // the newline ending the last record, -1 for none
}

func newLineScanner(rule lineRule, start int64) *lineScanner {
	return &lineScanner{rule: rule, lineStart: start, lastEnd: -1}
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f' }

// endLine handles the line that ends at end (a newline's offset, or the
// end of the data for a last line without one).
func (s *lineScanner) endLine(end int64) {
	keep := true
	if s.rule.blank && !s.known {
		keep = false
	}
	if s.rule.comments && s.known && s.first == '#' {
		keep = false
	}
	if keep {
		if s.lastEnd >= 0 && s.lastEnd+1 != s.lineStart {
			// Skipped lines lie between the last record and this one.
			s.ends = append(s.ends, recordEnd{record: len(s.starts) - 1, end: s.lastEnd})
		}
		s.starts = append(s.starts, s.lineStart)
		s.lastEnd = end
	}
	s.lineStart, s.known, s.first = end+1, false, 0
}

func (s *lineScanner) feed(off int64, b []byte) {
	for i := 0; i < len(b); {
		if !s.known {
			for i < len(b) && isBlank(b[i]) {
				i++
			}
			if i == len(b) {
				return
			}
			if b[i] != '\n' {
				s.known, s.first = true, b[i]
			}
		}
		j := s.lineEnd(b[i:])
		if j < 0 {
			return
		}
		i += j
		s.endLine(off + int64(i))
		i++
	}
}

// lineEnd returns the index of the newline ending the current line in b,
// or -1 if b ends first; with quotes, newlines inside them do not count.
func (s *lineScanner) lineEnd(b []byte) int {
	if !s.rule.quotes {
		return bytes.IndexByte(b, '\n')
	}
	for i := 0; i < len(b); {
		if s.inQuote {
			j := bytes.IndexByte(b[i:], '"')
			if j < 0 {
				return -1
			}
			i += j + 1
			s.inQuote = false // a doubled quote "" re-enters at once below
			continue
		}
		q := bytes.IndexByte(b[i:], '"')
		n := bytes.IndexByte(b[i:], '\n')
		switch {
		case n >= 0 && (q < 0 || n < q):
			return i + n
		case q >= 0:
			i += q + 1
			s.inQuote = true
		default:
			return -1
		}
	}
	return -1
}

// finish ends the scan of data that ends at size: a last line without its
// newline is a record. It returns the table.
func (s *lineScanner) finish(size int64) table {
	end := s.lastEnd + 1
	if s.lineStart < size {
		s.endLine(size)
		if s.lastEnd == size {
			// The last record has no newline: it ends at the data's end.
			s.ends = append(s.ends, recordEnd{record: len(s.starts) - 1, end: size})
			end = size
		} else {
			end = s.lastEnd + 1
		}
	}
	if len(s.starts) == 0 {
		return table{offs: []int64{min(s.lineStart, size)}}
	}
	return table{offs: append(s.starts, end), ends: s.ends}
}

// ScanLines returns the offset table of newline-delimited data starting at
// start, under format's rule of which lines are records, and whether the
// scan ended inside an open quote. It is the heart of the index build,
// exported for its fuzz test and benchmark.
func ScanLines(ctx context.Context, r storage.Reader, start int64, format string, progress func(done, total int64)) (offs []int64, ends map[int]int64, openQuote bool, err error) {
	s := newLineScanner(ruleOf(format), start)
	err = scanSeq(ctx, r, start, progress, func(off int64, b []byte) error {
		s.feed(off, b)
		return nil
	})
	t := s.finish(r.Size())
	ends = map[int]int64{}
	for _, e := range t.ends {
		ends[e.record] = e.end
	}
	return t.offs, ends, s.inQuote, err
}

func openLines(ctx context.Context, f storage.Reader, opts Options, format string) (Part, error) {
	inf := Info{}
	var start int64
	csv := format == "csv"
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
	variant := map[string]uint32{"libsvm": 5, "jsonl": 6, "csv": 2, "text": 1}[format]
	if csv && opts.CSVHeader {
		variant = 3
	}
	t, err := loadOrBuild(ctx, f, variant, opts, shape{min: 1}, func() (table, error) {
		s := newLineScanner(ruleOf(format), start)
		if err := scanSeq(ctx, f, start, opts.Progress, func(off int64, b []byte) error {
			s.feed(off, b)
			return nil
		}); err != nil {
			return table{}, err
		}
		if s.inQuote {
			return table{}, &FormatError{Path: f.Name(), Offset: s.lineStart, Err: fmt.Errorf("CSV record has an unterminated quote: %w", ErrCorrupt)}
		}
		return s.finish(f.Size()), nil
	})
	if err != nil {
		return nil, err
	}
	return &offsetPart{t: t, tail: 1, inf: inf}, nil
}
