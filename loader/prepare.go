package loader

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/riffle-ml/riffle/cache"
	"github.com/riffle-ml/riffle/dataset"
	"github.com/riffle-ml/riffle/sampler"
	"github.com/riffle-ml/riffle/storage"
)

// Preparing a batch turns its ids into units of work: reads of storage, each
// covering one record or a run of neighbouring records (coalesced), and
// copies of records another loader read into the cache. Records sit in the
// batch in delivery order (Options.Ordered), and units are laid out in the
// buffer in the order of their first record, so that records read one per
// read (every record of a global shuffle over a large dataset) are packed
// in delivery order and the batch is one array without a copy.

// load is a batch being loaded (a job is a client's, package job).
type load struct {
	Batch
	l     *Loader
	ents  []entry // the batch's records, sorted by location
	units []unit
	dones []func(error)      // unit i's read callback, made once per job
	reqs  []*storage.Request // the reads of one dispatch
	// pastIDs and past are the records PastCache is asked of in one
	// dispatch, and its answers; pastReqs their reads.
	pastIDs  []int
	past     []bool
	pastReqs []*storage.Request
	ids      []int  // the sampler's ids, before the delivery order
	unitOf   []int  // the unit serving each delivery slot
	end      int    // bytes of the batch's buffer
	raw      []byte // with a transform: where reads land, before it runs
	rawOff   []int  // with a transform: each slot's record in raw
	rawEnd   int
	cellAt   []int            // rows, samples: slot s's cells are cellAt[s]..cellAt[s+1] of cellOff and cellLen
	cellOff  []int            // rows, samples: cell k of slot s lands at raw[cellOff[cellAt[s]+k]]
	cellLen  []int            // and is this long
	rowsOut  dataset.RowBatch // rows: the batch the cells make
	stage    rowStage         // rows with a transform: where the batch is staged and transformed
	perm     []int
	left     atomic.Int64
	done     chan struct{}
	errOnce  sync.Once
	err      error
	failed   atomic.Bool
	win      *window // opportunistic ordering: the batches cut from this job
	own      int     // a gathered load: the end of its window, in positions of the epoch
	weight   int64
	mark     any // a Stateful sampler's state after this batch
	// sheddable says the load can give its memory back before Next takes
	// it, shed that it did, again that it is being read again (memory.go).
	sheddable, shed, again bool
}

// entry is one record of a batch.
type entry struct {
	obj   int
	off   int64
	n     int
	id    int
	slot  int         // its index in the batch's delivery order
	cell  int         // rows: which of the row's cells
	item  *cache.Item // pinned: its cached copy, or the item this batch fills
	claim bool        // this batch reads the record and fills item
}

// RecordMeta is the memory a load holds for each record beside its
// bytes: its entry, and its id (the sampler's and the batch's), offset,
// length, label, place in a cut window and share of a read, 8 bytes each.
const RecordMeta = int64(unsafe.Sizeof(entry{})) + 7*8

// bookkeeping is what a load weighs beside its bytes: a gathered window's
// RecordMeta a record. A window holds as many records as memory allows,
// and of records of 200 bytes (lines of LIBSVM) the bookkeeping is a third
// of what it holds: a loader of gathered windows that weighed only their
// bytes held 305 MB live in 128 MiB of memory, and was OOM-killed in a
// 320 MiB cgroup. A batch's bookkeeping is bounded by the batches in
// flight instead (a few), and its weight is its bytes: what a daemon's
// arena, the memory a job names, holds.
func (l *Loader) bookkeeping(j *load) int64 {
	if l.gathered == nil {
		return 0
	}
	return int64(len(j.ents)) * RecordMeta
}

// unit is one read of storage, or one record copied from the cache.
type unit struct {
	obj    int
	off    int64 // aligned start
	n      int   // aligned length
	dst    int   // where it lands in the batch's buffer
	lo, hi int   // the entries j.ents[lo:hi] it serves
	read   bool  // false: a cached record, copied
	req    storage.Request
	left   atomic.Int32 // with a transform: its records not transformed yet
}

