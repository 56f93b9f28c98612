// Package order says which records a job reads, in which order, and where
// an epoch resumes: the one room for a question that was spread over ten
// files of package job.
//
// Open is the one door. It takes a source the job resolved once (its
// dataset opened, a column view, the share groups' options: no path is
// expanded and no file opened here) and the plan's order fields, and
// returns the sampler and the basis of the rest of an epoch:
//
//   - the records (select.go, ids.go, column.go, dedup.go): a subset of
//     ranges, ids and labels, a filter by label, size, file or a column's
//     values, and one of each set of equal records;
//   - their order: sampler auto's choice (auto.go: DeepIO's randomization
//     level, deepio.txt §III-C, priced against the device's measured rate,
//     LIRS's partial shuffles, lirs.txt §5), a dataset's own blocks
//     (own.go: Parquet's pages), a mixture of sources (mixture.go), a share
//     group's dependent sampling after Joader (joader.txt §3; groups.go,
//     share.go), and DistributedSampler's split of ranks and workers
//     (part.go for a shared order, sampler.Config.Split for the others);
//   - the rest of an epoch resumed on another topology (rest.go): from one
//     position (an order that is a function of position), or from the
//     places of every part of the run that saved it (a shared or an
//     opportunistic order).
//
// The kinds of order are package sampler's (its table, kinds.go); what a
// job's order is, the daemon tells a client (Order.Info, wire.OrderInfo).
//
// The package imports no job and no server (imports_test.go): the only
// job code it runs is the share groups' options (a record's cache key and
// size, whether another keeper reads), which a group calls while batches
// load.
package order
