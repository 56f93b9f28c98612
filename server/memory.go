package server

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// cgroupLimit reads the memory limit of the daemon's cgroup, v1
// (memory.limit_in_bytes) or v2 (memory.max), if it has one.
func cgroupLimit() (int64, bool) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var file string
		switch {
		case parts[1] == "memory" || strings.Contains(","+parts[1]+",", ",memory,"):
			file = filepath.Join("/sys/fs/cgroup/memory", parts[2], "memory.limit_in_bytes")
		case parts[0] == "0" && parts[1] == "":
			file = filepath.Join("/sys/fs/cgroup", parts[2], "memory.max")
		default:
			continue
		}
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || v <= 0 || v >= 1<<62 {
			continue // "max", or v1's "no limit"
		}
		return v, true
	}
	return 0, false
}

// GoMemoryLimit is the Go heap limit a daemon in a memory cgroup should
// run under (runtime/debug.SetMemoryLimit), or 0 outside one. The record
// cache is live heap: without a limit the collector lets the heap grow to
// twice it before collecting, and a cache of two thirds of the cgroup gets
// the daemon OOM-killed. The fifth left is for the jobs' arenas (shared
// memory, outside the heap) and the stacks.
func GoMemoryLimit() int64 {
	if lim, ok := cgroupLimit(); ok {
		return lim / 5 * 4
	}
	return 0
}
