package columnar

import (
	"errors"
	"fmt"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
)

// Kind is how an array's buffers hold its elements.
type Kind uint8

const (
	KNull      Kind = iota // no buffers
	KFixed                 // validity, data of Width bytes per element
	KBool                  // validity, data bits
	KBinary                // validity, offsets (Width 4 or 8), data bytes
	KList                  // validity, offsets (Width 4 or 8), one child
	KFixedList             // validity, one child of Size elements per element
	KStruct                // validity, children
	KDict                  // validity, indices (Width bytes); values from a dictionary batch
	KView                  // validity, views of 16 bytes, variadic data buffers; read as KBinary (Width 4)
	KRunEnd                // no buffers; Runs (run ends of Width bytes) and Values; read as its values' kind
	KListView              // validity, offsets and sizes (Width 4 or 8), one child; read as KList
	KViews                 // a KView under a list: a row's views, and a range of each of the (at most two) data buffers their bytes lie in; read as KBinary
)

// Node is one array of a column's tree, as a record batch lays it out:
// nodes and buffers in pre-order.
type Node struct {
	Kind     Kind
	Width    int // KFixed: bytes per element; KBinary, KList: offset bytes; KDict: index bytes
	Size     int // KFixedList: elements per element
	Children []*Node
	Type     arrow.DataType // the source's type
	Name     string
	Nullable bool
	// Var numbers the KBinary, KList and KView nodes of the projection:
	// their rows' child starts (a KView's rows' byte ranges) are kept in
	// the index.
	Var    int
	DictID int64
	// Paired marks a node under a list view: a row's elements are not
	// where the next row's begin, so its Var starts are two a row (first,
	// end) instead of rows+1 shared bounds.
	Paired bool
	// Values is KDict's value node (KFixed, KBool or KBinary), and
	// KRunEnd's values child (one of those too); Runs is KRunEnd's run ends
	// child (KFixed).
	Values *Node
	Runs   *Node
	// ViewValues marks a dictionary's values node whose values the file
	// holds as views (string_view, binary_view): a dictionary batch's
	// buffers are then validity, views and the views' data buffers.
	ViewValues bool

	node, buf int // its first node and buffer among the record batch's
	views     int // view-typed fields before it (their buffers vary per batch)
}

// Cells is the number of buffers of the node's tree: the byte ranges each
// row has in it.
func (n *Node) Cells() int {
	c := 0
	switch n.Kind {
	case KNull:
	case KFixed, KBool, KList, KDict:
		c = 2
	case KBinary:
		c = 3
	case KView:
		c = 2 // validity, the value's bytes
	case KViews:
		c = 4 // validity, the row's views, the ranges of the two data buffers that hold their bytes
	case KRunEnd:
		c = 2 // its run's validity byte, its run's value (bytes or the byte of its bit)
	case KFixedList, KStruct, KListView:
		c = 1 // KListView: validity; its offsets are written anew
	}
	for _, k := range n.Children {
		c += k.Cells()
	}
	return c
}

// Layout is a projection of a schema: the columns a job reads, and where
// their nodes and buffers sit among every column's.
type Layout struct {
	Schema   *arrow.Schema // the source's
	Columns  []*Node       // the projected columns, in the order asked
	Vars     int           // KBinary and KList nodes among them
	NumCells int           // byte ranges per row
	dicts    []int64       // every dictionary-encoded field's id, pre-order
}

// ErrNoColumn is a column asked for by name that the data has not.
var ErrNoColumn = errors.New("no column")

// NewLayout lays out every column of schema riffle can read, skipping the
// others (their fields are returned: a caller opening every column refuses
// them with an UnreadError rather than dropping them unseen). dictIDs are the schema's dictionary
// ids in pre-order of its fields (ParseSchema). Every Var node is numbered:
// an index keeps the row starts of all of them, whichever columns a job
// then reads (Project).
func NewLayout(schema *arrow.Schema, dictIDs []int64) (*Layout, []arrow.Field, error) {
	l := &Layout{Schema: schema, dicts: dictIDs}
	c := &counter{dictIDs: dictIDs}
	var skipped []arrow.Field
	for _, f := range schema.Fields() {
		saved := *c
		n, err := c.node(f, true, 0)
		if err != nil {
			// Not readable: count its nodes and buffers all the same.
			*c = saved
			if _, err := c.node(f, false, 0); err != nil {
				return nil, nil, err
			}
			skipped = append(skipped, f)
			continue
		}
		l.Columns = append(l.Columns, n)
	}
	for _, n := range l.Columns {
		l.NumCells += n.Cells()
		l.numberVars(n)
	}
	return l, skipped, nil
}

