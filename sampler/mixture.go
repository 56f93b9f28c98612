package sampler

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
)

// Mixture is a weighted mixture of sources, each with its own order:
// position p of the mixed order takes the next record of the source a
// deterministic schedule names, and the record is that source's own
// order's next one, offset to the source's first global id.
//
// The schedule is Sainte-Laguë's (Webster's) apportionment read as a
// sequence: source i's k-th draw has the priority (k + 1/2) / w_i, and
// the mixed order takes draws by increasing priority (ties by source
// index). After any p positions source i has drawn its quota p·s_i (s_i
// = w_i/Σw) rounded by Webster: count_i - p·s_i = e_i - s_i·Σe_j with
// each e_j = count_j - t·w_j in [-1/2, 1/2], so it is off by at most
// (1 + s_i·(K-2))/2 for K sources: under one draw for up to three
// sources, and for more, under one for a source of share below
// 1/(K-2) (a divisor method cannot do better for every K: Balinski and
// Young's quota method does, sequentially, with no closed form to seek
// by). Over every window its share is so exact up to twice that, where a
// coin per sample (Hugging Face's interleave_datasets) is off by about
// √(window·share). The counts
// after p positions are found by a binary search over the priority, so
// the mixed order is a function of (epoch, position) like its sources',
// and resumes, elastically too, without replay.
//
// An epoch of the mixture ends, with Cycle false, when the schedule names
// a source whose own epoch is used up (Hugging Face's stopping_strategy
// "first_exhausted"): each source's records come at most once per epoch,
// in its order of the mixture's epoch, and the schedule starts again with
// the next epoch. With Cycle true ("all_exhausted") it ends when every
// source has been used up at least once, and the schedule runs on across
// epochs: a source used up sooner goes on with its own next epochs, as
// Mosaic's Stream repeats, and each of its own epochs is exactly once.
//
// Weights change at a place: Segments are the weights from position At of
// epoch From on (issue 48: set_weights takes effect at the next step, not
// the next epoch). At a change the schedule restarts (Sainte-Laguë from
// the change's position) and each source goes on from the draws it had
// made: every source stays within one sample of its share of the
// positions since the change. An epoch is then pieces, each of one
// weights from its start, and ends (first_exhausted) at the first draw of
// a used-up source under the weights of its piece; a change past its end
// is refused, by name. All_exhausted's epoch is as long as its weights
// take to use every source up once, so its weights change at an epoch's
// start only. A Mixture serves one run of epochs of one length: its first
// epoch's and, until the next change, those after (Through).
type Mixture struct {
	sources  []Sampler
	offsets  []int
	segments []Segment
	cycle    bool
	epoch    int     // the first epoch served
	through  int     // the last, or -1: every one after
	pieces   []piece // the epoch's pieces, by start
	n        int     // positions per epoch
	from     int     // with cycle: the epoch the segment's stream starts at

	mu       sync.Mutex
	cur      *cursor     // where the last Fill ended, to go on from without a search
	curPiece int         // the piece cur walks
	perms    []epochPerm // each Global source's permutation of its latest epoch
	// src, nth, rest and ids are Fill's scratch: each draw's source and
	// its draw index, the positions of sources not Global, their ids.
	src, nth, rest, ids []int
	// last is where the last Fill ended, for Mark.
	lastEpoch, lastPos int
}

// piece is a run of an epoch's positions under one weights: from position
// start, the schedule of plan restarted there, each source having drawn
// prior[i] times before it (in the epoch; with cycle, in the segment's
// epochs before, and every segment's before it).
type piece struct {
	start int
	plan  schedule
	prior []int
}

// The bounds of the schedule's arithmetic. A priority (k+1/2)/w is a
// float64, and counts of draws come from t·w rounded: they are exact
// while k+1/2 is (k under 2^52), so the schedule counts at most
// MaxPositions positions (2^50, a margin of 4 over that), in one epoch
// and, with cycle, over every epoch of a segment. Weights are scaled by a
// power of two so the largest lies in [1/2, 1) (normalise): every
// priority is then the one the given weights make times that power, so
// the order is the same, and a sum of weights no longer overflows
// ([1e308, 1e308]). A weight under MinWeightRatio of the largest is
// refused: its source's first draw, of priority 1/(2w), would come after
// 2^49 draws of the largest, and its records past the positions the
// schedule counts; smaller ratios make priorities overflow to +Inf, or
// weights scaled down to denormals lose their precision.
const (
	MaxPositions   = 1 << 50
	MinWeightRatio = 1.0 / (1 << 50)
)

