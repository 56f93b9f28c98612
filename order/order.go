package order

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// Source is a job's records as the job resolved them, once: its dataset
// opened, and what its share groups keep. Nothing here expands a path or
// opens a file.
//
// Its records are DS's, or, for a token corpus, Tokens': an epoch's
// samples cut from documents (package sequence: sample i of epoch e a
// pure function of both, any i in any order), which come in by the same
// door as a field beside DS. They are ordered as positions are (the
// plan's kind, seed, ranks and start apply to them as to records), and
// what is here about files (a selection, a dataset's own blocks, share
// groups, O_DIRECT) does not. Concat and pad cut as many samples every
// epoch; best_fit's count is its epoch's, and its job reads one epoch
// (job.Check), so the sampler, of one length, is of that epoch's.
type Source struct {
	// DS is the dataset; a mixture's is its sources one after another
	// (dataset.NewConcat's, or NewRowsUnion's), each a Part. A token
	// corpus's is the dataset of its documents.
	DS dataset.Dataset
	// Tokens, if set, are a token corpus's samples: the records the
	// order shuffles are its epoch's samples, not DS's records.
	Tokens Samples
	// Parts are a mixture's sources, each with a share group of its own;
	// nil for one source.
	Parts []*Source
	// Name names the source for people (the groups' status).
	Name string
	// Group keys the source's share group: its identity and what the
	// cache keeps of its records (a transform's outputs, or the records).
	Group string
	// Share are the options of the source's share group, if the plan
	// shares: Share[0] for the source as the job reads it, Share[1] for
	// its files read past the page cache (Order.Direct). The group calls
	// their functions (a record's key and size, whether another keeper
	// reads) while batches load.
	Share [2]share.Options
	// Column, for a filter by a column's values, is the dataset of rows
	// opened with that column alone; nil if the filter names none, or if
	// the source has no columns (the filter is then refused).
	Column dataset.Rows
	// DirectFrom, if not 0, is the least records of a selection (a
	// subset, a filter, dedup) that the job reads past the page cache: a
	// shuffle of fewer finds enough of their pages in it. The job's rule
	// (job/direct.go) grows with the records, so it is a threshold.
	DirectFrom int
}

// Plan is the order's part of a job's plan (job.Plan.Order).
type Plan struct {
	// Sampler is the order's kind and parameters: Kind "" is global,
	// "auto" the order auto.go chooses; its Rank, World and Start split
	// the order as DistributedSampler does (sampler.Config.Split).
	Sampler sampler.Config
	// Mixture, if set, mixes the source's Parts by weight.
	Mixture *Mixture
	// Share asks for dependent sampling in the source's share group (a
	// global order: job.Check refuses it of another).
	Share bool
	// Delivered are the places of every part of a run in Epoch: the
	// order is the rest of that epoch (rest.go).
	Delivered []wire.State
	// Epoch is the epoch the job starts at.
	Epoch int
	// BatchSize is the records of a batch; BatchStride and BatchOffset
	// the DataLoader worker's batches (offset, offset+stride, ...);
	// Opportunistic the batches of a window whose records come as their
	// reads end.
	BatchSize, BatchStride, BatchOffset, Opportunistic int
	// DropLast drops an epoch's last short batch; Ordered keeps the
	// sampler's order inside a batch.
	DropLast, Ordered bool
	// MinRandomness is the level sampler auto's order must reach;
	// AutoOrder the order it chose before, read again.
	MinRandomness float64
	AutoOrder     *wire.AutoOrder
	// Subset, Filter and Dedup select the records (select.go).
	Subset *wire.Subset
	Filter *wire.Filter
	Dedup  bool
}

// Mixture is how a mixture's sources are mixed: its weights from epoch 0
// on, each from a place (an epoch, a position of its order), and whether
// an epoch ends when every source's is used up (Cycle: all_exhausted) or
// the first's.
type Mixture struct {
	Segments []sampler.Segment
	Cycle    bool
}

// Env is what a job's environment gives its order.
type Env struct {
	// Store reads ids files (a subset's ids_file).
	Store storage.Store
	// IndexDir is where record hashes (dedup's) are kept, beside the
	// indexes.
	IndexDir string
	// Memory is the job's memory bound: sampler auto's windows fit in it.
	Memory int64
	// PageCacheBytes is what the page cache may keep of the job's files:
	// sampler auto counts files of at most that as read from memory.
	PageCacheBytes int64
	// Groups holds the share groups; Owner is the job a membership is
	// listed under in their status. Nil Groups: nothing is shared.
	Groups *Groups
	Owner  any
	// Fresh is how many records a member whose group keeps pages may take
	// ahead of its reads (share.Member.SetFresh).
	Fresh int
}

