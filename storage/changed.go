package storage

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Reads a change reached.
//
// A read of a local file that a writer shrinks and grows back while it
// runs can complete in full with bytes that were never the dataset's: a
// pread that checked the file's size before a truncation copies the
// zeros the truncation left in its last page; a file grown back by an
// extension reads zeros until the writer's bytes land; a mapping reads
// zeros within the new end's page. Nothing in the read's result says so
// (13 of 17,552 records delivered so in issue 46's run; in TestTornReads,
// whose writer extends with zeros every other round, one read in eight).
// A version check of the file after the read cannot tell such a read from
// one of a file rewritten in place with other bytes: the file did hold
// those zeros, for a moment, at its full size.
//
// So a file is read as it was opened, and a read that finds it changed
// fails at once. Every write and truncation sets the file's ctime (and
// mtime) to now, and since Linux 6.13 (multigrain timestamps on ext4,
// xfs, btrfs and tmpfs) a change after an fstat always gets a ctime the
// fstat did not see: the open's fstat is one. One fstat a file after
// each round of reads (a front worker's round of copies from the page
// cache, a round of the ring's completions, a ReadAt) compares the file's
// size, mtime and ctime with the open's; a read that landed before that
// fstat and finds them moved fails with ErrShrunk, if its bytes lie past
// the file's end now, else ErrChanged, naming the file and offset. The
// job says so (DataChanged), as the next epoch's check of the dataset
// would have.
//
// Where timestamps are coarse (older kernels, other file systems), a
// change within the same tick (1-4 ms) as the open's fstat can go unseen.
//
// Cost: one fstat per file per round; for a ReadAt alone (the goroutine
// pool's reads, without io_uring), one per read.

// stamp is what fstat says of a file's version: its size, mtime and ctime.
type stamp struct{ size, mtime, ctime int64 }

func stampOf(st *unix.Stat_t) stamp {
	return stamp{size: st.Size, mtime: unixTime(st.Mtim).UnixNano(), ctime: unixTime(st.Ctim).UnixNano()}
}

// changed checks, after reads of f have landed, that f is still as it was
// opened: it returns, for a read of n bytes at off among them, the error
// it fails with (nil for none). A file found changed stays so: its later
// checks cost no fstat.
func (f *File) changed() func(off int64, n int) error {
	defer runtime.KeepAlive(f)
	var st unix.Stat_t
	var err error
	switch {
	case f.moved.Load():
	case f.closed.Load():
		err = os.ErrClosed // its descriptor's number may be another file's by now
	default:
		if err = unix.Fstat(f.fd, &st); err == nil {
			now := stampOf(&st)
			if now == f.opened {
				return func(int64, int) error { return nil }
			}
			f.shortest.Store(min(f.shortest.Load(), now.size))
			f.moved.Store(true)
		}
	}
	return func(off int64, n int) error {
		if err != nil {
			return &Error{Op: "fstat", Object: f.name, Offset: off, Len: n, Err: err}
		}
		// Reads of an O_DIRECT file may run past its end to the aligned
		// size: only the bytes it had at open count.
		if short := f.shortest.Load(); min(off+int64(n), f.size) > short {
			return &Error{Op: "read", Object: f.name, Offset: off, Len: n, Err: f.endError(off, n, int(max(0, short-off)))}
		}
		return &Error{Op: "read", Object: f.name, Offset: off, Len: n,
			Err: fmt.Errorf("%w: written or truncated since, its bytes may be another version's", ErrChanged)}
	}
}

// settle completes reads of local files that have landed (a front
// worker's round of copies from the page cache, or a round of the ring's
// completions), each file's checked by one fstat.
func (e *Engine) settle(rs []*Request) {
	for len(rs) > 0 {
		f := rs[0].file
		check := f.changed()
		rest := rs[:0]
		for _, r := range rs {
			if r.file != f {
				rest = append(rest, r)
				continue
			}
			e.complete(r, check(r.Off, len(r.P)))
		}
		clear(rs[len(rest):])
		rs = rest
	}
}
