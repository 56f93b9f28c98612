package dataset

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/storage"
)

func FuzzParseNpyHeader(f *testing.F) {
	hdr := func(d string) []byte {
		b := []byte("\x93NUMPY\x01\x00")
		b = binary.LittleEndian.AppendUint16(b, uint16(len(d)))
		return append(b, d...)
	}
	f.Add(hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), }\n"))
	f.Add(hdr("{'descr': '|u1', 'fortran_order': True, 'shape': (7,), }"))
	f.Add(hdr("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }"))
	f.Add(hdr("{'descr': '<U5', 'shape': (), 'fortran_order': False}"))
	f.Add([]byte("\x93NUMPY\x02\x00\x10\x00\x00\x00{'a': 1}"))
	f.Add(hdr("{'descr': [('id', '<i8'), ('name', '<U5'), ('pos', '<f4', (2,)), ('', '|V4'), ('nested', [('a', '|u1'), ('', '|V7'), ('b', '<f8')])], 'fortran_order': False, 'shape': (4,), }"))
	f.Add(hdr("{'descr': [(('title', 'x'), '<M8[ns]'), ('y', '>f2', 3)], 'fortran_order': False, 'shape': (9,), }"))
	v3 := []byte("\x93NUMPY\x03\x00")
	d3 := "{'descr': [('名前', '<i4')], 'fortran_order': False, 'shape': (3,), }"
	v3 = binary.LittleEndian.AppendUint32(v3, uint32(len(d3)))
	f.Add(append(v3, d3...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseNpyHeader(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error %v is neither ErrCorrupt nor ErrUnsupported", err)
			}
			return
		}
		if h.DataOffset > int64(len(b)) {
			return // needs more bytes
		}
		if h.ItemSize <= 0 {
			t.Fatalf("accepted item size %d", h.ItemSize)
		}
		for _, d := range h.Shape {
			if d < 0 {
				t.Fatalf("accepted shape %v", h.Shape)
			}
		}
	})
}

// Scanning in chunks finds the same records as scanning all at once, and
// they are what splitting the bytes by hand under each format's rule gives.
func FuzzLineScanner(f *testing.F) {
	f.Add([]byte("a\nbb\n\nccc\n"), uint8(3), uint8(0))
	f.Add([]byte("1,\"x\ny\"\n2,3\n\"\"\"\"\n"), uint8(2), uint8(2))
	f.Add([]byte("# c\n1 1:1\n \n\t\n2 2:2"), uint8(4), uint8(3))
	formats := []string{"text", "jsonl", "csv", "libsvm"}
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8, format uint8) {
		rule := ruleOf(formats[int(format)%len(formats)])
		whole := newLineScanner(rule, 0)
		whole.feed(0, b)
		wt := whole.finish(int64(len(b)))
		parts := newLineScanner(rule, 0)
		c := int(chunk%16) + 1
		for off := 0; off < len(b); off += c {
			parts.feed(int64(off), b[off:min(off+c, len(b))])
		}
		pt := parts.finish(int64(len(b)))
		if !slices.Equal(wt.offs, pt.offs) || !slices.Equal(wt.ends, pt.ends) || whole.inQuote != parts.inQuote {
			t.Fatalf("chunked scan %v %v differs from whole %v %v", pt.offs, pt.ends, wt.offs, wt.ends)
		}
		if rule.quotes {
			return
		}
		p := &offsetPart{t: wt, tail: 1}
		var got []string
		for i := range p.Count() {
			off, n := p.Locate(i)
			got = append(got, string(b[off:off+int64(n)]))
		}
		var want []string
		lines := strings.Split(string(b), "\n")
		if strings.HasSuffix(string(b), "\n") || len(b) == 0 {
			lines = lines[:len(lines)-1]
		}
		for _, l := range lines {
			trimmed := strings.TrimLeft(l, " \t\r\v\f")
			if rule.blank && trimmed == "" || rule.comments && strings.HasPrefix(trimmed, "#") {
				continue
			}
			want = append(want, l)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("records %q, want %q", got, want)
		}
	})
}

