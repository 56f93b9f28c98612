package dataset

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/riffle-ml/riffle/storage"
)

// scanChunk is the size of one sequential read while building an index:
// large enough that the device streams, small enough to keep a few in flight.
const scanChunk = 4 << 20

// scanAhead is how many chunks are read ahead of the one being scanned.
const scanAhead = 3

// scanSeq reads r from start to its end in order and calls fn with each
// chunk and its offset. Chunks are read ahead concurrently so that scanning
// keeps up with the device's sequential bandwidth. b is valid only during fn.
func scanSeq(parent context.Context, r storage.Reader, start int64, progress func(done, total int64), fn func(off int64, b []byte) error) error {
	size := r.Size()
	type chunk struct {
		off  int64
		buf  []byte
		done chan error
	}
	free := make(chan []byte, scanAhead+1)
	for i := 0; i < scanAhead+1; i++ {
		free <- make([]byte, scanChunk)
	}
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	queue := make(chan *chunk, scanAhead)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(queue)
		for off := start; off < size; off += scanChunk {
			var buf []byte
			select {
			case buf = <-free:
			case <-gctx.Done():
				return nil
			}
			n := int64(scanChunk)
			if size-off < n {
				n = size - off
			}
			c := &chunk{off: off, buf: buf[:n], done: make(chan error, 1)}
			go func() { c.done <- r.ReadAt(gctx, c.buf, c.off) }()
			select {
			case queue <- c:
			case <-gctx.Done():
				<-c.done
				return nil
			}
		}
		return nil
	})
	g.Go(func() error {
		var err error
		for c := range queue {
			if e := <-c.done; e != nil && err == nil {
				err = e
			}
			if err == nil {
				err = fn(c.off, c.buf)
				if progress != nil {
					progress(c.off+int64(len(c.buf)), size)
				}
			}
			free <- c.buf[:cap(c.buf)]
			if err != nil {
				cancel()
			}
		}
		return err
	})
	if err := g.Wait(); err != nil {
		return err
	}
	// A cancelled scan stops early without an error of its own: say why.
	return parent.Err()
}
