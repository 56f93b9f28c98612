package loader

import (
	"context"
	"errors"
	"fmt"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/internal/alignbuf"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/transform"
)

// errAbandoned fails a cache item its reader will not read after all (its
// loader stopped); whoever waits for it reads the record for itself.
var errAbandoned = context.Canceled

// dispatch starts a planned load's work: its reads go to the engine, its
// cached records are copied as soon as they are ready.
func (l *Loader) dispatch(j *load) {
	if l.tf != nil || l.assembled() {
		if cap(j.raw) < j.rawEnd {
			j.raw = alignbuf.Make(j.rawEnd+j.rawEnd/8, l.bufAlign)
		}
		j.raw = j.raw[:j.rawEnd]
	}
	if len(j.units) == 0 {
		// Nothing to read: zero-length records, or rows whose pages are
		// unpacked already.
		l.finishLoad(j)
		return
	}
	// Every unit's read callback exists before the first copy waits: a
	// copy whose item's reader gave up reads the record itself (copyDone,
	// request), maybe from another goroutine while this loop still runs.
	l.callbacks(j)
	reqs := j.reqs[:0]
	j.pastIDs, j.pastReqs = j.pastIDs[:0], j.pastReqs[:0]
	for i := range j.units {
		u := &j.units[i]
		if !u.read {
			// Another loader may fill the item after this one closes: the
			// wait counts as I/O in flight, so Close waits for it before
			// the batch's memory goes.
			en := &j.ents[u.lo]
			l.io.Add(1)
			en.item.OnReady(func(err error) { l.copyDone(j, i, err) })
			continue
		}
		r := l.request(j, i)
		if l.opts.PastCache != nil && u.hi-u.lo == 1 && storage.CanPastCache(r.R, r.P, r.Off) {
			j.pastIDs, j.pastReqs = append(j.pastIDs, j.ents[u.lo].id), append(j.pastReqs, r)
		}
		reqs = append(reqs, r)
	}
	if len(j.pastIDs) > 0 {
		j.past = grow(j.past, len(j.pastIDs))
		clear(j.past)
		l.opts.PastCache(j.Epoch, j.pastIDs, j.past)
		for k, r := range j.pastReqs {
			r.PastCache = j.past[k]
		}
		clear(j.pastReqs)
	}
	if len(reqs) > 0 {
		l.io.Add(len(reqs))
		l.engine.Submit(reqs...)
	}
	clear(reqs)
	j.reqs = reqs[:0]
}

// callbacks makes the read callback of each of j's units that has none
// yet: once per load and unit index, so that a loader in steady state
// allocates nothing per read.
func (l *Loader) callbacks(j *load) {
	for len(j.dones) < len(j.units) {
		k := len(j.dones)
		j.dones = append(j.dones, func(err error) { l.readDone(j, k, err) })
	}
}

// request returns unit i's read, whose callback dispatch made.
func (l *Loader) request(j *load, i int) *storage.Request {
	u := &j.units[i]
	u.req = storage.Request{Ctx: l.ctx, R: l.ds.Object(u.obj), P: j.landing()[u.dst : u.dst+u.n], Off: u.off, Done: j.dones[i]}
	return &u.req
}

// landing is where reads land: the batch, or with a transform the staging
// buffer it reads from.
func (j *load) landing() []byte {
	if j.l.tf != nil || j.l.assembled() {
		return j.raw
	}
	return j.Data
}

// landOff is where entry en's record lands in landing().
func (j *load) landOff(en *entry) int {
	if j.l.tf != nil {
		return j.rawOff[en.slot]
	}
	return j.Off[en.slot]
}

// recordAt returns where entry en's record landed after its read.
func (j *load) recordAt(en *entry) []byte {
	off := j.landOff(en)
	return j.landing()[off : off+en.n]
}

// out is entry en's place in the batch.
func (j *load) out(en *entry) []byte {
	return j.Data[j.Off[en.slot] : j.Off[en.slot]+j.Len[en.slot]]
}