// prepare lays out batch b (and, with opportunistic ordering, the nb-1
// batches after it) of epoch e: which records, in which delivery order,
// which reads and copies, and where each record lands.
func (l *Loader) prepare(e, b, nb int, bs sampler.Batches, skip []int) (*load, error) {
	var j *load
	select {
	case j = <-l.freeLoads:
	default:
		j = &load{l: l}
	}
	j.err, j.errOnce, j.done, j.win, j.mark = nil, sync.Once{}, make(chan struct{}), nil, nil
	j.sheddable, j.shed, j.again = false, false, false
	j.failed.Store(false)
	pos, _ := bs.Span(b)
	lastPos, lastN := bs.Span(b + nb - 1)
	n := lastPos + lastN - pos
	if l.staged != nil {
		l.loadStages(e, lastPos+lastN-1)
	}
	j.ids = grow(j.ids, n)
	if got := l.smp.Fill(e, pos, j.ids); got != n {
		return nil, fmt.Errorf("loader: sampler gave %d ids at position %d of epoch %d, want %d", got, pos, e, n)
	}
	if l.stateful != nil {
		j.mark = l.stateful.Mark()
	}
	first := b
	if len(skip) > 0 {
		// Resuming inside an opportunistic window: its records already
		// delivered are left out, and the batches delivered are not cut again.
		// A sorted copy is searched: a scan of skip for each id was
		// quadratic in a client's list (up to MaxWindow·MaxBatchSize).
		sorted := slices.Sorted(slices.Values(skip))
		j.ids = slices.DeleteFunc(j.ids, func(id int) bool { _, ok := slices.BinarySearch(sorted, id); return ok })
		first = l.opts.Batch
		n = len(j.ids)
	}
	j.Batch = Batch{Epoch: e, Index: first, Pos: pos, Last: b+nb == bs.Count(),
		IDs: grow(j.IDs, n), Off: grow(j.Off, n), Len: grow(j.Len, n)}
	l.order(j, e, b)
	size := l.ds.Len()
	j.ents = j.ents[:0]
	if l.assembled() {
		if err := l.prepareRows(j, e); err != nil {
			return nil, err
		}
	}
	for slot, id := range j.IDs {
		if l.assembled() {
			break
		}
		if id < 0 || id >= size {
			return nil, fmt.Errorf("loader: sampler gave id %d outside [0, %d) in epoch %d", id, size, e)
		}
		loc := l.ds.Locate(id)
		if loc.Len < 0 || loc.Off < 0 {
			// A dataset's index that is not its file's: an error naming
			// the record, never a slice out of range in a read's buffer.
			return nil, &dataset.FormatError{Path: l.ds.Object(loc.Object).Name(), Offset: loc.Off,
				Err: fmt.Errorf("record %d has length %d: %w", id, loc.Len, dataset.ErrCorrupt)}
		}
		j.ents = append(j.ents, entry{obj: loc.Object, off: loc.Off, n: loc.Len, id: id, slot: slot})
		j.Len[slot] = loc.Len
		if l.tf != nil {
			j.Len[slot] = l.tf.Size()
		}
	}
	if l.labels && !l.assembled() {
		j.Labels = grow(j.Labels, n)
		for slot, id := range j.IDs {
			j.Labels[slot] = l.ds.Label(id)
		}
	} else {
		j.Labels = nil
	}
	if l.gathered != nil {
		_, j.own = l.gathered.WindowOf(e, pos)
	}
	// Fetch order: by location, so neighbours coalesce and the device sees
	// ascending offsets.
	slices.SortFunc(j.ents, func(a, b entry) int {
		if c := cmp.Compare(a.obj, b.obj); c != 0 {
			return c
		}
		return cmp.Compare(a.off, b.off)
	})
	// Laid out as if every record were read: the most memory the batch
	// can take. Its records are looked up in the cache (claiming those it
	// is to read for the others) only once it is admitted (claim).
	j.rawEnd = 0
	l.layout(j)
	j.weight = min(int64(j.size()+j.rawEnd)+l.bookkeeping(j), l.opts.MemoryBytes)
	if l.cut() {
		j.win = newWindow(j, first, b+nb-first, bs)
		if l.gathered != nil {
			// A resumed loader delivers from its place, inside the window
			// it loads whole.
			next := 0
			if e == l.opts.Epoch && l.opts.Batch > first {
				next = l.opts.Batch - first
			}
			j.win.gathered(next)
		}
		if l.rows != nil {
			// Each batch cut from the window is put together in a
			// buffer of its own (cutRows); the window's weight counts
			// them.
			j.win.arriveRows()
			j.end = 0
		}
	}
	return j, nil
}