// CheckWeights says why weights cannot weigh a mixture's sources: a
// weight that is not a positive finite number (NaN, Inf, 0, negative), or
// one under MinWeightRatio of the largest. The error names the weight's
// source and the bound.
func CheckWeights(ws []float64) error {
	if len(ws) == 0 {
		return fmt.Errorf("no weights")
	}
	top := 0.0
	for i, w := range ws {
		if !(w > 0) || math.IsInf(w, 0) {
			return fmt.Errorf("source %d's weight is %v, want a positive finite number", i, w)
		}
		top = max(top, w)
	}
	for i, w := range ws {
		if w/top < MinWeightRatio {
			return fmt.Errorf("source %d's weight %v is under 2^-50 of the largest, %v: its source would not be drawn within the 2^50 positions a mixture counts; give it a larger weight or leave it out", i, w, top)
		}
	}
	return nil
}

// normalise returns ws scaled by a power of two, exactly, so the largest
// lies in [1/2, 1); ws passed CheckWeights.
func normalise(ws []float64) []float64 {
	_, e := math.Frexp(slices.Max(ws))
	out := make([]float64, len(ws))
	for i, w := range ws {
		out[i] = math.Ldexp(w, -e)
	}
	return out
}

// Segment is a mixture's weights from position At of epoch From on.
type Segment struct {
	From    int
	At      int
	Weights []float64
}

// before says segment a's place comes before b's.
func (a Segment) before(b Segment) bool { return a.From < b.From || a.From == b.From && a.At < b.At }

// CheckSegments says why segments cannot be a mixture of n sources'
// weights: the first not from epoch 0's start, places not increasing, a
// count of weights not n, weights CheckWeights refuses, or (cycle) a
// change inside an epoch.
func CheckSegments(segments []Segment, n int, cycle bool) error {
	if len(segments) == 0 || segments[0].From != 0 || segments[0].At != 0 {
		return fmt.Errorf("mixture weights: want a first segment from epoch 0's start")
	}
	for k, seg := range segments {
		where := fmt.Sprintf("mixture weights from epoch %d position %d", seg.From, seg.At)
		if len(seg.Weights) != n {
			return fmt.Errorf("%s: %d weights for %d sources", where, len(seg.Weights), n)
		}
		if err := CheckWeights(seg.Weights); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if seg.From < 0 || seg.From > MaxEpoch || seg.At < 0 || seg.At > MaxPositions {
			return fmt.Errorf("%s: outside epochs 0 to %d and positions 0 to 2^50", where, MaxEpoch)
		}
		if k > 0 && !segments[k-1].before(seg) {
			return fmt.Errorf("%s after epoch %d position %d: want increasing places", where, segments[k-1].From, segments[k-1].At)
		}
		if cycle && seg.At != 0 {
			return fmt.Errorf("%s: an all_exhausted epoch lasts until its weights have used every source up once, so its weights change at an epoch's start (position 0) only", where)
		}
	}
	return nil
}

// NewMixture mixes sources (each over its own ids 0..Len-1) whose global
// ids start at offsets, by the weights of segments, for the epochs of the
// last segment's weights: NewMixtureAt of its epoch.
func NewMixture(sources []Sampler, offsets []int, segments []Segment, cycle bool) (*Mixture, error) {
	e := 0
	if len(segments) > 0 {
		e = segments[len(segments)-1].From
	}
	return NewMixtureAt(sources, offsets, segments, cycle, e)
}

