package loader

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/transform"
)

// Transforms of rows. A transform turns one record's bytes into its
// output; a row is columns. On a dataset of rows a transform reads one
// column (a binary column, or the bytes of a Hugging Face Image, a
// struct<bytes, path>), and its outputs take that column's place in the
// batch: a fixed-size list of Size bytes a row, typed as Arrow's
// canonical fixed_shape_tensor of the transform's shape, so that pyarrow
// reads the column as a tensor (to_numpy_ndarray: (n, *shape), a view of
// the batch) and numpy alone as an (n, Size) array; the other columns come
// as they are read.
//
// A batch's rows are put together as without a transform (the dataset's
// RowBatch.Assemble), into a staging message, where the column's values
// are found. The batch's message is written anew from the staging
// message's other columns (the columnar package's Message and Assemble, as
// for any rows), the outputs' buffer left empty, and each value is then
// transformed on the workers straight into its row's place there. Its
// size is known before any read: the other columns' planned buffers and
// the outputs'.

// tensorExtension types the outputs' column: Arrow's canonical
// extension, over a fixed-size list of uint8, that pyarrow reads as a
// tensor of the shape in its metadata.
const tensorExtension = "arrow.fixed_shape_tensor"

// rowTransform is a transform of one column of a dataset of rows.
type rowTransform struct {
	tf   Transform
	name string
	col  int // the column's index among the dataset's batches' columns
	// full lays out the dataset's batches (as staged), cols each of its
	// columns alone (for their cells), bufs each column's first buffer
	// among the batch's (and the count at the end).
	full *columnar.Layout
	cols []*columnar.Layout
	bufs []int
	// value and valid are the column's cells (of its own) that hold a
	// row's value bytes, and its validity bits: a 0 bit is a null value.
	value int
	valid []int
	// out lays out the batches written, tensor the outputs' column alone;
	// data is the outputs' buffer among out's buffers.
	out, tensor *columnar.Layout
	data        int
	elems       int // elements of an output (its bytes, or its float32s)
	meta        int // the prefix and metadata of out's messages
	schema      []byte
	columns     []columnar.Column
}

// valueCells says where column c of a layout keeps a row's value bytes
// among its cells, and its validity bits: a binary column's data, or the
// data of the binary child "bytes" of a struct (an HF Image). ok is false
// for a column of another type.
func valueCells(n *columnar.Node) (value int, valid []int, ok bool) {
	switch n.Kind {
	case columnar.KBinary:
		return 2, []int{0}, true
	case columnar.KStruct:
		at := 1 // after the struct's validity
		for _, k := range n.Children {
			if k.Name == "bytes" && k.Kind == columnar.KBinary {
				return at + 2, []int{0, at}, true
			}
			at += k.Cells()
		}
	}
	return 0, nil, false
}

