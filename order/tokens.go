package order

import (
	"fmt"

	"github.com/riffle-ml/riffle/sampler"
)

// Samples are a token corpus's samples, as the order sees them: how many
// an epoch has (sequence.Batcher's, over a mixture's sources too), and
// each source's first id in an epoch, then the epoch's samples.
type Samples interface {
	Len(epoch int) int
	Offsets(epoch int) []int
}

// tokens is the order of an epoch's samples: the global shuffle of them
// (Megatron's shuffle_idx, with no index: a Feistel permutation of the
// epoch's samples, keyed by seed and epoch), or the samples in order; cut
// from Start and split over ranks as any order of records (Split), so a
// place in it is a position any topology resumes from.
func (o *Order) tokens(s Samples, p Plan) error {
	n := s.Len(p.Epoch)
	o.Samples = n
	cfg := p.Sampler
	k, ok := sampler.KindOf(cfg.Kind)
	if !ok || (k.Name != "global" && k.Name != "sequential") {
		return fmt.Errorf("%w: sampler %q: a token corpus's samples are shuffled globally or read in order", ErrSpec, cfg.Kind)
	}
	o.Kind = k.Name
	if p.Mixture != nil {
		return o.tokenMixture(s, p, cfg)
	}
	smp, _, err := cfg.Build(n, nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	o.Sampler = smp
	return nil
}

// tokenMixture mixes a mixture's corpora's samples by its weights, at a
// sample's granularity: each source's samples of the epoch in their own
// order (seeded apart), drawn by the mixture's schedule, whose weights
// change at any place of the epoch (sampler.Mixture); then split from
// the start and over ranks as one order is. Each epoch's sources have the
// job's first epoch's samples: a best_fit job reads one epoch.
func (o *Order) tokenMixture(s Samples, p Plan, cfg sampler.Config) error {
	offs := s.Offsets(p.Epoch)
	srcs := make([]sampler.Sampler, len(offs)-1)
	for k := range srcs {
		own := cfg
		own.Seed = sampler.Mix(cfg.Seed, uint64(k)+1)
		own.Rank, own.World, own.Start = 0, 1, 0
		var err error
		if srcs[k], _, err = own.Build(offs[k+1]-offs[k], nil); err != nil {
			return fmt.Errorf("%w: mixture source %d: %w", ErrSpec, k, err)
		}
	}
	m, err := sampler.NewMixtureAt(srcs, offs[:len(srcs)], p.Mixture.Segments, p.Mixture.Cycle, p.Epoch)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	o.Samples, o.Through = m.Len(), m.Through()
	if o.Sampler, _, err = cfg.Split(m, "mixture"); err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	return nil
}
