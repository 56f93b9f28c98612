package dataset

import (
	"context"
	"errors"
	"time"

	"github.com/riffle-ml/riffle/cache"
)

// Unpacked blocks: a Parquet page group decoded, a compressed Arrow record
// batch decompressed, each laid out as a record batch's body. Such a block
// is read and unpacked whole, however few of its rows a batch takes, so a
// dataset keeps the blocks it unpacked in one claim/fill/wait cache.Cache
// under one budget: of the batches that miss a block one claims it (reads
// and unpacks it), the others wait for it, and the next batches that take
// rows of it find it unpacked.

// UnpackedBudget bounds the unpacked blocks one dataset keeps.
const UnpackedBudget = 64 << 20

// unpackedBudget is UnpackedBudget, but in tests that make a dataset's
// blocks outgrow it with a small file (export_test.go).
var unpackedBudget int64 = UnpackedBudget

// BlockSizer is a dataset whose blocks are unpacked whole into that
// budget: BlockBytes is the most one block takes unpacked. An order that
// spreads a window of blocks over batches keeps the window's blocks
// unpacked, so the window must fit.
type BlockSizer interface {
	BlockBytes() int64
}

func newUnpackedCache() *cache.Cache {
	return cache.New(cache.Options{Budget: unpackedBudget, Policy: cache.LRU{}})
}

// claimWait bounds how long a batch waits for a block another batch
// claimed.
const claimWait = 2 * time.Second

var errAbandonedBlock = errors.New("the batch that was to unpack this block gave up")

// holds is one batch's hold on the unpacked blocks it needs, K naming a
// block: each is pinned from the plan until the batch is assembled or
// released, and those the batch claimed are its to unpack and publish.
type holds[K comparable, V any] struct {
	c     *cache.Cache
	items map[K]*cache.Item
	mine  map[K]bool
	done  map[K]bool // claims published
}

func newHolds[K comparable, V any](c *cache.Cache) *holds[K, V] {
	return &holds[K, V]{c: c, items: map[K]*cache.Item{}, mine: map[K]bool{}, done: map[K]bool{}}
}

// add pins block key (ck in the cache), claiming it if no batch has.
func (h *holds[K, V]) add(key K, ck cache.Key) {
	if _, ok := h.items[key]; ok {
		return
	}
	it, st := h.c.GetOrClaim(ck)
	h.items[key] = it
	if st == cache.Claimed {
		h.mine[key] = true
	}
}

// claimed reports whether the batch is to unpack block key.
func (h *holds[K, V]) claimed(key K) bool { return h.mine[key] }

// publish settles a block the batch claimed: unpacked (kept with its
// bytes' size, body) or failed (then gone, so a later batch claims it
// again). Only the first publish of a key counts.
func (h *holds[K, V]) publish(key K, v V, body []byte, err error) {
	if !h.mine[key] || h.done[key] {
		return
	}
	h.done[key] = true
	it := h.items[key]
	if err == nil {
		h.c.Set(it, body, v)
	}
	h.c.Fill(it, err)
}

// abandon gives up the claims not published yet: whoever waits for them
// unpacks the block itself.
func (h *holds[K, V]) abandon() {
	var zero V
	for key := range h.mine {
		h.publish(key, zero, nil, errAbandonedBlock)
	}
}

// unpin lets the cache evict the blocks the batch held, once.
func (h *holds[K, V]) unpin() {
	for key, it := range h.items {
		it.Done(false)
		delete(h.items, key)
	}
}

// await returns every block the batch holds, waiting for those other
// batches unpack: for a while, since the batch that claimed one may be
// another job's, stalled by its consumer before it could read; then
// unpacking it here (self), under this batch's own context, so a loader
// that closes stops its reads too.
func (h *holds[K, V]) await(ctx context.Context, self func(K) (V, error)) (map[K]V, error) {
	have := make(map[K]V, len(h.items))
	// One deadline for the whole batch, and once it has passed no block
	// is waited for again: a timer's channel fires once, so a select on
	// it for the next block would wait for ever.
	deadline := time.NewTimer(claimWait)
	defer deadline.Stop()
	expired := false
	for key, it := range h.items {
		ready := make(chan error, 1)
		it.OnReady(func(err error) { ready <- err })
		var v V
		ok := false
		if expired {
			select {
			case err := <-ready:
				if err == nil {
					v, ok = it.Value().(V)
				}
			default:
			}
		} else {
			select {
			case err := <-ready:
				if err == nil {
					v, ok = it.Value().(V)
				}
			case <-deadline.C:
				expired = true
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if !ok {
			var err error
			if v, err = self(key); err != nil {
				return nil, err
			}
		}
		have[key] = v
	}
	return have, nil
}
