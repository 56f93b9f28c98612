package order

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/share"
	"github.com/riffle-ml/riffle/wire"
)

// The rest of an epoch resumed on another topology. An order that is a
// function of position resumes from one rank's position (Config.Start);
// two kinds of order cannot: a shared one, whose records each rank's
// group chose, and an opportunistic one, whose windows deliver records
// in the order reads end. Their rest is computed from the places of every
// part (rank and DataLoader worker) of the run that saved them
// (Plan.Delivered), and the job reads its part of what they left.

// rest is subset (every record of n, if nil) less the records places
// delivered of epoch, and those records as one state (its basis, which
// the rest's own places carry): a shared order's epoch resumed on another topology (any number
// of ranks and workers) is a uniform order of what is left, since a
// uniform permutation's rest, given the records before it, is a uniform
// permutation of the others. A place past the epoch delivered its whole
// part, dealt from what its run began with: subset, less what a rest's
// run was opened without (the set its places carry, EncodeDelivered's).
func rest(ctx context.Context, epoch int, places []wire.State, subset *roaring.Bitmap, n int) (*roaring.Bitmap, []byte, error) {
	all := subset
	if all == nil {
		all = roaring.New()
		all.AddRange(0, uint64(n))
	}
	done, before := roaring.New(), roaring.New()
	var whole []*wire.Part
	for k, st := range places {
		if err := ctx.Err(); err != nil {
			return nil, nil, err // the job closed while it opened
		}
		if p := st.Part; p != nil && st.Epoch > epoch && len(st.Sampler) == 0 {
			whole = append(whole, p)
			continue
		}
		if len(st.Sampler) == 0 {
			if st.Epoch > epoch || (st.Epoch == epoch && st.Batch > 0) || len(st.Skip) > 0 {
				return nil, nil, specErr("delivered: place %d (epoch %d, batch %d) says what it delivered of epoch %d without its sampler state or whose part it is", k, st.Epoch, st.Batch, epoch)
			}
			continue // a part that had delivered nothing of the epoch
		}
		s, err := share.Delivered(st.Sampler, n)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: delivered: place %d: %w", ErrSpec, k, err)
		}
		switch {
		case s.Epoch < epoch:
			continue // the end of the epoch before: nothing of this one
		case s.Epoch > epoch:
			return nil, nil, specErr("delivered: place %d is in epoch %d, past the rest of epoch %d", k, s.Epoch, epoch)
		}
		if s.Size == 0 {
			// What a rest's run was opened without: its parts were dealt
			// from the others.
			before.Or(s.Done)
		}
		done.Or(s.Done)
		// Of the tail an opportunistic window took, the records its
		// batches delivered are the place's skip; the others were not.
		// Each is looked up in what the place took, a set: a scan of
		// the order for each (8,000 skips over 10^6 records were 3.2 s
		// of a core) is no check to make of a client's list.
		if len(st.Skip) > 0 {
			taken := s.Taken()
			for i, id := range st.Skip {
				if i%4096 == 0 && ctx.Err() != nil {
					return nil, nil, ctx.Err()
				}
				if id < 0 || id >= n || !taken.Contains(uint32(id)) {
					return nil, nil, specErr("delivered: place %d skips record %d, which its order did not take", k, id)
				}
				done.Add(uint32(id))
			}
		}
	}
	if !done.IsEmpty() && int(done.Maximum()) >= n {
		return nil, nil, specErr("delivered: record %d, of a dataset of %d (the places are of other data)", done.Maximum(), n)
	}
	if len(whole) > 0 {
		dealt := roaring.AndNot(all, before)
		for _, p := range whole {
			if err := ctx.Err(); err != nil {
				return nil, nil, err // each part is a pass over the records: none after the job closed
			}
			done.Or(part(dealt, n, p.Rank, p.World, p.Worker, p.Workers, p.DropLast))
		}
	}
	basis, err := share.EncodeDelivered(epoch, done)
	if err != nil {
		return nil, nil, err
	}
	return roaring.AndNot(all, done), basis, nil
}

// A positional rest's basis: the rest of its base order a run read,
// which its places carry (as a shared rest's carry its set), so that a
// rest of it is computed from the same order. "RFPOS1\x00", "epoch start
// count\n", then count uvarints: the skipped positions, each as its
// distance from the one before (from start for the first).
const posMagic = "RFPOS1\x00"

type basis struct {
	epoch, start int
	skip         []int
}

func (b basis) encode() []byte {
	out := fmt.Appendf([]byte(posMagic), "%d %d %d\n", b.epoch, b.start, len(b.skip))
	prev := b.start
	for _, p := range b.skip {
		out = binary.AppendUvarint(out, uint64(p-prev))
		prev = p
	}
	return out
}