// The TFRecord scanner finds the same frames however the file is chunked,
// and never accepts a frame whose length CRC is wrong.
func FuzzTFScanner(f *testing.F) {
	good := AppendTFRecord(AppendTFRecord(nil, []byte("hello")), []byte("world!!"))
	f.Add(good, uint8(5))
	f.Add(good[:20], uint8(1))
	f.Add([]byte("garbage that is not a tfrecord"), uint8(7))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		run := func(c int) ([]int64, int64, error) {
			s := &tfScanner{path: "fuzz"}
			for off := 0; off < len(b); off += c {
				if err := s.feed(int64(off), b[off:min(off+c, len(b))]); err != nil {
					return nil, 0, err
				}
			}
			return s.offs, s.next, nil
		}
		whole, wn, werr := run(max(1, len(b)))
		parts, pn, perr := run(int(chunk%32) + 1)
		if (werr == nil) != (perr == nil) {
			t.Fatalf("whole scan error %v, chunked %v", werr, perr)
		}
		if werr != nil {
			var fe *FormatError
			if !errors.As(werr, &fe) {
				t.Fatalf("error %v is not a FormatError", werr)
			}
			return
		}
		if !slices.Equal(whole, parts) || wn != pn {
			t.Fatalf("chunked frames %v/%d differ from whole %v/%d", parts, pn, whole, wn)
		}
		for _, o := range whole {
			if o+tfHead <= int64(len(b)) && binary.LittleEndian.Uint32(b[o+8:]) != maskedCRC(b[o:o+8]) {
				t.Fatalf("frame at %d accepted with a bad length CRC", o)
			}
		}
	})
}

func FuzzReadIndex(f *testing.F) {
	key := indexKey{variant: 1, size: 100, version: 5}
	f.Add(writeIndex(key, table{offs: []int64{0, 16, 52, 100}}))
	f.Add(writeIndex(key, table{offs: []int64{0, 16, 52, 100}, ends: []recordEnd{{1, 30}, {2, 100}}}))
	f.Add(writeIndex(key, table{offs: []int64{0, 16, 16, 100}})) // a record of no frame
	f.Add(writeIndex(key, table{offs: []int64{0, 18, 52, 100}})) // one off its alignment
	f.Add(writeIndex(key, table{offs: []int64{0}}))
	f.Add([]byte(indexMagic + "short"))
	f.Fuzz(func(t *testing.T, b []byte) {
		sh := shape{head: 12, min: 16, align: 4}
		tb, err := readIndex("fuzz.ridx", b, key, sh)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Path != "fuzz.ridx" {
				t.Fatalf("error %v does not name the index", err)
			}
			return
		}
		offs := tb.offs
		for i := 1; i < len(offs); i++ {
			if offs[i] < offs[i-1] || offs[i] > key.size || offs[i-1]%sh.align != 0 {
				t.Fatalf("accepted offsets %v", offs)
			}
		}
		for _, e := range tb.ends {
			if e.end < offs[e.record]+sh.head || e.end > offs[e.record+1] {
				t.Fatalf("accepted end %v outside its record", e)
			}
		}
		// Every record lies in the source, of a length not negative.
		p := &offsetPart{t: tb, head: int(sh.head), tail: 4}
		for i := range p.Count() {
			off, n := p.Locate(i)
			if n < 0 || off < 0 || off+int64(n) > key.size {
				t.Fatalf("record %d at %d of %d bytes, in a source of %d", i, off, n, key.size)
			}
		}
	})
}

// memReader is an object in memory, for fuzzing the scanners.
type memReader struct{ b []byte }

var _ storage.Reader = memReader{}

