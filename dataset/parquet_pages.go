package dataset

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/compress"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/metadata"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/storage"
)

// readerAt adapts a storage.Reader to what arrow-go's Parquet reader takes.
type readerAt struct {
	ctx context.Context
	r   storage.Reader
	off int64
}

func (a *readerAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= a.r.Size() {
		return 0, io.EOF
	}
	n := min(int64(len(p)), a.r.Size()-off)
	if err := a.r.ReadAt(a.ctx, p[:n], off); err != nil {
		return 0, err
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

func (a *readerAt) Read(p []byte) (int, error) {
	n, err := a.ReadAt(p, a.off)
	a.off += int64(n)
	return n, err
}

func (a *readerAt) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		a.off = off
	case io.SeekCurrent:
		a.off += off
	case io.SeekEnd:
		a.off = a.r.Size() + off
	}
	if a.off < 0 {
		return 0, fmt.Errorf("seek before the start")
	}
	return a.off, nil
}

// pageFile is a Parquet file of one column, one row group and one group
// of pages (with its dictionary page): what arrow-go's reader decodes.
func pageFile(c *pqColumn, codec compress.Compression, dict, pages []byte, values int64) (*file.Reader, error) {
	var b bytes.Buffer
	b.WriteString("PAR1")
	info := metadata.ChunkMetaInfo{NumValues: values, IndexPageOffset: -1, DataPageOffset: 4,
		CompressedSize: int64(len(dict) + len(pages)), UncompressedSize: int64(len(dict) + len(pages))}
	if len(dict) > 0 {
		info.DictPageOffset, info.DataPageOffset = 4, int64(4+len(dict))
		b.Write(dict)
	}
	b.Write(pages)
	props := parquet.NewWriterProperties(parquet.WithCompression(codec), parquet.WithStats(false))
	fmb := metadata.NewFileMetadataBuilder(c.sub, props, c.kv)
	rgb := fmb.AppendRowGroup()
	ccb := rgb.NextColumnChunk()
	if err := ccb.Finish(info, len(dict) > 0, false, metadata.EncodingStats{}); err != nil {
		return nil, err
	}
	rgb.SetNumRows(int(values))
	if err := rgb.Finish(info.CompressedSize, 0); err != nil {
		return nil, err
	}
	return finishFile(&b, fmb)
}

// finishFile ends a one-row-group file made in memory (b holds its magic
// and column chunks): its footer, its length and the magic, and opens it
// for arrow-go's reader.
func finishFile(b *bytes.Buffer, fmb *metadata.FileMetaDataBuilder) (*file.Reader, error) {
	fm, err := fmb.Finish()
	if err != nil {
		return nil, err
	}
	at := b.Len()
	if _, err := fm.WriteTo(b, nil); err != nil {
		return nil, err
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(b.Len()-at))
	b.Write(n[:])
	b.WriteString("PAR1")
	rp := parquet.NewReaderProperties(memory.DefaultAllocator)
	rp.BufferedStreamEnabled = false
	return file.NewParquetReader(bytes.NewReader(b.Bytes()), file.WithReadProps(rp))
}

// decodePage decodes a group of pages into the column's Arrow array.
func decodePage(c *pqColumn, codec compress.Compression, dict, pages []byte, values int64) (arr arrow.Array, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decoding: %v", p)
		}
	}()
	rd, err := pageFile(c, codec, dict, pages, values)
	if err != nil {
		return nil, err
	}
	return readColumn(rd)
}

// readColumn reads a file of one column (a page file or a group file)
// whole, as one array.
func readColumn(rd *file.Reader) (arrow.Array, error) {
	defer rd.Close()
	fr, err := pqarrow.NewFileReader(rd, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		return nil, err
	}
	tab, err := fr.ReadTable(context.Background())
	if err != nil {
		return nil, err
	}
	defer tab.Release()
	chunks := tab.Column(0).Data().Chunks()
	if len(chunks) == 1 {
		chunks[0].Retain()
		return chunks[0], nil
	}
	return array.Concatenate(chunks, memory.DefaultAllocator)
}

