package sampler

import (
	"math/rand/v2"
	"sync"
)

// Samplers that read the data in file order and shuffle only what they
// hold in memory: cheaper shuffles, for comparison and for storage without
// fast random reads. Neither is a cheap function of position (each epoch is
// a stream), so they replay from the epoch's start when asked for an
// earlier position and keep their state for the next Fill, which the loader
// asks for in order.

// epochRand is the random stream of one epoch of a streaming sampler.
func epochRand(seed uint64, epoch int) *rand.Rand {
	key := Mix(seed, uint64(epoch))
	return rand.New(rand.NewPCG(key, key^0xda942042e4dd58b5))
}

// Buffered is tf.data's shuffle: a buffer of Buffer records is filled in
// file order; each output is a uniformly chosen record of the buffer, whose
// place the next record in file order takes. Buffer 1 is the sequential
// order; Buffer >= N is a full shuffle.
type Buffered struct {
	N, Buffer int
	Seed      uint64

	mu sync.Mutex
	st *bufState
}

type bufState struct {
	epoch, pos int
	buf        []int
	next       int
	rng        *rand.Rand
}

func (s *Buffered) Len() int { return s.N }

func (s *Buffered) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.N-pos))
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st == nil || st.epoch != epoch || st.pos > pos {
		st = &bufState{epoch: epoch, rng: epochRand(s.Seed, epoch)}
		b := max(1, s.Buffer)
		for st.next < min(b, s.N) {
			st.buf = append(st.buf, st.next)
			st.next++
		}
		s.st = st
	}
	for st.pos < pos+n {
		k := st.rng.IntN(len(st.buf))
		id := st.buf[k]
		if st.next < s.N {
			st.buf[k] = st.next
			st.next++
		} else {
			st.buf[k] = st.buf[len(st.buf)-1]
			st.buf = st.buf[:len(st.buf)-1]
		}
		if st.pos >= pos {
			dst[st.pos-pos] = id
		}
		st.pos++
	}
	return n
}

// Reservoir is OneAccess's sampling (oneaccess.txt §3, Vitter's Algorithm
// R): each round makes one sequential pass over the records not yet used
// this epoch, keeps a uniform random sample of Size of them, and emits that
// sample in random order; rounds repeat until every record was used once.
// Every subset of Size remaining records is equally likely to be a round's
// sample, so the order is uniform within what a pass can hold.
type Reservoir struct {
	N, Size int
	Seed    uint64

	mu sync.Mutex
	st *resState
}

type resState struct {
	epoch, pos int
	used       []bool
	out        []int // the current round's sample, in emission order
	at         int
	rng        *rand.Rand
}

func (s *Reservoir) Len() int { return s.N }

func (s *Reservoir) round(st *resState) {
	k := max(1, s.Size)
	st.out, st.at = st.out[:0], 0
	seen := 0
	for id := range s.N {
		if st.used[id] {
			continue
		}
		if len(st.out) < k {
			st.out = append(st.out, id)
		} else if j := st.rng.IntN(seen + 1); j < k {
			st.out[j] = id
		}
		seen++
	}
	for _, id := range st.out {
		st.used[id] = true
	}
	st.rng.Shuffle(len(st.out), func(i, j int) { st.out[i], st.out[j] = st.out[j], st.out[i] })
}

func (s *Reservoir) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.N-pos))
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st == nil || st.epoch != epoch || st.pos > pos {
		st = &resState{epoch: epoch, used: make([]bool, s.N), rng: epochRand(s.Seed, epoch)}
		s.st = st
	}
	for st.pos < pos+n {
		if st.at == len(st.out) {
			s.round(st)
		}
		if st.pos >= pos {
			dst[st.pos-pos] = st.out[st.at]
		}
		st.at++
		st.pos++
	}
	return n
}
