package job

import (
	"context"
	"errors"
	"io/fs"
	"syscall"

	"github.com/riffle-ml/riffle/columnar"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/loader"
	"github.com/riffle-ml/riffle/order"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// Errors are part of the protocol: each error frame says what it is about
// (wire's Kind constants), and the client raises the exception a PyTorch
// user catches for it (ValueError for a spec, FileNotFoundError for a
// path). The kinds are decided here, in one place, in this order: a file
// removed since its dataset was opened is a change, not a path not found;
// a spec error that wraps a missing file is about the file.

// errSpec marks an error in what the client asked for: the order's
// errors (package order) are such errors too.
var errSpec = order.ErrSpec

// Kind says what err is about: one of wire's Kind constants.
func Kind(err error) string {
	var fe *dataset.FormatError
	var se *storage.Error
	var re *loader.RecordError
	switch {
	case errors.Is(err, storage.ErrChanged), errors.Is(err, storage.ErrShrunk), errors.Is(err, dataset.ErrStaleIndex):
		return wire.KindChanged
	case errors.Is(err, fs.ErrNotExist):
		return wire.KindNotFound
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		// The daemon's descriptors ran out opening a file: not the data's fault.
		return wire.KindInternal
	case errors.Is(err, errSpec), errors.Is(err, dataset.ErrUnknownFormat), errors.Is(err, dataset.ErrEmpty),
		errors.Is(err, dataset.ErrUnsupported), errors.Is(err, storage.ErrOutsideRoots), errors.Is(err, storage.ErrNotRegular),
		errors.Is(err, storage.ErrTooLarge), errors.Is(err, columnar.ErrNoColumn):
		return wire.KindSpec
	case errors.As(err, &fe), errors.As(err, &se), errors.As(err, &re), errors.Is(err, dataset.ErrCorrupt),
		errors.Is(err, dataset.ErrCRC), errors.Is(err, dataset.ErrPartial):
		return wire.KindData
	case errors.Is(err, context.Canceled), errors.Is(err, ErrClosed):
		return wire.KindClosed
	case errors.Is(err, ErrMemory):
		return wire.KindMemory
	}
	return wire.KindInternal
}

// Where is the file (or object) and byte offset err is about, for an
// error reply: a *dataset.FormatError's or a *storage.Error's, the errors
// Kind says are about data; "" and 0 if it names none.
func Where(err error) (path string, offset int64) {
	var fe *dataset.FormatError
	var se *storage.Error
	switch {
	case errors.As(err, &fe):
		return fe.Path, fe.Offset
	case errors.As(err, &se):
		return se.Object, se.Offset
	}
	return "", 0
}

// ErrMemory marks a job that does not fit its memory: its daemon's budget
// is too small for it, or it waited for room and found none, or its
// client holds batches that fill its own bound.
var ErrMemory = errors.New("memory budget")

// ErrClosed is the error of requests a closing job or daemon leaves
// unanswered.
var ErrClosed = errors.New("closing")