// groupFile is a Parquet file of column c's leaves in one row group, from
// span, their chunks' bytes, read from offset off of the file.
func groupFile(c *pqColumn, rgm *metadata.RowGroupMetaData, span []byte, off int64) (*file.Reader, error) {
	var b bytes.Buffer
	b.WriteString("PAR1")
	b.Write(span)
	var props []parquet.WriterProperty
	infos := make([]metadata.ChunkMetaInfo, len(c.group))
	dicts := make([]bool, len(c.group))
	for k, l := range c.group {
		cm, err := rgm.ColumnChunk(l)
		if err != nil {
			return nil, err
		}
		start, data := chunkStart(cm), cm.DataPageOffset()
		if start < off || data < off || start+cm.TotalCompressedSize() > off+int64(len(span)) {
			return nil, fmt.Errorf("leaf %d chunk outside its column's bytes", l)
		}
		infos[k] = metadata.ChunkMetaInfo{NumValues: cm.NumValues(), IndexPageOffset: -1, DataPageOffset: 4 + data - off,
			CompressedSize: cm.TotalCompressedSize(), UncompressedSize: cm.TotalUncompressedSize()}
		if start < data {
			infos[k].DictPageOffset, dicts[k] = 4+start-off, true
		}
		props = append(props, parquet.WithCompressionFor(c.sub.Column(k).ColumnPath().String(), cm.Compression()))
	}
	fmb := metadata.NewFileMetadataBuilder(c.sub, parquet.NewWriterProperties(append(props, parquet.WithStats(false))...), c.kv)
	rgb := fmb.AppendRowGroup()
	var total int64
	for k := range c.group {
		if err := rgb.NextColumnChunk().Finish(infos[k], dicts[k], false, metadata.EncodingStats{}); err != nil {
			return nil, err
		}
		total += infos[k].CompressedSize
	}
	rgb.SetNumRows(int(rgm.NumRows()))
	if err := rgb.Finish(total, 0); err != nil {
		return nil, err
	}
	return finishFile(&b, fmb)
}

// decodeGroup decodes column c's leaves in a row group, from their bytes
// span read at offset off.
func decodeGroup(c *pqColumn, rgm *metadata.RowGroupMetaData, span []byte, off int64) (arr arrow.Array, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decoding: %v", p)
		}
	}()
	rd, err := groupFile(c, rgm, span, off)
	if err != nil {
		return nil, err
	}
	return readColumn(rd)
}

// pageSource lays a decoded page out as a one-column record batch body.
func pageSource(c *pqColumn, arr arrow.Array) (*columnar.Source, []byte, error) {
	return columnar.SourceOf(c.lay, arr)
}

// check compares a page's bytes after its header (body) with the CRC its
// header gives, if it gives one (pyarrow's write_page_checksum): a page
// changed on its way (a flipped bit in an uncompressed or snappy page
// decodes to wrong values without a word) fails here instead.
func (h pageHeader) check(body []byte) error {
	if h.hasCRC {
		if got := crc32.ChecksumIEEE(body); got != h.crc {
			return fmt.Errorf("CRC-32 %08x, its header says %08x", got, h.crc)
		}
	}
	return nil
}

// checkPages checks the CRCs of the pages in b, read from off: a
// dictionary page, or a group of data pages. The error names the page.
func checkPages(b []byte, off int64) (int64, error) {
	for at := 0; at < len(b); {
		h, err := parsePageHeader(b[at:])
		if err != nil {
			return off + int64(at), err
		}
		end := at + h.headerLen + int(h.compressed)
		if end > len(b) {
			return off + int64(at), fmt.Errorf("page of %d bytes past its group", h.compressed)
		}
		if err := h.check(b[at+h.headerLen : end]); err != nil {
			return off + int64(at), err
		}
		at = end
	}
	return 0, nil
}