// imageFeatures are the columns whose Hugging Face feature is Image.
func imageFeatures(features string) []string {
	var fs map[string]struct {
		Type string `json:"_type"`
	}
	if json.Unmarshal([]byte(features), &fs) != nil {
		return nil
	}
	var out []string
	for name, f := range fs {
		if f.Type == "Image" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// RowsColumn is the column of ds a transform reads: name, checked to be
// a binary column or an image's struct<bytes, path>; or, when name is "",
// the dataset's only column whose Hugging Face feature is Image, else its
// only column of either type. An error names the column, or the
// candidates.
func RowsColumn(ds dataset.Rows, name string) (string, error) {
	inf := ds.Info()
	var names, readable []string
	kinds := map[string]string{}
	for _, c := range inf.Columns {
		names = append(names, c.Name)
		kinds[c.Name] = c.Type
		if c.Layout == "binary" || c.Layout == "struct" && slices.ContainsFunc(c.Children, func(k columnar.Column) bool {
			return k.Name == "bytes" && k.Layout == "binary"
		}) {
			readable = append(readable, c.Name)
		}
	}
	if name != "" {
		if _, ok := kinds[name]; !ok {
			return "", fmt.Errorf("transform on rows: column=%q: no such column in %s (its columns: %s)", name, inf.Format, strings.Join(names, ", "))
		}
		if !slices.Contains(readable, name) {
			return "", fmt.Errorf("transform on rows: column=%q is %s, not binary nor an image (struct<bytes, path>): a transform reads a record's bytes", name, kinds[name])
		}
		return name, nil
	}
	var images []string
	for _, f := range imageFeatures(inf.Features) {
		if slices.Contains(readable, f) {
			images = append(images, f)
		}
	}
	switch {
	case len(images) == 1:
		return images[0], nil
	case len(images) == 0 && len(readable) == 1:
		return readable[0], nil
	case len(readable) == 0:
		return "", fmt.Errorf("transform on rows: no column of %s is binary or an image (its columns: %s)", inf.Format, strings.Join(names, ", "))
	}
	if len(images) > 1 {
		readable = images
	}
	return "", fmt.Errorf("transform on rows: name the column it reads with column= in the transform (image:...,column=NAME): %s has %s",
		inf.Format, strings.Join(readable, ", "))
}

// newRowTransform makes tf's transform of column name of ds.
func newRowTransform(ds dataset.Rows, tf Transform, name string) (*rowTransform, error) {
	var err error
	if name, err = RowsColumn(ds, name); err != nil {
		return nil, err
	}
	rd, err := ipc.NewReader(bytes.NewReader(ds.Info().Schema))
	if err != nil {
		return nil, fmt.Errorf("the batches' schema: %w", err)
	}
	staged := rd.Schema()
	rd.Release()
	full, _, err := columnar.NewLayout(staged, nil)
	if err != nil {
		return nil, err
	}
	if len(full.Columns) != len(staged.Fields()) {
		return nil, fmt.Errorf("the batches' schema has %d fields, %d laid out", len(staged.Fields()), len(full.Columns))
	}
	r := &rowTransform{tf: tf, name: name, col: -1, full: full, bufs: []int{0}}
	for c, n := range full.Columns {
		r.cols = append(r.cols, columnar.Compose(staged, []*columnar.Node{n}))
		r.bufs = append(r.bufs, r.bufs[c]+bufCount(n))
		if n.Name == name {
			r.col = c
		}
	}
	if r.col < 0 {
		return nil, fmt.Errorf("transform on rows: column %q is not in the batches' schema", name)
	}
	var ok bool
	if r.value, r.valid, ok = valueCells(full.Columns[r.col]); !ok {
		return nil, fmt.Errorf("transform on rows: column %q is %s, not binary nor an image (struct<bytes, path>)", name, full.Columns[r.col].Type)
	}
	// The outputs' elements: uint8 (images), or float32 (libsvm_dense);
	// any other output is its bytes.
	dtype, shape := shapeOf(tf)
	elem, width := arrow.DataType(arrow.PrimitiveTypes.Uint8), 1
	if dtype == "<f4" && tf.Size()%4 == 0 {
		elem, width = arrow.PrimitiveTypes.Float32, 4
	}
	r.elems = tf.Size() / width
	count := 1
	for _, d := range shape {
		count *= d
	}
	if count != r.elems {
		shape = []int{r.elems}
	}
	storage := arrow.FixedSizeListOf(int32(r.elems), elem)
	tl, _, err := columnar.NewLayout(arrow.NewSchema([]arrow.Field{{Name: name, Type: storage}}, nil), nil)
	if err != nil {
		return nil, err
	}
	r.tensor = tl
	ext, _ := json.Marshal(map[string]any{"shape": shape})
	fields := slices.Clone(full.OutputSchema().Fields())
	fields[r.col] = arrow.Field{Name: name, Type: storage, Metadata: arrow.NewMetadata(
		[]string{"ARROW:extension:name", "ARROW:extension:metadata"}, []string{tensorExtension, string(ext)})}
	md := staged.Metadata()
	schema := arrow.NewSchema(fields, &md)
	nodes := slices.Clone(full.Columns)
	nodes[r.col] = tl.Columns[0]
	r.out = columnar.Compose(schema, nodes)
	for _, nd := range nodes[:r.col] {
		r.data += bufCount(nd)
	}
	r.data += 2 // after the list's validity and its values'
	empty, err := r.out.Message(nil)
	if err != nil {
		return nil, err
	}
	r.meta = empty.Size
	if r.schema, err = columnar.SchemaBytes(schema); err != nil {
		return nil, err
	}
	r.columns = r.out.Describe()
	return r, nil
}

// shapeOf is a transform's output dtype and shape: its own (package
// transform's Shape), or bytes.
func shapeOf(tf Transform) (string, []int) {
	if s, ok := tf.(interface{ Shape() (string, []int) }); ok {
		return s.Shape()
	}
	return "|u1", []int{tf.Size()}
}

// bufCount is the buffers of node n's tree in a batch.
func bufCount(n *columnar.Node) int {
	c := 0
	switch n.Kind {
	case columnar.KFixed, columnar.KBool, columnar.KList:
		c = 2
	case columnar.KBinary:
		c = 3
	case columnar.KFixedList, columnar.KStruct:
		c = 1
	}
	for _, k := range n.Children {
		c += bufCount(k)
	}
	return c
}

func pad8(n int64) int64 { return (n + 7) &^ 7 }

// size is the most bytes the batch of rows planned as rb (n rows) takes
// written: the other columns' planned buffers, and the outputs'.
func (r *rowTransform) size(rb dataset.RowBatch, n int) int {
	planned := rb.Buffers()
	body := int64(0)
	for c := range r.full.Columns {
		if c == r.col {
			continue
		}
		for _, b := range planned[r.bufs[c]:r.bufs[c+1]] {
			body += pad8(b.Length)
		}
	}
	e, s := int64(r.elems)*int64(n), int64(r.tf.Size())*int64(n)
	body += pad8((int64(n)+7)/8) + pad8((e+7)/8) + pad8(s)
	return r.meta + int(body)
}

// rowStage is the memory a batch of rows is transformed in, kept by its
// load for the next: the staging message, and each row's value and cells
// there.
type rowStage struct {
	msg    []byte
	values [][]byte
	cells  [][]byte
}

func growBytes(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n, n+n/8)
	}
	return b[:n]
}

