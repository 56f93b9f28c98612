package dataset

import (
	"context"
	"fmt"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/riffle-ml/riffle/columnar"
)

// An Arrow index payload that does not fit its file is refused, each
// bound by its own error: batch bodies within the file, a known codec, a
// compressed batch's buffers as many packed as unpacked, as many runs of
// row starts as the schema has variable-length columns, every batch
// checked against the schema, and the payload whole words read to their
// end. The payloads are the writer's, of an index made wrong.
func TestArrowIndexBounds(t *testing.T) {
	ctx := context.Background()
	for _, codec := range []ipc.Option{nil, ipc.WithZstd()} {
		r := memReader{arrowSample(t, false, codec)}
		size := r.Size()
		open := func() (*arrowFile, *columnar.Layout) {
			f := &arrowFile{r: r}
			if err := f.readSchema(ctx, 8); err != nil {
				t.Fatal(err)
			}
			full, _, err := columnar.NewLayout(f.schema, f.sinfo.DictIDs)
			if err != nil {
				t.Fatal(err)
			}
			return f, full
		}
		cases := append(wordCases[*arrowFile](), []indexCase[*arrowFile]{
			{"a body past the end", func(f *arrowFile) { f.batches[0].body = size }, nil, "batch body outside the file"},
			{"a body longer than the file", func(f *arrowFile) { f.dicts[0].bodyLen = size }, nil, "batch body outside the file"},
			{"a body at a negative offset", func(f *arrowFile) { f.batches[0].body = -8 }, nil, "batch body outside the file"},
			{"rows below none", func(f *arrowFile) { f.batches[0].src.Meta.Rows = -1 }, nil, "batch body outside the file"},
			{"an unknown codec", func(f *arrowFile) { f.batches[0].src.Meta.Codec = 7 }, nil, "index codec 7"},
			{"no starts", func(f *arrowFile) { f.batches[0].src.Starts = nil }, nil, "index keeps 0 start columns, the schema has 2"},
			{"starts past the body", func(f *arrowFile) { f.batches[0].src.Starts[0][3] = 1 << 40 }, nil, "data buffer of 2 bytes"},
			{"a dictionary after the last batch", func(f *arrowFile) { f.dicts[0].before = len(f.batches) + 1 }, nil, "dictionary batch 0 comes before record batch"},
			{"a dictionary before no batch", func(f *arrowFile) { f.dicts[0].before = -1 }, nil, "dictionary batch 0 comes before record batch -1"},
		}...)
		if codec != nil {
			cases = append(cases, []indexCase[*arrowFile]{
				{"a packed buffer fewer", func(f *arrowFile) { f.batches[0].packed = f.batches[0].packed[1:] }, nil, "compressed batch of"},
				{"unpacked to less than nothing", func(f *arrowFile) { f.batches[0].unpacked = -1 }, nil, "compressed batch of"},
			}...)
		}
		for _, c := range cases {
			f, full := open()
			if err := f.scan(ctx, full, 8, Options{}); err != nil {
				t.Fatal(err)
			}
			g, full := open()
			c.name = fmt.Sprintf("%s (compressed %v)", c.name, codec != nil)
			c.check(t, g.readIndex(c.written(f, f.writeIndex), full))
		}
	}
}