// NewMixtureAt mixes sources (each over its own ids 0..Len-1) whose
// global ids start at offsets, by the weights of segments (places
// increasing, the first at epoch 0's start), for epoch and the epochs
// after it that are as long (Through).
func NewMixtureAt(sources []Sampler, offsets []int, segments []Segment, cycle bool, epoch int) (*Mixture, error) {
	if len(sources) == 0 || len(offsets) != len(sources) {
		return nil, fmt.Errorf("mixture of %d sources with %d offsets", len(sources), len(offsets))
	}
	if err := CheckSegments(segments, len(sources), cycle); err != nil {
		return nil, err
	}
	if epoch < 0 || epoch > MaxEpoch {
		return nil, fmt.Errorf("mixture: epoch %d", epoch)
	}
	lens := make([]int, len(sources))
	for i, s := range sources {
		if lens[i] = s.Len(); lens[i] == 0 {
			return nil, fmt.Errorf("mixture source %d holds no record", i)
		}
	}
	m := &Mixture{sources: sources, offsets: offsets, segments: segments, cycle: cycle, epoch: epoch, through: -1}
	// The segment in force at the epoch's start, those starting inside it,
	// and the first after it, whose epoch (or the one before, if it starts
	// at one's start) is the last this sampler serves.
	base := 0
	for k, seg := range segments {
		if seg.From < epoch || seg.From == epoch && seg.At == 0 {
			base = k
		}
	}
	mids := []Segment{segments[base]}
	for _, seg := range segments[base+1:] {
		if seg.From == epoch {
			mids = append(mids, seg)
			m.through = epoch
			continue
		}
		if m.through < 0 {
			m.through = seg.From - 1
		}
		break
	}
	if cycle {
		return m, m.cycled(lens, segments[:base+1])
	}
	return m, m.cut(lens, mids)
}

// cut makes the epoch's pieces without cycle: each segment's schedule
// restarted at its place, with the draws made before it; the epoch ends
// at the first draw of a used-up source under its piece's weights.
func (m *Mixture) cut(lens []int, segs []Segment) error {
	prior := make([]int, len(lens))
	rem := make([]int, len(lens))
	for k, seg := range segs {
		sc := schedule{w: normalise(seg.Weights)}
		p := piece{plan: sc, prior: slices.Clone(prior)}
		if k > 0 {
			p.start = seg.At // the first is in force from the epoch's start, wherever it began
		}
		for i := range rem {
			rem[i] = lens[i] - prior[i]
		}
		n, ok := sc.epochLen(rem, false)
		if !ok || n > MaxPositions-p.start {
			return fmt.Errorf("mixture weights from epoch %d position %d: an epoch would be over 2^50 positions", seg.From, seg.At)
		}
		m.pieces = append(m.pieces, p)
		end := p.start + n
		if k+1 == len(segs) {
			m.n = end
			return nil
		}
		next := segs[k+1].At
		if next > end {
			return fmt.Errorf("mixture weights from epoch %d position %d: under the weights before them, epoch %d ends at position %d, so no position %d comes; change them at a position of the epoch, or from the next epoch's start (position 0)",
				segs[k+1].From, next, m.epoch, end, next)
		}
		cnt := make([]int, len(lens))
		sc.counts(next-p.start, cnt)
		for i := range prior {
			prior[i] += cnt[i]
		}
	}
	return nil
}

// cycled makes the piece of an all_exhausted epoch: the last segment's
// schedule as one stream from its first epoch, each source's draws
// carrying on from the segments before, whose epochs ran whole.
func (m *Mixture) cycled(lens []int, segs []Segment) error {
	prior := make([]int, len(lens))
	for k, seg := range segs {
		sc := schedule{w: normalise(seg.Weights)}
		n, ok := sc.epochLen(lens, true)
		if !ok {
			return fmt.Errorf("mixture weights from epoch %d: an epoch would be over 2^50 positions (all_exhausted waits for the source of least weight per record to be used up): give it a larger weight", seg.From)
		}
		if k+1 < len(segs) {
			// The segment's epochs ran whole: its draws carry on.
			if segs[k+1].From-seg.From > MaxPositions/n {
				return fmt.Errorf("mixture weights from epoch %d to %d: over 2^50 positions", seg.From, segs[k+1].From)
			}
			cnt := make([]int, len(lens))
			sc.counts((segs[k+1].From-seg.From)*n, cnt)
			for i := range cnt {
				prior[i] += cnt[i]
			}
			continue
		}
		m.pieces, m.n, m.from = []piece{{plan: sc, prior: prior}}, n, seg.From
	}
	return nil
}

func (m *Mixture) Len() int { return m.n }