// apply writes the batch of rows ids (epoch's), staged as msg (its
// message: nodes, buffers, body where the body starts), into out, with
// the transform's outputs in the column's place.
func (r *rowTransform) apply(ctx context.Context, l *Loader, ids []int, epoch int, msg []byte, nodes, bufs [][2]int64, body int, out []byte, st *rowStage) (*Columns, error) {
	n := len(ids)
	meta := &columnar.BatchMeta{Rows: int64(n)}
	for _, x := range nodes {
		meta.Nodes = append(meta.Nodes, columnar.FieldNode{Length: x[0], NullCount: x[1]})
	}
	for _, x := range bufs {
		meta.Buffers = append(meta.Buffers, columnar.BufferLoc{Offset: x[0], Length: x[1]})
	}
	b := msg[body:]
	stage := &columnar.Source{Meta: meta}
	var err error
	stage.Starts, err = r.full.StartsFrom(meta, int64(len(b)), func(nd *columnar.Node) ([]byte, error) {
		loc, ok := stage.OffsetsBuffer(nd)
		if !ok || loc.Offset < 0 || loc.Length < 0 || loc.Offset+loc.Length > int64(len(b)) {
			return nil, fmt.Errorf("column %q: no offsets buffer in the staged batch", nd.Name)
		}
		return b[loc.Offset : loc.Offset+loc.Length], nil
	})
	if err == nil {
		err = r.full.Check(stage, int64(len(b)))
	}
	if err != nil {
		return nil, fmt.Errorf("loader: a staged batch of rows: %w", err)
	}
	// Each row's value; the batch without the outputs; then the outputs.
	size := r.tf.Size()
	st.values = slices.Grow(st.values[:0], n)[:n]
	var ranges []columnar.Range
	for slot, id := range ids {
		ranges = r.cols[r.col].Cells(stage, slot, ranges[:0])
		for _, v := range r.valid {
			if c := ranges[v]; c.Len > 0 && b[c.Off]>>(slot%8)&1 == 0 {
				return nil, l.rowError(id, fmt.Errorf("column %q is null: a transform reads bytes", r.name))
			}
		}
		c := ranges[r.value]
		st.values[slot] = b[c.Off : c.Off+c.Len]
	}
	tsrc := &columnar.Source{Meta: &columnar.BatchMeta{Rows: int64(n),
		Nodes:   []columnar.FieldNode{{Length: int64(n)}, {Length: int64(n * r.elems)}},
		Buffers: []columnar.BufferLoc{{}, {}, {Length: int64(n * size)}}}}
	refs := make([]columnar.RowRef, n)
	for slot := range refs {
		refs[slot].Cols = make([]columnar.ColRef, len(r.full.Columns))
		for c := range refs[slot].Cols {
			refs[slot].Cols[c] = columnar.ColRef{S: stage, Row: int64(slot)}
		}
		refs[slot].Cols[r.col].S = tsrc
	}
	outMsg, err := r.out.Message(refs)
	if err != nil {
		return nil, err
	}
	if outMsg.Size > len(out) {
		return nil, fmt.Errorf("loader: a transformed batch of rows of %d bytes, planned %d", outMsg.Size, len(out))
	}
	cur := -1
	cell := func(slot, k int) []byte {
		if slot != cur {
			cur = slot
			st.cells = st.cells[:0]
			for c, cl := range r.cols {
				if c == r.col {
					// No validity, and the outputs, written below.
					for range r.tensor.NumCells {
						st.cells = append(st.cells, nil)
					}
					continue
				}
				ranges = cl.Cells(stage, slot, ranges[:0])
				for _, x := range ranges {
					st.cells = append(st.cells, b[x.Off:x.Off+x.Len])
				}
			}
		}
		return st.cells[k]
	}
	written, err := outMsg.Assemble(refs, cell, out)
	if err != nil {
		return nil, err
	}
	at := outMsg.Body + int(outMsg.Buffers[r.data].Offset)
	if outMsg.Buffers[r.data].Length != int64(n*size) {
		return nil, fmt.Errorf("loader: the outputs' buffer of %d bytes, for %d outputs of %d", outMsg.Buffers[r.data].Length, n, size)
	}
	if err := l.transformRows(ctx, ids, epoch, st.values, out[at:at+n*size], size); err != nil {
		return nil, err
	}
	ns, bs := outMsg.Table()
	cols := &Columns{Len: written, Body: outMsg.Body}
	for _, x := range ns {
		cols.Nodes = append(cols.Nodes, [2]int64{x.Length, x.NullCount})
	}
	for _, x := range bs {
		cols.Buffers = append(cols.Buffers, [2]int64{x.Offset, x.Length})
	}
	return cols, nil
}

