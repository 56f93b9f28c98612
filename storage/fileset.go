package storage

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sync"
)

// FileSet serves many objects (one record each, as in an ImageFolder tree)
// without holding a descriptor for every one: objects are opened on first
// read and at most MaxOpen stay open.
type FileSet struct {
	paths   []string
	sizes   []int64
	store   Store
	hints   Hints
	maxOpen int

	mu   sync.Mutex
	open map[int]*fileRef
	// idle are the open files no read holds, the most recently released
	// first: the least recently used is closed first, found in O(1) (a
	// scan of every open file on each read was 0.5% of a daemon reading
	// an image tree).
	idle *list.List
}

type fileRef struct {
	r    Reader
	refs int
	idle *list.Element // in FileSet.idle while refs is 0
}

// holdLocked takes one more read of r, out of the idle list.
func (s *FileSet) holdLocked(r *fileRef) {
	r.refs++
	if r.idle != nil {
		s.idle.Remove(r.idle)
		r.idle = nil
	}
}

// NewFileSet returns a set over paths whose sizes are already known (from
// the dataset's walk), so that nothing is opened until it is read. Objects
// are opened through store (and its confinement); one whose size is not the
// one known fails its reads with ErrChanged.
func NewFileSet(store Store, paths []string, sizes []int64, maxOpen int) *FileSet {
	if maxOpen <= 0 {
		maxOpen = 256
	}
	return &FileSet{paths: paths, sizes: sizes, store: store, hints: store.Hints(), maxOpen: maxOpen, open: map[int]*fileRef{}, idle: list.New()}
}

// ErrChanged says a file is not the size it had when its dataset was
// opened: it was rewritten since.
var ErrChanged = errors.New("file changed since the dataset was opened")

// Len is the number of files.
func (s *FileSet) Len() int { return len(s.paths) }

// Object returns a Reader for file i. It costs nothing until it is read.
func (s *FileSet) Object(i int) Reader { return setFile{s, i} }

func (s *FileSet) acquire(ctx context.Context, i int) (Reader, error) {
	s.mu.Lock()
	if r, ok := s.open[i]; ok {
		s.holdLocked(r)
		s.mu.Unlock()
		return r.r, nil
	}
	s.mu.Unlock()
	f, err := s.store.Open(ctx, s.paths[i])
	if errors.Is(err, fs.ErrNotExist) {
		// It was there when the dataset was opened: the data changed.
		return nil, &Error{Op: "open", Object: s.paths[i], Err: fmt.Errorf("%w: the file was removed (%w)", ErrChanged, err)}
	}
	if err != nil {
		return nil, err
	}
	if f.Size() != s.sizes[i] {
		f.Close()
		return nil, &Error{Op: "open", Object: s.paths[i], Err: fmt.Errorf("%w (%d bytes then, %d now)", ErrChanged, s.sizes[i], f.Size())}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.open[i]; ok { // another reader opened it meanwhile
		f.Close()
		s.holdLocked(r)
		return r.r, nil
	}
	s.open[i] = &fileRef{r: f, refs: 1}
	s.evictLocked()
	return f, nil
}

// evictLocked closes least recently used idle files beyond maxOpen.
func (s *FileSet) evictLocked() {
	for len(s.open) > s.maxOpen {
		e := s.idle.Back()
		if e == nil {
			return // every open file is being read; allow the overshoot
		}
		i := s.idle.Remove(e).(int)
		s.open[i].r.Close()
		delete(s.open, i)
	}
}

func (s *FileSet) release(i int) {
	s.mu.Lock()
	if r, ok := s.open[i]; ok {
		if r.refs--; r.refs == 0 {
			r.idle = s.idle.PushFront(i)
		}
	}
	s.evictLocked()
	s.mu.Unlock()
}

// Close closes every open file.
func (s *FileSet) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.open {
		r.r.Close()
		delete(s.open, i)
	}
	s.idle.Init()
	return nil
}

// setFile is file i of a set, opened at its first read. It drops pages
// and goes to io_uring through the file it opens; it has no descriptor of
// its own to give (the set may close the file between reads).
type setFile struct {
	s *FileSet
	i int
}

var _ interface {
	Reader
	Dropper
	ringer
} = setFile{}

func (f setFile) Name() string { return f.s.paths[f.i] }
func (f setFile) Size() int64  { return f.s.sizes[f.i] }
func (f setFile) Close() error { return nil }
func (f setFile) Hints() Hints { return f.s.hints }

// Version is the file's version as it is open now, opening it if it is
// not open; "" if it cannot be opened (its reads then fail, naming why).
func (f setFile) Version() string {
	r, err := f.s.acquire(context.Background(), f.i)
	if err != nil {
		return ""
	}
	defer f.s.release(f.i)
	return r.Version()
}

func (f setFile) ReadAt(ctx context.Context, p []byte, off int64) error {
	r, err := f.s.acquire(ctx, f.i)
	if err != nil {
		return err
	}
	defer f.s.release(f.i)
	return r.ReadAt(ctx, p, off)
}

// Drop drops the cached pages of n bytes at off of the file (File.Drop),
// opening it if it is not open.
func (f setFile) Drop(off, n int64) error {
	r, err := f.s.acquire(context.Background(), f.i)
	if err != nil {
		return err
	}
	defer f.s.release(f.i)
	d, ok := As[Dropper](r)
	if !ok {
		return nil
	}
	return d.Drop(off, n)
}

func (f setFile) ringFile() (*File, func(), error) {
	r, err := f.s.acquire(context.Background(), f.i)
	if err != nil {
		return nil, nil, err
	}
	file, ok := r.(*File)
	if !ok {
		f.s.release(f.i)
		return nil, nil, errNotFile
	}
	return file, func() { f.s.release(f.i) }, nil
}
