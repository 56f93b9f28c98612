package order

import (
	"errors"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/share"
)

// join makes the order a member of src's share group over its part mine,
// from epoch, the group made with opts if it is the first. What the group
// keeps of a record, and where (the record cache, or the page cache), is
// the job's choice, in opts (job/pages.go).
func (o *Order) join(src *Source, env Env, opts share.Options, mine *roaring.Bitmap, epoch int) (*share.Member, error) {
	if env.Groups == nil {
		return nil, errors.New("no share groups in this environment")
	}
	m, ms, err := env.Groups.join(env.Owner, src, opts, mine, epoch)
	if err != nil {
		return nil, err
	}
	o.members = append(o.members, ms)
	if opts.Pages != nil {
		m.SetFresh(env.Fresh)
	}
	return m, nil
}
