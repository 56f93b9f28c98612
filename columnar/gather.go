package columnar

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Writing batches. The rows of a batch, read as cells, are put together
// into one Arrow record batch: an IPC message (prefix, flatbuffer
// metadata, body) written straight into the batch's shared memory, which
// pyarrow maps without a copy (pyarrow.ipc.read_record_batch) and plain
// numpy reads through the node and buffer table that travels with it.
// Dictionary-encoded columns are written decoded.

// RowRef is one row of a batch: its record batch and its row there; or,
// where each column keeps its own batches (the pages of a Parquet column,
// each laid out as a one-column Source), each column's.
type RowRef struct {
	S    *Source
	Row  int64
	Cols []ColRef // if set, column c's source and row
}

// ColRef is one column of a row: its source and its row there.
type ColRef struct {
	S   *Source
	Row int64
}

func (r RowRef) col(c int) (*Source, int64) {
	if r.Cols != nil {
		return r.Cols[c].S, r.Cols[c].Row
	}
	return r.S, r.Row
}

// out is one node of the batch being written.
type out struct {
	n      *Node
	kind   Kind // n's, or for KDict its values'
	width  int
	length int64 // planned elements, then written
	data   int64 // planned KBinary bytes (a bound for dictionaries), then written
	buf    int   // its first buffer among the batch's
	kids   []int
	wrote  int64 // elements written
	wdata  int64 // bytes written
	nulls  int64
}

// BatchMessage is the layout of one record batch's message, known before
// its rows are read: its nodes, buffers and size. (Message is a message
// read; BatchMessage one to write.)
type BatchMessage struct {
	l       *Layout
	nodes   []out
	Buffers []BufferLoc // planned places in the body
	Rows    int64
	metaLen int // the padded flatbuffer's bytes
	Size    int // the whole message: prefix, metadata, body
	Body    int // where the body starts in the message
}

func outBuffers(k Kind) int {
	switch k {
	case KFixed, KBool, KList:
		return 2
	case KBinary:
		return 3
	case KFixedList, KStruct:
		return 1
	}
	return 0
}

// Message sizes the message for rows: every node's elements and bytes, from
// the starts in the index (and, for dictionaries of strings, their longest
// value), so that its memory is taken before any read.
func (l *Layout) Message(rows []RowRef) (*BatchMessage, error) {
	p := &BatchMessage{l: l, Rows: int64(len(rows))}
	var build func(n *Node) int
	build = func(n *Node) int {
		i := len(p.nodes)
		o := out{n: n, kind: n.Kind, width: n.Width}
		switch n.Kind {
		case KDict:
			o.kind, o.width = n.Values.Kind, n.Values.Width
		case KView, KViews:
			o.kind, o.width = KBinary, 4 // written as a string (binary) column
		case KRunEnd:
			o.kind, o.width = n.Values.Kind, n.Values.Width // written as its values' column
		case KListView:
			o.kind = KList // written as a list
		}
		p.nodes = append(p.nodes, o)
		for _, c := range n.Children {
			k := build(c)
			p.nodes[i].kids = append(p.nodes[i].kids, k)
		}
		return i
	}
	tops := make([]int, len(l.Columns))
	for c, n := range l.Columns {
		tops[c] = build(n)
	}
	for _, r := range rows {
		for c, n := range l.Columns {
			s, row := r.col(c)
			if err := p.count(n, tops[c], s, row, row+1, row); err != nil {
				return nil, err
			}
		}
	}
	body := int64(0)
	for i := range p.nodes {
		o := &p.nodes[i]
		o.buf = len(p.Buffers)
		sizes := []int64{(o.length + 7) / 8}
		switch o.kind {
		case KFixed:
			sizes = append(sizes, o.length*int64(o.width))
		case KBool:
			sizes = append(sizes, (o.length+7)/8)
		case KBinary:
			sizes = append(sizes, (o.length+1)*int64(o.width), o.data)
		case KList:
			sizes = append(sizes, (o.length+1)*int64(o.width))
		case KNull:
			sizes = nil
		}
		if o.width == 4 && (o.kind == KBinary && o.data > math.MaxInt32 || o.kind == KList && p.nodes[o.kids[0]].length > math.MaxInt32) {
			return nil, fmt.Errorf("column %q: more in one batch than 32-bit offsets reach: ask for smaller batches", o.n.Name)
		}
		for _, s := range sizes {
			p.Buffers = append(p.Buffers, BufferLoc{body, s})
			body += pad8(s)
		}
	}
	p.metaLen = len(encodeMeta(p.Rows, make([]FieldNode, len(p.nodes)), p.Buffers, body))
	p.Body = 8 + p.metaLen
	p.Size = p.Body + int(body)
	return p, nil
}

