package job

import (
	"errors"
	"fmt"
	"testing"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// An error about data says where it is, through any wrapping: the file
// (or object) and byte offset, which an error reply carries.
func TestWhere(t *testing.T) {
	for _, c := range []struct {
		err    error
		path   string
		offset int64
	}{
		{fmt.Errorf("reading: %w", &dataset.FormatError{Path: "/d/a.tfrecord", Offset: 4096, Err: dataset.ErrCRC}), "/d/a.tfrecord", 4096},
		{fmt.Errorf("batch 3: %w", &storage.Error{Op: "read", Object: "s3://b/x.bin", Offset: 12, Err: errors.New("EIO")}), "s3://b/x.bin", 12},
		{specErr("batch_size is 0"), "", 0},
	} {
		path, offset := Where(c.err)
		if path != c.path || offset != c.offset {
			t.Errorf("%v: at %q %d, want %q %d", c.err, path, offset, c.path, c.offset)
		}
		if (path != "") != (Kind(c.err) == wire.KindData) {
			t.Errorf("%v: at %q, of kind %s: an error about data names where it is", c.err, path, Kind(c.err))
		}
	}
}
