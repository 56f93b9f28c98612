package columnar

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Message header types (the MessageHeader union of Message.fbs).
const (
	headerSchema      = 1
	headerDictionary  = 2
	headerRecordBatch = 3
)

// FieldNode is a node of a record batch: an array's length and null count.
type FieldNode struct{ Length, NullCount int64 }

// BufferLoc is a buffer of a record batch: its place in the message body.
type BufferLoc struct{ Offset, Length int64 }

// BatchMeta is a record batch's metadata: rows, nodes and buffers in the
// pre-order of the schema's fields.
type BatchMeta struct {
	Rows     int64
	Nodes    []FieldNode
	Buffers  []BufferLoc
	Variadic []int64 // the data buffer counts of view-typed fields, in order
	Codec    Codec   // how the buffers are compressed (compress.go)
}

// Message is an IPC message's metadata.
type Message struct {
	Type    int
	BodyLen int64
	Batch   BatchMeta // record and dictionary batches
	DictID  int64     // dictionary batches
	Delta   bool      // dictionary batches: appended to the last one
}

// Prefix reads an encapsulated message's prefix (the continuation marker
// and metadata length, or a pre-1.0 bare length): the metadata's length,
// the prefix's, and whether this is the end-of-stream marker.
func Prefix(b []byte) (metaLen, prefixLen int, eos bool, err error) {
	if len(b) < 4 {
		return 0, 0, false, fmt.Errorf("message prefix: %d bytes", len(b))
	}
	n := binary.LittleEndian.Uint32(b)
	if n == 0xFFFFFFFF {
		if len(b) < 8 {
			return 0, 0, false, fmt.Errorf("message prefix: %d bytes", len(b))
		}
		n, prefixLen = binary.LittleEndian.Uint32(b[4:]), 8
	} else {
		prefixLen = 4
	}
	if n == 0 {
		return 0, prefixLen, true, nil
	}
	if n > 1<<30 {
		return 0, 0, false, fmt.Errorf("message metadata of %d bytes", n)
	}
	return int(n), prefixLen, false, nil
}

// ParseMessage reads a message's flatbuffer metadata.
func ParseMessage(meta []byte) (*Message, error) {
	t, err := root(meta)
	if err != nil {
		return nil, err
	}
	version, err := t.int16(0, 0)
	if err != nil {
		return nil, err
	}
	if version < 3 { // V4 (1.0) is 3, V5 is 4
		return nil, fmt.Errorf("IPC metadata version V%d: riffle reads V4 and V5 (Arrow 0.15 and later)", version+1)
	}
	typ, err := t.uint8(1, 0)
	if err != nil {
		return nil, err
	}
	m := &Message{Type: int(typ)}
	if m.BodyLen, err = t.int64(3, 0); err != nil {
		return nil, err
	}
	if m.BodyLen < 0 {
		return nil, fmt.Errorf("%w: body of %d bytes", errFB, m.BodyLen)
	}
	h, ok, err := t.table(2)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: message without a header", errFB)
	}
	switch m.Type {
	case headerRecordBatch:
		err = parseBatch(h, &m.Batch)
	case headerDictionary:
		if m.DictID, err = h.int64(0, 0); err != nil {
			return nil, err
		}
		d, err := h.uint8(2, 0)
		if err != nil {
			return nil, err
		}
		m.Delta = d != 0
		rb, ok, err := h.table(1)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: dictionary batch without data", errFB)
		}
		if err := parseBatch(rb, &m.Batch); err != nil {
			return nil, err
		}
	}
	return m, err
}

func parseBatch(t table, b *BatchMeta) error {
	var err error
	if b.Rows, err = t.int64(0, 0); err != nil {
		return err
	}
	start, n, err := t.vector(1, 16)
	if err != nil {
		return err
	}
	b.Nodes = make([]FieldNode, n)
	for i := range b.Nodes {
		p := t.b[start+16*i:]
		b.Nodes[i] = FieldNode{int64(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))}
	}
	if start, n, err = t.vector(2, 16); err != nil {
		return err
	}
	b.Buffers = make([]BufferLoc, n)
	for i := range b.Buffers {
		p := t.b[start+16*i:]
		b.Buffers[i] = BufferLoc{int64(binary.LittleEndian.Uint64(p)), int64(binary.LittleEndian.Uint64(p[8:]))}
	}
	c, ok, err := t.table(3)
	if err != nil {
		return err
	}
	if ok {
		if b.Codec, err = parseCompression(c); err != nil {
			return err
		}
	}
	if start, n, err = t.vector(4, 8); err != nil {
		return err
	}
	b.Variadic = make([]int64, n)
	for i := range b.Variadic {
		b.Variadic[i] = int64(binary.LittleEndian.Uint64(t.b[start+8*i:]))
	}
	if b.Rows < 0 {
		return fmt.Errorf("%w: %d rows", errFB, b.Rows)
	}
	return nil
}

// ErrUnreadRow is a batch holding a row laid out in a way riffle does not
// read (its views under a list in three data buffers or more), though the
// file is sound.
var ErrUnreadRow = errors.New("a row riffle does not read")

// Block is a footer's entry for one message.
type Block struct {
	Offset  int64
	MetaLen int32
	BodyLen int64
}

// Footer is an IPC file's footer: where its dictionary and record batch
// messages are.
type Footer struct {
	Dictionaries []Block
	Batches      []Block
}

