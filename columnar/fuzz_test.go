package columnar

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"
)

// schemaMessage is a schema's IPC message metadata, as arrow-go writes it.
func schemaMessage(s *arrow.Schema) []byte {
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(s))
	w.Close()
	b := buf.Bytes()
	return b[8 : 8+binary.LittleEndian.Uint32(b[4:])]
}

// Metadata of any bytes is an error or a message; never a panic.
func FuzzParseMessage(f *testing.F) {
	f.Add(encodeMeta(3, []FieldNode{{3, 1}, {3, 0}}, []BufferLoc{{0, 8}, {8, 24}, {32, 0}}, 32))
	f.Add(schemaMessage(arrow.NewSchema([]arrow.Field{{Name: "a", Type: arrow.ListOf(arrow.BinaryTypes.String)},
		{Name: "d", Type: &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int32, ValueType: arrow.BinaryTypes.String}}}, nil)))
	f.Fuzz(func(t *testing.T, b []byte) {
		if m, err := ParseMessage(b); err == nil && m.BodyLen < 0 {
			t.Fatalf("a body of %d bytes", m.BodyLen)
		}
		ParseSchemaMessage(b)
		ParseFooter(b)
	})
}