// Order is a job's order: its sampler and what the job, the loader and a
// client need to know of it.
type Order struct {
	Sampler sampler.Sampler
	// Kind is the order as resolved: global, block, sequential, buffered
	// or reservoir (sampler auto's choice, a dataset's own blocks).
	Kind string
	// Auto is the order sampler auto chose; nil if the plan named one.
	Auto *wire.AutoOrder
	// Samples is an epoch's records over every rank: the selection's, the
	// dataset's, or a mixture's schedule's.
	Samples int
	// Delivered, of the rest of an epoch resumed from every part's
	// places, is its basis, which the rest's own places carry: the set
	// the places delivered (share.EncodeDelivered), or a positional rest
	// of the order (rest.go).
	Delivered []byte
	// Direct says the selection is read past the page cache (it has at
	// least Source.DirectFrom records): the job opens the files so.
	Direct bool
	// OwnPart says the sampler is this rank's and DataLoader worker's
	// part already (a share group's members, a shared rest): the loader
	// takes every batch of it.
	OwnPart bool
	// Through, if not -1, is the last epoch the order serves: a
	// mixture's epochs are as long until its weights change again (the
	// job reads to it; the next epoch is a job of its own).
	Through int
	// Packed says a batch's records are delivered as they lie in its
	// memory (loader.Batch.PackedOrder): the order inside a batch is the
	// batch's own, its layout a function of the order (sampler.Packed),
	// not of timing (sharing, opportunistic windows) nor of a mixture's
	// sources.
	Packed bool

	plan    Plan
	groups  *Groups
	members []membership
	once    sync.Once
}

// Open is the one door: the records a job reads (a subset, a filter,
// dedup), their order (sampler auto's choice, a dataset's own blocks, a
// mixture, a share group's dependent sampling, DistributedSampler's split
// of ranks) and the rest of an epoch resumed on any topology (from one
// position, or from every part's places). ctx bounds the open only; Close
// leaves the share groups Open joined.
func Open(ctx context.Context, src *Source, p Plan, env Env) (*Order, error) {
	o := &Order{plan: p, groups: env.Groups, Through: -1}
	if src.Tokens != nil {
		if err := o.tokens(ctx, src, p, env); err != nil {
			o.Close()
			return nil, err
		}
		o.OwnPart = o.Shared() || (o.Delivered != nil && p.Share)
		return o, nil
	}
	sel, err := selection(ctx, src, p, env)
	if err != nil {
		return nil, err
	}
	o.Samples = src.DS.Len()
	if sel != nil {
		o.Samples = int(sel.GetCardinality())
		o.Direct = src.DirectFrom > 0 && o.Samples >= src.DirectFrom
	}
	if o.Sampler, err = o.order(ctx, src, p, env, sel); err != nil {
		o.Close()
		return nil, err
	}
	o.OwnPart = o.Shared() || (o.Delivered != nil && p.Share)
	o.Packed = sampler.Packed(o.Kind) && !p.Ordered && !p.Share && p.Opportunistic <= 1 && p.Mixture == nil
	return o, nil
}

// Shared says the order is a member of share groups (its source's, or
// each of its mixture's sources').
func (o *Order) Shared() bool { return len(o.members) > 0 }

// Close leaves the order's share groups, and a group goes with its last
// member. Safe to call twice; Shared still says what the order was.
func (o *Order) Close() {
	o.once.Do(func() { o.groups.leave(o.members) })
}

// Info is what the order is, for a client (an opened reply's order).
func (o *Order) Info() wire.OrderInfo {
	return wire.OrderInfo{Kind: o.Kind, Positional: o.plan.Positional(), Shared: o.plan.Share, Rest: o.plan.Rest(),
		Packed: o.Packed, Replay: o.plan.Replay()}
}

// Positional says a place in the plan's order is a position of an order
// that is a function of (seed, epoch, position), which any topology
// resumes from (sampler.Config.Start): not shared (a group chose its
// records), not opportunistic (its windows deliver records as reads end).
// Sampler auto picks a global or a block order.
func (p Plan) Positional() bool {
	k := p.Sampler.Kind
	return !p.Share && p.Opportunistic <= 1 && (sampler.Positional(k) || k == "auto")
}

