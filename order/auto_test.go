package order

import (
	"testing"

	"github.com/riffle-ml/riffle/quality"
)

// A device model: records per second of an order, by the size of its
// reads, over 4 KiB records: a disk's rate grows with the read size, and a
// block order's window of w blocks reads w-th shares of them.
func disk(a Auto) (float64, error) {
	read := 4096.0
	if a.Sampler == "block" {
		read = float64(a.BlockSize) / float64(a.Window) * 8 // nearby reads merge, some
	}
	bw := min(2e9, 2e8*read/4096) // 4 KiB reads at a tenth of its bandwidth
	return bw / 4096, nil
}

// memoryDevice reads any pattern alike.
func memoryDevice(Auto) (float64, error) { return 5e5, nil }

func TestChooseOrder(t *testing.T) {
	const n, rec = 1 << 20, 4096 // 4 GiB of 4 KiB records
	total := int64(n * rec)
	for _, c := range []struct {
		name    string
		measure func(Auto) (float64, error)
		minRL   float64
		memory  int64
		want    string // the sampler
	}{
		{"memory: every order reads alike, the most random wins", memoryDevice, 0.5, 8 << 30, "global"},
		// RL 0.9 of 2^20 records needs windows of about 2^18 of them (RL's
		// log of the orders grows as the log of a window's records).
		{"disk, room for windows of a quarter of the data", disk, 0.9, 8 << 30, "block"},
		{"disk, too little memory to reach the level", disk, 0.9, 256 << 20, "global"},
		{"disk, a full shuffle asked for", disk, 1, 8 << 30, "global"},
		{"disk, a lower level in less memory", disk, 0.6, 256 << 20, "block"},
	} {
		cands := candidates(n, total, c.minRL, c.memory, func(size int) int { return int((total + int64(size) - 1) / int64(size)) })
		for _, a := range cands {
			if a.RL < c.minRL {
				t.Errorf("%s: candidate %+v below RL %.2f", c.name, a, c.minRL)
			}
			if a.Sampler == "block" {
				blocks := int(total / int64(a.BlockSize))
				if a.Window < min(minMix, blocks) || 3*int64(a.Window)*int64(a.BlockSize) > c.memory {
					t.Errorf("%s: window %d of %d-byte blocks: fewer than %d, or more than memory %d", c.name, a.Window, a.BlockSize, minMix, c.memory)
				}
				if rl := quality.BlockRL(n, blocks, a.Window); rl != a.RL {
					t.Errorf("%s: RL %.4f, the block order's is %.4f", c.name, a.RL, rl)
				}
			}
		}
		a, err := choose(cands, c.measure)
		if err != nil {
			t.Fatal(err)
		}
		if a.Sampler != c.want {
			t.Errorf("%s: chose %+v of %d candidates, want %s", c.name, a, len(cands), c.want)
		}
		for _, o := range cands {
			if r, _ := c.measure(o); r > a.Rate*1.01 {
				t.Errorf("%s: chose %+v, slower than %+v (%.0f/s)", c.name, a, o, r)
			}
		}
	}
}
