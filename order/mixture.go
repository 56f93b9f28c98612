package order

import (
	"fmt"
	"log/slog"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
)

// concatenated is a mixture's dataset (dataset.NewConcat's, or
// NewRowsUnion's): its sources one after another.
type concatenated interface {
	Part(id int) (k, local int)
	Offsets() []int
	Parts() []dataset.Dataset
}

// mixture is a mixture's order: each source in its own order (of the
// job's kind, seeded apart, over its part of the subset), mixed by the
// weights, then split from the start and over ranks as one order is.
func (o *Order) mixture(src *Source, p Plan, env Env, cfg sampler.Config, subset *roaring.Bitmap) (sampler.Sampler, error) {
	c, ok := src.DS.(concatenated)
	if !ok || len(src.Parts) != len(c.Parts()) {
		return nil, fmt.Errorf("a mixture's dataset (%T) is not its %d sources one after another", src.DS, len(src.Parts))
	}
	parts, offs := c.Parts(), c.Offsets()
	// Each source's part of the subset, in its own ids (nil: all).
	locals := make([]*roaring.Bitmap, len(parts))
	for k, ds := range parts {
		if subset == nil {
			continue
		}
		mine := roaring.New()
		mine.AddRange(uint64(offs[k]), uint64(offs[k]+ds.Len()))
		mine.And(subset)
		if mine.IsEmpty() {
			return nil, fmt.Errorf("%w: the subset holds no record of mixture source %d (%s)", dataset.ErrEmpty, k, ds.Info().Paths[0])
		}
		locals[k] = roaring.New()
		it := mine.Iterator()
		for it.HasNext() {
			locals[k].Add(it.Next() - uint32(offs[k]))
		}
	}
	srcs := make([]sampler.Sampler, len(parts))
	if p.Share && sampler.Uniform(cfg.Kind) && p.Opportunistic <= 1 {
		// Each source's order is a member of its source's share group, as
		// a job on the source alone would be: mixtures and jobs over
		// overlapping sources read what they have in common once.
		if err := o.shareSources(src, p, env, cfg, locals, srcs); err != nil {
			return nil, err
		}
		cfg.Rank, cfg.World = 0, 1 // members cover this rank's and worker's part
	} else {
		if p.Share {
			// As a job alone: only a global shuffle is shared (and a
			// mixture's not with opportunistic batches, whose windows
			// would cross its sources' epochs).
			slog.Info("mixture not shared", "sampler", cfg.Kind, "opportunistic", p.Opportunistic)
		}
		for k, ds := range parts {
			own := ownBlocks(cfg, ds) // a Parquet source: a block order over its pages
			own.Seed = sampler.Mix(cfg.Seed, uint64(k)+1)
			own.Rank, own.World, own.Start = 0, 1, 0
			var err error
			if srcs[k], err = ownOrder(own, ds, locals[k]); err != nil {
				return nil, fmt.Errorf("%w: mixture source %d: %w", ErrSpec, k, err)
			}
		}
	}
	m, err := sampler.NewMixtureAt(srcs, offs, p.Mixture.Segments, p.Mixture.Cycle, p.Epoch)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	o.Samples = m.Len() // an epoch's samples: the schedule's, not every record
	o.Through = m.Through()
	s, _, err := cfg.Split(m, "mixture")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	return s, nil
}

// shareSources puts in srcs, for each source, a member of the source's
// share group over this rank's and worker's part of the source's records
// (locals[k], nil for all) dealt as a shared job's (part).
// A member starts at the source's own epoch the mixture's schedule has
// reached at the job's start.
func (o *Order) shareSources(src *Source, p Plan, env Env, cfg sampler.Config, locals []*roaring.Bitmap, srcs []sampler.Sampler) error {
	mine := make([]*roaring.Bitmap, len(srcs))
	sizes := make([]sampler.Sampler, len(srcs))
	for k, ps := range src.Parts {
		n := ps.DS.Len()
		mine[k] = partOf(p, cfg, locals[k], n)
		if mine[k] != nil {
			n = int(mine[k].GetCardinality())
		}
		if n == 0 {
			return fmt.Errorf("%w: this rank's part of mixture source %d holds no record", dataset.ErrEmpty, k)
		}
		sizes[k] = sampler.Sequential{N: n}
	}
	at, err := sampler.NewMixtureAt(sizes, src.DS.(concatenated).Offsets(), p.Mixture.Segments, p.Mixture.Cycle, p.Epoch)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	draws, err := at.Draws(p.Epoch, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	for k, ps := range src.Parts {
		epoch := p.Epoch
		if p.Mixture.Cycle {
			epoch = draws[k] / sizes[k].Len()
		}
		m, err := o.join(ps, env, ps.Share[0], mine[k], epoch)
		if err != nil {
			return fmt.Errorf("mixture source %d not shared: %w", k, err)
		}
		srcs[k] = m
	}
	return nil
}
