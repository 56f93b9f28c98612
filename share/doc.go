// Package share makes the jobs of a group (jobs reading one source) share
// their reads: dependent sampling (joader.txt §3.1) picks each job's next
// record so that jobs choosing at the same time choose the same record as
// often as their datasets allow, while each job's own order stays a
// uniformly random permutation of its own subset: every one of its records
// exactly once per epoch.
//
// At each round the participating jobs, sorted by how many records they
// have left, walk Joader's dependent sampling tree (§4): the first selects
// the intersection I of their remaining sets with probability |I|/|D1|,
// each next one selects it with probability |D(i-1)|/|D(i)| if its
// predecessor did, and those that selected it share one uniform sample of
// I; the others recurse on their sets less I. For two jobs the probability
// of one shared record per round reaches the bound |I|/max(|D1|,|D2|)
// (Theorem 1), and every job's pick is uniform over its remaining set
// (Theorem 2), so its epoch is a uniform permutation.
//
// The tree is not built as sets. Records are grouped by signature, the set
// of jobs that still need them (classes.go); every vertex of the tree is a
// union of signature classes, found by one pass over the classes. A round
// costs O(n * classes) for n jobs; inserting a job (joining, or starting
// its next epoch) moves each of its records to its new class, O(|D|), where
// the paper's insertion is O(n * |D|); deleting one is O(records it still
// needs).
//
// Jobs keep their own pace: a round is run when a job needs a record and
// has none queued, among the jobs with room in their queues; a slow job's
// queue fills and it sits out rounds until it catches up, so no job waits
// for another, and the records a job was given but has not read yet are
// what the cache holds for it (the RefCnt cache, §3.2: each shared record
// is reserved with the number of jobs that will read it, and dropped when
// the last has). Raw records of local files are not copied: the first
// read leaves their pages in the page cache, and the group bounds the
// pages its slow jobs wait for by the memory the page cache may keep
// (Options.Hold), the same bound the RefCnt cache's budget sets. The group
// also chooses which of those pages the page cache keeps (Options.Pages,
// pages.go): when the memory runs out it drops the pages whose records
// are needed least soon (by the jobs that still need them this epoch,
// each at its rate over the records it has left), not the least recently
// read, which under uniform orders are the ones still needed. Joader's
// cache holds only what a round gave several jobs; every other record a
// job reads alone is left to the LRU and lost to the jobs behind it.
// Four staggered jobs at 1x, 1x, 2x, 4x over 4 GiB in a 3 GiB cgroup
// read 1.10x one epoch (fixed records), 1.47x (lines), 1.45x (a file
// tree), against 1.59x, 2.16x and 1.96x with the kernel's choice.
//
// Jobs that do not share, each reading the source in an order of its own
// (a job alone, DataLoader workers' and ranks' parts of one order), have
// their pages kept the same way by the source's Steward (steward.go):
// their orders' inverses say when each page is read next, and the pages
// read soonest stay (Belady's MIN), which under a uniform shuffle answers
// a share c of the reads where the LRU answers c + (1-c)ln(1-c). A job
// alone has its first epoch planned, MIN with bypass (bypass.go): a read
// whose page would not stay until its next read goes past the cache.
package share