// From is the first epoch the sampler serves, Through the last (-1: every
// epoch after): the epochs until the weights change again are as long.
func (m *Mixture) From() int    { return m.epoch }
func (m *Mixture) Through() int { return m.through }

// Share is source i's expected share of positions, under the weights of
// the epoch's last piece.
func (m *Mixture) Share(i int) float64 {
	w := m.pieces[len(m.pieces)-1].plan.w
	var sum float64
	for _, x := range w {
		sum += x
	}
	return w[i] / sum
}

// pieceOf is the piece position pos of the epoch is in.
func (m *Mixture) pieceOf(pos int) int {
	return sort.Search(len(m.pieces), func(k int) bool { return m.pieces[k].start > pos }) - 1
}

func (m *Mixture) Fill(epoch, pos int, dst []int) int {
	n := max(0, min(len(dst), m.n-pos))
	if n == 0 || !m.serves(epoch) {
		return 0 // an epoch this sampler does not serve: the loader says it got no ids
	}
	m.mu.Lock() // one Fill at a time: they share the cursor and the permutations
	defer m.mu.Unlock()
	for done := 0; done < n; {
		k := m.pieceOf(pos + done)
		end := n
		if k+1 < len(m.pieces) {
			end = min(n, m.pieces[k+1].start-pos)
		}
		if !m.fillPiece(epoch, k, pos+done, dst[done:end]) {
			return done
		}
		done = end
	}
	m.lastEpoch, m.lastPos = epoch, pos+n
	return n
}

// serves says the sampler serves epoch.
func (m *Mixture) serves(epoch int) bool {
	return epoch >= m.epoch && (m.through < 0 || epoch <= m.through)
}

// fillPiece fills dst with the ids of positions pos... of epoch, all in
// piece k; false past the positions the schedule counts. m.mu is held.
func (m *Mixture) fillPiece(epoch, k, pos int, dst []int) bool {
	pc := &m.pieces[k]
	q, ok := m.at(epoch, pos)
	if !ok {
		return false
	}
	n := len(dst)
	c := m.cur
	if c == nil || m.curPiece != k || c.q > q || q-c.q > 4096 {
		c, m.curPiece = pc.plan.seek(q), k
	}
	for c.q < q {
		c.next()
	}
	// A global shuffle's draw is one step of its permutation, kept per
	// source and epoch. Other sources' draws in one Fill are consecutive:
	// each source's run is filled with one call of its own Fill.
	// Scratch kept between Fills (m.mu is held): a Fill allocates nothing.
	if cap(m.src) < n {
		m.src, m.nth = make([]int, n), make([]int, n)
	}
	src, nth := m.src[:n], m.nth[:n]
	rest := m.rest[:0] // positions of draws of other sources
	for j := range n {
		i, d := c.next()
		d += pc.prior[i]
		src[j], nth[j] = i, d
		g, ok := m.sources[i].(Global)
		if !ok {
			rest = append(rest, j)
			continue
		}
		e := epoch
		if m.cycle {
			e, d = d/g.N, d%g.N
		}
		dst[j] = m.offsets[i] + int(m.perm(i, g, e).at(uint64(d)))
	}
	m.cur, m.rest = c, rest
	if len(rest) == 0 {
		return true
	}
	slices.SortStableFunc(rest, func(a, b int) int { return src[a] - src[b] })
	if cap(m.ids) < len(rest) {
		m.ids = make([]int, len(rest))
	}
	ids := m.ids[:len(rest)]
	for a := 0; a < len(rest); {
		i, b := src[rest[a]], a+1
		for b < len(rest) && src[rest[b]] == i {
			b++
		}
		m.fillRun(epoch, i, nth[rest[a]], ids[a:b])
		for t := a; t < b; t++ {
			dst[rest[t]] = m.offsets[i] + ids[t]
		}
		a = b
	}
	return true
}

// perm is source i's permutation of epoch e (a Global g's), made once per
// source and epoch; m.mu is held.
func (m *Mixture) perm(i int, g Global, e int) *perm {
	if m.perms == nil {
		m.perms = make([]epochPerm, len(m.sources))
	}
	c := &m.perms[i]
	if !c.ok || c.epoch != e {
		c.p, c.epoch, c.ok = newPerm(uint64(g.N), Mix(g.Seed, uint64(e))), e, true
	}
	return &c.p
}

