// Package sampler says which records come in which order.
//
// A Sampler is a pure function of (epoch, position): the id at a position of
// an epoch depends only on the sampler's configuration (its seed among it),
// never on what was read before. That is what makes an order reproducible
// on every machine (DeepIO §III-D generates each worker's shuffled index
// array from a shared seed instead of broadcasting it), lets each rank of a
// data-parallel job compute its own share without talking to the others, and
// lets a job save its place as (epoch, position) in a checkpoint and resume
// there without replaying the epoch, as grain's samplers do.
//
// Batches are consecutive slices of an epoch's order (see Batches), so a
// batch's membership is exact and itself a function of (epoch, batch index).
// The loader asks for ids a slice at a time through Fill, which lets
// samplers that group records (block-aware, buffered, multi-job) produce
// whole runs cheaply.
package sampler

// Sampler produces each epoch's order of record ids.
type Sampler interface {
	// Len is the number of positions in every epoch.
	Len() int
	// Fill writes the ids at positions pos, pos+1, ... of epoch into dst and
	// returns how many it wrote: len(dst), or fewer at the end of the epoch.
	// It is safe for concurrent use.
	Fill(epoch, pos int, dst []int) int
}

// Order returns a whole epoch's ids, for tests and tools; the loader never
// materializes an epoch.
func Order(s Sampler, epoch int) []int {
	out := make([]int, s.Len())
	s.Fill(epoch, 0, out)
	return out
}

// Sequential is the identity order 0..N-1 in every epoch.
type Sequential struct{ N int }

func (s Sequential) Len() int { return s.N }

func (s Sequential) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.N-pos))
	for i := range n {
		dst[i] = pos + i
	}
	return n
}

// From is the rest of Base's epochs from position Start on: what is left
// of an epoch whose first Start positions were delivered, by ranks and
// workers of any number. It is a function of (epoch, position) as Base is.
type From struct {
	Base  Sampler
	Start int
}

func (s From) Len() int { return max(0, s.Base.Len()-s.Start) }

func (s From) Fill(epoch, pos int, dst []int) int {
	return s.Base.Fill(epoch, s.Start+pos, dst[:max(0, min(len(dst), s.Len()-pos))])
}