// prepareRows makes an entry of each cell of each row (or sample), and
// plans the batch they make. A row has NumCells cells; a sample as many
// as its pieces.
func (l *Loader) prepareRows(j *load, e int) error {
	size := l.ds.Len()
	if l.samples != nil {
		size = l.samples.Len(e)
	}
	for _, id := range j.IDs {
		if id < 0 || id >= size {
			return fmt.Errorf("loader: sampler gave id %d outside [0, %d) in epoch %d", id, size, e)
		}
	}
	var err error
	if j.rowsOut, err = l.cellsOf(e, j.IDs); err != nil {
		return err
	}
	if l.outCache != nil {
		l.owe(j.IDs)
	}
	var cells []dataset.Loc
	j.cellAt = grow(j.cellAt, len(j.IDs)+1)
	j.cellAt[0] = 0
	for slot, id := range j.IDs {
		cells = j.rowsOut.Cells(slot, cells[:0])
		if l.rows != nil && len(cells) != l.ncells {
			return fmt.Errorf("loader: row %d has %d cells, want %d", id, len(cells), l.ncells)
		}
		for c, loc := range cells {
			j.ents = append(j.ents, entry{obj: loc.Object, off: loc.Off, n: loc.Len, id: id, slot: slot, cell: c})
		}
		j.cellAt[slot+1] = j.cellAt[slot] + len(cells)
		j.Off[slot], j.Len[slot] = 0, 0
	}
	return nil
}

// order puts the sampler's ids (j.ids) into the batch in delivery order.
func (l *Loader) order(j *load, e, b int) {
	n := len(j.IDs)
	if l.opts.Ordered || l.cut() || n < 2 {
		// An opportunistic window is cut in arrival order anyway.
		copy(j.IDs, j.ids)
		return
	}
	j.perm = grow(j.perm, n)
	key := sampler.Mix(sampler.Mix(l.opts.Seed, uint64(e)), uint64(b))
	sampler.Global{N: n, Seed: key}.Fill(0, 0, j.perm)
	for slot, k := range j.perm {
		j.IDs[slot] = j.ids[k]
	}
}

// claim looks the admitted batch's records up in the cache and lays it
// out again, copies where the cache has them, and gives back the memory
// the copies save. It comes after the batch's memory and its place in
// flight: a loader that claimed records (for others sharing them to wait
// on) and then waited for its own consumer to take a batch would hold
// those others, whose consumers it may itself be waiting for (jobs paced
// together: a deadlock).
func (l *Loader) claim(j *load) {
	if l.cache == nil {
		return
	}
	l.lookup(j)
	j.rawEnd = 0
	l.layout(j)
	switch w := min(int64(j.size()+j.rawEnd)+l.bookkeeping(j), l.opts.MemoryBytes); {
	case w < j.weight:
		l.mem.Release(j.weight - w)
		j.weight = w
	case w > j.weight && l.mem.TryAcquire(w-j.weight):
		// Split reads can round to more aligned blocks than one read of
		// them all. Without the room now, the batch goes a few blocks
		// over rather than wait holding its claims.
		j.weight = w
	}
}

// lookup pins the cached copy of every record that has one: ready to
// copy, loading by another loader, or reserved for this batch to read.
func (l *Loader) lookup(j *load) {
	for k := range j.ents {
		en := &j.ents[k]
		if en.n == 0 && l.tf == nil {
			continue
		}
		it, st := l.cache.Get(l.key(en.id))
		switch st {
		case cache.Ready, cache.Loading:
			en.item = it
		case cache.Claimed:
			en.item, en.claim = it, true
		}
	}
}

// neighbourGap is the most bytes a read spans between neighbouring records
// (ids i and i+1 of one object): a line's terminator, or what frames a
// record, so that records read in order are one read however they are
// framed (a pread a line made a sequential epoch of JSONL 3-4x slower).
// Only neighbours: bytes of a record the batch does not take would leave
// a hole in it, which then is not one array.
const neighbourGap = 64

