package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/riffle-ml/riffle/dataset"
)

// datasets shares opened datasets between jobs: jobs on the same files with
// the same options use one Dataset, its index loaded once. An unused
// dataset stays open for keepOpen, so a client that opens a job per epoch
// does not reload its index each time.
type datasets struct {
	mu   sync.Mutex
	open map[string]*dsEntry
}

type dsEntry struct {
	key   string
	ds    dataset.Dataset
	refs  int
	timer *time.Timer
}

const keepOpen = 30 * time.Second

func newDatasets() *datasets { return &datasets{open: map[string]*dsEntry{}} }

func (d *datasets) get(ctx context.Context, paths []string, opts dataset.Options) (*dsEntry, error) {
	opts.Progress = nil
	key := fmt.Sprintf("%q %+v", paths, opts)
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.open[key]; ok {
		e.refs++
		if e.timer != nil {
			e.timer.Stop()
			e.timer = nil
		}
		return e, nil
	}
	ds, err := dataset.Open(ctx, opts, paths...)
	if err != nil {
		return nil, err
	}
	e := &dsEntry{key: key, ds: ds, refs: 1}
	d.open[key] = e
	return e, nil
}

func (d *datasets) put(e *dsEntry) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e.refs--
	if e.refs > 0 {
		return
	}
	e.timer = time.AfterFunc(keepOpen, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if e.refs == 0 && d.open[e.key] == e {
			delete(d.open, e.key)
			e.ds.Close()
		}
	})
}

func (d *datasets) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, e := range d.open {
		if e.timer != nil {
			e.timer.Stop()
		}
		e.ds.Close()
		delete(d.open, k)
	}
}
