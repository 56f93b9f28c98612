package dataset

import (
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/riffle-ml/riffle/storage"
)

// Concat is the records of several datasets one after another: part k's
// record i is record Offsets()[k]+i, and its objects follow the objects
// of the parts before it. A mixture's sources are read through it, so the
// loader, the cache and the tiers see one dataset. The parts stay their
// opener's: Close closes none of them.
type Concat struct {
	parted
	objs  []int // first object of each part, and the objects at the end
	objOf runs  // the part of an object
	info  Info
}

// parted is datasets one after another by id: part k's record i is
// record offs[k]+i.
type parted struct {
	parts []Dataset
	offs  []int // first id of each part, and the records at the end
	of    runs  // the part of an id
}

func newParted(parts []Dataset) parted {
	p := parted{parts: parts, offs: make([]int, len(parts)+1)}
	for k, d := range parts {
		p.offs[k+1] = p.offs[k] + d.Len()
	}
	p.of = newRuns(p.offs)
	return p
}

// runs says which of runs one after another (starts ascending, then the
// end) a value is in: sort.SearchInts's answer, from a table of the run
// at every 2^shift-th value, which leaves a search among the runs of one
// step, usually none. A mixture asks for every record it reads (its
// source, its object, its cache key), and a binary search over 1,000
// sources' bounds was as costly as the mixture's schedule.
type runs struct {
	starts []int
	shift  uint
	at     []int32 // the run of value b<<shift
}

func newRuns(starts []int) runs {
	n, end := len(starts)-1, starts[len(starts)-1]
	r := runs{starts: starts}
	for end>>r.shift > 4*n {
		r.shift++
	}
	r.at = make([]int32, end>>r.shift+2)
	for b := range r.at {
		r.at[b] = int32(min(n-1, sort.SearchInts(starts, b<<r.shift+1)-1))
	}
	return r
}

// find is the run v is in, for v in [starts[0], end).
func (r runs) find(v int) int {
	b := v >> r.shift
	lo, hi := int(r.at[b]), int(r.at[b+1])
	if lo == hi {
		return lo
	}
	return lo + sort.SearchInts(r.starts[lo+1:hi+1], v+1)
}

// Offsets are the first id of each part.
func (p parted) Offsets() []int { return p.offs[:len(p.parts)] }

// Parts are the datasets put together.
func (p parted) Parts() []Dataset { return p.parts }

// Part is the part record id is in, and its id there.
func (p parted) Part(id int) (k, local int) {
	k = p.of.find(id)
	return k, id - p.offs[k]
}

func (p parted) records() int { return p.offs[len(p.parts)] }

// NewConcat puts parts one after another. Parts of rows (Parquet, Arrow,
// Hugging Face) put their batches together per dataset: they are read as
// one dataset of all their files instead (NewRowsUnion). Parts whose
// records sit in frames (TFRecord) mix only with parts framed the same way.
func NewConcat(parts []Dataset) (Dataset, error) {
	if len(parts) == 0 {
		return nil, errors.New("concatenating no dataset")
	}
	c := &Concat{parted: newParted(parts), objs: make([]int, len(parts)+1)}
	first := parts[0].Info()
	c.info = Info{Format: first.Format, RecordSize: first.RecordSize, Dtype: first.Dtype, Shape: first.Shape,
		Classes: first.Classes, Header: first.Header}
	var frame [2]int
	framed := 0
	for k, p := range parts {
		inf := p.Info()
		if _, ok := p.(Rows); ok {
			return nil, fmt.Errorf("%s (%s): a dataset of rows mixes only with rows of its format and schema (read as one dataset of their files), "+
				"not with records (npy, fixed, lines, TFRecord, tar, directories, packs)", inf.Paths[0], inf.Format)
		}
		if f, ok := p.(Framed); ok && f.Checks() {
			h, t := f.Frame()
			if framed > 0 && frame != [2]int{h, t} {
				return nil, fmt.Errorf("%s: its records' frames differ from the other sources'", inf.Paths[0])
			}
			frame, framed = [2]int{h, t}, framed+1
		}
		c.objs[k+1] = c.objs[k] + objectsOf(p)
		if inf.Format != c.info.Format {
			c.info.Format = "mixture"
		}
		if inf.RecordSize != c.info.RecordSize || inf.Dtype != c.info.Dtype || !slices.Equal(inf.Shape, c.info.Shape) {
			// Records of other sizes or types: a batch of them is a list
			// of records, not one array.
			c.info.RecordSize, c.info.Dtype, c.info.Shape = 0, "", nil
		}
		if !slices.Equal(inf.Classes, c.info.Classes) {
			c.info.Classes = nil
		}
		if inf.Header != c.info.Header {
			c.info.Header = ""
		}
		c.info.Paths = append(c.info.Paths, inf.Paths...)
		c.info.Versions = append(c.info.Versions, inf.Versions...)
		c.info.Bytes += inf.Bytes
	}
	if framed > 0 && framed < len(parts) {
		return nil, errors.New("a mixture of TFRecord and other formats: the sources' records are framed differently; mix TFRecord files only with TFRecord files")
	}
	c.objOf = newRuns(c.objs)
	if framed > 0 {
		return framedConcat{c}, nil
	}
	return c, nil
}

