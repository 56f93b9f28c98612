package order

import (
	"fmt"

	"github.com/riffle-ml/riffle/sampler"
)

// Samples are a token corpus's samples, as the order sees them: how many
// an epoch has (sequence.Batcher's, over a mixture's sources too).
type Samples interface {
	Len(epoch int) int
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
	smp, _, err := cfg.Build(n, nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	o.Sampler = smp
	return nil
}
