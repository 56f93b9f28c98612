package share

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/RoaringBitmap/roaring/v2"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/sampler"
)

// MaxMembers is how many jobs one group can hold: one bit each in a
// record's signature. Jobs beyond it load on their own.
const MaxMembers = 64

// ErrFull says a group holds MaxMembers jobs already.
var ErrFull = errors.New("share: the group is full")

// Options configures a Group.
type Options struct {
	// Records is the number of records of the source.
	Records int
	// Cache holds the records shared jobs will read. With none the group
	// reserves nothing: the records wait where the first job's read left
	// them (the page cache, bounded by Hold), or the order alone is
	// dependent.
	Cache *cache.Cache
	// Key names record id in the cache, Size its exact bytes there (the
	// record's length, or its transform's output size): a shared record's
	// item is reserved at that size, and a copy of any other length fails.
	Key  func(id int) cache.Key
	Size func(id int) int
	// QueueCap bounds the records a job was given but has not taken yet:
	// a job whose queue is full sits out rounds. By default the bound is
	// the group's bytes held, not a count: the jobs behind the leader sit
	// out while the records given to several jobs in one round (read once,
	// kept until each has taken it) come to four fifths of the cache's
	// budget, or to Hold, counted once however many jobs wait for one. A
	// record given to one job alone is read when it takes it and costs
	// its queue a few bytes.
	QueueCap int
	// Hold, with no Cache, bounds the bytes of the records given to
	// several jobs and not yet taken by each (as Size counts them): they
	// wait in the page cache, where the first job's read put them, and
	// the jobs behind the leader sit out while Hold is held, as they do
	// at four fifths of a Cache's budget.
	Hold int64
	// Pages, with no Cache, names the pages the records lie in: the group
	// then keeps in the page cache the pages needed soonest (pages.go).
	Pages *Pages
	// Others, if set, says jobs outside the group read the source now,
	// whose next reads it cannot weigh (a Steward's): the group then
	// drops none of its pages, as the Steward drops none while the group
	// reads, and the kernel's order decides for both.
	Others func() bool
	// Seed seeds the group's random source; 0 draws one.
	Seed uint64
}

// Group coordinates the jobs of one source.
type Group struct {
	opts Options
	mu   sync.Mutex
	cl   *classes
	rng  *rand.Rand
	mem  [MaxMembers]*Member
	// waiting counts, for each record given to several jobs, the jobs yet
	// to take it; held is those records' bytes in the cache.
	waiting map[int32]int32
	held    int64
	// res is the pages the group keeps in the page cache (Options.Pages);
	// takes counts every member's takes, the clock of their rates.
	res   *resident
	takes int64

	rounds, given, shared, saved atomic.Int64
}

// NewGroup returns a group over a source of opts.Records records.
func NewGroup(opts Options) *Group {
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	g := &Group{opts: opts, cl: newClasses(opts.Records), rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		waiting: map[int32]int32{}}
	if opts.Pages != nil && opts.Cache == nil {
		g.res = newResident(*opts.Pages, g.rng, g.pageNeed, sampled, true)
		g.res.blind = opts.Others
	}
	return g
}

// Stats are a group's counts: rounds run, records given to jobs, and
// records given to two jobs or more in one round (read once for all).
type Stats struct {
	Rounds, Given, Shared int64
	// Saved is the reads sharing saved: records given to k jobs in one
	// round count k-1. Given less Saved is what the jobs read.
	Saved   int64
	Members int
	// PagesKept is the pages of the group's records it keeps in the page
	// cache, PagesDropped those it has asked the kernel to drop
	// (Options.Pages).
	PagesKept, PagesDropped int64
}

func (g *Group) Stats() Stats {
	g.mu.Lock()
	n := 0
	for _, m := range g.mem {
		if m != nil {
			n++
		}
	}
	var kept, dropped int64
	if g.res != nil {
		kept, dropped = int64(len(g.res.pages)), g.res.dropCount
	}
	g.mu.Unlock()
	return Stats{Rounds: g.rounds.Load(), Given: g.given.Load(), Shared: g.shared.Load(), Saved: g.saved.Load(), Members: n,
		PagesKept: kept, PagesDropped: dropped}
}