func pad8(n int64) int64 { return (n + 7) &^ 7 }

func (p *BatchMessage) count(n *Node, on int, s *Source, lo, hi, row int64) error {
	o := &p.nodes[on]
	o.length += hi - lo
	switch n.Kind {
	case KBinary:
		from, to := n.span(s.Starts[n.Var], row)
		o.data += to - from
	case KView:
		o.data += s.Starts[n.Var][2*row+1]
	case KViews:
		o.data += s.Starts[n.Var][viewsStride*row+6]
	case KRunEnd:
		t := s.Starts[n.Var]
		o.data += t[3*row+2] - t[3*row+1]
	case KList:
		from, to := n.span(s.Starts[n.Var], row)
		return p.count(n.Children[0], o.kids[0], s, from, to, row)
	case KListView:
		t := s.Starts[n.Var]
		return p.count(n.Children[0], o.kids[0], s, t[2*row], t[2*row+1], row)
	case KFixedList:
		k := int64(n.Size)
		return p.count(n.Children[0], o.kids[0], s, lo*k, hi*k, row)
	case KStruct:
		for i, c := range n.Children {
			if err := p.count(c, o.kids[i], s, lo, hi, row); err != nil {
				return err
			}
		}
	case KDict:
		d := s.Dicts[n.DictID]
		if d == nil {
			return fmt.Errorf("column %q: no dictionary %d before this batch", n.Name, n.DictID)
		}
		if o.kind == KBinary {
			o.data += (hi - lo) * d.MaxLen
		}
	}
	return nil
}

// Assemble writes the batch's message into msg (Size bytes): cell(slot, k)
// is row slot's k-th cell as read. It returns the message's length, which
// is Size but for dictionaries of strings, whose bound was planned.
func (p *BatchMessage) Assemble(rows []RowRef, cell func(slot, k int) []byte, msg []byte) (int, error) {
	if len(msg) < p.Size {
		return 0, fmt.Errorf("batch message of %d bytes, planned %d", len(msg), p.Size)
	}
	body := msg[p.Body:p.Size]
	clear(body)
	for i := range p.nodes {
		p.nodes[i].wrote, p.nodes[i].wdata = 0, 0
	}
	tops := make([]int, 0, len(p.l.Columns))
	for i := range p.nodes {
		if len(tops) < len(p.l.Columns) && p.nodes[i].n == p.l.Columns[len(tops)] {
			tops = append(tops, i)
		}
	}
	a := assembler{p: p, body: body}
	for slot, r := range rows {
		k := 0
		a.cell = func() []byte {
			b := cell(slot, k)
			k++
			return b
		}
		for c, n := range p.l.Columns {
			s, row := r.col(c)
			if err := a.row(n, tops[c], s, row, row+1, row); err != nil {
				return 0, err
			}
		}
	}
	nodes := make([]FieldNode, len(p.nodes))
	bufs := append([]BufferLoc(nil), p.Buffers...)
	for i := range p.nodes {
		o := &p.nodes[i]
		if o.kind != KNull {
			b := p.Buffers[o.buf]
			o.nulls = countZeros(body[b.Offset:], o.wrote)
		} else {
			o.nulls = o.wrote
		}
		nodes[i] = FieldNode{o.wrote, o.nulls}
		if o.kind == KBinary {
			bufs[o.buf+2].Length = o.wdata
		}
	}
	meta := encodeMeta(p.Rows, nodes, bufs, int64(p.Size-p.Body))
	if len(meta) != p.metaLen {
		return 0, fmt.Errorf("batch metadata of %d bytes, planned %d", len(meta), p.metaLen)
	}
	binary.LittleEndian.PutUint32(msg, 0xFFFFFFFF)
	binary.LittleEndian.PutUint32(msg[4:], uint32(p.metaLen))
	copy(msg[8:], meta)
	return p.Size, nil
}

// Table is the batch's nodes and buffers as written (after Assemble), for
// a reader without pyarrow: body offsets are relative to BatchMessage.Body.
func (p *BatchMessage) Table() (nodes []FieldNode, bufs []BufferLoc) {
	nodes = make([]FieldNode, len(p.nodes))
	bufs = append([]BufferLoc(nil), p.Buffers...)
	for i := range p.nodes {
		o := &p.nodes[i]
		nodes[i] = FieldNode{o.wrote, o.nulls}
		if o.kind == KBinary {
			bufs[o.buf+2].Length = o.wdata
		}
	}
	return nodes, bufs
}

type assembler struct {
	p    *BatchMessage
	body []byte
	cell func() []byte
}

func (a *assembler) buf(o *out, k int) []byte {
	b := a.p.Buffers[o.buf+k]
	return a.body[b.Offset : b.Offset+b.Length]
}