// transformRows runs the transform on each row's value, on the workers,
// into its place in outs (size bytes each), and waits for them all. A
// random transform draws as it does for records (transform.Draw of the
// loader's seed, the epoch and the row).
//
// With a cache of outputs (jobs sharing a transform's outputs: their group
// reserves an item of the output's size for each row it gives several of
// them, as for records), a row's output is copied from its item when
// another job's batch made it, made here and kept when this batch is the
// first to come for it, and waited for when another batch is making it:
// each shared row is transformed once. The lookups and the waits are this
// goroutine's, never a worker's (a worker waiting for an output another
// batch's task makes, queued behind it, would wait for ever); the items a
// batch claimed are filled before it waits for any.
func (l *Loader) transformRows(ctx context.Context, ids []int, epoch int, values [][]byte, outs []byte, size int) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = err
		}
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	out := func(slot int) []byte { return outs[slot*size : (slot+1)*size] }
	run := func(slot int) {
		wg.Add(1)
		l.workers.Go(func() {
			defer wg.Done()
			if ctx.Err() != nil {
				return
			}
			var err error
			if l.rnd != nil {
				err = l.rnd.ApplyRandom(values[slot], out(slot), transform.Draw(l.opts.Seed, epoch, ids[slot]))
			} else {
				err = l.tf.Apply(values[slot], out(slot))
			}
			if err != nil {
				fail(l.rowError(ids[slot], err))
			}
		})
	}
	var claimed, loading map[int]*cache.Item
	if l.outCache != nil {
		// Whatever comes of them, the batch's uses of its rows' outputs
		// are this call's to settle (Done), not Close's.
		defer l.pay(ids)
	}
	for slot, id := range ids {
		if l.outCache == nil {
			run(slot)
			continue
		}
		it, st := l.outCache.Get(l.key(id))
		switch st {
		case cache.Ready:
			if err := it.CopyTo(out(slot)); err != nil {
				fail(l.rowError(id, err))
			}
			it.Done(true)
			l.hits.Add(1)
		case cache.Loading:
			if loading == nil {
				loading = map[int]*cache.Item{}
			}
			loading[slot] = it
		case cache.Claimed:
			if claimed == nil {
				claimed = map[int]*cache.Item{}
			}
			claimed[slot] = it
			run(slot)
		default:
			run(slot)
		}
	}
	wg.Wait()
	for slot, it := range claimed {
		err := failed()
		if err == nil {
			err = ctx.Err()
		}
		if err == nil {
			if err = it.Put(out(slot)); err != nil {
				fail(l.rowError(ids[slot], err))
			}
		}
		if err != nil {
			err = errAbandoned // whoever waits makes the output itself
		}
		l.outCache.Fill(it, err)
		it.Done(true)
	}
	for slot, it := range loading {
		ready := make(chan error, 1)
		it.OnReady(func(err error) { ready <- err })
		var err error
		select {
		case err = <-ready:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err == nil && failed() == nil {
			if err = it.CopyTo(out(slot)); err != nil {
				fail(l.rowError(ids[slot], err))
			}
			l.hits.Add(1)
		} else if ctx.Err() == nil && failed() == nil {
			run(slot) // its maker gave up: made here
		}
		it.Done(true)
	}
	wg.Wait()
	if err := failed(); err != nil {
		return err
	}
	return ctx.Err()
}