// Member is one job of a group, and its order: a Sampler whose epochs are
// uniform permutations of its subset, chosen dependently with the other
// members'. Fill must be called at increasing positions (the loader does);
// Save and Restore keep the set of records already delivered in an epoch.
//
// A member is given records one epoch ahead of the one it takes: when the
// last record of an epoch is given, the next epoch's records go into the
// classes at once, so a job keeps sharing across its epoch boundaries
// while it still reads the end of the last one.
type Member struct {
	g         *Group
	bit       uint64
	subset    *roaring.Bitmap // nil: every record
	size      int
	epoch     int     // the epoch being taken
	give      int     // the epoch being given (epoch, or epoch+1)
	remaining int     // records of give with this member's bit: not given yet
	queue     []given // given, not yet taken
	seq       []int32 // this epoch's records, in the order taken
	// past are the epochs before's seqs, whole, oldest first, while their
	// places may still be saved: a loader reads ahead into the next
	// epochs before the state of its last batches is asked for, and over
	// tiny epochs (a small part of a subset) it may be several ahead. The
	// last one is always kept; older ones while they hold few ids.
	past []pastEpoch
	// done is seq as a set, kept as seq grows so that saving a state
	// costs the set's size, not a pass over the epoch so far.
	done   roaring.Bitmap
	active bool // give's records are in the classes
	gone   bool
	picked int // the record of the current round
	// rate is the member's share of the group's takes, takes its own
	// (Options.Pages: how soon it needs its records).
	rate             float64
	takes, lastTakes int64
	// Last, if not negative, is the job's last epoch: it is not given
	// records of later ones.
	Last int
	// ahead is SetFresh's count.
	ahead int
}

// pastEpoch is an epoch's records in the order taken.
type pastEpoch struct {
	epoch int
	seq   []int32
}

// keepIDs bounds the ids the epochs before the last keep: 64K, a few
// hundred KiB, many epochs of a small part.
const keepIDs = 1 << 16

// keep adds epoch's seq to the past, dropping the oldest beyond the last
// while the past holds more than keepIDs ids.
func (m *Member) keep(epoch int, seq []int32) {
	m.past = append(m.past, pastEpoch{epoch, slices.Clone(seq)})
	total := 0
	for _, p := range m.past {
		total += len(p.seq)
	}
	for len(m.past) > 1 && total-len(m.past[len(m.past)-1].seq) > keepIDs {
		total -= len(m.past[0].seq)
		m.past = m.past[1:]
	}
}

// pastSeq is a kept epoch's seq, nil if it is not kept.
func (m *Member) pastSeq(epoch int) []int32 {
	for _, p := range m.past {
		if p.epoch == epoch {
			return p.seq
		}
	}
	return nil
}

// given is a record given to a member, and the epoch it is given for.
type given struct {
	id    int32
	epoch int32
	size  int32 // its bytes in the cache, if it was given to others too; else 0
}

// Join inserts a job reading subset (nil: all records) at the start of
// epoch, from now on: it takes part in the next round.
func (g *Group) Join(subset *roaring.Bitmap, epoch int) (*Member, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.mem {
		if g.mem[i] == nil {
			m := &Member{g: g, bit: 1 << i, subset: subset, size: g.opts.Records, epoch: -1, Last: -1, rate: 1}
			if subset != nil {
				if subset.GetCardinality() > 0 && int(subset.Maximum()) >= g.opts.Records {
					return nil, fmt.Errorf("share: subset names record %d of %d", subset.Maximum(), g.opts.Records)
				}
				m.size = int(subset.GetCardinality())
			}
			g.mem[i] = m
			m.start(epoch)
			return m, nil
		}
	}
	return nil, ErrFull
}

// Leave deletes the job from the group: its records go from every
// signature, and the cache forgets its uses of the records it was given
// and did not take (a record only it still needed is dropped at once).
func (m *Member) Leave() {
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if m.gone {
		return
	}
	m.gone = true
	if m.active {
		g.cl.clearBit(m.bit)
	}
	m.remaining = 0
	m.dropQueue()
	for i := range g.mem {
		if g.mem[i] == m {
			g.mem[i] = nil
		}
	}
}

// dropQueue forgets the records given and not taken: the cache forgets
// their uses by this member.
func (m *Member) dropQueue() {
	g := m.g
	if g.opts.Cache != nil {
		for _, q := range m.queue {
			g.opts.Cache.AddRefs(g.opts.Key(int(q.id)), -1)
		}
	}
	for _, q := range m.queue {
		g.taken(q)
	}
	m.queue = m.queue[:0]
}

