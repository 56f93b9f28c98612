package columnar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Reading rows. An Arrow row is no one byte range: it is a slice of every
// buffer of its columns (a bit range of each validity bitmap, its values,
// its offsets and the bytes they point to). Each such slice is a cell;
// every row of a layout has Layout.Cells of them, in pre-order of the
// nodes and their buffers, so a row is read like Cells small records,
// coalesced with its neighbours' and never a byte twice (lirs.txt §4.2).
// Where a row's slice of a child begins depends on its parent's offsets;
// those starts are read once, when the file is indexed, and kept beside
// the buffers' places: the offset table of a columnar file.

// Range is a byte range of an object.
type Range struct{ Off, Len int64 }

// Source is one record batch of an object: where its body is, its
// metadata, the child starts of each Var node, and the dictionaries in
// force for it.
type Source struct {
	Body   int64
	Meta   *BatchMeta
	Starts [][]int64 // [Var][row]: rows+1 child starts of each KBinary and KList node; a KView's 2*rows (body offset, length) pairs; a KRunEnd's 3*rows (run, value from, value to); a KListView's 2*rows (first element, end)
	Dicts  map[int64]*Dict
}

// buffer returns node n's k-th buffer in s.
func (s *Source) buffer(n *Node, k int) BufferLoc {
	i := n.buf + k
	for _, c := range s.Meta.Variadic[:min(n.views, len(s.Meta.Variadic))] {
		i += int(c)
	}
	return s.Meta.Buffers[i]
}

// Cells appends the byte ranges of row's cells (in object coordinates).
// The source must have been checked (Check).
func (l *Layout) Cells(s *Source, row int, dst []Range) []Range {
	r := int64(row)
	for _, n := range l.Columns {
		dst = s.cells(n, r, r+1, r, dst)
	}
	return dst
}

func (s *Source) cells(n *Node, lo, hi, row int64, dst []Range) []Range {
	bits := func(k int) Range {
		b := s.buffer(n, k)
		if b.Length == 0 || hi == lo {
			return Range{}
		}
		return Range{s.Body + b.Offset + lo/8, (hi+7)/8 - lo/8}
	}
	bytes := func(k int, from, to int64) Range {
		if to == from {
			return Range{}
		}
		return Range{s.Body + s.buffer(n, k).Offset + from, to - from}
	}
	switch n.Kind {
	case KFixed:
		dst = append(dst, bits(0), bytes(1, lo*int64(n.Width), hi*int64(n.Width)))
	case KBool:
		dst = append(dst, bits(0), bits(1))
	case KDict:
		dst = append(dst, bits(0), bytes(1, lo*int64(n.Width), hi*int64(n.Width)))
	case KBinary:
		from, to := n.span(s.Starts[n.Var], row)
		dst = append(dst, bits(0), bytes(1, lo*int64(n.Width), (hi+1)*int64(n.Width)), bytes(2, from, to))
	case KView:
		t := s.Starts[n.Var]
		v := Range{}
		if t[2*row+1] > 0 {
			v = Range{s.Body + t[2*row], t[2*row+1]}
		}
		dst = append(dst, bits(0), v)
	case KViews:
		t := s.Starts[n.Var][viewsStride*row:]
		dst = append(dst, bits(0), bytes(1, lo*16, hi*16))
		for d := range 2 {
			r := Range{}
			if t[3*d+2] > t[3*d+1] {
				r = Range{s.Body + t[3*d+1], t[3*d+2] - t[3*d+1]}
			}
			dst = append(dst, r)
		}
	case KRunEnd:
		t := s.Starts[n.Var]
		v := n.Values
		run := t[3*row]
		valid := Range{}
		if b := s.buffer(v, 0); b.Length > 0 {
			valid = Range{s.Body + b.Offset + run/8, 1}
		}
		var value Range
		switch v.Kind {
		case KFixed:
			value = Range{s.Body + s.buffer(v, 1).Offset + run*int64(v.Width), int64(v.Width)}
		case KBool:
			value = Range{s.Body + s.buffer(v, 1).Offset + run/8, 1}
		case KBinary:
			if t[3*row+2] > t[3*row+1] {
				value = Range{s.Body + s.buffer(v, 2).Offset + t[3*row+1], t[3*row+2] - t[3*row+1]}
			}
		}
		dst = append(dst, valid, value)
	case KList:
		from, to := n.span(s.Starts[n.Var], row)
		dst = append(dst, bits(0), bytes(1, lo*int64(n.Width), (hi+1)*int64(n.Width)))
		dst = s.cells(n.Children[0], from, to, row, dst)
	case KListView:
		t := s.Starts[n.Var]
		dst = append(dst, bits(0))
		dst = s.cells(n.Children[0], t[2*row], t[2*row+1], row, dst)
	case KFixedList:
		dst = append(dst, bits(0))
		k := int64(n.Size)
		dst = s.cells(n.Children[0], lo*k, hi*k, row, dst)
	case KStruct:
		dst = append(dst, bits(0))
		for _, c := range n.Children {
			dst = s.cells(c, lo, hi, row, dst)
		}
	}
	return dst
}