func (m memReader) ReadAt(_ context.Context, p []byte, off int64) error {
	if off < 0 || off > int64(len(m.b)) || int64(len(p)) > int64(len(m.b))-off {
		return io.ErrUnexpectedEOF
	}
	copy(p, m.b[off:])
	return nil
}
func (m memReader) Size() int64          { return int64(len(m.b)) }
func (m memReader) Name() string         { return "fuzz" }
func (m memReader) Close() error         { return nil }
func (m memReader) Version() string      { return "" }
func (m memReader) Hints() storage.Hints { return storage.Hints{} }

// tarOf makes a tar of the given members with archive/tar.
func tarOf(members map[string]string, long bool) []byte {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	names := slices.Sorted(maps.Keys(members))
	for _, n := range names {
		if long {
			n = strings.Repeat("d", 120) + "/" + n
		}
		w.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(members[strings.TrimPrefix(n, strings.Repeat("d", 120)+"/")]))})
		w.Write([]byte(members[strings.TrimPrefix(n, strings.Repeat("d", 120)+"/")]))
	}
	w.Close()
	return buf.Bytes()
}

// A tar of any bytes is an error or a table whose samples lie in the file.
func FuzzTarScan(f *testing.F) {
	f.Add(tarOf(map[string]string{"a.jpg": "xx", "a.cls": "1", "b.jpg": strings.Repeat("y", 600)}, false))
	f.Add(tarOf(map[string]string{"k.txt": "long", "k.json": "{}"}, true))
	f.Add(make([]byte, 1024))
	f.Fuzz(func(t *testing.T, b []byte) {
		tb, err := tarScan(context.Background(), memReader{b}, Options{})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrPartial) {
				t.Fatalf("error %v is neither ErrCorrupt nor ErrPartial", err)
			}
			return
		}
		for i := 1; i < len(tb.offs); i++ {
			if tb.offs[i] < tb.offs[i-1] || tb.offs[i] > int64(len(b)) {
				t.Fatalf("sample %d at %d after %d, file of %d", i, tb.offs[i], tb.offs[i-1], len(b))
			}
		}
		for _, e := range tb.ends {
			if e.end < tb.offs[e.record] || e.end > tb.offs[e.record+1] {
				t.Fatalf("end %d of sample %d outside it", e.end, e.record)
			}
		}
	})
}

// arrowSample is an Arrow file (or stream) of three rows (a string, a
// list and a dictionary column), its batch compressed by codec if not nil.
func arrowSample(tb testing.TB, stream bool, codec ipc.Option) []byte {
	schema := arrow.NewSchema([]arrow.Field{
		{Name: "s", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "l", Type: arrow.ListOf(arrow.PrimitiveTypes.Int16), Nullable: true},
		{Name: "d", Type: &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int8, ValueType: arrow.BinaryTypes.String}},
	}, nil)
	var buf bytes.Buffer
	var w interface {
		Write(arrow.RecordBatch) error
		Close() error
	}
	opts := []ipc.Option{ipc.WithSchema(schema)}
	if codec != nil {
		opts = append(opts, codec)
	}
	if stream {
		w = ipc.NewWriter(&buf, opts...)
	} else {
		w, _ = ipc.NewFileWriter(&buf, opts...)
	}
	rec, _, err := array.RecordFromJSON(memory.NewGoAllocator(), schema,
		strings.NewReader(`[{"s":"ab","l":[1,2],"d":"x"},{"s":null,"l":null,"d":"y"},{"s":"","l":[],"d":"x"}]`))
	if err != nil {
		tb.Fatal(err)
	}
	w.Write(rec)
	w.Close()
	return buf.Bytes()
}