// Project is the layout of the named columns (all that NewLayout kept, if
// names is empty), sharing l's nodes and their numbering.
func (l *Layout) Project(names []string) (*Layout, error) {
	p := &Layout{Schema: l.Schema, Vars: l.Vars, dicts: l.dicts}
	if len(names) == 0 {
		p.Columns = l.Columns
	}
	seen := map[string]bool{}
	for _, name := range names {
		if seen[name] {
			return nil, fmt.Errorf("column %q asked twice", name)
		}
		seen[name] = true
		var found *Node
		for _, n := range l.Columns {
			if n.Name == name {
				found = n
				break
			}
		}
		if found == nil {
			if fs, ok := l.Schema.FieldsByName(name); ok && len(fs) > 0 {
				return nil, fmt.Errorf("column %q: type %s is not read by riffle (leave it out of columns=)", name, fs[0].Type)
			}
			return nil, fmt.Errorf("%w %q (the columns are %v)", ErrNoColumn, name, fieldNames(l.Schema))
		}
		p.Columns = append(p.Columns, found)
	}
	if len(p.Columns) == 0 {
		return nil, fmt.Errorf("no column riffle reads (the columns are %v)", fieldNames(l.Schema))
	}
	for _, n := range p.Columns {
		p.NumCells += n.Cells()
	}
	return p, nil
}

// UnreadError is a dataset opened with every column (no list of columns)
// whose schema holds columns riffle cannot read yet. It is refused whole:
// a column left out unseen would look, to a training job, like a dataset
// without it. The message names each such column and its type, and the
// list of columns that reads the others.
type UnreadError struct {
	Unread   []arrow.Field
	Readable []string
}

func (e *UnreadError) Error() string {
	var b strings.Builder
	b.WriteString("column")
	if len(e.Unread) > 1 {
		b.WriteString("s")
	}
	for i, f := range e.Unread {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %q (%s)", f.Name, TypeBrief(f.Type))
	}
	b.WriteString(" cannot be read yet")
	if len(e.Readable) == 0 {
		b.WriteString(", and no other column can")
		return b.String()
	}
	b.WriteString("; pass columns=[")
	for i, n := range e.Readable {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%q", n)
	}
	b.WriteString("] to read the others")
	return b.String()
}

// TypeBrief names a type for a message as pyarrow prints it, which is
// what a user knows (arrow-go says utf8 for string), with a struct by its
// fields' names alone: struct<bytes, path>.
func TypeBrief(t arrow.DataType) string {
	switch tt := t.(type) {
	case *arrow.StructType:
		names := make([]string, tt.NumFields())
		for i, f := range tt.Fields() {
			names[i] = f.Name
		}
		return "struct<" + strings.Join(names, ", ") + ">"
	case *arrow.MapType:
		return "map<" + TypeBrief(tt.KeyType()) + ", " + TypeBrief(tt.ItemType()) + ">"
	case *arrow.ListType:
		return "list<" + TypeBrief(tt.Elem()) + ">"
	case *arrow.LargeListType:
		return "large_list<" + TypeBrief(tt.Elem()) + ">"
	case *arrow.ListViewType:
		return "list_view<" + TypeBrief(tt.Elem()) + ">"
	case *arrow.LargeListViewType:
		return "large_list_view<" + TypeBrief(tt.Elem()) + ">"
	case *arrow.StringType:
		return "string"
	case *arrow.LargeStringType:
		return "large_string"
	}
	return t.String()
}

// Names are the names of the layout's columns.
func (l *Layout) Names() []string {
	out := make([]string, len(l.Columns))
	for i, n := range l.Columns {
		out[i] = n.Name
	}
	return out
}

func fieldNames(s *arrow.Schema) []string {
	out := make([]string, s.NumFields())
	for i, f := range s.Fields() {
		out[i] = f.Name
	}
	return out
}

func (l *Layout) numberVars(n *Node) {
	if n.Kind == KBinary || n.Kind == KList || n.Kind == KView || n.Kind == KRunEnd || n.Kind == KListView || n.Kind == KViews {
		n.Var = l.Vars
		l.Vars++
	}
	for _, k := range n.Children {
		l.numberVars(k)
	}
}

// counter walks every field in pre-order, counting nodes, buffers, view
// fields and dictionaries, and builds nodes for the projected ones.
type counter struct {
	nodes, bufs, views, dicts int
	dictIDs                   []int64
	inList                    int // lists around the node: a view there is not read
	inView                    int // list views around the node: its starts are paired
}