// epochPerm is a source's permutation of one epoch.
type epochPerm struct {
	p     perm
	epoch int
	ok    bool
}

// fillRun writes source i's draws d, d+1, ... into ids: in its epoch of
// the mixture's, or with cycle, across its own epochs.
func (m *Mixture) fillRun(epoch, i, d int, ids []int) {
	if !m.cycle {
		m.sources[i].Fill(epoch, d, ids)
		return
	}
	n := m.sources[i].Len()
	for len(ids) > 0 {
		got := m.sources[i].Fill(d/n, d%n, ids)
		ids, d = ids[got:], d+got
	}
}

// Stream says whether a source's order is a stream (a share group's
// member): the mixture's place then needs their states to resume.
func (m *Mixture) Stream() bool {
	return slices.ContainsFunc(m.sources, IsStream)
}

type mixMark struct {
	epoch, pos int
	marks      []any // each stream source's
}

// Mark is the place after the last Fill, with each stream source's.
func (m *Mixture) Mark() any {
	m.mu.Lock()
	mk := &mixMark{epoch: m.lastEpoch, pos: m.lastPos, marks: make([]any, len(m.sources))}
	m.mu.Unlock()
	for i, s := range m.sources {
		if st, ok := s.(Stateful); ok && IsStream(s) {
			mk.marks[i] = st.Mark()
		}
	}
	return mk
}

const mixMagic = "RFMIX1\x00"

// Save is the mixture's place and each stream source's state there:
// "RFMIX1\x00", uvarints epoch, position and sources, then each source's
// state as a uvarint length and its bytes (none for a positional one).
func (m *Mixture) Save(mark any) ([]byte, error) {
	mk, ok := mark.(*mixMark)
	if !ok {
		return nil, nil
	}
	out := append([]byte(mixMagic), binary.AppendUvarint(nil, uint64(mk.epoch))...)
	out = binary.AppendUvarint(out, uint64(mk.pos))
	out = binary.AppendUvarint(out, uint64(len(m.sources)))
	for i, s := range m.sources {
		var b []byte
		if mk.marks[i] != nil {
			var err error
			if b, err = s.(Stateful).Save(mk.marks[i]); err != nil {
				return nil, fmt.Errorf("mixture source %d: %w", i, err)
			}
		}
		out = append(binary.AppendUvarint(out, uint64(len(b))), b...)
	}
	return out, nil
}

// Restore puts each stream source where the state says, and the mixture
// at its place.
func (m *Mixture) Restore(state []byte) (int, int, error) {
	bad := func(why string) (int, int, error) {
		return 0, 0, fmt.Errorf("mixture: %w (%s)", ErrState, why)
	}
	if !bytes.HasPrefix(state, []byte(mixMagic)) {
		return bad("not a mixture's state")
	}
	r := state[len(mixMagic):]
	var v [3]uint64
	for k := range v {
		x, n := binary.Uvarint(r)
		if n <= 0 {
			return bad("truncated")
		}
		v[k], r = x, r[n:]
	}
	if v[0] > MaxEpoch || v[1] > uint64(m.n) || v[2] != uint64(len(m.sources)) {
		return bad(fmt.Sprintf("saved for %d sources at epoch %d position %d, this one has %d sources and %d positions", v[2], v[0], v[1], len(m.sources), m.n))
	}
	epoch, pos := int(v[0]), int(v[1])
	for i, s := range m.sources {
		n, k := binary.Uvarint(r)
		if k <= 0 || uint64(len(r)-k) < n {
			return bad("truncated")
		}
		b := r[k : k+int(n)]
		r = r[k+int(n):]
		st, ok := s.(Stateful)
		if !ok || !IsStream(s) {
			if len(b) > 0 {
				return bad(fmt.Sprintf("source %d is not a stream", i))
			}
			continue
		}
		if _, _, err := st.Restore(b); err != nil {
			return 0, 0, fmt.Errorf("mixture source %d: %w", i, err)
		}
	}
	m.mu.Lock()
	m.lastEpoch, m.lastPos, m.cur = epoch, pos, nil
	m.mu.Unlock()
	return epoch, pos, nil
}

