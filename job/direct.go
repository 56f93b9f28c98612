package job

import (
	"os"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/storage"
)

// Reads past the page cache, when nothing comes of passing through it.
//
// A shuffle (global, or the order auto picks) of files the page cache
// cannot keep reads them cold every epoch: a record read once is evicted
// before the epoch comes back to it, a random read finds the page of
// another, and a hit is as likely as the cache is small beside the data.
// Through the cache each cold 4 KiB read costs the kernel ~40% more CPU
// than an O_DIRECT one (page insertion, memcg charge: BENCHMARKS.md, the
// depth section), and on a device that CPU limits (a fast NVMe, the RAM
// device there) that is the rate lost. It also pushes out what the cache
// held for others. So a job whose spec leaves direct unset reads such
// files with O_DIRECT; jobs sharing the records find them in riffle's own
// cache (the share group's), not the page cache. Files the cache can keep
// are read through it: from the second epoch every read is a hit.
//
// "Cannot keep" is the rule sampler auto prices orders by: more than half
// the memory the process may use (its cgroup's limit if lower), the other
// half being the jobs' and the daemon's own. The orders are those that
// read records at random: a sequential or buffered order reads file
// order, which the kernel's readahead turns into large reads, and a block
// order named by the user reads blocks its own way. Only local files are
// read with O_DIRECT (a directory's many small files, object stores and
// datasets of rows are read as before).

// pageCacheBytes is what the page cache may keep of a job's files.
func (env *Env) pageCacheBytes() int64 {
	if env.opts.PageCacheBytes > 0 {
		return env.opts.PageCacheBytes
	}
	return AvailableMemory() / 2
}

// readsDirect says whether a job of plan over paths reads them with
// O_DIRECT: its spec leaves it to the job, its order reads records at
// random, and paths are local files larger together than keep.
func readsDirect(plan Plan, paths []string, keep int64) bool {
	if !plan.DirectUnset || plan.Refresh || plan.Mixture != nil {
		return false
	}
	if k := plan.Sampler.Kind; k != "" && k != "global" && k != "auto" {
		return false
	}
	var total int64
	for _, p := range paths {
		if storage.IsS3(p) {
			return false
		}
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() {
			return false // a directory's files, or an open that will say what is wrong
		}
		total += st.Size()
	}
	return total > keep
}

// chosenDirect says whether ds's records may be read with O_DIRECT as chosen:
// not a dataset of rows, whose pages go through their own readers.
func chosenDirect(ds dataset.Dataset) bool {
	_, rows := ds.(dataset.Rows)
	return !rows
}