// ParseFooter reads an IPC file's footer flatbuffer.
func ParseFooter(b []byte) (*Footer, error) {
	t, err := root(b)
	if err != nil {
		return nil, err
	}
	f := &Footer{}
	for i, dst := range []*[]Block{&f.Dictionaries, &f.Batches} {
		start, n, err := t.vector(2+i, 24)
		if err != nil {
			return nil, err
		}
		*dst = make([]Block, n)
		for k := range *dst {
			p := b[start+24*k:]
			(*dst)[k] = Block{int64(binary.LittleEndian.Uint64(p)), int32(binary.LittleEndian.Uint32(p[8:])), int64(binary.LittleEndian.Uint64(p[16:]))}
		}
	}
	return f, nil
}

// FooterSchema returns the schema an IPC file's footer holds, as the
// metadata of a Schema message (what ParseSchemaMessage and arrow-go's
// stream reader take). The footer is where the file format keeps its
// schema: Polars (write_ipc) and apache-arrow's JavaScript writer put no
// schema message after the magic, only record batches.
//
// The message is a small flatbuffer table placed before a copy of the
// footer, its header field pointing at the footer's schema table: flatbuffer
// offsets are relative and point forward, so the schema is not rebuilt.
func FooterSchema(footer []byte) ([]byte, error) {
	t, err := root(footer)
	if err != nil {
		return nil, err
	}
	version, err := t.int16(0, 0)
	if err != nil {
		return nil, err
	}
	at, ok, err := t.offset(1)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: footer without a schema", errFB)
	}
	if _, err := tableAt(footer, at); err != nil {
		return nil, err
	}
	const (
		vt    = 4  // the Message's vtable: 4 fields
		tab   = 16 // the Message table
		start = 32 // the footer's copy, 8-byte aligned as it was
	)
	b := make([]byte, start+len(footer))
	binary.LittleEndian.PutUint32(b, tab)
	binary.LittleEndian.PutUint16(b[vt:], 12)   // vtable bytes
	binary.LittleEndian.PutUint16(b[vt+2:], 12) // table bytes
	binary.LittleEndian.PutUint16(b[vt+4:], 4)  // version
	binary.LittleEndian.PutUint16(b[vt+6:], 6)  // header_type
	binary.LittleEndian.PutUint16(b[vt+8:], 8)  // header
	binary.LittleEndian.PutUint16(b[vt+10:], 0) // bodyLength: 0
	binary.LittleEndian.PutUint32(b[tab:], tab-vt)
	binary.LittleEndian.PutUint16(b[tab+4:], uint16(version))
	b[tab+6] = headerSchema
	binary.LittleEndian.PutUint32(b[tab+8:], uint32(start+at-(tab+8)))
	copy(b[start:], footer)
	return b, nil
}

// SchemaInfo is what riffle reads of a schema flatbuffer itself: its
// endianness and the dictionary id of each dictionary-encoded field, in
// the pre-order of the fields.
type SchemaInfo struct {
	BigEndian bool
	DictIDs   []int64
}

// ParseSchema reads a Schema message's header (or a footer's schema).
func ParseSchema(t table) (*SchemaInfo, error) {
	e, err := t.int16(0, 0)
	if err != nil {
		return nil, err
	}
	s := &SchemaInfo{BigEndian: e == 1}
	fields, err := t.tables(1)
	if err != nil {
		return nil, err
	}
	// Every string, vector and table arrow-go's schema reader will follow
	// is checked here first: it trusts their lengths (a forged length is
	// an allocation of gigabytes, which no recover catches).
	if err := checkMetadata(t, 2); err != nil {
		return nil, err
	}
	if _, _, err := t.vector(3, 8); err != nil {
		return nil, err
	}
	var walk func(fs []table, depth int) error
	walk = func(fs []table, depth int) error {
		if depth > 64 {
			return fmt.Errorf("%w: fields nested more than 64 deep", errFB)
		}
		for _, f := range fs {
			if _, err := f.string(0); err != nil {
				return err
			}
			if err := checkType(f); err != nil {
				return err
			}
			if err := checkMetadata(f, 6); err != nil {
				return err
			}
			d, ok, err := f.table(4)
			if err != nil {
				return err
			}
			if ok {
				id, err := d.int64(0, 0)
				if err != nil {
					return err
				}
				if _, _, err := d.table(1); err != nil {
					return err
				}
				s.DictIDs = append(s.DictIDs, id)
			}
			kids, err := f.tables(5)
			if err != nil {
				return err
			}
			if err := walk(kids, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	return s, walk(fields, 0)
}

// checkMetadata checks a custom_metadata vector of KeyValue tables.
func checkMetadata(t table, field int) error {
	kvs, err := t.tables(field)
	if err != nil {
		return err
	}
	for _, kv := range kvs {
		if _, err := kv.string(0); err != nil {
			return err
		}
		if _, err := kv.string(1); err != nil {
			return err
		}
	}
	return nil
}

// checkType checks a Field's type table and the vectors some types hold
// (a Timestamp's time zone, a Union's type ids).
func checkType(f table) error {
	tt, err := f.uint8(2, 0)
	if err != nil {
		return err
	}
	typ, ok, err := f.table(3)
	if err != nil || !ok {
		return err
	}
	switch tt {
	case 10: // Timestamp
		_, err = typ.string(1)
	case 14: // Union
		_, _, err = typ.vector(1, 4)
	}
	return err
}

// ParseSchemaMessage reads the schema of a Schema message's metadata.
func ParseSchemaMessage(meta []byte) (*SchemaInfo, error) {
	t, err := root(meta)
	if err != nil {
		return nil, err
	}
	typ, err := t.uint8(1, 0)
	if err != nil {
		return nil, err
	}
	if typ != headerSchema {
		return nil, fmt.Errorf("the first message is not a schema (header type %d)", typ)
	}
	h, ok, err := t.table(2)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%w: schema message without a header", errFB)
	}
	return ParseSchema(h)
}
