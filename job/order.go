package job

import (
	"context"
	"fmt"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/order"
)

// order opens the job's order through its one door (package order): the
// source resolved here, once, from what the job opened (its dataset, a
// column view over the same files, its share groups' options, the
// selection's threshold for O_DIRECT), and the plan's order fields.
func (j *Job) order(ctx context.Context) (*order.Order, error) {
	src, plan := j.src, j.plan
	env := order.Env{Store: j.env.store, IndexDir: j.env.opts.IndexDir, Memory: j.memory, PageCacheBytes: j.env.pageCacheBytes(),
		Groups: j.env.groups, Owner: j, Fresh: 2 * j.readAhead()}
	if j.tokens != nil {
		return order.Open(ctx, j.tokenSource(), plan.Order(), env)
	}
	osrc := j.orderSource(src, plan.Share)
	if plan.Mixture != nil {
		for _, p := range src.parts {
			osrc.Parts = append(osrc.Parts, j.orderSource(p, plan.Share))
		}
	}
	if f := plan.Filter; f != nil && f.Column != "" {
		if _, rows := src.ds.(dataset.Rows); rows && plan.Mixture == nil {
			// The column alone, of the files the source was opened with
			// (not the paths expanded again: a glob may match others by
			// now).
			opts := plan.Dataset
			opts.Columns = []string{f.Column}
			col, err := j.env.sets.get(ctx, src.files(), opts)
			if err != nil {
				return nil, fmt.Errorf("filter by column %q: %w", f.Column, err)
			}
			defer j.env.sets.put(col)
			osrc.Column, _ = col.ds.(dataset.Rows)
		}
	}
	if !j.persisted && (plan.Subset != nil || plan.Filter != nil || plan.Dedup) {
		osrc.DirectFrom = j.env.directFrom(plan, src)
	}
	return order.Open(ctx, osrc, plan.Order(), env)
}

// orderSource is src as the order takes it, with its share group's
// options if the job shares.
func (j *Job) orderSource(src *source, shares bool) *order.Source {
	cached := j.cached()
	osrc := &order.Source{DS: src.ds, Name: src.desc(), Group: fmt.Sprintf("%s|%s", src.key, cached)}
	if shares {
		key := cacheKey(src, cached)
		osrc.Share[0] = j.shareOptions(src, key, true)
		osrc.Share[1] = j.shareOptions(src, key, false)
	}
	return osrc
}