// parquetSample is a Parquet file of four rows (a string and a list
// column) in row groups of two, its pages compressed with codec.
func parquetSample(tb testing.TB, codec compress.Compression) []byte {
	sc := arrow.NewSchema([]arrow.Field{{Name: "s", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "l", Type: arrow.ListOf(arrow.PrimitiveTypes.Int16), Nullable: true}}, nil)
	rec, _, err := array.RecordFromJSON(memory.NewGoAllocator(), sc,
		strings.NewReader(`[{"s":"ab","l":[1,2]},{"s":null,"l":null},{"s":"","l":[]},{"s":"zz","l":[7]}]`))
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := pqarrow.NewFileWriter(sc, &buf, parquet.NewWriterProperties(parquet.WithCompression(codec), parquet.WithMaxRowGroupLength(2)),
		pqarrow.DefaultWriterProps())
	if err != nil {
		tb.Fatal(err)
	}
	w.Write(rec)
	w.Close()
	return buf.Bytes()
}

// An Arrow file of any bytes is an error, or an index whose every row's
// cells lie inside the file and whose rows can be put together; the index
// reads back to itself, byte for byte.
func FuzzArrowFile(f *testing.F) {
	for i, stream := range []bool{false, true, false, true} {
		var codec ipc.Option
		if i >= 2 { // compressed batches, as pyarrow's feather writes them
			codec = []ipc.Option{ipc.WithLZ4(), ipc.WithZstd()}[i-2]
		}
		f.Add(arrowSample(f, stream, codec))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx := context.Background()
		af := &arrowFile{r: memReader{b}}
		at := int64(8)
		if !bytes.HasPrefix(b, arrowMagic) {
			af.stream, at = true, 0
		}
		if af.readSchema(ctx, at) != nil {
			return
		}
		full, _, err := columnar.NewLayout(af.schema, af.sinfo.DictIDs)
		if err != nil || af.scan(ctx, full, at, Options{}) != nil || af.attachDicts(ctx, full) != nil {
			return
		}
		again := &arrowFile{r: af.r}
		if err := again.readIndex(af.writeIndex(), full); err != nil {
			t.Fatalf("the index does not read back: %v", err)
		}
		if !bytes.Equal(again.writeIndex(), af.writeIndex()) {
			t.Fatal("the index read back writes other bytes")
		}
		for i := range af.batches {
			ab := &af.batches[i]
			src := &ab.src
			body := b // where the cells lie: the file, or a batch's decompressed body
			if ab.compressed() {
				var err error
				if body, err = af.readUnpacked(ctx, ab); err != nil {
					t.Fatalf("batch %d decompressed when indexed, not now: %v", i, err)
				}
			}
			var refs []columnar.RowRef
			for r := range min(src.Meta.Rows, 50) {
				for _, c := range full.Cells(src, int(r), nil) {
					if c.Off < 0 || c.Len < 0 || c.Off+c.Len > int64(len(body)) {
						t.Fatalf("batch %d row %d: cell %d+%d outside a body of %d", i, r, c.Off, c.Len, len(body))
					}
				}
				refs = append(refs, columnar.RowRef{S: src, Row: r})
			}
			p, err := full.Message(refs)
			if err != nil || p.Size > 1<<26 {
				continue // a loader's memory bound refuses such a batch
			}
			msg := make([]byte, p.Size)
			p.Assemble(refs, func(slot, k int) []byte {
				c := full.Cells(src, int(refs[slot].Row), nil)[k]
				return body[c.Off : c.Off+c.Len]
			}, msg)
		}
	})
}

// A page header of any bytes is an error or a header whose sizes are not
// negative.
func FuzzParquetPageHeader(f *testing.F) {
	f.Add([]byte{0x15, 0x00, 0x15, 0x80, 0x01, 0x15, 0x80, 0x01, 0x2c, 0x15, 0x14, 0x15, 0x00, 0x15, 0x06, 0x15, 0x06, 0x00, 0x00})
	f.Add([]byte{0x15, 0x04, 0x15, 0x10, 0x15, 0x10, 0x4c, 0x15, 0x04, 0x15, 0x00, 0x00, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parsePageHeader(b)
		if err == nil && (h.compressed < 0 || h.values < 0 || h.headerLen > len(b)) {
			t.Fatalf("accepted %+v from %d bytes", h, len(b))
		}
	})
}