// validity copies the row's validity bits (all set if its batch keeps none).
func (a *assembler) validity(o *out, lo, cnt int64) {
	src := a.cell()
	dst := a.buf(o, 0)
	if len(src) == 0 {
		fillBits(dst, o.wrote, cnt)
		return
	}
	copyBits(dst, o.wrote, src, lo%8, cnt)
}

// offsets writes cnt+1 offsets rebased from src's first to base.
func (a *assembler) offsets(o *out, src []byte, cnt, base int64) (first, last int64, err error) {
	dst := a.buf(o, 1)
	w := int64(o.width)
	if int64(len(src)) != (cnt+1)*w {
		return 0, 0, fmt.Errorf("column %q: offsets cell of %d bytes for %d elements", o.n.Name, len(src), cnt)
	}
	get := func(j int64) int64 {
		v, _ := offsetAt(src, w, j) // in range: the cell's length is checked above
		return v
	}
	first = get(0)
	for j := int64(0); j <= cnt; j++ {
		v := get(j) - first + base
		if w == 4 {
			binary.LittleEndian.PutUint32(dst[(o.wrote+j)*4:], uint32(v))
		} else {
			binary.LittleEndian.PutUint64(dst[(o.wrote+j)*8:], uint64(v))
		}
	}
	return first, get(cnt), nil
}

func (a *assembler) row(n *Node, on int, s *Source, lo, hi, row int64) error {
	o := &a.p.nodes[on]
	cnt := hi - lo
	switch n.Kind {
	case KNull:
	case KFixed:
		a.validity(o, lo, cnt)
		copy(a.buf(o, 1)[o.wrote*int64(o.width):], a.cell())
	case KBool:
		a.validity(o, lo, cnt)
		if src := a.cell(); cnt > 0 {
			copyBits(a.buf(o, 1), o.wrote, src, lo%8, cnt)
		}
	case KBinary:
		a.validity(o, lo, cnt)
		first, last, err := a.offsets(o, a.cell(), cnt, o.wdata)
		if err != nil {
			return err
		}
		data := a.cell()
		if int64(len(data)) != last-first {
			return fmt.Errorf("column %q: data cell of %d bytes, offsets say %d", n.Name, len(data), last-first)
		}
		copy(a.buf(o, 2)[o.wdata:], data)
		o.wdata += int64(len(data))
	case KView:
		a.validity(o, lo, cnt)
		data := a.cell()
		if want := s.Starts[n.Var][2*row+1]; int64(len(data)) != want {
			return fmt.Errorf("column %q: value cell of %d bytes, its view says %d", n.Name, len(data), want)
		}
		copy(a.buf(o, 2)[o.wdata:], data)
		o.wdata += int64(len(data))
		a.endValue(o, o.wrote)
	case KViews:
		a.validity(o, lo, cnt)
		views, data0, data1 := a.cell(), a.cell(), a.cell()
		if int64(len(views)) != 16*cnt {
			return fmt.Errorf("column %q: views cell of %d bytes for %d elements", n.Name, len(views), cnt)
		}
		t := s.Starts[n.Var][viewsStride*row:]
		valid := a.buf(o, 0)
		for j := range cnt {
			at := o.wrote + j
			v := views[16*j:]
			size := int64(int32(binary.LittleEndian.Uint32(v)))
			if valid[at>>3]&(1<<(at&7)) != 0 {
				var b []byte
				switch {
				case size >= 0 && size <= 12:
					b = v[4 : 4+size]
				case size > 12:
					k := int64(int32(binary.LittleEndian.Uint32(v[8:])))
					for d, data := range [][]byte{data0, data1} {
						if k != t[3*d] || k < 0 {
							continue
						}
						p := s.buffer(n, 2+int(k)).Offset + int64(int32(binary.LittleEndian.Uint32(v[12:]))) - t[3*d+1]
						if p >= 0 && p <= int64(len(data)) && size <= int64(len(data))-p {
							b = data[p : p+size]
						}
						break
					}
				}
				if int64(len(b)) != size {
					return fmt.Errorf("column %q: element %d's view outside the bytes read for its row", n.Name, lo+j)
				}
				copy(a.buf(o, 2)[o.wdata:], b)
				o.wdata += size
			}
			a.endValue(o, at)
		}
	case KRunEnd:
		// One row, one element (no list is around it): its run's value.
		t := s.Starts[n.Var]
		run := t[3*row]
		a.validity(o, run, 1)
		value := a.cell()
		switch o.kind {
		case KFixed:
			if len(value) != o.width {
				return fmt.Errorf("column %q: value cell of %d bytes, want %d", n.Name, len(value), o.width)
			}
			copy(a.buf(o, 1)[o.wrote*int64(o.width):], value)
		case KBool:
			if len(value) != 1 {
				return fmt.Errorf("column %q: value cell of %d bytes, want 1", n.Name, len(value))
			}
			copyBits(a.buf(o, 1), o.wrote, value, run%8, 1)
		case KBinary:
			if want := t[3*row+2] - t[3*row+1]; int64(len(value)) != want {
				return fmt.Errorf("column %q: value cell of %d bytes, its offsets say %d", n.Name, len(value), want)
			}
			copy(a.buf(o, 2)[o.wdata:], value)
			o.wdata += int64(len(value))
			a.endValue(o, o.wrote)
		}
	case KList:
		a.validity(o, lo, cnt)
		c := &a.p.nodes[o.kids[0]]
		if _, _, err := a.offsets(o, a.cell(), cnt, c.wrote); err != nil {
			return err
		}
		from, to := n.span(s.Starts[n.Var], row)
		if err := a.row(n.Children[0], o.kids[0], s, from, to, row); err != nil {
			return err
		}
	case KListView:
		// One row (no list is around it): its offsets are its elements'
		// place in the list written.
		a.validity(o, lo, cnt)
		c := &a.p.nodes[o.kids[0]]
		t := s.Starts[n.Var]
		from, to := t[2*row], t[2*row+1]
		dst := a.buf(o, 1)
		if o.width == 4 {
			binary.LittleEndian.PutUint32(dst[o.wrote*4:], uint32(c.wrote))
			binary.LittleEndian.PutUint32(dst[(o.wrote+1)*4:], uint32(c.wrote+to-from))
		} else {
			binary.LittleEndian.PutUint64(dst[o.wrote*8:], uint64(c.wrote))
			binary.LittleEndian.PutUint64(dst[(o.wrote+1)*8:], uint64(c.wrote+to-from))
		}
		if err := a.row(n.Children[0], o.kids[0], s, from, to, row); err != nil {
			return err
		}
	case KFixedList:
		a.validity(o, lo, cnt)
		k := int64(n.Size)
		if err := a.row(n.Children[0], o.kids[0], s, lo*k, hi*k, row); err != nil {
			return err
		}
	case KStruct:
		a.validity(o, lo, cnt)
		for i, c := range n.Children {
			if err := a.row(c, o.kids[i], s, lo, hi, row); err != nil {
				return err
			}
		}
	case KDict:
		a.validity(o, lo, cnt)
		if err := a.dict(n, o, s, cnt); err != nil {
			return err
		}
	}
	o.wrote += cnt
	return nil
}

