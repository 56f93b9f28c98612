package dataset

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/riffle-ml/riffle/storage"
)

// files is a dataset of one or more files of one format, concatenated: the
// records of file k follow those of file k-1.
type files struct {
	inf    Info
	objs   []storage.Reader
	parts  []Part
	starts []int // starts[k] is the id of file k's first record; one extra at the end
	framed bool  // frames are read and checked (TFRecord)
	head   int
	tail   int
}

func openFiles(ctx context.Context, names []string, f *Format, opts Options) (Dataset, error) {
	d := &files{starts: []int{0}}
	for _, p := range names {
		r, err := opts.Store.Open(ctx, p)
		if err != nil {
			d.Close()
			return nil, err
		}
		d.objs = append(d.objs, r)
		pt, err := f.OpenPart(ctx, r, opts)
		if err != nil {
			d.Close()
			return nil, err
		}
		if len(d.parts) > 0 {
			a, b := d.parts[0].Info(), pt.Info()
			if a.RecordSize != b.RecordSize || a.Dtype != b.Dtype || !slices.Equal(a.Shape, b.Shape) {
				d.Close()
				return nil, &FormatError{Path: p, Err: fmt.Errorf("records differ from %s's (%d bytes %s%v against %d bytes %s%v): %w",
					names[0], b.RecordSize, b.Dtype, b.Shape, a.RecordSize, a.Dtype, a.Shape, ErrCorrupt)}
			}
		}
		d.parts = append(d.parts, pt)
		d.starts = append(d.starts, d.starts[len(d.starts)-1]+pt.Count())
		d.inf.Versions = append(d.inf.Versions, version(r))
	}
	versions := d.inf.Versions
	d.inf = d.parts[0].Info()
	d.inf.Format = f.Name
	d.inf.Paths = names
	d.inf.Versions = versions
	for _, pt := range d.parts {
		d.inf.Bytes += pt.Bytes()
	}
	// A frame with a head (TFRecord's length and its CRC) is read and its
	// head checked even with SkipCRC: it is where the index says a record
	// is; a pack's records have only their CRC, which SkipCRC skips.
	if fp, ok := d.parts[0].(framedPart); ok {
		if h, t := fp.Frame(); h > 0 || !opts.SkipCRC {
			d.framed = true
			d.head, d.tail = h, t
		}
	}

	if d.Len() == 0 {
		d.Close()
		return nil, fmt.Errorf("%s: %w", describe(names), ErrEmpty)
	}
	return d, nil
}

// version is a Reader's object version, "" if its store cannot say.
func version(r storage.Reader) string { return r.Version() }

func describe(paths []string) string {
	if len(paths) == 1 {
		return paths[0]
	}
	return fmt.Sprintf("%s and %d more files", paths[0], len(paths)-1)
}

func (d *files) Len() int   { return d.starts[len(d.starts)-1] }
func (d *files) Info() Info { return d.inf }

func (d *files) Locate(id int) Loc {
	k := 0
	if len(d.parts) > 1 {
		k = sort.SearchInts(d.starts, id+1) - 1
	}
	off, n := d.parts[k].Locate(id - d.starts[k])
	return Loc{Object: k, Off: off, Len: n}
}

// RecordsIn returns the records (ids lo to hi-1) a byte range of object
// obj touches, for a cache that asks when a range is next wanted; false if
// the format cannot say.
func (d *files) RecordsIn(obj int, off, n int64) (lo, hi int, ok bool) {
	sp, ok := d.parts[obj].(interface{ records(off, n int64) (int, int) })
	if !ok {
		return 0, 0, false
	}
	lo, hi = sp.records(off, n)
	return d.starts[obj] + lo, d.starts[obj] + hi, true
}

// Origin names record id by its file and its index in that file: the
// record's identity whatever other files a dataset lists with it.
func (d *files) Origin(id int) (file int, index int) {
	k := 0
	if len(d.parts) > 1 {
		k = sort.SearchInts(d.starts, id+1) - 1
	}
	return k, id - d.starts[k]
}

// labeledPart is a Part whose records carry labels (a pack's).
type labeledPart interface {
	label(i int) int
	hasLabels() bool
}

func (d *files) Label(id int) int {
	if lp, ok := d.parts[0].(labeledPart); !ok || !lp.hasLabels() {
		return -1
	}
	k, i := d.Origin(id)
	return d.parts[k].(labeledPart).label(i)
}
func (d *files) Object(i int) storage.Reader { return d.objs[i] }
func (d *files) Objects() int                { return len(d.objs) }

// Checks says the loader should give every record read to Verify: the
// format checks records (TFRecord's CRCs, a pack's), unless SkipCRC (which
// leaves a TFRecord frame's length and its CRC checked).
func (d *files) Checks() bool { return d.framed }

// Frame says how many bytes around each record the loader reads so that
// Verify can check them: TFRecord's length, its CRC and the data's CRC.
func (d *files) Frame() (head, tail int) {
	if d.framed {
		return d.head, d.tail
	}
	return 0, 0
}

// Verify checks a frame read along with record id.
func (d *files) Verify(id int, frame []byte) error {
	if !d.framed {
		return nil
	}
	loc := d.Locate(id)
	return d.parts[loc.Object].(framedPart).Verify(frame, d.objs[loc.Object].Name(), loc.Off-int64(d.head))
}

func (d *files) Close() error {
	var errs []error
	for _, f := range d.objs {
		errs = append(errs, f.Close())
	}
	d.objs = nil
	return errors.Join(errs...)
}