func decodeBasis(state []byte, n int) (basis, error) {
	var b basis
	var count int
	r := bytes.NewReader(state[len(posMagic):])
	// Each position is a uvarint, a byte at least: count is bounded by the
	// bytes that hold it as well as by the order, before it is allocated.
	if _, err := fmt.Fscanf(r, "%d %d %d\n", &b.epoch, &b.start, &count); err != nil || b.epoch < 0 || b.start < 0 ||
		b.start > n || count < 0 || count > n-b.start || count > r.Len() {
		return b, fmt.Errorf("the rest of an epoch a run read: %w (its header)", sampler.ErrState)
	}
	b.skip = make([]int, count)
	prev := b.start
	for i := range b.skip {
		d, err := binary.ReadUvarint(r)
		if err != nil || (i > 0 && d == 0) || d > uint64(n) || prev+int(d) >= n {
			return b, fmt.Errorf("the rest of an epoch a run read: %w (its positions)", sampler.ErrState)
		}
		prev += int(d)
		b.skip[i] = prev
	}
	return b, nil
}

// positionalRest is the rest of an opportunistic order's epoch from the
// places of every part of the run that saved it, whatever its topology:
// base (the epoch's order, over one rank) from the first position not
// every rank delivered, less the positions some delivered past it (the
// windows of workers ahead of the others, and the records of partly
// delivered windows: the ids of batches in flight). A rank's part is
// every world-th position of the order (DistributedSampler's stride), so
// once rank r delivered its first J_r positions, the order's positions
// below min over r of (r + J_r·world) are all delivered. It returns the
// rest's basis too, for the run's places to carry.
func positionalRest(ctx context.Context, epoch int, places []wire.State, dropLast bool, base sampler.Sampler) (sampler.Sampler, []byte, error) {
	var b0 *basis
	type role struct {
		st   wire.State
		part wire.Part
	}
	var roles []role
	for k, st := range places {
		switch {
		case bytes.HasPrefix(st.Sampler, []byte(posMagic)):
			b, err := decodeBasis(st.Sampler, base.Len())
			if err != nil {
				return nil, nil, fmt.Errorf("%w: delivered: place %d: %w", ErrSpec, k, err)
			}
			if b.epoch != epoch {
				continue // the rest of the epoch before, which a place past it carries
			}
			if b0 != nil && (b0.start != b.start || !slices.Equal(b0.skip, b.skip)) {
				return nil, nil, specErr("delivered: place %d is of another rest of epoch %d than the places before it", k, epoch)
			}
			b0 = &b
		case len(st.Sampler) > 0:
			return nil, nil, specErr("delivered: place %d has a sampler state, which an opportunistic order's place has not: it is of another order", k)
		case st.Part == nil || st.Part.BatchSize < 1 || st.Part.Window < 1:
			return nil, nil, specErr("delivered: place %d does not say whose part it is, with its batch size and window", k)
		case st.Epoch < epoch:
			return nil, nil, specErr("delivered: place %d is in epoch %d, before the rest of epoch %d", k, st.Epoch, epoch)
		default:
			roles = append(roles, role{st, *st.Part})
		}
	}
	old := sampler.Rest{Base: base}
	if b0 != nil {
		var ok bool
		if old, ok = sampler.NewRest(base, b0.start, b0.skip); !ok {
			return nil, nil, specErr("delivered: the rest the places were read from is not of this order")
		}
	}
	if len(roles) == 0 {
		if b0 == nil {
			return nil, nil, specErr("delivered: no part's place, and no rest of epoch %d", epoch)
		}
		// The rest itself, with no part's place: a part of its run opened
		// again where it was (its batch and skip), on the same topology
		// (a client reconnecting to a restarted daemon).
		return old, b0.encode(), nil
	}
	n := old.Len()
	first := roles[0].part
	world, size, win, drop := first.World, first.BatchSize, first.Window, first.DropLast
	// Rank r's j-th position is the old order's r + j·world (padding
	// wraps to its start: records delivered twice, as DistributedSampler
	// pads); its part has rankLen positions, in batches of size.
	rankLen := (n + world - 1) / world
	if drop {
		rankLen = n / world
	}
	batches := (rankLen + size - 1) / size
	if dropLast {
		batches = rankLen / size
	}
	delivered := min(rankLen, batches*size) // rank positions its batches hold
	// Each rank's roles: T, the windows before which each delivered all of
	// its own (worker w of workers owns windows t ≡ w, mod workers), and
	// the records of the window it was inside.
	type progress struct {
		workers int
		done    map[int]int // worker -> T
		skip    map[int][]int
	}
	ranks := make([]progress, world)
	for k, r := range roles {
		if err := ctx.Err(); err != nil {
			return nil, nil, err // the job closed while it opened
		}
		p := r.part
		if p.World != world || p.BatchSize != size || p.Window != win || p.DropLast != drop ||
			p.Rank < 0 || p.Rank >= world || p.Workers < 1 || p.Worker < 0 || p.Worker >= p.Workers {
			return nil, nil, specErr("delivered: place %d's part (%+v) is not of the run of place 0's (%+v)", k, p, first)
		}
		rp := &ranks[p.Rank]
		if rp.done == nil {
			rp.workers, rp.done, rp.skip = p.Workers, map[int]int{}, map[int][]int{}
		}
		if rp.workers != p.Workers {
			return nil, nil, specErr("delivered: rank %d's places say %d and %d workers", p.Rank, rp.workers, p.Workers)
		}
		if _, twice := rp.done[p.Worker]; twice {
			return nil, nil, specErr("delivered: rank %d worker %d's place given twice", p.Rank, p.Worker)
		}
		t := (batches + win - 1) / win // past the epoch: every window
		if r.st.Epoch == epoch {
			t = r.st.Batch / win
			if r.st.Batch%win != 0 {
				rp.skip[p.Worker] = r.st.Skip
			} else if len(r.st.Skip) > 0 {
				return nil, nil, specErr("delivered: place %d skips records at a window's start", k)
			}
		}
		rp.done[p.Worker] = t
	}
	windows := (batches + win - 1) / win
	prefix := n // the first position not every rank delivered
	for r := range ranks {
		rp := &ranks[r]
		if rp.done == nil {
			return nil, nil, specErr("delivered: no place of rank %d of %d: a resume on another topology needs every rank's", r, world)
		}
		// The first window not delivered: each worker's first own window
		// at or after its T (a worker with no place delivered none).
		first := windows
		for w := range rp.workers {
			t := rp.done[w]
			t += ((w-t)%rp.workers + rp.workers) % rp.workers
			first = min(first, t)
		}
		if j := min(delivered, first*win*size); j < rankLen {
			prefix = min(prefix, r+j*world)
		}
	}
	// Positions past the prefix some rank delivered: its windows past its
	// first one not delivered, and the records of a window it was inside.
	skip := map[int]bool{}
	add := func(r, lo, hi int) { // rank r's positions [lo, hi)
		for q := max(lo, (prefix-r+world-1)/world); q < hi && ctx.Err() == nil; q++ {
			if p := r + q*world; p < n && p >= prefix {
				skip[p] = true
			}
		}
	}
	buf := make([]int, win*size)
	for r, rp := range ranks {
		for w := range rp.workers {
			// From the window holding the prefix's position on: the
			// windows before it are below the prefix.
			t := max(0, (prefix-r)/world) / (win * size)
			t += ((w-t)%rp.workers + rp.workers) % rp.workers
			for ; t < rp.done[w]; t += rp.workers {
				add(r, t*win*size, min(delivered, (t+1)*win*size))
			}
			ids := rp.skip[w]
			if len(ids) == 0 {
				continue
			}
			// The window's records, to find where the delivered ones are.
			t = rp.done[w]
			lo, hi := t*win*size, min(delivered, (t+1)*win*size)
			at := map[int]int{}
			for q := lo; q < hi && ctx.Err() == nil; q++ {
				p := (r + q*world) % n
				old.Fill(epoch, p, buf[:1])
				at[buf[0]] = p
			}
			for _, id := range ids {
				p, ok := at[id]
				if !ok {
					return nil, nil, specErr("delivered: rank %d worker %d skips record %d, which its window does not hold", r, w, id)
				}
				if p >= prefix {
					skip[p] = true
				}
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	// The new rest, in positions of base: the old rest's skips still
	// ahead, and the new ones.
	start := old.BaseOf(prefix)
	var next []int
	for _, p := range old.Skip {
		if p >= start {
			next = append(next, p)
		}
	}
	for p := range skip {
		next = append(next, old.BaseOf(p))
	}
	slices.Sort(next)
	next = slices.Compact(next)
	rest, ok := sampler.NewRest(base, start, next)
	if !ok {
		return nil, nil, fmt.Errorf("positional rest: a rest out of its order (start %d, %d skipped)", start, len(next))
	}
	return rest, basis{epoch: epoch, start: start, skip: next}.encode(), nil
}
