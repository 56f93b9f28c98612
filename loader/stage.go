package loader

import (
	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/internal/alignbuf"
	"github.com/riffle-ml/riffle/storage"
)

// A Staged sampler (OneAccess's reservoir, tf.data's buffer) has its
// records read ahead into the cache in ascending file order, in large
// coalesced reads: storage sees forward passes only, and batches are
// copied from memory (oneaccess.txt §3). Each staged record waits in the
// cache with one use to come; the batch that uses it drops it. A record
// the cache had no room for, or that a resumed sampler needs from before
// the resume, is read by its batch like any other.

// stager tracks which stages of the current epoch have been started.
type stager struct {
	epoch int
	next  int // the next stage to start
	init  bool
}

// maxStageRead bounds one coalesced read of a stage.
const maxStageRead = 8 << 20

// loadStages starts every stage needed before position upTo of epoch e
// is filled, and one stage beyond, so the next stage's reads overlap the
// batches of this one.
func (l *Loader) loadStages(e, upTo int) {
	st := &l.stage
	if !st.init || st.epoch != e {
		first := 0
		if e == l.opts.Epoch {
			// Resuming mid-epoch: records of earlier stages still to come
			// (a shuffle buffer's contents) are read on demand.
			pos, _ := l.Batches().Span(l.opts.Batch)
			first = l.staged.StageOf(e, pos)
		}
		*st = stager{epoch: e, next: first, init: true}
	}
	last := l.staged.StageOf(e, min(l.smp.Len()-1, upTo)) + 1
	for ; st.next <= last; st.next++ {
		ids, ok := l.staged.Stage(e, st.next)
		if !ok {
			st.next = last + 1
			break
		}
		l.loadStage(ids)
	}
}

// loadStage reads one stage's records into the cache.
func (l *Loader) loadStage(ids []int) {
	a := int64(l.align)
	type run struct {
		obj      int
		off, end int64
		ids      []int
	}
	var runs []run
	for _, id := range ids {
		loc := l.ds.Locate(id)
		if loc.Len == 0 {
			continue
		}
		start, end := loc.Off-int64(l.head), loc.Off+int64(loc.Len)+int64(l.tail)
		as, ae := start/a*a, (end+a-1)/a*a
		if m := len(runs) - 1; m >= 0 {
			r := &runs[m]
			if r.obj == loc.Object && as >= r.off && as <= r.end+int64(l.opts.CoalesceGap) && ae-r.off <= maxStageRead {
				r.end = max(r.end, ae)
				r.ids = append(r.ids, id)
				continue
			}
		}
		runs = append(runs, run{obj: loc.Object, off: as, end: ae, ids: []int{id}})
	}
	var reqs []*storage.Request
	for _, r := range runs {
		items := make([]*cache.Item, len(r.ids))
		any := false
		for i, id := range r.ids {
			if l.cache.AddRefs(l.key(id), 1) {
				continue // still there for an earlier use: one more use to come
			}
			loc := l.ds.Locate(id)
			items[i], _ = l.cache.Reserve(l.key(id), loc.Len, 1, cache.Never, true)
			any = any || items[i] != nil
		}
		if !any {
			continue // all there already, or no room
		}
		buf := alignbuf.Make(int(r.end-r.off), l.align)
		r := r
		reqs = append(reqs, &storage.Request{Ctx: l.ctx, R: l.ds.Object(r.obj), P: buf, Off: r.off, Done: func(err error) {
			defer l.io.Done()
			if err == nil {
				l.stagedBytes.Add(int64(len(buf)))
			}
			for i, id := range r.ids {
				it := items[i]
				if it == nil {
					continue
				}
				loc := l.ds.Locate(id)
				at := loc.Off - r.off
				e := err
				if e == nil && l.framed != nil {
					e = l.framed.Verify(id, buf[at-int64(l.head):at+int64(loc.Len)+int64(l.tail)])
				}
				if e == nil {
					e = it.Put(buf[at : at+int64(loc.Len)])
				}
				l.cache.Fill(it, e)
				it.Done(false)
			}
		}})
	}
	if len(reqs) > 0 {
		l.io.Add(len(reqs))
		l.engine.Submit(reqs...)
	}
}

// stageBudget is the default byte budget of a Staged sampler's cache: the
// stages the first position needs (a shuffle buffer's worth) and three
// more, at least 64 MiB.
func (l *Loader) stageBudget() int64 {
	if l.opts.StageBytes > 0 {
		return l.opts.StageBytes
	}
	ids, _ := l.staged.Stage(l.opts.Epoch, 0)
	mean := l.ds.Info().Bytes/int64(l.ds.Len()) + 1
	stages := int64(l.staged.StageOf(l.opts.Epoch, 0) + 4)
	return max(64<<20, stages*int64(len(ids))*mean)
}
