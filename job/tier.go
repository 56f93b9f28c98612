package job

import (
	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
)

// nextUse tells the disk tier when this job next reads a byte of a range
// of an object: the earliest next position of the records the range
// touches, from the inverse of the job's order (sampler.NextUses), which
// makes the tier's eviction Belady's MIN. Ranges of other objects, and
// orders with no inverse, are cache.Never. It runs under the tier's lock
// for every block, so the object is found in a map made once per job.
func (j *Job) nextUse(object string, off, n int64) int64 {
	ds := j.src.ds
	r, ok := ds.(dataset.Ranger)
	if !ok {
		return cache.Never
	}
	obj, ok := j.objects[object]
	if !ok {
		return cache.Never
	}
	lo, hi, ok := r.RecordsIn(obj, off, n)
	if !ok {
		return cache.Never
	}
	st, _ := j.l.Place()
	now := st.Epoch*j.smp.Len() + st.Batch*j.plan.Loader.BatchSize
	best := int64(cache.Never)
	next := sampler.NextUses(j.smp, now)
	for id := lo; id < hi && id < lo+1024; id++ {
		t, ok := next(id)
		if !ok {
			return cache.Never
		}
		best = min(best, t)
	}
	return best
}
