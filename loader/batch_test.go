package loader

import (
	"slices"
	"testing"
)

func TestPackedOrder(t *testing.T) {
	for _, c := range []struct {
		name string
		off  []int
		lens []int
		data int
		want []int // nil: delivered as it is
	}{
		{"packed already", []int{0, 4, 8}, []int{4, 4, 4}, 12, nil},
		{"a run read by one read", []int{0, 8, 4}, []int{4, 4, 4}, 12, []int{0, 2, 1}},
		{"reversed", []int{8, 4, 0}, []int{4, 4, 4}, 12, []int{2, 1, 0}},
		{"padding after records", []int{8, 0, 4}, []int{4, 4, 4}, 16, nil},
		{"sizes differ", []int{6, 0, 4}, []int{2, 4, 2}, 8, nil},
		{"off the size's grid", []int{2, 6, 0}, []int{4, 4, 2}, 10, nil},
		{"two at one place", []int{4, 4, 0}, []int{4, 4, 4}, 12, nil},
		{"one record", []int{0}, []int{4}, 4, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &Batch{IDs: make([]int, len(c.off)), Off: c.off, Len: c.lens, Data: make([]byte, c.data)}
			got := b.PackedOrder(nil)
			if !slices.Equal(got, c.want) {
				t.Fatalf("PackedOrder = %v, want %v", got, c.want)
			}
			if got == nil {
				return
			}
			// Delivered in that order, the records lie back to back.
			at := 0
			for _, i := range got {
				if c.off[i] != at {
					t.Fatalf("record %d at %d, want %d", i, c.off[i], at)
				}
				at += c.lens[i]
			}
		})
	}
}