// copyDone copies a cached record into the batch once its item is ready.
// If the item's reader gave up (its job closed), this batch reads the
// record itself.
func (l *Loader) copyDone(j *load, i int, err error) {
	defer l.io.Done()
	u := &j.units[i]
	en := &j.ents[u.lo]
	it := en.item
	transform := false
	if err == nil && !j.failed.Load() {
		if cerr := it.CopyTo(l.cached(j, en)); cerr != nil {
			// The item was sized for another record: never a cut record.
			j.fail(l.recordError(en, cerr))
		} else {
			l.hits.Add(1)
			transform = l.rnd != nil
		}
	}
	if transform {
		// The cache keeps a random transform's records: this batch
		// transforms its copy with its own draw, holding the item until it
		// has (its uses to come then count the batches that will still
		// transform it: a shared decode's). Not from here: this runs in
		// whoever filled the item, maybe a worker, whose queue may be full
		// of tasks waiting for workers.
		l.io.Add(1)
		go func() {
			defer l.io.Done()
			l.transform(j, i)
		}()
		return
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

// readDone checks the records of a finished read, transforms them if the
// loader has a transform, fills the cache items this batch was to read for
// others, and counts the unit done.
func (l *Loader) readDone(j *load, i int, err error) {
	defer l.io.Done()
	u := &j.units[i]
	if err == nil && !j.failed.Load() {
		l.reads.Add(1)
		l.bytes.Add(int64(u.n))
		if l.framed != nil {
			for k := u.lo; k < u.hi && err == nil; k++ {
				en := &j.ents[k]
				off := j.landOff(en)
				err = l.framed.Verify(en.id, j.landing()[off-l.head:off+en.n+l.tail])
			}
		}
	}
	if err != nil || j.failed.Load() || l.tf == nil || l.assembled() {
		// (A transform of rows runs once the batch's rows are put
		// together: rowtf.go.)
		l.settleUnit(j, u, err)
		l.unitDone(j, i)
		return
	}
	l.transform(j, i)
}

// transform runs the transform on unit i's records, on the workers, a
// record each; the unit is done when its last record is. Each task counts
// as I/O in flight, so that Close waits for transforms writing into the
// batch too. The bounds are read once: the last task may finish, and the
// load be reused, before this loop ends.
func (l *Loader) transform(j *load, i int) {
	u := &j.units[i]
	lo, hi := u.lo, u.hi
	u.left.Store(int32(hi - lo))
	l.io.Add(hi - lo)
	for k := lo; k < hi; k++ {
		en := &j.ents[k]
		l.workers.Go(func() {
			defer l.io.Done()
			if !j.failed.Load() {
				var err error
				if l.rnd != nil {
					err = l.applyRandom(j, en)
				} else {
					err = l.tf.Apply(j.recordAt(en), j.out(en))
				}
				if err != nil {
					j.fail(l.recordError(en, err))
				}
			}
			if u.left.Add(-1) == 0 {
				var err error
				if j.failed.Load() {
					err = j.err
				}
				if !u.read {
					// A copy's item, held through its transform.
					en := &j.ents[lo]
					en.item.Done(true)
					en.item = nil
				}
				l.settleUnit(j, u, err)
				l.unitDone(j, i)
			}
		})
	}
}

// settleUnit fills (or fails) the cache items the unit's records were read
// for, from what landed in the batch.
func (l *Loader) settleUnit(j *load, u *unit, err error) {
	for k := u.lo; k < u.hi; k++ {
		en := &j.ents[k]
		if it := en.item; it != nil {
			// Only items this batch claimed sit in a read unit.
			ierr := err
			if ierr == nil {
				if ierr = it.Put(l.cached(j, en)); ierr != nil {
					ierr = l.recordError(en, ierr)
					j.fail(ierr)
				}
			}
			l.cache.Fill(it, ierr)
			en.item, en.claim = nil, false
			it.Done(ierr == nil)
		}
	}
	if err != nil {
		j.fail(err)
	}
}

// applyRandom runs a random transform on entry en. With a transform that
// can cut its output from a shared decode (transform.Shared), a record
// other jobs' batches also take is decoded once, by the first, into the
// cache, with a use for each of them; each cuts its own draw from it, to
// the bytes the record itself gives. A batch that finds the decode under
// way does not wait (it runs on a worker the decoder may need): it
// decodes what it needs itself.
func (l *Loader) applyRandom(j *load, en *entry) error {
	raw, out, draw := j.recordAt(en), j.out(en), transform.Draw(l.opts.Seed, j.Epoch, en.id)
	sh, ok := l.rnd.(SharedTransform)
	if !ok || l.cache == nil {
		return l.rnd.ApplyRandom(raw, out, draw)
	}
	key := l.key(en.id).DecodedOf()
	// The record's uses to come are the batches that will still transform
	// it (a batch holds the record's item until it has): the decode's.
	uses := 0
	if en.item != nil {
		uses = en.item.Uses()
	}
	var it *cache.Item
	st := cache.Miss
	if uses >= 2 {
		it, st = l.cache.GetOrClaim(key)
	} else {
		// The record's last use: a decode others made may wait for it, and
		// whatever uses it still counts go with this one (a count is a
		// guess when batches cross: none outlives the record's).
		it, st = l.cache.Get(key)
		defer l.cache.AddRefs(key, -1<<30)
	}
	switch st {
	case cache.Ready:
		done, err := sh.FromDecoded(it.Bytes(), out, draw)
		it.Done(true)
		if done {
			l.sharedDecodes.Add(1)
		}
		if done || err != nil {
			return err
		}
	case cache.Claimed:
		dec, err := sh.Decode(raw)
		if err != nil {
			l.cache.Fill(it, err)
			it.Done(false)
			return err
		}
		if l.cache.Set(it, dec, nil) {
			l.cache.AddRefs(key, uses-1) // the other jobs' batches to come
		}
		l.cache.Fill(it, nil)
		done, err := sh.FromDecoded(dec, out, draw)
		it.Done(true)
		if done || err != nil {
			return err
		}
	case cache.Loading:
		it.Done(true)
	}
	return l.rnd.ApplyRandom(raw, out, draw)
}

// cached is what the cache keeps of entry en: its place in the batch
// (the record, or a transform's output), or with a random transform the
// record where it landed before the transform.
func (l *Loader) cached(j *load, en *entry) []byte {
	if l.rnd != nil {
		return j.recordAt(en)
	}
	return j.out(en)
}

// recordError names the record an error is about (a transform that failed
// on it, a cache item of another size): its id, object and offset.
func (l *Loader) recordError(en *entry, err error) error {
	return &RecordError{ID: en.id, Object: l.ds.Object(en.obj).Name(), Offset: en.off, Err: err}
}

// RecordError is an error about one record: a transform that failed on
// it, or a shared copy of it that was not its size.
type RecordError struct {
	ID     int
	Object string
	Offset int64
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("record %d (%s at offset %d): %v", e.ID, e.Object, e.Offset, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// unitDone counts one unit of j finished and completes j after its last.
func (l *Loader) unitDone(j *load, i int) {
	if j.win != nil && !j.failed.Load() {
		u := &j.units[i]
		j.win.arrive(j.ents[u.lo:u.hi])
	}
	if j.left.Add(-1) == 0 {
		l.finishLoad(j)
	}
}

// finishLoad marks j complete: every unit done, or failed. A batch of rows
// is put together first, on the workers.
func (l *Loader) finishLoad(j *load) {
	if l.flight != nil && !j.again {
		l.flight.done(len(j.units))
	}
	if !l.assembled() {
		sheddable := j.sheddable // once done, j may be taken, released and reused
		close(j.done)
		if sheddable {
			l.mem.poke() // a reload waiting for room may shed it
			if l.mem.over(0) {
				l.kickShed() // over a bound lowered while it was read
			}
		}
		return
	}
	if j.failed.Load() || j.win != nil {
		// A window's batches are cut from its cells and put together
		// each on its own (cutRows): the window's row batch only read them.
		j.rowsOut.Release()
		close(j.done)
		return
	}
	// Its own goroutine, not a worker: a batch may wait for pages another
	// batch decodes, and must not hold a worker that batch needs.
	l.io.Add(1)
	go func() {
		defer l.io.Done()
		cell := func(slot, k int) []byte {
			c := j.cellAt[slot] + k
			if j.cellLen[c] == 0 {
				return nil
			}
			return j.raw[j.cellOff[c] : j.cellOff[c]+j.cellLen[c]]
		}
		if l.samples != nil {
			l.putSamples(j, cell)
			close(j.done)
			return
		}
		cols, err := l.putRows(l.ctx, j.rowsOut, j.IDs, j.Epoch, cell, j.Data, &j.stage)
		if err != nil {
			j.fail(err)
		} else {
			j.Columns = cols
		}
		close(j.done)
	}()
}

func (j *load) fail(err error) {
	j.errOnce.Do(func() {
		j.err = err
		j.failed.Store(true)
	})
}

// key names record id in the cache.
func (l *Loader) key(id int) cache.Key {
	if l.opts.CacheKey != nil {
		return l.opts.CacheKey(id)
	}
	return cache.Key{Space: l.space, ID: int64(id)}
}