// Draws is how many draws of each source the schedule makes before
// position pos of epoch: where each source's own order is then.
func (m *Mixture) Draws(epoch, pos int) ([]int, error) {
	q, ok := m.at(epoch, pos)
	if !ok || !m.serves(epoch) {
		return nil, fmt.Errorf("mixture: epoch %d is not of the weights this schedule serves (epochs %d to %d), or past the 2^50 positions it counts (%d positions an epoch)", epoch, m.epoch, m.through, m.n)
	}
	pc := m.pieces[m.pieceOf(pos)]
	cnt := make([]int, len(m.sources))
	pc.plan.counts(q, cnt)
	for i := range cnt {
		cnt[i] += pc.prior[i]
	}
	return cnt, nil
}

// at is the schedule's position of position pos of epoch in its piece:
// counted from the piece's start when the schedule starts again each
// epoch, else the segment's stream's; false past MaxPositions (or before
// the segment).
func (m *Mixture) at(epoch, pos int) (int, bool) {
	if pos < 0 || pos > m.n {
		return 0, false
	}
	if !m.cycle {
		return pos - m.pieces[m.pieceOf(pos)].start, true
	}
	e := epoch - m.from
	if e < 0 || e > (MaxPositions-pos)/max(1, m.n) {
		return 0, false
	}
	return e*m.n + pos, true
}

// schedule is one segment's weights.
type schedule struct{ w []float64 }

// priority of source i's k-th draw.
func (s schedule) priority(i, k int) float64 { return (float64(k) + 0.5) / s.w[i] }

// below is how many of source i's draws have a priority under t.
func (s schedule) below(i int, t float64) int {
	k := max(0, int(math.Ceil(t*s.w[i]-0.5)))
	for k > 0 && s.priority(i, k-1) >= t {
		k--
	}
	for s.priority(i, k) < t {
		k++
	}
	return k
}

func (s schedule) countBelow(t float64) int {
	n := 0
	for i := range s.w {
		n += s.below(i, t)
	}
	return n
}

