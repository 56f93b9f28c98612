package job

import (
	"bufio"
	"container/heap"
	"io/fs"
	"math"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// jobMemory is a job's bound on batches in flight and held when the plan
// does not give one: room for 16 batches of meanRecord-byte records and
// two of the largest, at least 64 MiB (or share, if smaller and not 0),
// at most what one job may have. share is a daemon's fair share of its
// budget for jobs (EnvOptions.JobMemory): a floor larger than that would
// let a few default jobs take the whole budget, and the others wait.
func jobMemory(meanRecord int64, batch int, maxBatch, share int64) int64 {
	floor := int64(64 << 20)
	if share > 0 {
		floor = min(floor, share)
	}
	m := max(floor, mulSat(16, mulSat(int64(batch), meanRecord)), mulSat(2, maxBatch))
	return min(m, MaxMemory())
}

// MaxMemory bounds one job's memory: half the memory the process may use
// (AvailableMemory).
func MaxMemory() int64 { return AvailableMemory() / 2 }

// AvailableMemory is the memory this process may use: the machine's, or
// the limit of its memory cgroup (v1 or v2, the lowest on its path from
// the root) if lower. It is read again at each call: a process can be
// moved to another cgroup.
func AvailableMemory() int64 {
	var si unix.Sysinfo_t
	total := int64(8 << 30)
	if unix.Sysinfo(&si) == nil {
		total = int64(si.Totalram) * int64(si.Unit)
	}
	if lim, ok := cgroupLimit(); ok && lim < total {
		return lim
	}
	return total
}

// cgroupLimit reads the memory limit of the process's cgroup, v1
// (memory.limit_in_bytes) or v2 (memory.max): the lowest of its own and
// its ancestors', since a parent's limit bounds its children's sum.
func cgroupLimit() (int64, bool) { return cgroupLimitIn(os.DirFS("/")) }

// cgroupLimitIn is cgroupLimit over a file system rooted where / is.
func cgroupLimitIn(fsys fs.FS) (int64, bool) {
	limit, _, ok := cgroupMemoryIn(fsys)
	return limit, ok
}

// cgroupMemoryIn reads the memory cgroups on the process's path from the
// root (v1 or v2): the lowest limit, and the least room under a limit,
// the limit (or v2's memory.high, where the kernel starts reclaiming,
// if lower) less what the cgroup uses, the page cache of its files
// included; MaxInt64 where no usage could be read.
func cgroupMemoryIn(fsys fs.FS) (limit, room int64, found bool) {
	f, err := fsys.Open("proc/self/cgroup")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	room = math.MaxInt64
	read := func(name string) (int64, bool) {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	// "max", or v1's "no limit" (a page short of MaxInt64), is none.
	limited := func(name string) (int64, bool) {
		v, ok := read(name)
		return v, ok && v > 0 && v < 1<<62
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var root, file, high, usage string
		switch {
		case parts[1] == "memory" || strings.Contains(","+parts[1]+",", ",memory,"):
			root, file, usage = "sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
		case parts[0] == "0" && parts[1] == "":
			root, file, high, usage = "sys/fs/cgroup", "memory.max", "memory.high", "memory.current"
		default:
			continue
		}
		for dir := path.Clean("/" + parts[2]); ; dir = path.Dir(dir) {
			v, ok := limited(path.Join(root, dir, file))
			if ok && (!found || v < limit) {
				limit, found = v, true
			}
			if h, hok := limited(path.Join(root, dir, high)); high != "" && hok && (!ok || h < v) {
				v, ok = h, true
			}
			if ok {
				if u, uok := read(path.Join(root, dir, usage)); uok {
					room = min(room, v-u)
				}
			}
			if dir == "/" {
				break
			}
		}
	}
	return limit, room, found
}

// memoryRoom is the bytes this process's page cache may still grow by:
// under a memory cgroup's limit, what the cgroup leaves less a
// thirty-second of the limit (the kernel reclaims at the limit, and
// charges are batched per CPU), before the kernel reclaims any; else the
// memory the kernel says is available less held (the caller's own pages,
// which it counts as available: it could reclaim them) and a
// thirty-second of the machine's. The kernel counts other files' pages
// as available too and may reclaim among them and the caller's by its
// own order before that runs out; the caller then keeps fewer pages by
// need, never more than the machine has.
func memoryRoom(held int64) int64 {
	if limit, room, ok := cgroupMemoryIn(os.DirFS("/")); ok && room != math.MaxInt64 {
		return room - limit/32
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	total := int64(si.Totalram) * int64(si.Unit)
	avail, ok := memAvailable()
	if !ok {
		return int64(si.Freeram)*int64(si.Unit) - total/32
	}
	return avail - held - total/32
}

// memAvailable reads MemAvailable from /proc/meminfo: free memory and
// what the kernel can reclaim without swapping.
func memAvailable() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}

// metaBytes is the room for a batch's ids, offsets, lengths and labels:
// four int64 arrays, as a daemon sends them.
func metaBytes(batch int) int64 { return 32 * int64(batch) }

// Ask is the memory a job asks of its Alloc: Want bytes for its full
// memory bound; if it may run in less (its memory bends, below), Floor
// bytes for the least, two of its largest batches in flight. Floor is
// Want for a job that may not.
type Ask struct{ Want, Floor int64 }

// Memory that bends (issue 46). A job needs only a few batches in flight
// to run: one its consumer holds and one being read keep it going, at a
// lower rate than 16 batches do. So when a daemon's budget is short it
// gives an open less than its full bound, down to that floor of two
// batches, rather than make it wait; and it gives the job more (Resize),
// up to its full bound, as memory frees, and takes some back from jobs
// above their share when more opens come (server's budget.go).
//
// A job's memory bends if its plan leaves memory_bytes to the daemon
// (one the user named is the job's) and its loads are single batches: an
// opportunistic order's windows and a block order's gathered ones are
// loaded whole, each as large as the bound allows, and cannot run in two
// batches' room.
func (j *Job) bends() bool {
	if k := j.plan.Sampler.Kind; sampler.Windows(k) || k == "auto" {
		return false // auto may choose a block order
	}
	return j.plan.Memory == 0 && j.plan.Loader.Opportunistic <= 1
}

// size sets the job's memory bound and returns what its batches need from
// its allocator: twice the bound, so fragmentation never blocks the loader
// for long, plus the metadata of as many batches as the bound lets a client
// hold; and the least, twice the floor's bound, if its memory bends.
func (j *Job) size(rows bool) (Ask, error) {
	ds := j.src.ds
	inf := ds.Info()
	bs := j.plan.Loader.BatchSize
	mean := max(1, inf.Bytes/int64(max(1, ds.Len())))
	biggest := j.src.maxBatchBytes(bs)
	if rows {
		// Cells land in a staging buffer before the rows are put together,
		// with offsets and validity bits added: twice the bytes, and some.
		biggest = mulSat(2, biggest) + mulSat(int64(bs), 64) + 1<<16
		mean = 2*mean + 64
	}
	if j.tf != nil {
		// Outputs of the transform, and the records read for them.
		mean += int64(j.tf.Size())
		biggest += mulSat(int64(bs), int64(j.tf.Size()))
	}
	mem := j.plan.Memory
	if mem == 0 {
		mem = jobMemory(mean, bs, biggest, j.env.opts.JobMemory)
	}
	if mem < biggest {
		return Ask{}, specErr("memory_bytes %d is smaller than one batch (up to %d bytes for batch_size %d of this dataset): raise memory_bytes or lower batch_size",
			mem, biggest, bs)
	}
	j.memory = mem
	j.arenaOf = func(m int64) int64 {
		batches := m/max(1, mulSat(int64(bs), mean)) + 16
		return mulSat(2, m) + mulSat(batches, metaBytes(bs)+64)
	}
	ask := Ask{Want: j.arenaOf(mem), Floor: j.arenaOf(mem)}
	if j.bends() {
		j.floor = min(mem, mulSat(2, biggest))
		ask.Floor = j.arenaOf(j.floor)
	}
	return ask, nil
}

// boundOf is the job's memory bound in size bytes of its allocator: the
// largest whose arenaOf fits, between the floor and the full bound.
func (j *Job) boundOf(size int64) int64 {
	lo, hi := max(1, j.floor), j.memory
	if j.arenaOf(hi) <= size {
		return hi
	}
	for lo < hi {
		m := lo + (hi-lo+1)/2
		if j.arenaOf(m) <= size {
			lo = m
		} else {
			hi = m - 1
		}
	}
	return lo
}

// Resize tells the job its allocator holds size bytes now (its daemon's
// budget bent it): its memory bound follows, between the floor and its
// full bound. Lowered, the batches alive above the new bound stay until
// their consumer releases them; the allocator gives the rest back once
// they are gone. Safe from any goroutine, and after Close.
func (j *Job) Resize(size int64) { j.l.SetMemory(j.boundOf(size)) }

// maxBatchBytes is the size of the largest batch the dataset can make:
// the sum of its batch largest records, each padded to the alignment and
// with its frame. It is a scan of every record's length, once per dataset
// and batch size.
func (e *source) maxBatchBytes(batch int) int64 {
	if v, ok := e.maxBatch.Load(batch); ok {
		return v.(int64)
	}
	n := maxBatchBytes(e.ds, batch)
	e.maxBatch.Store(batch, n)
	return n
}

func maxBatchBytes(ds dataset.Dataset, batch int) int64 {
	head, tail := 0, 0
	if f, ok := ds.(dataset.Framed); ok {
		head, tail = f.Frame()
	}
	align := int64(storage.AlignmentOf(ds.Object(0)))
	pad := func(n int) int64 { return (int64(n+head+tail) + 2*align - 2) / align * align }
	if rs := ds.Info().RecordSize; rs > 0 {
		return mulSat(int64(min(batch, ds.Len())), pad(rs))
	}
	h := &int64Heap{}
	for id := range ds.Len() {
		n := pad(ds.Locate(id).Len)
		if h.Len() < batch {
			heap.Push(h, n)
		} else if n > (*h)[0] {
			(*h)[0] = n
			heap.Fix(h, 0)
		}
	}
	var sum int64
	for _, n := range *h {
		sum += n
	}
	return sum
}

type int64Heap []int64

func (h int64Heap) Len() int           { return len(h) }
func (h int64Heap) Less(i, j int) bool { return h[i] < h[j] }
func (h int64Heap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *int64Heap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *int64Heap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