// start makes epoch e this member's, from its start: its records are all
// needed again, and what was given for another epoch is forgotten. The
// epochs before's places (past) are the caller's to keep or forget.
func (m *Member) start(e int) {
	if m.active {
		m.g.cl.clearBit(m.bit)
	}
	m.dropQueue()
	m.epoch, m.seq = e, m.seq[:0]
	m.done.Clear()
	m.insert(e)
}

// insert puts the member's records into the classes for epoch e.
func (m *Member) insert(e int) {
	g := m.g
	m.give, m.remaining, m.active = e, 0, true
	add := func(id int) {
		g.cl.move(id, g.cl.sig(id)|m.bit)
		m.remaining++
	}
	if m.subset == nil {
		for id := range g.opts.Records {
			add(id)
		}
		return
	}
	it := m.subset.Iterator()
	for it.HasNext() {
		add(int(it.Next()))
	}
}

func (m *Member) Len() int { return m.size }

// Fill writes the records at positions pos... of epoch, running rounds as
// the member's queue runs dry.
func (m *Member) Fill(epoch, pos int, dst []int) int {
	g := m.g
	g.mu.Lock()
	n := m.fill(epoch, pos, dst)
	var drops []int32
	if g.res != nil {
		drops = g.res.dropped()
	}
	g.mu.Unlock()
	if len(drops) > 0 {
		g.res.p.dropRuns(drops)
	}
	return n
}

func (m *Member) fill(epoch, pos int, dst []int) int {
	if m.gone {
		return 0
	}
	if epoch != m.epoch {
		if epoch == m.epoch+1 && len(m.seq) == m.size && pos == 0 {
			// The next epoch, given ahead already; the last one is kept
			// for the states of its last places.
			m.keep(m.epoch, m.seq)
			m.epoch, m.seq = epoch, m.seq[:0]
			m.done.Clear()
		} else if epoch > m.epoch && m.epoch >= 0 && pos == 0 {
			// On into a later epoch before this one was whole (a
			// mixture's source when another ran out first): its records
			// are all needed again, and the places of the one left are
			// kept, as a whole one's are.
			m.keep(m.epoch, m.seq)
			m.start(epoch)
		} else {
			m.past = nil
			m.start(epoch)
		}
	}
	n := max(0, min(len(dst), m.size-pos))
	for i := 0; i < n; i++ {
		p := pos + i
		if p < len(m.seq) {
			dst[i] = int(m.seq[p]) // asked again: the same record
			continue
		}
		for p > len(m.seq) { // positions skipped: taken and passed over
			m.take()
		}
		dst[i] = m.take()
	}
	return n
}

// take returns the member's next record, running a round if it has none.
func (m *Member) take() int {
	if len(m.queue) == 0 {
		if m.remaining == 0 {
			m.insert(m.give + 1) // past its last epoch after all
		}
		m.g.run(m)
	}
	q := m.queue[0]
	m.queue = m.queue[1:]
	m.g.taken(q)
	m.seq = append(m.seq, q.id)
	m.done.Add(uint32(q.id))
	if g := m.g; g.res != nil {
		g.rates(m)
		g.touch(m, int(q.id))
	}
	return int(q.id)
}

// room says whether member o may be given more records ahead of taking
// them. The records given to it and others wait in the cache; when the
// jobs behind the leader hold more than it can, RefCnt evicts and they
// read again.
func (g *Group) room(o *Member) bool {
	if g.opts.QueueCap > 0 {
		return len(o.queue) < g.opts.QueueCap
	}
	if hold := g.hold(); hold > 0 {
		return len(o.queue) < 64 || g.held < hold
	}
	return len(o.queue) < 64
}

// hold is the bytes the group may hold for the jobs behind the leader:
// four fifths of its cache's budget, or Hold.
func (g *Group) hold() int64 {
	if c := g.opts.Cache; c != nil {
		return c.Budget() * 4 / 5
	}
	return g.opts.Hold
}

// taken counts q, given to several jobs, taken by one of them (or given
// up): the last to take it ends the group's hold on its bytes.
func (g *Group) taken(q given) {
	if q.size == 0 {
		return
	}
	if g.waiting[q.id]--; g.waiting[q.id] <= 0 {
		delete(g.waiting, q.id)
		g.held -= int64(q.size)
	}
}

