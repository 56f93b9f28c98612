// Package job is one training job, from a spec to batches: usable from Go
// with no socket, and what the daemon (package server) serves to clients.
//
// A spec becomes a Plan in one place, Check, from one table of options,
// Options (name, kind, bounds, default, doc); the Python client's option
// list (python/riffle/spec.py) and docs/protocol.md's table are generated
// from it. An Env holds what the jobs of a process share: the opened
// datasets (sources, each with a struct identity), the record cache, the
// share groups, the read engines and the transform workers. Env.Open
// makes a Job: it resolves and opens the source once, sizes its memory,
// opens its order through package order's one door (which records, in
// which order, and where an epoch resumes: a subset, Parquet's pages
// block-aware by default, a share group's dependent sampling after Joader
// (joader.txt §3), DistributedSampler's split of ranks), and starts a
// loader (package loader) into memory the caller gives (a daemon's shared
// arena, or the Go heap).
//
// Whoever holds the bytes states their size: a shared record's cache item
// is the record's own length, or its transform's output size, and every
// copy into or out of an item checks it (cache.Item.Put, CopyTo); a local
// file's raw records wait in the page cache instead, counted by the pages
// they lie in (Job.shareOptions). A job
// in a group covers its rank's and DataLoader worker's part of every
// epoch; Describe says how many batches that is, and a client counts by
// that and never works it out again.
//
// Errors say what they are about (Kind): a spec, a path not found, bad
// data, data that changed, a job closing, or an internal failure.
package job