// Rest says how an epoch of the plan's order resumes on another topology
// as its rest, from the places of every part of the run that saved it
// (Delivered): "shared" (a share group's), "opportunistic" (a global
// order's windows), or "" if it does not (a mixture resumes on the
// topology it was saved on, or from its position).
func (p Plan) Rest() string {
	k := p.Sampler.Kind
	switch {
	case p.Mixture != nil:
		return ""
	case p.Share:
		return "shared"
	case p.Opportunistic > 1 && sampler.Uniform(k):
		return "opportunistic"
	}
	return ""
}

// Replay says a client may rebuild a place's sampler state from the
// records it was delivered (share.Member's state is the set it took): a
// shared order that delivers each batch whole, of one dataset, from an
// epoch's start, not the rest of one.
func (p Plan) Replay() bool {
	return p.Share && p.Opportunistic <= 1 && p.Mixture == nil && len(p.Delivered) == 0 && p.Sampler.Start == 0
}

// order makes the sampler, in this one place: a member of its source's
// group when it asks to share a global shuffle (Joader's dependent
// sampling), else its own sampler (by default block-aware over a
// dataset's own blocks, Parquet's pages), over its selection if it has
// one.
func (o *Order) order(ctx context.Context, src *Source, p Plan, env Env, subset *roaring.Bitmap) (sampler.Sampler, error) {
	ds := src.DS
	cfg := p.Sampler
	if cfg.Kind == "auto" {
		var err error
		if cfg, o.Auto, err = autoOrder(ctx, cfg, ds, p, env); err != nil {
			return nil, err
		}
	}
	cfg = ownBlocks(cfg, ds)
	o.Kind = cfg.Kind
	if k, ok := sampler.KindOf(cfg.Kind); ok {
		o.Kind = k.Name // "" is the table's first, global
	}
	if p.Mixture != nil {
		return o.mixture(src, p, env, cfg, subset)
	}
	if p.Share && sampler.Uniform(cfg.Kind) {
		// Ranks and DataLoader workers are dealt parts of the subset (or
		// of the rest of an epoch resumed on another topology): a shared
		// order is no function of position to cut.
		if len(p.Delivered) > 0 {
			var err error
			if subset, o.Delivered, err = rest(ctx, p.Epoch, p.Delivered, subset, ds.Len()); err != nil {
				return nil, err
			}
		}
		mine := partOf(p, cfg, subset, ds.Len())
		if o.Delivered != nil && mine.IsEmpty() {
			// Of this part, every record was delivered: the rest holds none.
			return sampler.Sequential{}, nil
		}
		if mine != nil && mine.IsEmpty() {
			return nil, fmt.Errorf("%w: this rank's part of the subset holds no record", dataset.ErrEmpty)
		}
		opts := src.Share[0]
		if o.Direct {
			opts = src.Share[1]
		}
		m, err := o.join(src, env, opts, mine, p.Epoch)
		if err == nil {
			return m, nil
		}
		slog.Info("job not shared", "reason", err)
		if o.Delivered != nil {
			// Alone, the rest is its own uniform order over this part's
			// records not delivered: still each once.
			own := cfg
			own.Rank, own.World = 0, 1
			smp, err := ownOrder(own, ds, mine)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrSpec, err)
			}
			return smp, nil
		}
	}
	if len(p.Delivered) > 0 {
		// An opportunistic order's rest, from every part's place: of the
		// epoch's order over one rank, split over this run's.
		one := cfg
		one.Rank, one.World, one.RankDropLast = 0, 1, false
		base, err := ownOrder(one, ds, subset)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSpec, err)
		}
		var r sampler.Sampler
		if r, o.Delivered, err = positionalRest(ctx, p.Epoch, p.Delivered, p.DropLast, base); err != nil {
			return nil, err
		}
		smp, _, err := cfg.Split(r, "rest")
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSpec, err)
		}
		return smp, nil
	}
	smp, err := ownOrder(cfg, ds, subset)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSpec, err)
	}
	return smp, nil
}

// partOf is this rank's and DataLoader worker's part of subset (every
// record of n, if nil) when the order is shared, dealt as part deals it.
func partOf(p Plan, cfg sampler.Config, subset *roaring.Bitmap, n int) *roaring.Bitmap {
	stride := max(1, p.BatchStride)
	return part(subset, n, cfg.Rank, max(1, cfg.World), p.BatchOffset, stride, cfg.RankDropLast)
}