// run runs one round for m and every member with records left and room
// in its queue, and hands out the picks.
func (g *Group) run(m *Member) {
	parts := []*Member{m}
	for _, o := range g.mem {
		if o != nil && o != m && o.active && o.remaining > 0 && g.room(o) {
			parts = append(parts, o)
		}
	}
	picks := round(g.cl, g.rng, parts)
	g.rounds.Add(1)
	// Apply the round: each record leaves the sets of the jobs it went to.
	clear := map[int]uint64{}
	for i, e := range picks {
		clear[e] |= parts[i].bit
	}
	for e, bits := range clear {
		g.cl.move(e, g.cl.sig(e)&^bits)
	}
	for i, e := range picks {
		p := parts[i]
		p.remaining--
		q := given{id: int32(e), epoch: int32(p.give)}
		if k := int32(popcount(clear[e])); g.hold() > 0 && k >= 2 {
			q.size = int32(g.opts.Size(e))
			if g.opts.Cache != nil {
				q.size += 64 // the item's bookkeeping
			}
			if _, ok := g.waiting[q.id]; !ok {
				g.held += int64(q.size)
			}
			g.waiting[q.id]++
		}
		p.queue = append(p.queue, q)
		if p.remaining == 0 {
			// Its epoch is all given: give the next one from now on,
			// unless it has no next one.
			if p.Last < 0 || p.give < p.Last {
				p.insert(p.give + 1)
			} else {
				p.active = false
			}
		}
	}
	g.given.Add(int64(len(picks)))
	for e, bits := range clear {
		k := popcount(bits)
		if k < 2 {
			continue
		}
		g.shared.Add(1)
		g.saved.Add(int64(k - 1))
		if c := g.opts.Cache; c != nil {
			// One read for the k jobs: the first to plan it reads it into
			// the cache, the others copy it from there. A record still there
			// for readers of an earlier round has k more uses to come.
			key := g.opts.Key(e)
			if !c.AddRefs(key, k) {
				c.Reserve(key, g.opts.Size(e), k, cache.Never, false)
			}
		}
	}
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// Stream says the member's order needs its saved state to resume.
func (m *Member) Stream() bool { return true }

type memberMark struct{ epoch, pos int }

// Mark is the place after the last Fill.
func (m *Member) Mark() any {
	m.g.mu.Lock()
	defer m.g.mu.Unlock()
	return memberMark{m.epoch, len(m.seq)}
}

// A member's state: "RFSHR2\x00", then "epoch pos size tail\n", the set
// of the records delivered before the tail (a roaring bitmap), and the
// tail's records in the order taken, as uvarints. RFSHR1 states (no
// tail) still restore.
const (
	memberMagicV1 = "RFSHR1\x00"
	memberMagic   = "RFSHR2\x00"
)

// Save encodes the records delivered this epoch up to the mark.
func (m *Member) Save(mark any) ([]byte, error) { return m.SaveFrom(mark, -1) }

// SaveFrom is Save, keeping the order of the records taken from position
// from to the mark: a loader whose opportunistic window was taken whole
// loads the window again, so the restored member must give the same
// records at the window's positions, not any of the delivered ones.
func (m *Member) SaveFrom(mark any, from int) ([]byte, error) {
	mk, ok := mark.(memberMark)
	if !ok {
		return nil, nil
	}
	m.g.mu.Lock()
	var seq []int32
	switch {
	case mk.epoch == m.epoch && mk.pos <= len(m.seq):
		seq = m.seq[:mk.pos]
	case m.pastSeq(mk.epoch) != nil && mk.pos <= len(m.pastSeq(mk.epoch)):
		// A place of an epoch before, asked after the loader read on
		// into this one.
		seq = m.pastSeq(mk.epoch)[:mk.pos]
	case mk.pos > 0:
		m.g.mu.Unlock()
		return nil, fmt.Errorf("shared sampler: the records delivered up to position %d of epoch %d are no longer kept (the job is at epoch %d)", mk.pos, mk.epoch, m.epoch)
	}
	if from < 0 || from > len(seq) {
		from = len(seq)
	}
	bm := roaring.New()
	for _, e := range seq[:from] {
		bm.Add(uint32(e))
	}
	tail := slices.Clone(seq[from:])
	m.g.mu.Unlock()
	var b bytes.Buffer
	b.WriteString(memberMagic)
	fmt.Fprintf(&b, "%d %d %d %d\n", mk.epoch, mk.pos, m.size, len(tail))
	if _, err := bm.WriteTo(&b); err != nil {
		return nil, err
	}
	for _, e := range tail {
		b.Write(binary.AppendUvarint(nil, uint64(e)))
	}
	return b.Bytes(), nil
}

// Saved is what a saved state says was delivered of its epoch.
type Saved struct {
	Epoch int
	// Size is the records per epoch of the job that saved it; 0 for a set
	// of records delivered by several (EncodeDelivered's).
	Size int
	// Done is the set of records delivered before the tail, every one.
	Done *roaring.Bitmap
	// Tail are the records taken last, in the order taken: records an
	// opportunistic window took, not all of them delivered (the place's
	// skip says which). None is in Done.
	Tail []int
}

// Taken is every record the state took: Done and the tail.
func (s Saved) Taken() *roaring.Bitmap {
	t := s.Done.Clone()
	for _, id := range s.Tail {
		t.Add(uint32(id))
	}
	return t
}

// Delivered decodes a saved state: a member's (Save's), a set of records
// delivered by several jobs (EncodeDelivered's), or a member's kept by
// its client (RFBIT1), of a dataset of records. Every count it reads is
// checked against the bytes that hold it and against records before
// anything is allocated by it, and a state holds at most one other (a
// client's holds the state its job opened from, which is not a client's):
// a state from a client is hostile until it has been read.
func Delivered(state []byte, records int) (Saved, error) {
	if bytes.HasPrefix(state, []byte(bitsMagic)) {
		return bitsDelivered(state[len(bitsMagic):], records)
	}
	return delivered(state, records)
}

// delivered is Delivered of a state that is not a client's.
func delivered(state []byte, records int) (Saved, error) {
	bad := func(why string) (Saved, error) {
		return Saved{}, fmt.Errorf("shared sampler: %w (%s)", sampler.ErrState, why)
	}
	var s Saved
	var head string
	var fields []*int
	var pos, tail int
	switch {
	case bytes.HasPrefix(state, []byte(memberMagic)):
		head, fields = memberMagic, []*int{&s.Epoch, &pos, &s.Size, &tail}
	case bytes.HasPrefix(state, []byte(memberMagicV1)):
		head, fields = memberMagicV1, []*int{&s.Epoch, &pos, &s.Size}
	case bytes.HasPrefix(state, []byte(setMagic)):
		head, fields = setMagic, []*int{&s.Epoch, &pos}
	default:
		return s, fmt.Errorf("shared sampler: %w", sampler.ErrState)
	}
	r, ok := header(state[len(head):], fields)
	if !ok || s.Epoch < 0 || s.Epoch > sampler.MaxEpoch || pos < 0 || pos > records || s.Size < 0 || s.Size > records ||
		tail < 0 || tail > pos || tail > len(r) { // a tail's record is a uvarint, a byte at least
		return bad(fmt.Sprintf("its header, of a dataset of %d records", records))
	}
	done, r, err := readSet(r, records)
	if err != nil {
		return bad(err.Error())
	}
	if int(done.GetCardinality()) != pos-tail {
		return bad(fmt.Sprintf("a set of %d records, its header says %d", done.GetCardinality(), pos-tail))
	}
	s.Done = done
	if tail > 0 {
		s.Tail = make([]int, 0, tail)
		seen := done.Clone()
		for range tail {
			e, k := binary.Uvarint(r)
			if k <= 0 || e >= uint64(records) || !seen.CheckedAdd(uint32(e)) {
				return bad("the records taken last")
			}
			s.Tail, r = append(s.Tail, int(e)), r[k:]
		}
	}
	return s, nil
}

// header reads a state's header: the decimal fields, spaced, and a
// newline, and returns the bytes after it. A field is at most 19 digits
// (an int64's), so a header of hostile digits costs nothing.
func header(b []byte, fields []*int) ([]byte, bool) {
	for k, f := range fields {
		end := byte(' ')
		if k == len(fields)-1 {
			end = '\n'
		}
		i := bytes.IndexByte(b[:min(len(b), 21)], end)
		if i < 1 || i > 19 {
			return nil, false
		}
		v, err := strconv.ParseInt(string(b[:i]), 10, 64)
		if err != nil {
			return nil, false
		}
		*f, b = int(v), b[i+1:]
	}
	return b, true
}

// setMagic heads a set of records delivered of an epoch by any number of
// jobs (the parts of a run on another topology): "RFSET1\x00",
// "epoch count\n", then the set (a roaring bitmap).
const setMagic = "RFSET1\x00"

// EncodeDelivered is the state of a set of records delivered of epoch,
// which Delivered reads back.
func EncodeDelivered(epoch int, done *roaring.Bitmap) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(setMagic)
	fmt.Fprintf(&b, "%d %d\n", epoch, done.GetCardinality())
	if _, err := done.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// bitsMagic heads a member's state as its client kept it, from the ids of
// the batches it delivered (the daemon that kept the member's went away):
// "RFBIT1\x00", "epoch size n\n", the n bytes of the state its job opened
// from (none at an epoch's start), then a bit a record delivered since,
// record i's bit i%8 of byte i/8. A client keeps it only of an order that
// delivers each batch whole: the state has no tail.
const bitsMagic = "RFBIT1\x00"

func bitsDelivered(b []byte, records int) (Saved, error) {
	bad := func(why string) (Saved, error) {
		return Saved{}, fmt.Errorf("shared sampler: %w (%s)", sampler.ErrState, why)
	}
	var s Saved
	var n int
	rest, ok := header(b, []*int{&s.Epoch, &s.Size, &n})
	if !ok || s.Epoch < 0 || s.Epoch > sampler.MaxEpoch || s.Size <= 0 || s.Size > records || n < 0 || n > len(rest) {
		return bad(fmt.Sprintf("its header, of a dataset of %d records", records))
	}
	base, set := rest[:n], rest[n:]
	done := roaring.New()
	if n > 0 {
		// The state its job opened from is the daemon's: a client keeps
		// one set of bits over it (riffle.state's _Taken), never a state
		// of its own inside another, so one level is all a state holds
		// and no nesting can run the decoder's stack out.
		if bytes.HasPrefix(base, []byte(bitsMagic)) {
			return bad("a client's state inside another")
		}
		bs, err := delivered(base, records)
		if err != nil {
			return s, err
		}
		if bs.Epoch != s.Epoch || bs.Size != s.Size || len(bs.Tail) != 0 {
			return s, fmt.Errorf("shared sampler: %w (the state it opened from is of epoch %d, %d records, a tail of %d)", sampler.ErrState, bs.Epoch, bs.Size, len(bs.Tail))
		}
		done = bs.Done
	}
	// The client's bits grow by doubling (riffle.state's _Taken.add):
	// zero bytes past the last record are no records.
	set = bytes.TrimRight(set, "\x00")
	if len(set) > (records+7)/8 {
		return bad(fmt.Sprintf("a set of %d bytes, of a dataset of %d records", len(set), records))
	}
	for i, c := range set {
		for ; c != 0; c &= c - 1 {
			e := i*8 + bits.TrailingZeros8(c)
			if e >= records || !done.CheckedAdd(uint32(e)) {
				return bad(fmt.Sprintf("record %d delivered twice, or past the dataset's %d", e, records))
			}
		}
	}
	if int(done.GetCardinality()) > s.Size {
		return bad(fmt.Sprintf("%d records delivered of %d", done.GetCardinality(), s.Size))
	}
	s.Done = done
	return s, nil
}

// Restore continues an epoch without the records a saved state delivered.
func (m *Member) Restore(state []byte) (int, int, error) {
	s, err := Delivered(state, m.g.opts.Records)
	if err != nil {
		return 0, 0, err
	}
	pos := int(s.Done.GetCardinality()) + len(s.Tail)
	if s.Size == 0 && pos > 0 {
		return 0, 0, fmt.Errorf("shared sampler: %w (a set of records delivered by other jobs, not this job's place: open the rest of the epoch without them)", sampler.ErrState)
	}
	epoch := s.Epoch
	if s.Size != m.size || pos > m.size {
		return 0, 0, fmt.Errorf("shared sampler: %w (saved for %d records, this job has %d)", sampler.ErrState, s.Size, m.size)
	}
	// The records delivered: the set in id order, then the tail as taken.
	order := s.Done.ToArray()
	g := m.g
	g.mu.Lock()
	defer g.mu.Unlock()
	m.past = nil
	m.start(epoch)
	// A whole epoch delivered stays that epoch's end (its records all
	// taken): the next begins when it is asked for, and an opportunistic
	// window that reached the end is loaded again from them, less what
	// was delivered.
	take := func(e int) error {
		if e >= g.opts.Records || g.cl.sig(e)&m.bit == 0 {
			return fmt.Errorf("shared sampler: %w (record %d is not this job's)", sampler.ErrState, e)
		}
		g.cl.move(e, g.cl.sig(e)&^m.bit)
		m.remaining--
		m.seq = append(m.seq, int32(e))
		m.done.Add(uint32(e))
		return nil
	}
	for _, e := range order {
		if err := take(int(e)); err != nil {
			return 0, 0, err
		}
	}
	for _, e := range s.Tail {
		if err := take(e); err != nil {
			return 0, 0, err
		}
	}
	return epoch, pos, nil
}