func (c *counter) node(f arrow.Field, build bool, depth int) (*Node, error) {
	if depth > 64 {
		return nil, fmt.Errorf("column %q: nested more than 64 deep", f.Name)
	}
	t := f.Type
	if ext, ok := t.(arrow.ExtensionType); ok {
		t = ext.StorageType()
	}
	n := &Node{Type: f.Type, Name: f.Name, Nullable: f.Nullable, Var: -1, node: c.nodes, buf: c.bufs, views: c.views, Paired: c.inView > 0}
	c.nodes++
	unsupported := func() (*Node, error) {
		if build {
			return nil, fmt.Errorf("column %q: type %s is not read by riffle (leave it out of columns=)", f.Name, f.Type)
		}
		return nil, nil
	}
	var kids []arrow.Field
	switch tt := t.(type) {
	case *arrow.NullType:
		n.Kind = KNull
	case *arrow.BooleanType:
		n.Kind = KBool
		c.bufs += 2
	case *arrow.DictionaryType:
		n.Kind = KDict
		n.Width = tt.IndexType.(arrow.FixedWidthDataType).BitWidth() / 8
		c.bufs += 2
		if c.dicts >= len(c.dictIDs) {
			return nil, fmt.Errorf("column %q: the schema names fewer dictionaries than it has", f.Name)
		}
		n.DictID = c.dictIDs[c.dicts]
		c.dicts++
		if build {
			v := &Node{Type: tt.ValueType, Name: f.Name, Nullable: true, Var: -1}
			switch vt := tt.ValueType.(type) {
			case *arrow.BooleanType:
				v.Kind = KBool
			case *arrow.StringType, *arrow.BinaryType:
				v.Kind, v.Width = KBinary, 4
			case *arrow.LargeStringType, *arrow.LargeBinaryType:
				v.Kind, v.Width = KBinary, 8
			case *arrow.StringViewType, *arrow.BinaryViewType:
				// Polars' Categorical: the dictionary's values are views,
				// read into offsets and bytes once (NewDict).
				v.Kind, v.Width, v.ViewValues = KBinary, 4, true
			case arrow.FixedWidthDataType:
				if vt.BitWidth()%8 != 0 {
					return unsupported()
				}
				v.Kind, v.Width = KFixed, vt.BitWidth()/8
			default:
				return unsupported()
			}
			n.Values = v
		}
	case *arrow.StringType, *arrow.BinaryType:
		n.Kind, n.Width = KBinary, 4
		c.bufs += 3
	case *arrow.LargeStringType, *arrow.LargeBinaryType:
		n.Kind, n.Width = KBinary, 8
		c.bufs += 3
	case *arrow.ListType:
		n.Kind, n.Width, kids = KList, 4, []arrow.Field{tt.ElemField()}
		c.bufs += 2
	case *arrow.LargeListType:
		n.Kind, n.Width, kids = KList, 8, []arrow.Field{tt.ElemField()}
		c.bufs += 2
	case *arrow.MapType:
		n.Kind, n.Width, kids = KList, 4, []arrow.Field{tt.ElemField()}
		c.bufs += 2
	case *arrow.FixedSizeListType:
		n.Kind, n.Size, kids = KFixedList, int(tt.Len()), []arrow.Field{tt.ElemField()}
		c.bufs++
	case *arrow.StructType:
		n.Kind, kids = KStruct, tt.Fields()
		c.bufs++
	case *arrow.StringViewType, *arrow.BinaryViewType:
		// A row holds one view where no list is around it: its bytes are
		// one range (inside the view, or in a data buffer), found when the
		// file is indexed. Under a list, a row's views are many.
		c.bufs += 2
		c.views++
		n.Kind, n.Width = KView, 4
		if c.inList > 0 {
			// Under a list a row's views are many: their bytes are read as
			// a range of each data buffer they lie in, at most two, since
			// writers (pyarrow, Polars) fill buffers in element order and
			// start a new one when one is full.
			n.Kind = KViews
		}
	case *arrow.ListViewType, *arrow.LargeListViewType:
		// A row is one range of its child's elements where no list is
		// around it (its offset and size, kept in the index), and is
		// written out as a list. Rows' ranges may be in any order, so the
		// nodes below keep two starts a row (Paired).
		c.bufs += 3
		elem := tt.(arrow.ListLikeType).ElemField()
		readable := build && c.inList == 0
		c.inList++
		c.inView++
		kn, err := c.node(elem, readable, depth+1)
		c.inList--
		c.inView--
		if err != nil || !readable {
			if err != nil {
				return nil, err
			}
			return unsupported()
		}
		n.Kind, n.Width, n.Children = KListView, 4, []*Node{kn}
		if tt.ID() == arrow.LARGE_LIST_VIEW {
			n.Width = 8
		}
		return n, nil
	case arrow.UnionType:
		c.bufs++
		if tt.Mode() == arrow.DenseMode {
			c.bufs++
		}
		for _, k := range tt.Fields() {
			if _, err := c.node(k, false, depth+1); err != nil {
				return nil, err
			}
		}
		return unsupported()
	case *arrow.RunEndEncodedType:
		// A row is one element of one run where no list is around it: the
		// run, found when the file is indexed, gives its value. Values of a
		// fixed width, booleans and strings are read; the run's value is
		// written out as a plain column of the values' type, as pyarrow's
		// to_pylist gives it.
		fields := []arrow.Field{{Name: "run_ends", Type: tt.RunEnds()}, {Name: "values", Type: tt.Encoded(), Nullable: true}}
		readable := build && c.inList == 0
		if readable {
			switch vt := tt.Encoded().(type) {
			case *arrow.DictionaryType:
				readable = false
			case *arrow.BooleanType, *arrow.StringType, *arrow.BinaryType, *arrow.LargeStringType, *arrow.LargeBinaryType:
			case arrow.FixedWidthDataType:
				readable = vt.BitWidth()%8 == 0 && vt.BitWidth() > 0
			default:
				readable = false
			}
		}
		kids := make([]*Node, 2)
		for i, k := range fields {
			kn, err := c.node(k, readable, depth+1)
			if err != nil {
				return nil, err
			}
			kids[i] = kn
		}
		if !readable {
			return unsupported()
		}
		n.Kind, n.Runs, n.Values, n.Width = KRunEnd, kids[0], kids[1], kids[0].Width
		return n, nil
	case arrow.FixedWidthDataType:
		n.Kind = KFixed
		c.bufs += 2
		if tt.BitWidth()%8 != 0 || tt.BitWidth() == 0 {
			return unsupported()
		}
		n.Width = tt.BitWidth() / 8
	default:
		return nil, fmt.Errorf("column %q: type %s has no layout riffle knows (not even to skip it)", f.Name, f.Type)
	}
	if n.Kind == KList || n.Kind == KFixedList {
		c.inList++
		defer func() { c.inList-- }()
	}
	for _, k := range kids {
		kn, err := c.node(k, build, depth+1)
		if err != nil {
			return nil, err
		}
		if build {
			n.Children = append(n.Children, kn)
		}
	}
	if !build {
		return nil, nil
	}
	return n, nil
}