// objectsOf counts a dataset's objects: Object(i) is valid for i below it.
// Every dataset names its objects 0..n-1; the locations say how many.
func objectsOf(ds Dataset) int {
	if o, ok := ds.(Counted); ok {
		return o.Objects()
	}
	n := 0
	for id := range ds.Len() {
		n = max(n, ds.Locate(id).Object+1)
	}
	return n
}

// Objects is how many objects the parts have together.
func (c *Concat) Objects() int { return c.objs[len(c.objs)-1] }

func (c *Concat) Len() int { return c.records() }

func (c *Concat) Locate(id int) Loc {
	k, i := c.Part(id)
	l := c.parts[k].Locate(i)
	l.Object += c.objs[k]
	return l
}

func (c *Concat) Label(id int) int {
	k, i := c.Part(id)
	return c.parts[k].Label(i)
}

func (c *Concat) Object(i int) storage.Reader {
	k := c.objOf.find(i)
	return c.parts[k].Object(i - c.objs[k])
}

func (c *Concat) Info() Info { return c.info }

func (c *Concat) Close() error { return nil }

// RecordsIn says which records a byte range of an object holds, for the
// disk tier, from the part the object is in.
func (c *Concat) RecordsIn(obj int, off, n int64) (lo, hi int, ok bool) {
	k := c.objOf.find(obj)
	r, ok := c.parts[k].(Ranger)
	if !ok {
		return 0, 0, false
	}
	lo, hi, ok = r.RecordsIn(obj-c.objs[k], off, n)
	return lo + c.offs[k], hi + c.offs[k], ok
}

// framedConcat is a Concat of framed parts: each record's frame is
// checked by its own part.
type framedConcat struct{ *Concat }

func (c framedConcat) Frame() (head, tail int) { return c.parts[0].(Framed).Frame() }
func (c framedConcat) Checks() bool            { return true }
func (c framedConcat) Verify(id int, frame []byte) error {
	k, i := c.Part(id)
	return c.parts[k].(Framed).Verify(i, frame)
}

// rowsUnion is sources of rows of one format read as one dataset (their
// files opened together: the rows of a batch are put together by one
// reader), with each source's rows a run of its ids, as in a Concat.
type rowsUnion struct {
	Rows
	parted
	info Info
}

// NewRowsUnion says whose each row of u is: u holds parts' files in
// order, so part k's row i is u's row Offsets()[k]+i. The parts and u stay
// their opener's.
func NewRowsUnion(u Rows, parts []Dataset) (Dataset, error) {
	r := &rowsUnion{Rows: u, parted: newParted(parts), info: u.Info()}
	if r.records() != u.Len() {
		return nil, fmt.Errorf("sources of %d rows in all read as one dataset of %d", r.records(), u.Len())
	}
	// Hugging Face directories' features (ClassLabel names, Image
	// columns) are in their dataset_info.json, which the union of their
	// Arrow files does not read: kept when every part says the same.
	r.info.Features = parts[0].Info().Features
	for _, p := range parts[1:] {
		if p.Info().Features != r.info.Features {
			r.info.Features = ""
		}
	}
	return r, nil
}

func (r *rowsUnion) Info() Info { return r.info }

func (r *rowsUnion) Close() error { return nil }
