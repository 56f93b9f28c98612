package sampler

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
)

// Buffered is tf.data's shuffle: a buffer of Buffer records is filled in
// file order; each output is a uniformly chosen record of the buffer, whose
// place the next record in file order takes. Buffer 1 is the sequential
// order; Buffer >= N is a full shuffle.
//
// Records enter the buffer in file order, so storage sees one sequential
// stream: stage s is the Chunk records [s*Chunk, (s+1)*Chunk), read with
// large reads; drawing from the buffer happens in memory. The order is a
// stream (each output depends on the generator's whole history), so the
// sampler is Stateful: its state is the generator's, the buffer's ids and
// the next record to enter, a few KiB, and a resumed epoch continues
// exactly where it stopped.
type Buffered struct {
	N, Buffer int
	Seed      uint64
	// Chunk is how many records of file order one stage loads; default 1024.
	Chunk int

	mu sync.Mutex
	st *bufState
}

type bufState struct {
	epoch, pos int
	buf        []int
	next       int
	src        *rand.PCG
	rng        *rand.Rand
}

func (s *Buffered) Len() int { return s.N }

func (s *Buffered) chunk() int {
	if s.Chunk > 0 {
		return s.Chunk
	}
	return 1024
}

// epochSource is the random stream of one epoch of a streaming sampler.
func epochSource(seed uint64, epoch int) *rand.PCG {
	key := Mix(seed, uint64(epoch))
	return rand.NewPCG(key, key^0xda942042e4dd58b5)
}

func (s *Buffered) start(epoch int) *bufState {
	src := epochSource(s.Seed, epoch)
	st := &bufState{epoch: epoch, src: src, rng: rand.New(src)}
	for st.next < min(max(1, s.Buffer), s.N) {
		st.buf = append(st.buf, st.next)
		st.next++
	}
	return st
}

func (s *Buffered) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), s.N-pos))
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st == nil || st.epoch != epoch || st.pos > pos {
		st = s.start(epoch) // replay: only for callers that go back
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

// Stage s loads records [s*Chunk, (s+1)*Chunk) of file order.
func (s *Buffered) Stage(epoch, st int) ([]int, bool) {
	c := s.chunk()
	if st < 0 || st*c >= s.N {
		return nil, false
	}
	ids := make([]int, min(c, s.N-st*c))
	for i := range ids {
		ids[i] = st*c + i
	}
	return ids, true
}

// StageOf: by the output at pos, records up to Buffer+pos have entered.
func (s *Buffered) StageOf(epoch, pos int) int {
	last := min(s.N-1, max(1, s.Buffer)+pos)
	return last / s.chunk()
}

// bufMark is the state after the positions filled so far.
type bufMark struct {
	epoch, pos, next int
	buf              []int
	src              []byte
}

func (s *Buffered) Mark() any {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	if st == nil {
		return nil
	}
	src, _ := st.src.MarshalBinary()
	return &bufMark{epoch: st.epoch, pos: st.pos, next: st.next, buf: append([]int(nil), st.buf...), src: src}
}

const bufStateMagic = "RFBUF1"

func (s *Buffered) Save(mark any) ([]byte, error) {
	m, ok := mark.(*bufMark)
	if !ok || m == nil {
		return nil, nil // at an epoch's start: nothing to save
	}
	b := append([]byte(bufStateMagic), 0)
	b = binary.AppendUvarint(b, uint64(s.N))
	b = binary.AppendUvarint(b, uint64(s.Buffer))
	b = binary.AppendUvarint(b, s.Seed)
	b = binary.AppendUvarint(b, uint64(m.epoch))
	b = binary.AppendUvarint(b, uint64(m.pos))
	b = binary.AppendUvarint(b, uint64(m.next))
	b = binary.AppendUvarint(b, uint64(len(m.src)))
	b = append(b, m.src...)
	b = binary.AppendUvarint(b, uint64(len(m.buf)))
	for _, id := range m.buf {
		b = binary.AppendUvarint(b, uint64(id))
	}
	return b, nil
}

// ErrState says a saved sampler state does not fit this sampler.
var ErrState = errors.New("sampler state does not match the sampler")

func (s *Buffered) Restore(state []byte) (int, int, error) {
	if len(state) < len(bufStateMagic)+1 || string(state[:len(bufStateMagic)]) != bufStateMagic {
		return 0, 0, fmt.Errorf("buffered sampler: %w (not a buffered state)", ErrState)
	}
	r := state[len(bufStateMagic)+1:]
	next := func() (uint64, bool) {
		v, n := binary.Uvarint(r)
		if n <= 0 {
			return 0, false
		}
		r = r[n:]
		return v, true
	}
	var f [7]uint64
	for i := range f {
		v, ok := next()
		if !ok {
			return 0, 0, fmt.Errorf("buffered sampler: %w (truncated)", ErrState)
		}
		f[i] = v
		if i == 6 && (v > uint64(len(r))) {
			return 0, 0, fmt.Errorf("buffered sampler: %w (truncated)", ErrState)
		}
	}
	if f[0] != uint64(s.N) || f[1] != uint64(s.Buffer) || f[2] != s.Seed {
		return 0, 0, fmt.Errorf("buffered sampler: %w (saved for %d records, buffer %d, seed %d)", ErrState, f[0], f[1], f[2])
	}
	src := &rand.PCG{}
	if err := src.UnmarshalBinary(r[:f[6]]); err != nil {
		return 0, 0, fmt.Errorf("buffered sampler: %w: %w", ErrState, err)
	}
	r = r[f[6]:]
	nbuf, ok := next()
	if !ok || nbuf > uint64(s.N) || f[4] > uint64(s.N) || f[5] > uint64(s.N) {
		return 0, 0, fmt.Errorf("buffered sampler: %w (bad counts)", ErrState)
	}
	st := &bufState{epoch: int(f[3]), pos: int(f[4]), next: int(f[5]), src: src, rng: rand.New(src), buf: make([]int, nbuf)}
	for i := range st.buf {
		v, ok := next()
		if !ok || v >= uint64(s.N) {
			return 0, 0, fmt.Errorf("buffered sampler: %w (bad buffer)", ErrState)
		}
		st.buf[i] = int(v)
	}
	s.mu.Lock()
	s.st = st
	s.mu.Unlock()
	return st.epoch, st.pos, nil
}
