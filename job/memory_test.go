package job

import (
	"math"
	"testing"
	"testing/fstest"
)

// The memory limit is the lowest on the cgroup's path from the root, v1
// or v2; "max" and v1's "no limit" are none.
func TestCgroupLimit(t *testing.T) {
	const noLimit = "9223372036854771712\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		ok    bool
	}{
		{"v1 own", map[string]string{
			"proc/self/cgroup":                               "4:memory:/a/b\n1:cpu:/\n",
			"sys/fs/cgroup/memory/memory.limit_in_bytes":     noLimit,
			"sys/fs/cgroup/memory/a/memory.limit_in_bytes":   noLimit,
			"sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": "536870912\n",
		}, 512 << 20, true},
		{"v1 parent's", map[string]string{
			"proc/self/cgroup": "4:memory:/a/b\n",
			"sys/fs/cgroup/memory/a/memory.limit_in_bytes":   "1073741824\n",
			"sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": noLimit,
		}, 1 << 30, true},
		{"v1 joined with cpu", map[string]string{
			"proc/self/cgroup": "3:cpu,memory:/x\n",
			"sys/fs/cgroup/memory/x/memory.limit_in_bytes": "268435456\n",
		}, 256 << 20, true},
		{"v2", map[string]string{
			"proc/self/cgroup":                        "0::/user.slice/job\n",
			"sys/fs/cgroup/user.slice/memory.max":     "max\n",
			"sys/fs/cgroup/user.slice/job/memory.max": "805306368\n",
		}, 768 << 20, true},
		{"v2 without limit", map[string]string{
			"proc/self/cgroup":             "0::/job\n",
			"sys/fs/cgroup/job/memory.max": "max\n",
		}, 0, false},
		{"no cgroup file", map[string]string{}, 0, false},
	} {
		fsys := fstest.MapFS{}
		for name, data := range tc.files {
			fsys[name] = &fstest.MapFile{Data: []byte(data)}
		}
		got, ok := cgroupLimitIn(fsys)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// The room under a cgroup is the least of each limited cgroup's limit
// less its usage on the path from the root.
func TestCgroupRoom(t *testing.T) {
	fsys := fstest.MapFS{
		"proc/self/cgroup": {Data: []byte("4:memory:/a/b\n")},
		"sys/fs/cgroup/memory/a/memory.limit_in_bytes":   {Data: []byte("1073741824\n")},
		"sys/fs/cgroup/memory/a/memory.usage_in_bytes":   {Data: []byte("1000000000\n")},
		"sys/fs/cgroup/memory/a/b/memory.limit_in_bytes": {Data: []byte("536870912\n")},
		"sys/fs/cgroup/memory/a/b/memory.usage_in_bytes": {Data: []byte("36870912\n")},
	}
	limit, room, ok := cgroupMemoryIn(fsys)
	if !ok || limit != 512<<20 || room != 1073741824-1000000000 {
		t.Fatalf("limit %d, room %d, %v; want %d, %d (the parent's)", limit, room, ok, 512<<20, 1073741824-1000000000)
	}
	fsys["sys/fs/cgroup/memory/a/memory.usage_in_bytes"] = &fstest.MapFile{Data: []byte("1\n")}
	if _, room, _ := cgroupMemoryIn(fsys); room != 500000000 {
		t.Fatalf("room %d, want %d (the child's)", room, 500000000)
	}
	v2 := fstest.MapFS{
		"proc/self/cgroup":                 {Data: []byte("0::/job\n")},
		"sys/fs/cgroup/job/memory.max":     {Data: []byte("805306368\n")},
		"sys/fs/cgroup/job/memory.current": {Data: []byte("5306368\n")},
	}
	if limit, room, ok := cgroupMemoryIn(v2); !ok || limit != 768<<20 || room != 800000000 {
		t.Fatalf("v2: limit %d, room %d, %v", limit, room, ok)
	}
	// Reclaim starts at memory.high.
	v2["sys/fs/cgroup/job/memory.high"] = &fstest.MapFile{Data: []byte("105306368\n")}
	if _, room, _ := cgroupMemoryIn(v2); room != 100000000 {
		t.Fatalf("v2 with memory.high: room %d, want 100000000", room)
	}
	// A limit whose usage cannot be read says nothing of the room.
	delete(v2, "sys/fs/cgroup/job/memory.current")
	if limit, room, ok := cgroupMemoryIn(v2); !ok || limit != 768<<20 || room != math.MaxInt64 {
		t.Fatalf("v2 without usage: limit %d, room %d, %v", limit, room, ok)
	}
}
