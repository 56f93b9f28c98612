package columnar

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	flatbuffers "github.com/google/flatbuffers/go"
)

// encodeMeta builds a RecordBatch message's flatbuffer (Message.fbs,
// metadata version V5), padded to 8 bytes. Every field is written (the
// defaults given the builder are values never written), so that its size depends only on the numbers of nodes and buffers:
// a batch's memory is planned before its rows are read.
func encodeMeta(rows int64, nodes []FieldNode, bufs []BufferLoc, bodyLen int64) []byte {
	b := flatbuffers.NewBuilder(64 + 16*(len(nodes)+len(bufs)))
	b.StartVector(16, len(bufs), 8)
	for i := len(bufs) - 1; i >= 0; i-- {
		b.Prep(8, 16)
		b.PrependInt64(bufs[i].Length)
		b.PrependInt64(bufs[i].Offset)
	}
	bv := b.EndVector(len(bufs))
	b.StartVector(16, len(nodes), 8)
	for i := len(nodes) - 1; i >= 0; i-- {
		b.Prep(8, 16)
		b.PrependInt64(nodes[i].NullCount)
		b.PrependInt64(nodes[i].Length)
	}
	nv := b.EndVector(len(nodes))
	b.StartObject(5) // RecordBatch
	b.PrependInt64Slot(0, rows, -1)
	b.PrependUOffsetTSlot(1, nv, 0)
	b.PrependUOffsetTSlot(2, bv, 0)
	rb := b.EndObject()
	b.StartObject(5)             // Message
	b.PrependInt16Slot(0, 4, -1) // MetadataVersion V5
	b.PrependByteSlot(1, headerRecordBatch, 0)
	b.PrependUOffsetTSlot(2, rb, 0)
	b.PrependInt64Slot(3, bodyLen, -1)
	b.Finish(b.EndObject())
	meta := b.FinishedBytes()
	// The body must start 8-aligned after the 8-byte prefix.
	return append(meta, make([]byte, int(pad8(int64(len(meta))))-len(meta))...)
}

// SchemaBytes is an IPC stream holding only schema: what a client reads
// its batches' schema from (pyarrow.ipc.open_stream(b).schema).
func SchemaBytes(s *arrow.Schema) ([]byte, error) {
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(s))
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Record decodes a batch's message with arrow-go, given the schema
// stream: release it when done.
func Record(schema, msg []byte) (arrow.RecordBatch, func(), error) {
	var s bytes.Buffer
	if len(schema) < 8 {
		return nil, nil, fmt.Errorf("schema stream of %d bytes", len(schema))
	}
	s.Write(schema[:len(schema)-8]) // without its end-of-stream marker
	s.Write(msg)
	s.Write([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0})
	rd, err := ipc.NewReader(&s)
	if err != nil {
		return nil, nil, err
	}
	if !rd.Next() {
		rd.Release()
		return nil, nil, fmt.Errorf("no record batch in the message: %v", rd.Err())
	}
	return rd.RecordBatch(), rd.Release, nil
}

// JSONRows decodes a batch's message with arrow-go, given the schema
// stream, into one JSON object per row: for showing rows, and for tests.
func JSONRows(schema, msg []byte) ([]string, error) {
	rec, release, err := Record(schema, msg)
	if err != nil {
		return nil, err
	}
	defer release()
	var out bytes.Buffer
	if err := array.RecordToJSON(rec, &out); err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"), nil
}
