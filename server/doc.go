// Package server is riffle's daemon: one loading layer for every training
// job on a machine (OneAccess's shared loading layer, oneaccess.txt §3).
// It holds transport only: sockets, authentication, admission, the
// shared-memory arenas, frames to and from job calls, status and metrics.
// The stores it reads through are built by storage/stack from its fields,
// in one call, and the jobs' environment by job.NewEnv.
// What a job is (its options, its order, its memory, its share group, the
// datasets it shares with other jobs) is package job's; the daemon keeps
// one job.Env for all its clients, so that jobs on the same data share
// opened datasets and indexes, reads, decoding and the record cache.
//
// Clients speak the protocol of package wire over a Unix socket (mode 0600)
// or, for remote clients, TCP with a token. A client's handle on a job
// puts the job's batches in a shared-memory arena (Arena) that the client
// maps too: on a Unix socket a batch reaches Python without being copied
// through the socket (Rinas's PyTorch side, rinas.txt §4.5-5). Over TCP the
// batch bytes follow their header instead. Every error frame carries its
// kind (job.Kind), so a client raises what its user catches.
//
// A client that disconnects or dies has its jobs closed at once: its
// connection's reader sees the end of the stream and cancels the context
// every blocking call of the connection runs under.
package server