// at is the priority of the draw at position p: the greatest t with at
// most p draws below it, found over the ordered bits of positive floats.
func (s schedule) at(p int) float64 {
	// Below t, source i has drawn at least t·w_i - 1/2 times, so more than
	// p draws lie below (p + sources/2 + 1)/Σw: t is under it (twice
	// that, for the rounding of the sum). Each source's count below any t
	// the search tries is then at most about 2(p + sources), never the
	// count a bound by the least weight would try (p·w_max/w_min, which
	// overflowed an int at [1, 1e308] and counted for ever).
	var sum float64
	for _, w := range s.w {
		sum += w
	}
	lo, hi := uint64(0), math.Float64bits(2*(float64(p)+float64(len(s.w))/2+2)/sum)
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if s.countBelow(math.Float64frombits(mid)) <= p {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return math.Float64frombits(lo)
}

// counts writes how many draws of each source the first p positions hold.
func (s schedule) counts(p int, cnt []int) {
	t := s.at(p)
	r := p
	for i := range s.w {
		cnt[i] = s.below(i, t)
		r -= cnt[i]
	}
	// The draws of priority exactly t come by source index.
	for i := 0; r > 0 && i < len(s.w); i++ {
		if s.priority(i, cnt[i]) == t {
			cnt[i]++
			r--
		}
	}
}

// epochLen is where an epoch ends: without cycle, at the first draw the
// schedule names from a source that has none left (as Hugging Face's
// first_exhausted stops at the first source it cannot draw from, so
// sources sized to their weights are each read whole); with cycle, after
// the last source's last draw.
//
// It is false when the epoch would be over MaxPositions positions.
func (s schedule) epochLen(lens []int, cycle bool) (int, bool) {
	// Draws come in (priority, source) order, so the draw that ends the
	// epoch is the least (or, with cycle, the greatest) of the sources'
	// deciding draws; only its place is worked out.
	end, at := -1, 0.0
	for i, l := range lens {
		k := l // the draw past the source's records
		if cycle {
			k = l - 1 // its last: the epoch ends after it
		}
		t := s.priority(i, k)
		if end < 0 || (!cycle && t < at) || (cycle && t >= at) {
			end, at = i, t
		}
	}
	// Its place: every draw of lower priority, or of equal priority from a
	// source before it, comes first. Each source has drawn at most t·w_i
	// + 1/2 below t: past MaxPositions the counting is not tried.
	var sum float64
	for _, w := range s.w {
		sum += w
	}
	if at*sum > MaxPositions {
		return 0, false
	}
	p := s.countBelow(at)
	for j := range end {
		if s.priority(j, s.below(j, at)) == at {
			p++
		}
	}
	if cycle {
		p++
	}
	return p, p <= MaxPositions
}

// seek makes a cursor at position q.
func (s schedule) seek(q int) *cursor {
	c := &cursor{s: s, q: q, gen: make([]int, len(s.w))}
	s.counts(q, c.gen)
	var sum float64
	for _, w := range s.w {
		sum += w
	}
	// A window of about 4 draws a source (at least 1,024) makes its pass
	// over the sources a small part of each draw's cost.
	c.width = float64(max(1024, 4*len(s.w))) / sum
	return c
}

// cursor walks the schedule on from position q. It takes the draws a
// window of priorities at a time: every draw below the window's end not
// taken yet, put in (priority, source) order by a bucket sort over the
// window, whose buckets hold one draw on average. A binary heap of each
// source's next draw gives the same order, but its log₂(sources) steps
// of unpredictable comparisons a draw were a third of a 1,000-source
// mixture's Fill.
type cursor struct {
	s     schedule
	q     int
	gen   []int   // each source's draws taken into windows so far
	width float64 // priorities a window spans: about 4 draws a source
	buf   []draw  // the window's draws in order; buf[at:] are still to come
	at    int
	tmp   []draw
	count []int32
}

type draw struct {
	pri float64
	src int
	k   int // the source's draw index
}

// next is the draw at the cursor's position, as its source and that
// source's draw index; the cursor moves on one.
func (c *cursor) next() (src, draw int) {
	if c.at == len(c.buf) {
		c.window()
	}
	d := &c.buf[c.at]
	c.at++
	c.q++
	return d.src, d.k
}

// window takes the next window's draws into buf, in order. It starts at
// the least priority not taken yet, so it holds at least that draw, and
// every draw of lower priority has been taken before.
func (c *cursor) window() {
	s := c.s
	lo := math.Inf(1)
	for i, k := range c.gen {
		lo = min(lo, s.priority(i, k))
	}
	hi := lo + c.width
	if hi <= lo {
		hi = math.Nextafter(lo, math.Inf(1)) // priorities too large to add the width: the draws at lo
	}
	c.tmp = c.tmp[:0]
	for i, k := range c.gen {
		for ; ; k++ {
			p := s.priority(i, k)
			if p >= hi {
				break
			}
			c.tmp = append(c.tmp, draw{pri: p, src: i, k: k})
		}
		c.gen[i] = k
	}
	// Bucket b holds the priorities in [lo + b·(hi-lo)/n, ...): the
	// index is monotone in the priority (each operation is correctly
	// rounded), so buckets in turn, each in order, are the window in
	// order.
	n := len(c.tmp)
	scale := float64(n) / (hi - lo)
	bucket := func(p float64) int { return min(n-1, int((p-lo)*scale)) }
	if cap(c.count) < n+1 {
		c.count = make([]int32, n+1)
	}
	count := c.count[:n+1]
	clear(count)
	for _, d := range c.tmp {
		count[bucket(d.pri)+1]++
	}
	for b := 1; b <= n; b++ {
		count[b] += count[b-1]
	}
	if cap(c.buf) < n {
		c.buf = make([]draw, n)
	}
	c.buf, c.at = c.buf[:n], 0
	for _, d := range c.tmp {
		b := bucket(d.pri)
		c.buf[count[b]] = d
		count[b]++
	}
	// The buckets in turn are in order, a bucket's draws not yet: an
	// insertion sort moves each draw within its bucket only, a draw or
	// two, by priority then source.
	for i := 1; i < n; i++ {
		for j := i; j > 0 && before(&c.buf[j], &c.buf[j-1]); j-- {
			c.buf[j], c.buf[j-1] = c.buf[j-1], c.buf[j]
		}
	}
}

// before orders draws by priority, then source.
func before(a, b *draw) bool {
	return a.pri < b.pri || (a.pri == b.pri && a.src < b.src)
}
