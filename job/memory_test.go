package job

import (
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
