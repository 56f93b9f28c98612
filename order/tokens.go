package order

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/RoaringBitmap/roaring/v2"

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
func (o *Order) tokens(ctx context.Context, src *Source, p Plan, env Env) error {
	s := src.Tokens
	n := s.Len(p.Epoch)
	o.Samples = n
	cfg := p.Sampler
	k, ok := sampler.KindOf(cfg.Kind)
	if !ok || (k.Name != "global" && k.Name != "sequential" && k.Name != "block") {
		return fmt.Errorf("%w: sampler %q: a token corpus's samples are shuffled globally, read in order, or in blocks of best_fit's windows", ErrSpec, cfg.Kind)
	}
	o.Kind = k.Name
	if p.Mixture != nil {
		return o.tokenMixture(s, p, cfg)
	}
	if k.Name == "block" {
		return o.tokenBlocks(s, p, cfg)
	}
	if p.Share && k.Uniform {
		return o.tokenShare(ctx, src, p, env, cfg, n)
	}
	smp, _, err := cfg.Build(n, nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	o.Sampler = smp
	return nil
}

// tokenBlocks is the block order over best_fit's windows: the windows of
// the epoch shuffled, each window's samples spread over the batches of
// Window windows (sampler.Block), so a window is packed once where the
// global shuffle of samples packs one again for nearly every sample
// (sequence's BenchmarkBestFitOrder: 3.3 thousand samples/s against 1.2
// million at seq_len 2048). A batch then holds samples of a few windows,
// each of documents of the epoch's shuffled order.
func (o *Order) tokenBlocks(s Samples, p Plan, cfg sampler.Config) error {
	w, ok := s.(interface{ Windows(int) ([]int, bool) })
	if !ok {
		return fmt.Errorf("%w: sampler block of a token corpus: its samples have no windows", ErrSpec)
	}
	bounds, ok := w.Windows(p.Epoch)
	if !ok {
		return fmt.Errorf("%w: sampler block of a token corpus is over best_fit's windows, of one corpus", ErrSpec)
	}
	cfg.Bounds, cfg.Window = bounds, max(1, cfg.Window)
	if p.Sampler.Window == 0 {
		cfg.Window = 4
	}
	smp, _, err := cfg.Build(bounds[len(bounds)-1], nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSpec, err)
	}
	o.Sampler = smp
	return nil
}

// tokenShare makes the order a member of the source's share group (jobs
// of one corpus cut into samples alike, Source.Group) over this rank's
// and worker's part of the epoch's samples, or of the rest of an epoch
// resumed from every part's places (Delivered), dealt as a shared job's
// records are: dependent sampling (package share) gives jobs at one place
// the same samples at about the same time, so a sample's pieces are read
// from the device once and wait in the page cache for the others, and
// each job still takes each of its samples once per epoch, in a uniform
// order. Alone (no groups), the rest is its own uniform order, and an
// epoch from its start the positional one.
func (o *Order) tokenShare(ctx context.Context, src *Source, p Plan, env Env, cfg sampler.Config, n int) error {
	var subset *roaring.Bitmap
	if len(p.Delivered) > 0 {
		var err error
		if subset, o.Delivered, err = rest(ctx, p.Epoch, p.Delivered, nil, n); err != nil {
			return err
		}
	}
	mine := partOf(p, cfg, subset, n)
	if o.Delivered != nil && mine.IsEmpty() {
		o.Sampler = sampler.Sequential{} // of this part, every sample was delivered
		return nil
	}
	m, err := o.join(src, env, src.Share[0], mine, p.Epoch)
	if err == nil {
		o.Sampler = m
		return nil
	}
	slog.Info("job not shared", "reason", err)
	if o.Delivered != nil {
		// Alone, the rest is its own uniform order over this part's
		// samples not delivered: still each once.
		own := cfg
		own.Rank, own.World, own.Start = 0, 1, 0
		base, _, err := own.Build(int(mine.GetCardinality()), nil)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSpec, err)
		}
		o.Sampler = &subsetSampler{base: base, ids: mine.ToArray()}
		return nil
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
