// Package cache is riffle's one record cache: bytes of records (or blocks,
// or a transform's output) held in memory under one byte budget, shared by
// every loader of the daemon.
//
// Training reads each record once per epoch per job, so a general-purpose
// rule (LRU, LFU) keeps the wrong things: a record just read by every job
// that wants it is the most recently used and the least useful. Riffle
// knows the future instead, and evicts by it:
//
//   - RefCnt (joader.txt §3.2): an item carries the number of uses still to
//     come this epoch (the jobs that will read it, or one for a record a
//     staged sampler loaded ahead). The lowest count is evicted first, and
//     an item whose count reaches zero is dropped at once.
//   - Among equal counts, the item whose next use is farthest goes first
//     (Belady's MIN, which is optimal when the future is known): riffle's
//     orders are functions of (seed, epoch), so next use is computable.
//
// Both rules are one Policy (policy.go); an LRU Policy is kept beside them
// as the baseline the benchmarks compare against.
//
// An item is loaded once: the first loader to need it reserves it and
// reads into it, others wait for it with a callback instead of reading the
// same bytes again (OneAccess §3: one read serves every job).
package cache