// A Parquet file of any bytes is an error, or an index whose pages lie in
// the file, which reads back to itself, byte for byte.
func FuzzParquetFile(f *testing.F) {
	for _, codec := range []compress.Compression{compress.Codecs.Snappy, compress.Codecs.Uncompressed} {
		f.Add(parquetSample(f, codec))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ctx := context.Background()
		r := memReader{b}
		meta, cols, err := parquetMeta(ctx, r)
		if err != nil {
			return
		}
		pf := &pqFile{r: r, meta: meta}
		if pf.scan(ctx, cols, Options{}) != nil {
			return
		}
		for _, rg := range pf.chunks {
			for _, ch := range rg {
				for _, p := range ch.pages {
					if p.off < 0 || p.off+p.length > int64(len(b)) {
						t.Fatalf("page %d+%d outside a file of %d", p.off, p.length, len(b))
					}
				}
			}
		}
		again := &pqFile{r: r, meta: meta}
		if err := again.readIndex(pf.writeIndex(), cols); err != nil {
			t.Fatalf("the index does not read back: %v", err)
		}
		if !bytes.Equal(again.writeIndex(), pf.writeIndex()) {
			t.Fatal("the index read back writes other bytes")
		}
	})
}

// shardOf writes a shard of records labelled as labels (none if nil),
// with classes, as pack writes one.
func shardOf(recs []string, labels []int64, classes []string) []byte {
	hb, _ := json.Marshal(ShardHeader{Version: 1, Classes: classes, Labels: labels != nil})
	b := binary.LittleEndian.AppendUint32([]byte(ShardMagic), uint32(len(hb)))
	b = append(b, hb...)
	var ib []byte
	for i, r := range recs {
		ib = binary.LittleEndian.AppendUint64(ib, uint64(len(b)))
		ib = binary.LittleEndian.AppendUint32(ib, uint32(len(r)))
		ib = binary.LittleEndian.AppendUint32(ib, crc32.Checksum([]byte(r), castagnoli))
		l := int64(-1)
		if labels != nil {
			l = labels[i]
		}
		ib = binary.LittleEndian.AppendUint64(ib, uint64(l))
		b = append(b, r...)
	}
	foot := binary.LittleEndian.AppendUint64(nil, uint64(len(b)))
	foot = binary.LittleEndian.AppendUint64(foot, uint64(len(recs)))
	foot = binary.LittleEndian.AppendUint32(foot, crc32.Checksum(ib, castagnoli))
	foot = append(foot, 0, 0, 0, 0)
	foot = append(foot, ShardEnd...)
	return append(append(b, ib...), foot...)
}

// A shard of any bytes is an error, or records that lie in it, one after
// another, before its index, whose labels name its classes, each read
// and checked against its CRC without a panic.
func FuzzOpenShard(f *testing.F) {
	f.Add(shardOf([]string{"abc", "", "defgh"}, nil, nil))
	f.Add(shardOf([]string{"cat0", "dog0", "cat1"}, []int64{0, 1, 0}, []string{"cat", "dog"}))
	f.Add(shardOf([]string{"x"}, []int64{7}, []string{"cat", "dog"}))
	f.Add(shardOf(nil, nil, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		pt, err := openShard(context.Background(), memReader{b}, Options{})
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("error %v is not a FormatError", err)
			}
			return
		}
		p := pt.(*shardPart)
		end := int64(0)
		for i := range p.Count() {
			off, n := p.Locate(i)
			if off < end || n < 0 || off+int64(n) > int64(len(b)) {
				t.Fatalf("record %d at %d+%d after %d, in a shard of %d", i, off, n, end, len(b))
			}
			end = off + int64(n)
			if p.hasLabels() && len(p.inf.Classes) > 0 && (p.label(i) < -1 || p.label(i) >= len(p.inf.Classes)) {
				t.Fatalf("record %d's label %d of %d classes", i, p.label(i), len(p.inf.Classes))
			}
			p.Verify(b[off:off+int64(n)], "fuzz", off)
		}
	})
}
