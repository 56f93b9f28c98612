package dataset

import (
	"fmt"
	"hash/fnv"
)

// Key is the identity of the data o opens: the options that decide which
// records there are and what their bytes are. Two opens of the same files
// whose options have one Key are the same records, byte for byte, so a
// daemon opens them once and names their records alike (its cache spaces,
// its share groups, a record's name between nodes). The options left out
// decide only where an index is kept and how it is used, how and through
// what the records are read, and who is told of progress; TestOptionsKey
// holds each field of Options to being in Key or in its list of those left
// out, with the reason.
//
// The text is the one the daemon built by hand before Key (job's
// sourceKey), so the names it gave records do not change.
func (o Options) Key() string {
	k := fmt.Sprintf("%s %d %d %v %v %v %q %q %q", o.Format, o.RecordSize,
		o.HeaderBytes, o.CSVHeader, o.SkipCRC, o.DropPartialTail, o.Columns, o.Split, o.Extensions)
	if o.Only != nil {
		h := fnv.New64a()
		fmt.Fprintf(h, "%q", o.Only)
		k += fmt.Sprintf(" only %d %016x", len(o.Only), h.Sum64())
	}
	return k
}
