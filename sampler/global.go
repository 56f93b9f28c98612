package sampler

import "math/bits"

// Global is a fresh uniformly random permutation of 0..N-1 every epoch, with
// O(1) state: the id at position p is perm_(seed,epoch)(p), where perm is a
// keyed pseudo-random permutation (LIRS §4.1's index shuffling, done without
// materializing the index array).
//
// The permutation is an unbalanced Feistel network over the smallest power
// of two that holds N, with cycle walking down to [0, N): each round
// replaces one half with itself xor a keyed hash of the other half, which is
// a bijection whatever the hash; positions that land at or above N are
// permuted again until they fall inside, which keeps the map a bijection on
// [0, N) (Black and Rogaway's cycle walking). The domain is under 2N, so a
// position walks less than twice on average. This is the construction
// behind grain's index_shuffle and Google's "shuffle at scale".
type Global struct {
	N    int
	Seed uint64
}

// feistelRounds balances statistical quality against cost: every round is
// one 64-bit hash. The chi-square tests of position and adjacent-pair
// uniformity fail clearly with 2 rounds; 12 leaves a wide margin for small
// domains, where each half is only a few bits.
const feistelRounds = 12

func (g Global) Len() int { return g.N }

func (g Global) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), g.N-pos))
	if n == 0 {
		return 0
	}
	p := newPerm(uint64(g.N), Mix(g.Seed, uint64(epoch)))
	for i := range n {
		dst[i] = int(p.at(uint64(pos + i)))
	}
	return n
}

// At is the id at one position.
func (g Global) At(epoch, pos int) int {
	p := newPerm(uint64(g.N), Mix(g.Seed, uint64(epoch)))
	return int(p.at(uint64(pos)))
}

// Position is where id falls in epoch's order: the inverse permutation,
// as cheap as At. A cache that knows every record's next position can
// evict what is needed farthest in the future (Belady's MIN).
func (g Global) Position(epoch, id int) int {
	p := newPerm(uint64(g.N), Mix(g.Seed, uint64(epoch)))
	return int(p.inv(uint64(id)))
}

type perm struct {
	n      uint64
	loBits uint
	loMask uint64
	hiMask uint64
	keys   [feistelRounds]uint64
}

func newPerm(n, key uint64) perm {
	k := uint(bits.Len64(n - 1))
	if k < 2 {
		k = 2
	}
	p := perm{n: n, loBits: k / 2}
	p.loMask = 1<<p.loBits - 1
	p.hiMask = 1<<(k-p.loBits) - 1
	for i := range p.keys {
		key = splitmix(key)
		p.keys[i] = key
	}
	return p
}

func (p *perm) at(x uint64) uint64 {
	if p.n <= 1 {
		return x
	}
	for {
		lo, hi := x&p.loMask, x>>p.loBits
		for r := 0; r < feistelRounds; r += 2 {
			lo ^= mix(hi^p.keys[r]) & p.loMask
			hi ^= mix(lo^p.keys[r+1]) & p.hiMask
		}
		x = hi<<p.loBits | lo
		if x < p.n {
			return x
		}
	}
}

// inv is at's inverse: the rounds undone in reverse, and cycle walking
// backwards, which retraces the forward walk's cycle.
func (p *perm) inv(y uint64) uint64 {
	if p.n <= 1 {
		return y
	}
	for {
		lo, hi := y&p.loMask, y>>p.loBits
		for r := feistelRounds - 2; r >= 0; r -= 2 {
			hi ^= mix(lo^p.keys[r+1]) & p.hiMask
			lo ^= mix(hi^p.keys[r]) & p.loMask
		}
		y = hi<<p.loBits | lo
		if y < p.n {
			return y
		}
	}
}

// Mix derives a per-epoch key from a seed, so epochs are independent and
// the same (seed, epoch) gives the same key on every machine.
func Mix(seed, epoch uint64) uint64 {
	return splitmix(splitmix(seed) ^ splitmix(epoch+0x632be59bd9b4e019))
}

// splitmix is SplitMix64's step: a full-avalanche 64-bit mix.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	return mix(x)
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Positioner is implemented by orders that can say where an id falls
// (their inverse): the global shuffle, the sequential order.
type Positioner interface {
	Position(epoch, id int) int
}

// Position of the sequential order is the id.
func (s Sequential) Position(epoch, id int) int { return id }

// Ahead returns, for the absolute position now (epoch*N + position), how
// many positions pass before s next gives an id: NextUse's answer less
// now, for many ids at once (a page cache's keeper asks it of every page
// it weighs); false if s cannot say. A rank's part says when the rank
// itself reads id: an id of neither this epoch's part nor the next's is
// two epochs away.
func Ahead(s Sampler, now int) func(id int) (int64, bool) {
	if rp, ok := s.(*RankPart); ok && s.Len() > 0 {
		if base, ok := rp.Base.(Positioner); ok {
			return rp.ahead(base, now/s.Len(), now%s.Len())
		}
	}
	next := NextUses(s, now)
	return func(id int) (int64, bool) {
		t, ok := next(id)
		return t - int64(now), ok
	}
}

// NextUse is when s next gives id after the absolute position now
// (epoch*N + position), counting positions the same way; false if s
// cannot say.
func NextUse(s Sampler, now int, id int) (int64, bool) { return NextUses(s, now)(id) }

// NextUses is NextUse for many ids from one place: the global shuffle's
// two epochs' permutations are made once, not per id.
func NextUses(s Sampler, now int) func(id int) (int64, bool) {
	p, ok := s.(Positioner)
	n := s.Len()
	if !ok || n == 0 {
		return func(int) (int64, bool) { return 0, false }
	}
	e, pos := now/n, now%n
	at := p.Position
	if g, ok := s.(Global); ok {
		this, next := newPerm(uint64(n), Mix(g.Seed, uint64(e))), newPerm(uint64(n), Mix(g.Seed, uint64(e+1)))
		at = func(epoch, id int) int {
			if epoch == e {
				return int(this.inv(uint64(id)))
			}
			return int(next.inv(uint64(id)))
		}
	}
	return func(id int) (int64, bool) {
		if id < 0 || id >= n {
			return 0, false
		}
		if q := at(e, id); q >= pos {
			return int64(e*n + q), true
		}
		return int64((e+1)*n + at(e+1, id)), true
	}
}
