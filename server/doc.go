// Package server is riffle's daemon: one loading layer for every training
// job on a machine (OneAccess's shared loading layer, oneaccess.txt §3), so
// that jobs on the same data share its opened datasets and indexes now, and
// its reads, decoding and cache later.
//
// Clients speak the protocol of package wire over a Unix socket (mode 0600)
// or, for remote clients, TCP. A client opens jobs; each job is a loader
// over a dataset and a sampler, whose batches the loader reads straight into
// a shared-memory arena (Arena) that the client maps too: on a Unix socket a
// batch reaches Python without being copied through the socket (Rinas's
// PyTorch side, rinas.txt §4.5-5). Over TCP the batch bytes follow their
// header instead.
//
// A client that disconnects or dies has its jobs closed at once: its
// connection's reader sees the end of the stream and cancels the context
// every blocking call of the connection runs under.
package server