// owe counts, for a loader that keeps a transform's outputs, a use of
// each row's output its batch took from the order: the group reserved the
// item of a row it gave several jobs with one use for each. A batch that
// is transformed settles its uses (pay); those of the batches a loader
// planned and never transformed (it closed first, a read failed) Close
// gives back, so their items are dropped once the other jobs are done.
func (l *Loader) owe(ids []int) {
	l.owedMu.Lock()
	defer l.owedMu.Unlock()
	if l.owed == nil {
		l.owed = map[int]int{}
	}
	for _, id := range ids {
		l.owed[id]++
	}
}

// pay marks the uses of ids settled.
func (l *Loader) pay(ids []int) {
	l.owedMu.Lock()
	defer l.owedMu.Unlock()
	for _, id := range ids {
		if l.owed[id]--; l.owed[id] <= 0 {
			delete(l.owed, id)
		}
	}
}

// giveBackOwed gives the cache back the uses never settled, once nothing
// of the loader runs.
func (l *Loader) giveBackOwed() {
	l.owedMu.Lock()
	defer l.owedMu.Unlock()
	for id, n := range l.owed {
		l.outCache.AddRefs(l.key(id), -n)
	}
	l.owed = nil
}

// rowError names the row an error is about: its id, and where Locate
// places it.
func (l *Loader) rowError(id int, err error) error {
	loc := l.ds.Locate(id)
	return &RecordError{ID: id, Object: l.ds.Object(loc.Object).Name(), Offset: loc.Off, Err: err}
}

// RowsOutput is the schema (an IPC stream) and columns of the batches of
// a loader that transforms a column of rows; nil for any other loader,
// whose batches' are the dataset's.
func (l *Loader) RowsOutput() ([]byte, []columnar.Column) {
	if l.rowTf == nil {
		return nil, nil
	}
	return l.rowTf.schema, l.rowTf.columns
}

// rowsSize is the bytes the batch of rows planned as rb (n rows) takes.
func (l *Loader) rowsSize(rb dataset.RowBatch, n int) int {
	if l.rowTf != nil {
		return l.rowTf.size(rb, n)
	}
	return rb.Size()
}

// putRows writes the batch of rows rb (its rows ids of epoch, their cells
// as cell gives them) into out: as the dataset puts them together, or,
// staged so in st, with a transform's outputs in its column's place. It
// describes the message written.
func (l *Loader) putRows(ctx context.Context, rb dataset.RowBatch, ids []int, epoch int, cell func(slot, k int) []byte, out []byte, st *rowStage) (*Columns, error) {
	if l.rowTf == nil {
		size, err := rb.Assemble(ctx, cell, out)
		if err != nil {
			return nil, err
		}
		nodes, bufs, body := rb.Table()
		return &Columns{Len: size, Body: body, Nodes: nodes, Buffers: bufs}, nil
	}
	st.msg = growBytes(st.msg, rb.Size())
	size, err := rb.Assemble(ctx, cell, st.msg)
	if err != nil {
		return nil, err
	}
	nodes, bufs, body := rb.Table()
	return l.rowTf.apply(ctx, l, ids, epoch, st.msg[:size], nodes, bufs, body, out, st)
}
