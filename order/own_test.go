package order

import (
	"slices"
	"testing"
)

func TestSubsetBounds(t *testing.T) {
	// Blocks [0,10) [10,20) [20,30) [30,40); the subset keeps 3, 5, 25, 26, 39.
	got := subsetBounds([]int{0, 10, 20, 30, 40}, []uint32{3, 5, 25, 26, 39})
	if want := []int{0, 2, 4, 5}; !slices.Equal(got, want) {
		t.Fatalf("subsetBounds = %v, want %v", got, want)
	}
	if got := subsetBounds([]int{0, 10}, []uint32{1, 2}); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("one block: %v", got)
	}
}