// OutputType is the type a column's rows reach the user as: its own, with
// dictionaries decoded.
func (n *Node) OutputType() arrow.DataType {
	switch n.Kind {
	case KDict:
		if n.Values.ViewValues { // read into offsets and bytes: a string column
			if n.Values.Type.ID() == arrow.STRING_VIEW {
				return arrow.BinaryTypes.String
			}
			return arrow.BinaryTypes.Binary
		}
		return n.Values.Type
	case KRunEnd:
		return n.Values.OutputType()
	case KListView:
		if n.Width == 8 {
			return arrow.LargeListOfField(n.Children[0].outputField())
		}
		return arrow.ListOfField(n.Children[0].outputField())
	case KList:
		el := n.Children[0].outputField()
		switch n.Type.ID() {
		case arrow.LARGE_LIST:
			return arrow.LargeListOfField(el)
		case arrow.MAP:
			st := el.Type.(*arrow.StructType)
			m := arrow.MapOfFields(st.Field(0), st.Field(1))
			m.KeysSorted = n.Type.(*arrow.MapType).KeysSorted
			return m
		}
		return arrow.ListOfField(el)
	case KView, KViews:
		t := n.Type
		if ext, ok := t.(arrow.ExtensionType); ok {
			t = ext.StorageType()
		}
		if t.ID() == arrow.STRING_VIEW {
			return arrow.BinaryTypes.String
		}
		return arrow.BinaryTypes.Binary
	case KFixedList:
		return arrow.FixedSizeListOfField(int32(n.Size), n.Children[0].outputField())
	case KStruct:
		fs := make([]arrow.Field, len(n.Children))
		for i, k := range n.Children {
			fs[i] = k.outputField()
		}
		return arrow.StructOf(fs...)
	}
	return n.Type
}

