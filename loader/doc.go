// Package loader fills batches: it turns a sampler's ids into many concurrent
// reads straight into one contiguous, reused buffer per batch.
//
// The execution model is Rinas's unordered batch generation (rinas.txt
// §4.4): the order of records inside a batch does not matter to SGD, so a
// batch's reads are issued all at once, sorted by location so that adjacent
// records coalesce into one read (and, with O_DIRECT, so that no page is read
// twice), and the batch is complete when the last read lands, whichever it
// is. By default records sit in the batch in that fetch order and the batch
// lists which id is where; Options.Ordered keeps the sampler's order.
//
// Reading is pipelined across batches as in DeepIO (deepio.txt §III-B): one
// read engine keeps the reads of the next Prefetch batches in flight, so the
// device queue stays full across batch boundaries while the consumer works,
// under a bound on the bytes of batches in flight. How many reads the
// device is given is chosen per device from its rate and latency as the
// job runs (storage's depth.go), unless Options.Depth pins it. Buffers come from an
// Allocator and go back to it when the consumer releases the batch, so the
// steady state allocates nothing per record; the daemon plugs in an
// allocator over shared memory so batches reach clients without a copy.
//
// Errors carry the file and offset of the failed read and reach the consumer
// on its next batch; cancelling the context stops all reads promptly.
package loader
