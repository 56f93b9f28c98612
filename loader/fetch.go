package loader

import (
	"context"
	"errors"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/storage"
)

// errAbandoned fails a cache item its reader will not read after all (its
// loader stopped); whoever waits for it reads the record for itself.
var errAbandoned = context.Canceled

// dispatch starts a planned job's work: its reads go to the engine, its
// cached records are copied as soon as they are ready.
func (l *Loader) dispatch(j *job) {
	reqs := j.reqs[:0]
	for i := range j.units {
		u := &j.units[i]
		if !u.read {
			en := &j.ents[u.lo]
			en.item.OnReady(func(err error) { l.copyDone(j, i, err) })
			continue
		}
		reqs = append(reqs, l.request(j, i))
	}
	if len(reqs) > 0 {
		l.io.Add(len(reqs))
		l.engine.Submit(reqs...)
	}
	clear(reqs)
	j.reqs = reqs[:0]
}

// request returns unit i's read. Its callback is made once per job and
// unit index, so that a loader in steady state allocates nothing per read.
func (l *Loader) request(j *job, i int) *storage.Request {
	for len(j.dones) <= i {
		k := len(j.dones)
		j.dones = append(j.dones, func(err error) { l.readDone(j, k, err) })
	}
	u := &j.units[i]
	u.req = storage.Request{Ctx: l.ctx, R: l.ds.Object(u.obj), P: j.Data[u.dst : u.dst+u.n], Off: u.off, Done: j.dones[i]}
	return &u.req
}

// copyDone copies a cached record into the batch once its item is ready.
// If the item's reader gave up (its job closed), this batch reads the
// record itself.
func (l *Loader) copyDone(j *job, i int, err error) {
	u := &j.units[i]
	en := &j.ents[u.lo]
	it := en.item
	if err == nil && !j.failed.Load() {
		copy(j.Data[j.Off[en.slot]:j.Off[en.slot]+en.n], it.Bytes())
		l.hits.Add(1)
	}
	en.item = nil
	it.Done(err == nil)
	if err != nil && errors.Is(err, context.Canceled) && l.ctx.Err() == nil && !j.failed.Load() {
		u.read = true
		l.io.Add(1)
		l.engine.Submit(l.request(j, i))
		return
	}
	if err != nil {
		j.fail(err)
	}
	l.unitDone(j, i)
}

// readDone checks the records of a finished read, fills the cache items
// this batch was to read for others, and counts the unit done.
func (l *Loader) readDone(j *job, i int, err error) {
	defer l.io.Done()
	u := &j.units[i]
	if err == nil && !j.failed.Load() {
		l.reads.Add(1)
		l.bytes.Add(int64(u.n))
		if l.framed != nil {
			for k := u.lo; k < u.hi && err == nil; k++ {
				en := &j.ents[k]
				off := j.Off[en.slot]
				err = l.framed.Verify(en.id, j.Data[off-l.head:off+en.n+l.tail])
			}
		}
	}
	for k := u.lo; k < u.hi; k++ {
		en := &j.ents[k]
		if it := en.item; it != nil {
			// Only items this batch claimed sit in a read unit.
			if err == nil {
				off := j.Off[en.slot]
				copy(it.Bytes(), j.Data[off:off+en.n])
			}
			l.cache.Fill(it, err)
			en.item, en.claim = nil, false
			it.Done(err == nil)
		}
	}
	if err != nil {
		j.fail(err)
	}
	l.unitDone(j, i)
}

// unitDone counts one unit of j finished and completes j after its last.
func (l *Loader) unitDone(j *job, i int) {
	if j.win != nil && !j.failed.Load() {
		u := &j.units[i]
		j.win.arrive(j.ents[u.lo:u.hi])
	}
	if j.left.Add(-1) == 0 {
		l.finishJob(j)
	}
}

// finishJob marks j complete: every unit done, or failed.
func (l *Loader) finishJob(j *job) {
	if l.flight != nil {
		l.flight.done(len(j.units))
	}
	close(j.done)
}

func (j *job) fail(err error) {
	j.errOnce.Do(func() {
		j.err = err
		j.failed.Store(true)
	})
}

// key names record id in the cache.
func (l *Loader) key(id int) cache.Key { return cache.Key{Space: l.space, ID: int64(id)} }
