package dataset

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/riffle-ml/riffle/storage"
)

// part is one file's records.
type part interface {
	count() int
	locate(i int) (off int64, n int)
	bytes() int64
	info() Info
}

// files is a dataset of one or more files of one format, concatenated: the
// records of file k follow those of file k-1.
type files struct {
	inf    Info
	objs   []*storage.File
	parts  []part
	starts []int // starts[k] is the id of file k's first record; one extra at the end
	tf     bool  // TFRecord frames are read and checked
}

func openFiles(ctx context.Context, paths []string, format string, opts Options, scan func(context.Context, *storage.File, Options) (part, error)) (Dataset, error) {
	d := &files{starts: []int{0}}
	for _, p := range paths {
		f, err := storage.OpenFile(p, storage.FileOptions{Direct: opts.Direct})
		if err != nil {
			d.Close()
			return nil, err
		}
		d.objs = append(d.objs, f)
		pt, err := scan(ctx, f, opts)
		if err != nil {
			d.Close()
			return nil, err
		}
		if len(d.parts) > 0 {
			a, b := d.parts[0].info(), pt.info()
			if a.RecordSize != b.RecordSize || a.Dtype != b.Dtype || !slices.Equal(a.Shape, b.Shape) {
				d.Close()
				return nil, &FormatError{Path: p, Err: fmt.Errorf("records differ from %s's (%d bytes %s%v against %d bytes %s%v): %w",
					paths[0], b.RecordSize, b.Dtype, b.Shape, a.RecordSize, a.Dtype, a.Shape, ErrCorrupt)}
			}
		}
		d.parts = append(d.parts, pt)
		d.starts = append(d.starts, d.starts[len(d.starts)-1]+pt.count())
	}
	d.inf = d.parts[0].info()
	d.inf.Format = format
	d.inf.Paths = paths
	for _, pt := range d.parts {
		d.inf.Bytes += pt.bytes()
	}
	d.tf = format == "tfrecord" && !opts.SkipCRC
	if d.Len() == 0 {
		d.Close()
		return nil, fmt.Errorf("%s: %w", describe(paths), ErrEmpty)
	}
	return d, nil
}

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
	off, n := d.parts[k].locate(id - d.starts[k])
	return Loc{Object: k, Off: off, Len: n}
}

func (d *files) Label(int) int               { return -1 }
func (d *files) Object(i int) storage.Reader { return d.objs[i] }

// Frame says how many bytes around each record the loader reads so that
// Verify can check them: TFRecord's length, its CRC and the data's CRC.
func (d *files) Frame() (head, tail int) {
	if d.tf {
		return tfHead, tfTail
	}
	return 0, 0
}

// Verify checks a TFRecord frame read along with record id.
func (d *files) Verify(id int, frame []byte) error {
	if !d.tf {
		return nil
	}
	loc := d.Locate(id)
	return checkFrame(frame, d.objs[loc.Object].Name(), loc.Off-tfHead)
}

func (d *files) Close() error {
	var errs []error
	for _, f := range d.objs {
		errs = append(errs, f.Close())
	}
	d.objs = nil
	return errors.Join(errs...)
}