// dict looks the row's indices up in its batch's dictionary.
func (a *assembler) dict(n *Node, o *out, s *Source, cnt int64) error {
	d := s.Dicts[n.DictID]
	idx := a.cell()
	valid := a.buf(o, 0)
	w := int64(n.Width)
	for j := int64(0); j < cnt; j++ {
		at := o.wrote + j
		if valid[at>>3]&(1<<(at&7)) == 0 {
			a.endValue(o, at)
			continue
		}
		var i int64
		switch w {
		case 1:
			i = int64(int8(idx[j]))
		case 2:
			i = int64(int16(binary.LittleEndian.Uint16(idx[j*2:])))
		case 4:
			i = int64(int32(binary.LittleEndian.Uint32(idx[j*4:])))
		default:
			i = int64(binary.LittleEndian.Uint64(idx[j*8:]))
		}
		if i < 0 || i >= d.N {
			return fmt.Errorf("column %q: dictionary index %d of a dictionary of %d", n.Name, i, d.N)
		}
		if !d.isValid(i) {
			valid[at>>3] &^= 1 << (at & 7)
		}
		switch o.kind {
		case KFixed:
			vw := int64(o.width)
			copy(a.buf(o, 1)[at*vw:(at+1)*vw], d.data[i*vw:(i+1)*vw])
		case KBool:
			copyBits(a.buf(o, 1), at, d.data, i, 1)
		case KBinary:
			v := d.data[d.offs[i]:d.offs[i+1]]
			copy(a.buf(o, 2)[o.wdata:], v)
			o.wdata += int64(len(v))
		}
		a.endValue(o, at)
	}
	return nil
}

// endValue writes the offset after a decoded dictionary value.
func (a *assembler) endValue(o *out, at int64) {
	if o.kind != KBinary {
		return
	}
	ob := a.buf(o, 1)
	if o.width == 4 {
		binary.LittleEndian.PutUint32(ob[(at+1)*4:], uint32(o.wdata))
	} else {
		binary.LittleEndian.PutUint64(ob[(at+1)*8:], uint64(o.wdata))
	}
}
