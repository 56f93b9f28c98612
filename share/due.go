package share

import "container/heap"

// dueHeap holds records by the position of their next read, the farthest
// on top: a bypass's intervals by their ends. An interval ended or given up
// leaves its entry behind, stale, skipped at the top and swept out when
// the stale entries outnumber the intervals held.
type dueHeap []dueEntry

type dueEntry struct {
	due int64
	key int32 // the record
}

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].due > h[j].due }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(dueEntry)) }
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func (h *dueHeap) push(due int64, id int) { heap.Push(h, dueEntry{due: due, key: int32(id)}) }

// top is the record due farthest whose entry is its own (live), or -1.
func (h *dueHeap) top(live func(id int32, due int64) bool) int {
	for h.Len() > 0 {
		if e := (*h)[0]; live(e.key, e.due) {
			return int(e.key)
		}
		heap.Pop(h)
	}
	return -1
}

// compact sweeps the stale entries out once they are more than the held
// intervals and a few thousand besides: each read leaves one behind,
// most of them due sooner than any live entry, which top never reaches.
func (h *dueHeap) compact(held int, live func(id int32, due int64) bool) {
	if h.Len() <= 2*held+4096 {
		return
	}
	k := 0
	for _, e := range *h {
		if live(e.key, e.due) {
			(*h)[k] = e
			k++
		}
	}
	*h = (*h)[:k]
	heap.Init(h)
}