func (n *Node) outputField() arrow.Field {
	return arrow.Field{Name: n.Name, Type: n.OutputType(), Nullable: n.Nullable}
}

// OutputSchema is the schema of the batches a layout's rows are written as.
func (l *Layout) OutputSchema() *arrow.Schema {
	fs := make([]arrow.Field, len(l.Columns))
	for i, n := range l.Columns {
		f := n.outputField()
		if src, ok := l.Schema.FieldsByName(n.Name); ok && len(src) > 0 {
			f.Metadata = src[0].Metadata
		}
		fs[i] = f
	}
	md := l.Schema.Metadata()
	return arrow.NewSchema(fs, &md)
}

// Column describes an output column for a reader without an Arrow
// library: how its buffers hold its elements.
type Column struct {
	Name     string   `json:"name"`
	Type     string   `json:"type"`            // Arrow's name of the type
	Layout   string   `json:"layout"`          // null, fixed, bool, binary, utf8, list, fixed_list, struct
	Dtype    string   `json:"dtype,omitempty"` // fixed: the numpy dtype of an element
	Width    int      `json:"width,omitempty"` // fixed: bytes per element; binary, list: bytes per offset
	Size     int      `json:"size,omitempty"`  // fixed_list: elements per element
	Nullable bool     `json:"nullable"`
	Children []Column `json:"children,omitempty"`
}

// Describe describes the layout's output columns.
func (l *Layout) Describe() []Column {
	out := make([]Column, len(l.Columns))
	for i, n := range l.Columns {
		out[i] = n.describe()
	}
	return out
}

func (n *Node) describe() Column {
	t := n.OutputType()
	c := Column{Name: n.Name, Type: t.String(), Nullable: n.Nullable}
	kind, width := n.Kind, n.Width
	if kind == KDict || kind == KRunEnd {
		kind, width = n.Values.Kind, n.Values.Width
	}
	if kind == KView || kind == KViews {
		kind = KBinary
	}
	if kind == KListView {
		kind = KList
	}
	switch kind {
	case KNull:
		c.Layout = "null"
	case KBool:
		c.Layout = "bool"
	case KFixed:
		c.Layout, c.Width, c.Dtype = "fixed", width, numpyDtype(t, width)
	case KBinary:
		c.Layout, c.Width = "binary", width
		if id := t.ID(); id == arrow.STRING || id == arrow.LARGE_STRING {
			c.Layout = "utf8"
		}
	case KList:
		c.Layout, c.Width = "list", width
	case KFixedList:
		c.Layout, c.Size = "fixed_list", n.Size
	case KStruct:
		c.Layout = "struct"
	}
	for _, k := range n.Children {
		c.Children = append(c.Children, k.describe())
	}
	return c
}

// numpyDtype names the numpy dtype of a fixed-width Arrow type: numbers
// as themselves, times as datetime64/timedelta64 in their unit, anything
// else as raw bytes.
func numpyDtype(t arrow.DataType, width int) string {
	switch t.ID() {
	case arrow.INT8:
		return "|i1"
	case arrow.UINT8:
		return "|u1"
	case arrow.INT16:
		return "<i2"
	case arrow.UINT16:
		return "<u2"
	case arrow.INT32:
		return "<i4"
	case arrow.UINT32:
		return "<u4"
	case arrow.INT64:
		return "<i8"
	case arrow.UINT64:
		return "<u8"
	case arrow.FLOAT16:
		return "<f2"
	case arrow.FLOAT32:
		return "<f4"
	case arrow.FLOAT64:
		return "<f8"
	case arrow.DATE32:
		return "<i4" // days; numpy's datetime64 has no 32-bit form
	case arrow.DATE64:
		return "<M8[ms]"
	case arrow.TIMESTAMP:
		return "<M8[" + t.(*arrow.TimestampType).Unit.String() + "]"
	case arrow.DURATION:
		return "<m8[" + t.(*arrow.DurationType).Unit.String() + "]"
	case arrow.TIME32, arrow.TIME64:
		return fmt.Sprintf("<i%d", width)
	}
	return fmt.Sprintf("|V%d", width)
}

// Compose is the layout of columns that keep their own sources (each a
// one-column layout's, its nodes and buffers numbered from 0): a batch's
// rows then name each column's source (RowRef.Cols).
func Compose(schema *arrow.Schema, cols []*Node) *Layout {
	l := &Layout{Schema: schema, Columns: cols}
	for _, n := range cols {
		l.NumCells += n.Cells()
	}
	return l
}