// Check validates a source against the layout of every column it will be
// read with: node lengths, buffers inside the body, every start inside
// its child. After it, Cells never leaves a buffer.
func (l *Layout) Check(s *Source, bodyLen int64) error {
	m := s.Meta
	for i, b := range m.Buffers {
		if b.Offset < 0 || b.Length < 0 || b.Offset > bodyLen || b.Length > bodyLen-b.Offset {
			return fmt.Errorf("buffer %d (%d bytes at %d) outside the body of %d bytes", i, b.Length, b.Offset, bodyLen)
		}
	}
	for _, n := range l.Columns {
		if err := s.check(n, m.Rows, 0); err != nil {
			return err
		}
	}
	return nil
}

func (s *Source) check(n *Node, length int64, depth int) error {
	if n.node >= len(s.Meta.Nodes) {
		return fmt.Errorf("column %q: %d nodes in the batch, want more", n.Name, len(s.Meta.Nodes))
	}
	fn := s.Meta.Nodes[n.node]
	if fn.Length != length {
		return fmt.Errorf("column %q: node of %d elements where its parent makes %d", n.Name, fn.Length, length)
	}
	if n.Kind == KRunEnd {
		return s.checkRunEnd(n, length)
	}
	nb := map[Kind]int{KFixed: 2, KBool: 2, KDict: 2, KBinary: 3, KList: 2, KFixedList: 1, KStruct: 1, KView: 2, KListView: 3, KViews: 2}[n.Kind]
	last := n.buf + nb - 1
	for _, c := range s.Meta.Variadic[:min(n.views, len(s.Meta.Variadic))] {
		last += int(c)
	}
	if n.Kind == KView || n.Kind == KViews {
		if n.views >= len(s.Meta.Variadic) || s.Meta.Variadic[n.views] < 0 || s.Meta.Variadic[n.views] > int64(len(s.Meta.Buffers)) {
			return fmt.Errorf("column %q: no count of its data buffers in the batch", n.Name)
		}
		last += int(s.Meta.Variadic[n.views])
	}
	if nb > 0 && last >= len(s.Meta.Buffers) {
		return fmt.Errorf("column %q: %d buffers in the batch, want more", n.Name, len(s.Meta.Buffers))
	}
	need := func(k int, bytes int64, what string) error {
		if b := s.buffer(n, k); b.Length < bytes {
			return fmt.Errorf("column %q: %s buffer of %d bytes for %d elements (want %d)", n.Name, what, b.Length, length, bytes)
		}
		return nil
	}
	if nb > 0 && (fn.NullCount > 0 || s.buffer(n, 0).Length > 0) {
		if err := need(0, (length+7)/8, "validity"); err != nil {
			return err
		}
	}
	switch n.Kind {
	case KFixed, KDict:
		return need(1, length*int64(n.Width), "data")
	case KBool:
		return need(1, (length+7)/8, "data")
	case KBinary, KList:
		if err := need(1, (length+1)*int64(n.Width), "offsets"); err != nil {
			return err
		}
		t := s.Starts[n.Var]
		end := int64(0)
		if n.Paired {
			if int64(len(t)) != 2*s.Meta.Rows {
				return fmt.Errorf("column %q: %d row ranges for %d rows", n.Name, len(t)/2, s.Meta.Rows)
			}
			for i := 0; i < len(t); i += 2 {
				if t[i] < 0 || t[i+1] < t[i] {
					return fmt.Errorf("column %q: offsets out of order at row %d", n.Name, i/2)
				}
				end = max(end, t[i+1])
			}
		} else {
			if int64(len(t)) != s.Meta.Rows+1 {
				return fmt.Errorf("column %q: %d row starts for %d rows", n.Name, len(t), s.Meta.Rows)
			}
			for i := 1; i < len(t); i++ {
				if t[i] < t[i-1] || t[0] < 0 {
					return fmt.Errorf("column %q: offsets out of order at row %d", n.Name, i)
				}
			}
			end = t[len(t)-1]
		}
		if n.Kind == KBinary {
			return need(2, end, "data")
		}
		c := n.Children[0]
		if c.node >= len(s.Meta.Nodes) {
			return fmt.Errorf("column %q: %d nodes in the batch, want more", n.Name, len(s.Meta.Nodes))
		}
		if cl := s.Meta.Nodes[c.node].Length; end > cl {
			return fmt.Errorf("column %q: offsets reach element %d of a child of %d", n.Name, end, cl)
		}
		return s.check(c, s.Meta.Nodes[c.node].Length, depth+1)
	case KView:
		if err := need(1, length*16, "views"); err != nil {
			return err
		}
		t := s.Starts[n.Var]
		if int64(len(t)) != 2*length {
			return fmt.Errorf("column %q: %d value ranges for %d rows", n.Name, len(t)/2, length)
		}
		// Every range lies inside one of the column's buffers.
		for i := 0; i < len(t); i += 2 {
			if t[i+1] == 0 {
				continue
			}
			in := false
			for k := 1; k < 2+int(s.Meta.Variadic[n.views]) && !in; k++ {
				b := s.buffer(n, k)
				in = t[i] >= b.Offset && t[i+1] > 0 && t[i+1] <= b.Length && t[i]-b.Offset <= b.Length-t[i+1]
			}
			if !in {
				return fmt.Errorf("column %q: row %d's value outside its buffers", n.Name, i/2)
			}
		}
		return nil
	case KViews:
		if err := need(1, length*16, "views"); err != nil {
			return err
		}
		t := s.Starts[n.Var]
		if int64(len(t)) != viewsStride*s.Meta.Rows {
			return fmt.Errorf("column %q: %d data ranges for %d rows", n.Name, len(t)/viewsStride, s.Meta.Rows)
		}
		nbuf := s.Meta.Variadic[n.views]
		for i := 0; i < len(t); i += viewsStride {
			for d := 0; d < 6; d += 3 {
				k, from, to := t[i+d], t[i+d+1], t[i+d+2]
				if k == -1 && from == 0 && to == 0 {
					continue
				}
				if k < 0 || k >= nbuf {
					return fmt.Errorf("column %q: row %d's values in data buffer %d of %d", n.Name, i/viewsStride, k, nbuf)
				}
				b := s.buffer(n, 2+int(k))
				if from < b.Offset || from > to || to-b.Offset > b.Length {
					return fmt.Errorf("column %q: row %d's values outside their data buffer", n.Name, i/viewsStride)
				}
			}
			if t[i+6] < 0 {
				return fmt.Errorf("column %q: row %d's values of %d bytes", n.Name, i/viewsStride, t[i+6])
			}
		}
		return nil
	case KListView:
		t := s.Starts[n.Var]
		if int64(len(t)) != 2*length {
			return fmt.Errorf("column %q: %d element ranges for %d rows", n.Name, len(t)/2, length)
		}
		c := n.Children[0]
		if c.node >= len(s.Meta.Nodes) {
			return fmt.Errorf("column %q: %d nodes in the batch, want more", n.Name, len(s.Meta.Nodes))
		}
		cl := s.Meta.Nodes[c.node].Length
		for i := 0; i < len(t); i += 2 {
			if t[i] < 0 || t[i] > t[i+1] || t[i+1] > cl {
				return fmt.Errorf("column %q: row %d's elements %d to %d of a child of %d", n.Name, i/2, t[i], t[i+1], cl)
			}
		}
		return s.check(c, cl, depth+1)
	case KFixedList:
		return s.check(n.Children[0], length*int64(n.Size), depth+1)
	case KStruct:
		for _, c := range n.Children {
			if err := s.check(c, length, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// span is the range of a Var node's children (or bytes) that row holds,
// from its starts t: shared bounds, or a pair a row under a list view.
func (n *Node) span(t []int64, row int64) (from, to int64) {
	if n.Paired {
		return t[2*row], t[2*row+1]
	}
	return t[row], t[row+1]
}

// checkRunEnd checks a KRunEnd node of length rows: its run ends and
// values nodes, and each row's run and value inside them.
func (s *Source) checkRunEnd(n *Node, length int64) error {
	m := s.Meta
	r, v := n.Runs, n.Values
	if v.node >= len(m.Nodes) || r.node >= len(m.Nodes) || v.buf+outBuffers(v.Kind)-1 >= len(m.Buffers) {
		return fmt.Errorf("column %q: fewer nodes or buffers in the batch than its runs need", n.Name)
	}
	runs := m.Nodes[r.node].Length
	if m.Nodes[v.node].Length != runs {
		return fmt.Errorf("column %q: %d run ends for %d values", n.Name, runs, m.Nodes[v.node].Length)
	}
	t := s.Starts[n.Var]
	if int64(len(t)) != 3*length {
		return fmt.Errorf("column %q: %d runs found for %d rows", n.Name, len(t)/3, length)
	}
	vb := func(k int) int64 { return s.buffer(v, k).Length }
	for i := 0; i < len(t); i += 3 {
		run, from, to := t[i], t[i+1], t[i+2]
		if run < 0 || run >= runs {
			return fmt.Errorf("column %q: row %d in run %d of %d", n.Name, i/3, run, runs)
		}
		if vb(0) > 0 && vb(0) <= run/8 {
			return fmt.Errorf("column %q: values validity of %d bytes for run %d", n.Name, vb(0), run)
		}
		ok := true
		switch v.Kind {
		case KFixed:
			ok = (run+1)*int64(v.Width) <= vb(1)
		case KBool:
			ok = run/8 < vb(1)
		case KBinary:
			ok = from >= 0 && from <= to && to <= vb(2)
		}
		if !ok {
			return fmt.Errorf("column %q: row %d's value outside its values buffers", n.Name, i/3)
		}
	}
	return nil
}

// runEnds finds the run of each element in elems but the last (one past
// the last row), from a KRunEnd node's run ends of width w; and for
// string values, each value's byte range from their offsets. Three
// numbers a row: run, from, to (Arrow's columnar format, "Run-End Encoded
// Layout": an element's run is the first whose end is past it).
func runEnds(n *Node, ends, voffs []byte, elems []int64) ([]int64, error) {
	w := int64(n.Runs.Width)
	nruns := int64(len(ends)) / w
	end := func(i int64) int64 {
		switch w {
		case 2:
			return int64(int16(binary.LittleEndian.Uint16(ends[i*2:])))
		case 4:
			return int64(int32(binary.LittleEndian.Uint32(ends[i*4:])))
		}
		return int64(binary.LittleEndian.Uint64(ends[i*8:]))
	}
	vw := int64(n.Values.Width)
	off := func(i int64) (int64, error) {
		v, ok := offsetAt(voffs, vw, i)
		if !ok {
			return 0, fmt.Errorf("column %q: values offsets of %d bytes, value %d asked", n.Name, len(voffs), i)
		}
		return v, nil
	}
	t := make([]int64, 0, 3*(len(elems)-1))
	for _, e := range elems[:len(elems)-1] {
		lo, hi := int64(0), nruns
		for lo < hi {
			mid := (lo + hi) / 2
			if end(mid) > e {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		if lo >= nruns {
			return nil, fmt.Errorf("column %q: element %d past the last run's end", n.Name, e)
		}
		from, to := int64(0), int64(0)
		if n.Values.Kind == KBinary {
			var err error
			if from, err = off(lo); err != nil {
				return nil, err
			}
			if to, err = off(lo + 1); err != nil {
				return nil, err
			}
		}
		t = append(t, lo, from, to)
	}
	return t, nil
}

// StartsFrom computes the child starts of every Var node of the layout
// from the batch's offsets buffers, read whole: offsets(n) returns Var
// node n's offsets buffer. Starts are what Cells needs of each row.
func (l *Layout) StartsFrom(m *BatchMeta, bodyLen int64, offsets func(n *Node) ([]byte, error)) ([][]int64, error) {
	starts := make([][]int64, l.Vars)
	if l.Vars == 0 {
		return starts, nil
	}
	// Starts take 8 bytes a row; a row of a variable-length column takes
	// at least an offset in the body.
	if m.Rows > bodyLen {
		return nil, fmt.Errorf("a batch of %d rows in a body of %d bytes", m.Rows, bodyLen)
	}
	rows := make([]int64, m.Rows+1)
	for i := range rows {
		rows[i] = int64(i)
	}
	src := &Source{Meta: m}
	var walk func(n *Node, s []int64) error
	walk = func(n *Node, s []int64) error {
		switch n.Kind {
		case KRunEnd:
			ends, err := offsets(n.Runs)
			if err != nil {
				return err
			}
			var voffs []byte
			if n.Values.Kind == KBinary {
				if voffs, err = offsets(n.Values); err != nil {
					return err
				}
			}
			t, err := runEnds(n, ends, voffs, s)
			if err != nil {
				return err
			}
			starts[n.Var] = t
		case KViews, KView:
			b, err := offsets(n)
			if err != nil {
				return err
			}
			ranges := viewRanges
			if n.Kind == KViews {
				ranges = viewsRanges
			}
			t, err := ranges(src, n, b, s)
			if err != nil {
				return err
			}
			starts[n.Var] = t
		case KBinary, KList:
			b, err := offsets(n)
			if err != nil {
				return err
			}
			w := int64(n.Width)
			t := make([]int64, len(s))
			for i, e := range s {
				var ok bool
				if t[i], ok = offsetAt(b, w, e); !ok {
					return fmt.Errorf("column %q: offsets buffer of %d bytes, element %d asked", n.Name, len(b), e)
				}
			}
			starts[n.Var] = t
			if n.Kind == KList {
				return walk(n.Children[0], t)
			}
		case KListView:
			// Its offsets and sizes (Arrow's "ListView Layout"): the sizes
			// are the buffer after the offsets.
			offs, err := offsets(n)
			if err != nil {
				return err
			}
			sn := *n
			sn.buf++
			sizes, err := offsets(&sn)
			if err != nil {
				return err
			}
			w := int64(n.Width)
			get := func(b []byte, e int64) (int64, error) {
				v, ok := offsetAt(b, w, e)
				if !ok {
					return 0, fmt.Errorf("column %q: offsets or sizes buffer of %d bytes, element %d asked", n.Name, len(b), e)
				}
				return v, nil
			}
			t := make([]int64, 0, 2*(len(s)-1))
			for _, e := range s[:len(s)-1] {
				o, err := get(offs, e)
				if err != nil {
					return err
				}
				z, err := get(sizes, e)
				if err != nil {
					return err
				}
				if o < 0 || z < 0 || o > math.MaxInt64-z {
					return fmt.Errorf("column %q: element %d of %d values at %d", n.Name, e, z, o)
				}
				t = append(t, o, o+z)
			}
			starts[n.Var] = t
			return walk(n.Children[0], t)
		case KFixedList:
			t := make([]int64, len(s))
			for i, e := range s {
				t[i] = e * int64(n.Size)
			}
			return walk(n.Children[0], t)
		case KStruct:
			for _, c := range n.Children {
				if err := walk(c, s); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, n := range l.Columns {
		if err := walk(n, rows); err != nil {
			if errors.Is(err, ErrUnreadRow) {
				err = fmt.Errorf("column %q: %w", n.Name, err)
			}
			return nil, err
		}
	}
	return starts, nil
}

// viewRanges finds where each element's bytes are in a KView node's batch
// (elems are its rows' elements, one each, and one past the last): inline
// in its 16-byte view when it is 12 bytes or shorter, else at the view's
// buffer index and offset (Arrow's columnar format, "Variable-size Binary
// View Layout"). The ranges are body offsets and lengths, two per row.
func viewRanges(s *Source, n *Node, views []byte, elems []int64) ([]int64, error) {
	m := s.Meta
	if n.views >= len(m.Variadic) {
		return nil, fmt.Errorf("column %q: no count of its data buffers in the batch", n.Name)
	}
	nbuf := m.Variadic[n.views]
	first := n.buf
	for _, c := range m.Variadic[:n.views] {
		first += int(c)
	}
	if nbuf < 0 || int64(first)+2+nbuf > int64(len(m.Buffers)) {
		return nil, fmt.Errorf("column %q: %d data buffers, the batch has %d buffers", n.Name, nbuf, len(m.Buffers))
	}
	vb := s.buffer(n, 1)
	t := make([]int64, 0, 2*(len(elems)-1))
	for _, e := range elems[:len(elems)-1] {
		if e < 0 || (e+1)*16 > int64(len(views)) {
			return nil, fmt.Errorf("column %q: views buffer of %d bytes, element %d asked", n.Name, len(views), e)
		}
		v := views[e*16:]
		size := int64(int32(binary.LittleEndian.Uint32(v)))
		switch {
		case size < 0:
			return nil, fmt.Errorf("column %q: view of %d bytes at element %d", n.Name, size, e)
		case size <= 12:
			t = append(t, vb.Offset+e*16+4, size)
		default:
			k := int64(int32(binary.LittleEndian.Uint32(v[8:])))
			off := int64(int32(binary.LittleEndian.Uint32(v[12:])))
			if k < 0 || k >= nbuf {
				return nil, fmt.Errorf("column %q: view of element %d in data buffer %d of %d", n.Name, e, k, nbuf)
			}
			db := s.buffer(n, 2+int(k))
			if off < 0 || off > db.Length || size > db.Length-off {
				return nil, fmt.Errorf("column %q: view of element %d (%d bytes at %d) outside its data buffer of %d bytes", n.Name, e, size, off, db.Length)
			}
			t = append(t, db.Offset+off, size)
		}
	}
	return t, nil
}

// viewsStride is the numbers a KViews node keeps a row: two (data buffer
// or -1, body from, body to), and the total length of its values.
const viewsStride = 7

// viewsRanges finds, for each row of a KViews node (its elements are
// bounds, or pairs if Paired), the data buffers its views' bytes lie in
// (at most two) and the body range of each that holds them, and their
// total length. A row whose values lie in three data buffers or more is
// not read.
func viewsRanges(s *Source, n *Node, views []byte, elems []int64) ([]int64, error) {
	m := s.Meta
	if n.views >= len(m.Variadic) {
		return nil, fmt.Errorf("column %q: no count of its data buffers in the batch", n.Name)
	}
	nbuf := m.Variadic[n.views]
	first := n.buf
	for _, c := range m.Variadic[:n.views] {
		first += int(c)
	}
	if nbuf < 0 || int64(first)+2+nbuf > int64(len(m.Buffers)) {
		return nil, fmt.Errorf("column %q: %d data buffers, the batch has %d buffers", n.Name, nbuf, len(m.Buffers))
	}
	rows := int64(len(elems) - 1)
	if n.Paired {
		rows = int64(len(elems) / 2)
	}
	t := make([]int64, 0, viewsStride*rows)
	for r := range rows {
		lo, hi := n.span(elems, r)
		if lo < 0 || hi < lo || hi*16 > int64(len(views)) {
			return nil, fmt.Errorf("column %q: views buffer of %d bytes, elements %d to %d asked", n.Name, len(views), lo, hi)
		}
		span := [6]int64{-1, 0, 0, -1, 0, 0}
		total := int64(0)
		for e := lo; e < hi; e++ {
			v := views[e*16:]
			size := int64(int32(binary.LittleEndian.Uint32(v)))
			if size < 0 {
				return nil, fmt.Errorf("column %q: view of %d bytes at element %d", n.Name, size, e)
			}
			total += size
			if size <= 12 {
				continue
			}
			bk := int64(int32(binary.LittleEndian.Uint32(v[8:])))
			off := int64(int32(binary.LittleEndian.Uint32(v[12:])))
			if bk < 0 || bk >= nbuf {
				return nil, fmt.Errorf("column %q: view of element %d in data buffer %d of %d", n.Name, e, bk, nbuf)
			}
			db := s.buffer(n, 2+int(bk))
			if off < 0 || off > db.Length || size > db.Length-off {
				return nil, fmt.Errorf("column %q: view of element %d (%d bytes at %d) outside its data buffer of %d bytes", n.Name, e, size, off, db.Length)
			}
			a, b := db.Offset+off, db.Offset+off+size
			switch {
			case span[0] == -1 || span[0] == bk:
				if span[0] == -1 {
					span[0], span[1], span[2] = bk, a, b
				}
				span[1], span[2] = min(span[1], a), max(span[2], b)
			case span[3] == -1 || span[3] == bk:
				if span[3] == -1 {
					span[3], span[4], span[5] = bk, a, b
				}
				span[4], span[5] = min(span[4], a), max(span[5], b)
			default:
				return nil, fmt.Errorf("row %d's values lie in data buffers %d, %d and %d, more than riffle reads in a row: %w", r, span[0], span[3], bk, ErrUnreadRow)
			}
		}
		t = append(t, span[:]...)
		t = append(t, total)
	}
	return t, nil
}

// OffsetsBuffer is a Var node's offsets buffer in s (a KView's views; a
// KFixed's data, for a KRunEnd's run ends; with buf one further, a
// KListView's sizes).
func (s *Source) OffsetsBuffer(n *Node) (BufferLoc, bool) {
	if n.Kind != KBinary && n.Kind != KList && n.Kind != KView && n.Kind != KFixed && n.Kind != KListView && n.Kind != KViews {
		return BufferLoc{}, false
	}
	i := n.buf + 1
	for _, c := range s.Meta.Variadic[:min(n.views, len(s.Meta.Variadic))] {
		i += int(c)
	}
	if i >= len(s.Meta.Buffers) {
		return BufferLoc{}, false
	}
	return s.Meta.Buffers[i], true
}

// SourceOf lays an array of a one-column layout's column out as a record
// batch in memory: its buffers copied back to back into a body, with its
// nodes, buffers and row starts, so that rows are cut from it as from a
// file's record batch. The array may be a slice (its offset is honoured).
func SourceOf(l *Layout, arr arrow.Array) (*Source, []byte, error) {
	if len(l.Columns) != 1 {
		return nil, nil, fmt.Errorf("a source of one column, for a layout of %d", len(l.Columns))
	}
	n := l.Columns[0]
	if arr.Data().Offset() != 0 || hasOffset(arr.Data()) {
		var err error
		if arr, err = array.Concatenate([]arrow.Array{arr}, memory.DefaultAllocator); err != nil {
			return nil, nil, err
		}
		defer arr.Release()
	}
	m := &BatchMeta{Rows: int64(arr.Len())}
	var body []byte
	put := func(b []byte) {
		m.Buffers = append(m.Buffers, BufferLoc{int64(len(body)), int64(len(b))})
		body = append(body, b...)
		body = append(body, make([]byte, int(pad8(int64(len(body))))-len(body))...)
	}
	buf := func(d arrow.ArrayData, i int) []byte {
		bs := d.Buffers()
		if i >= len(bs) || bs[i] == nil {
			return nil
		}
		return bs[i].Bytes()
	}
	var walk func(n *Node, d arrow.ArrayData) error
	walk = func(n *Node, d arrow.ArrayData) error {
		m.Nodes = append(m.Nodes, FieldNode{int64(d.Len()), int64(d.NullN())})
		valid := buf(d, 0)
		if d.NullN() == 0 {
			valid = nil
		}
		switch n.Kind {
		case KNull:
			return nil
		case KFixed, KBool, KDict:
			put(valid)
			put(buf(d, 1))
		case KBinary:
			put(valid)
			put(buf(d, 1))
			put(buf(d, 2))
		case KList:
			put(valid)
			put(buf(d, 1))
		case KFixedList, KStruct:
			put(valid)
		}
		kids := d.Children()
		if len(kids) != len(n.Children) {
			return fmt.Errorf("column %q: an array of %d children for a type of %d", n.Name, len(kids), len(n.Children))
		}
		for i, c := range n.Children {
			if err := walk(c, kids[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(n, arr.Data()); err != nil {
		return nil, nil, err
	}
	s := &Source{Meta: m}
	var err error
	s.Starts, err = l.StartsFrom(m, int64(len(body)), func(v *Node) ([]byte, error) {
		b, ok := s.OffsetsBuffer(v)
		if !ok {
			return nil, fmt.Errorf("column %q: no offsets buffer", v.Name)
		}
		return body[b.Offset : b.Offset+b.Length], nil
	})
	if err != nil {
		return nil, nil, err
	}
	if err := l.Check(s, int64(len(body))); err != nil {
		return nil, nil, err
	}
	return s, body, nil
}

func hasOffset(d arrow.ArrayData) bool {
	if d.Offset() != 0 {
		return true
	}
	for _, c := range d.Children() {
		if hasOffset(c) {
			return true
		}
	}
	return false
}

// offsetAt reads element e of a buffer of w-byte (4 or 8) little-endian
// signed offsets (or sizes), and says false if e lies outside it.
func offsetAt(b []byte, w, e int64) (int64, bool) {
	if e < 0 || (e+1)*w > int64(len(b)) {
		return 0, false
	}
	if w == 4 {
		return int64(int32(binary.LittleEndian.Uint32(b[e*4:]))), true
	}
	return int64(binary.LittleEndian.Uint64(b[e*8:])), true
}
