package loader

import (
	"github.com/riffle-ml/riffle/cache"
	"slices"
	"testing"
)

// layout: which reads a batch makes and where each record lands, for
// alignment, gaps, frames, zero-length and cached records.
func TestLayout(t *testing.T) {
	type ent struct {
		obj  int
		off  int64
		n    int
		slot int
		hit  bool
	}
	type rd struct {
		obj   int
		off   int64
		n     int
		dst   int
		read  bool
		slots []int
	}
	for _, c := range []struct {
		name       string
		align, gap int
		head, tail int
		ents       []ent // sorted by location, as prepare leaves them
		reads      []rd
		off        []int // by slot
	}{
		{
			name: "touching records coalesce, placed by first slot",
			ents: []ent{{0, 0, 10, 2, false}, {0, 10, 10, 0, false}, {0, 50, 5, 1, false}},
			reads: []rd{
				{0, 0, 20, 0, true, []int{2, 0}},
				{0, 50, 5, 20, true, []int{1}},
			},
			off: []int{10, 20, 0},
		},
		{
			name: "a gap within CoalesceGap is read too",
			gap:  40,
			ents: []ent{{0, 0, 10, 0, false}, {0, 50, 5, 1, false}},
			reads: []rd{
				{0, 0, 55, 0, true, []int{0, 1}},
			},
			off: []int{0, 50},
		},
		{
			name: "objects never coalesce",
			ents: []ent{{0, 0, 10, 0, false}, {1, 10, 10, 1, false}},
			reads: []rd{
				{0, 0, 10, 0, true, []int{0}},
				{1, 10, 10, 10, true, []int{1}},
			},
			off: []int{0, 10},
		},
		{
			name:  "O_DIRECT: whole pages, no page twice, no gap",
			align: 4096, gap: 100000,
			ents: []ent{{0, 1000, 3000, 1, false}, {0, 4000, 3000, 0, false}, {0, 20000, 100, 2, false}},
			reads: []rd{
				{0, 0, 8192, 0, true, []int{1, 0}},
				{0, 16384, 4096, 8192, true, []int{2}},
			},
			off: []int{4000, 1000, 8192 + 20000 - 16384},
		},
		{
			name: "frames are read around records (TFRecord)",
			head: 12, tail: 4,
			ents: []ent{{0, 12, 5, 0, false}, {0, 33, 5, 1, false}},
			reads: []rd{
				{0, 0, 42, 0, true, []int{0, 1}},
			},
			off: []int{12, 33},
		},
		{
			name: "zero-length records need no read",
			ents: []ent{{0, 5, 0, 0, false}, {0, 5, 3, 1, false}, {0, 8, 0, 2, false}},
			reads: []rd{
				{0, 5, 3, 0, true, []int{1}},
			},
			off: []int{0, 0, 0},
		},
		{
			name: "a cached record is copied, not read, and breaks a run",
			ents: []ent{{0, 0, 10, 1, false}, {0, 10, 10, 0, true}, {0, 20, 10, 2, false}},
			reads: []rd{
				{0, 10, 10, 0, false, []int{0}},
				{0, 0, 10, 10, true, []int{1}},
				{0, 20, 10, 20, true, []int{2}},
			},
			off: []int{0, 10, 20},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := &Loader{align: max(1, c.align), head: c.head, tail: c.tail, opts: Options{CoalesceGap: c.gap}}
			j := &load{l: l}
			j.IDs, j.Off, j.Len = make([]int, len(c.ents)), make([]int, len(c.ents)), make([]int, len(c.ents))
			for _, e := range c.ents {
				en := entry{obj: e.obj, off: e.off, n: e.n, slot: e.slot}
				if e.hit {
					en.item = new(cache.Item)
				}
				j.ents = append(j.ents, en)
			}
			l.layout(j)
			var got []rd
			for i := range j.units {
				u := &j.units[i]
				r := rd{u.obj, u.off, u.n, u.dst, u.read, nil}
				for _, en := range j.ents[u.lo:u.hi] {
					r.slots = append(r.slots, en.slot)
				}
				got = append(got, r)
			}
			slices.SortFunc(got, func(a, b rd) int { return a.dst - b.dst })
			if !slices.EqualFunc(got, c.reads, func(a, b rd) bool {
				return a.obj == b.obj && a.off == b.off && a.n == b.n && a.dst == b.dst && a.read == b.read && slices.Equal(a.slots, b.slots)
			}) {
				t.Fatalf("units %+v, want %+v", got, c.reads)
			}
			if !slices.Equal(j.Off, c.off) {
				t.Fatalf("offsets %v, want %v", j.Off, c.off)
			}
			if int(j.left.Load()) != len(c.reads) {
				t.Fatalf("%d units to wait for, want %d", j.left.Load(), len(c.reads))
			}
		})
	}
}
