package dataset

import (
	"context"
	"testing"

	"github.com/apache/arrow-go/v18/parquet/compress"
)

// A Parquet index payload that does not fit its file is refused, each
// bound by its own error: counts of row groups and columns, pages within
// the file and in row order, every page's row starts (as many as its rows
// and one, in order), the pages' rows adding up to their row group's,
// the dictionary page within the file, and the payload whole words read
// to their end. The payloads are the writer's, of an index made wrong.
func TestParquetIndexBounds(t *testing.T) {
	ctx := context.Background()
	r := memReader{parquetSample(t, compress.Codecs.Snappy)}
	size := r.Size()
	meta, cols, err := parquetMeta(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(wordCases[*pqFile](), []indexCase[*pqFile]{
		{"a row group fewer", func(f *pqFile) { f.chunks = f.chunks[:1] }, nil, "index of 1 row groups, the file has 2"},
		{"a column fewer", func(f *pqFile) { f.chunks[1] = f.chunks[1][:1] }, nil, "index of 1 columns, the file has 2"},
		{"a page past the end", func(f *pqFile) { f.chunks[0][0].pages[0].off = size }, nil, "page outside the file"},
		{"a page longer than the file", func(f *pqFile) { f.chunks[0][1].pages[0].length = size }, nil, "page outside the file"},
		{"a page at a negative offset", func(f *pqFile) { f.chunks[1][0].pages[0].off = -1 }, nil, "page outside the file"},
		{"a page out of row order", func(f *pqFile) { f.chunks[0][0].pages[0].first = 1 }, nil, "page outside the file or out of order"},
		{"a page of rows below none", func(f *pqFile) { f.chunks[0][0].pages[0].rows = -1 }, nil, "page outside the file or out of order"},
		{"a page without its starts", func(f *pqFile) { f.chunks[0][0].pages[0].starts = nil }, nil, "page with 0 start columns, the column has 1"},
		{"starts of a row fewer", func(f *pqFile) {
			p := &f.chunks[0][0].pages[0]
			p.starts[0] = p.starts[0][:len(p.starts[0])-1]
		}, nil, "page starts of 1 rows, the page has 2"},
		{"starts that go back", func(f *pqFile) { f.chunks[0][0].pages[0].starts[0][2] = -1 }, nil, "index run out of order"},
		{"pages short of their row group's rows", func(f *pqFile) {
			p := &f.chunks[0][0].pages[0]
			p.rows, p.starts[0] = 1, p.starts[0][:2]
		}, nil, "pages hold 1 rows, the row group 2"},
		{"a dictionary page past the end", func(f *pqFile) { f.chunks[0][0].dictOff, f.chunks[0][0].dictLen = size, 1 }, nil, "dictionary page outside the file"},
	}...) {
		f := &pqFile{r: r, meta: meta}
		if err := f.scan(ctx, cols, Options{}); err != nil {
			t.Fatal(err)
		}
		c.check(t, (&pqFile{r: r, meta: meta}).readIndex(c.written(f, f.writeIndex), cols))
	}
}