// layout makes the units: a read per run of neighbouring records to read
// (touching, within CoalesceGap, or neighbours within neighbourGap, on the
// same object), a copy per cached
// record; and places them in the buffer in delivery order. Every unit
// spans whole aligned blocks with O_DIRECT, so a cached record whose load
// fails can be read in its place.
func (l *Loader) layout(j *load) {
	j.units = j.units[:0]
	a := int64(l.align)
	gap, near := int64(l.opts.CoalesceGap), int64(neighbourGap)
	if a > 1 {
		gap, near = 0, 0
	}
	if l.assembled() {
		near = 0 // a row's cells lie in column chunks apart; a sample's pieces are no records of their own
	}
	for k := range j.ents {
		en := &j.ents[k]
		if en.n == 0 && l.head+l.tail == 0 && (l.tf == nil || l.assembled()) {
			continue // a zero-length record (or cell) needs no read
		}
		start := en.off - int64(l.head)
		end := en.off + int64(en.n) + int64(l.tail)
		as, ae := start/a*a, (end+a-1)/a*a
		read := en.item == nil || en.claim
		if m := len(j.units) - 1; m >= 0 && read {
			cur := &j.units[m]
			curEnd := cur.off + int64(cur.n)
			neighbour := en.id == j.ents[cur.hi-1].id+1 && as <= curEnd+near
			if cur.read && en.obj == cur.obj && as >= cur.off && (as <= curEnd+gap || neighbour || l.oneBlock(j, &j.ents[cur.lo], en)) {
				cur.n = int(max(curEnd, ae) - cur.off)
				cur.hi = k + 1
				continue
			}
		}
		j.units = append(j.units, unit{obj: en.obj, off: as, n: int(ae - as), lo: k, hi: k + 1, read: read})
	}
	if l.assembled() {
		l.layoutCells(j)
		return
	}
	// Place units in the order of their first record's slot: walk the
	// slots in order and place each unit the first time one of its
	// records comes up (no sort: slots are 0..n-1).
	j.unitOf = grow(j.unitOf, len(j.IDs))
	for i := range j.unitOf {
		j.unitOf[i] = -1
	}
	for i := range j.units {
		u := &j.units[i]
		for k := u.lo; k < u.hi; k++ {
			j.unitOf[j.ents[k].slot] = i
		}
		u.dst = -1
	}
	dst := int64(0)
	off := j.Off // where records land: the batch, or with a transform the staging buffer
	if l.tf != nil {
		j.rawOff = grow(j.rawOff, len(j.IDs))
		off = j.rawOff
	}

	for _, i := range j.unitOf {
		if i < 0 || j.units[i].dst >= 0 {
			continue
		}
		u := &j.units[i]
		dst = (dst + a - 1) / a * a
		u.dst = int(dst)
		dst += int64(u.n)
		for k := u.lo; k < u.hi; k++ {
			en := &j.ents[k]
			off[en.slot] = u.dst + int(en.off-u.off)
		}
	}
	j.end = int(dst)
	for k := range j.ents {
		if en := &j.ents[k]; en.n == 0 && l.head+l.tail == 0 {
			off[en.slot] = 0
		}
	}
	if l.tf != nil {
		// Outputs are packed in delivery order: the batch is one array.
		j.rawEnd = j.end
		size := l.tf.Size()
		for slot := range j.IDs {
			j.Off[slot], j.Len[slot] = slot*size, size
		}
		j.end = len(j.IDs) * size
	}
	j.left.Store(int64(len(j.units)))
}

// oneBlock says whether records a and b of a gathered load are of one
// block of the load's window: one read spans them, the records between
// them too (the window's other batches take those). A record of the
// next window (the last batch straddles it) is read on its own: its
// block is read whole by the next load.
func (l *Loader) oneBlock(j *load, a, b *entry) bool {
	if l.gathered == nil || j.Pos+a.slot >= j.own || j.Pos+b.slot >= j.own {
		return false
	}
	return l.gathered.BlockOf(a.id) == l.gathered.BlockOf(b.id)
}

// layoutCells places a batch of rows' reads in the staging buffer in
// location order, and notes where each cell lands. The batch itself is
// the message the rows make.
func (l *Loader) layoutCells(j *load) {
	cells := j.cellAt[len(j.IDs)]
	j.cellOff = grow(j.cellOff, cells)
	j.cellLen = grow(j.cellLen, cells)
	clear(j.cellLen)
	a := int64(l.align)
	dst := int64(0)
	for i := range j.units {
		u := &j.units[i]
		dst = (dst + a - 1) / a * a
		u.dst = int(dst)
		dst += int64(u.n)
		for e := u.lo; e < u.hi; e++ {
			if en := &j.ents[e]; en.n > 0 {
				c := j.cellAt[en.slot] + en.cell
				j.cellOff[c], j.cellLen[c] = u.dst+int(en.off-u.off), en.n
			}
		}
	}
	j.rawEnd = int(dst)
	j.end = l.rowsSize(j.rowsOut, len(j.IDs))
	if l.samples != nil {
		j.end = j.rowsOut.Size()
	}
	j.left.Store(int64(len(j.units)))
}

// size is the bytes of the batch's buffer.
func (j *load) size() int { return j.end }

// unpin gives back the cache items of a job that will not be dispatched:
// its uses of them are gone (an item no one else will read is dropped), and
// items it was to read fail, so that whoever waits reads for itself.
func (j *load) unpin() {
	if j.rowsOut != nil {
		j.rowsOut.Release()
	}
	for k := range j.ents {
		en := &j.ents[k]
		if en.item == nil {
			continue
		}
		if en.claim {
			j.l.cache.Fill(en.item, errAbandoned)
		}
		en.item.Done(true)
		en.item, en.claim = nil, false
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
