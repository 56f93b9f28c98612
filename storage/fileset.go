package storage

import (
	"context"
	"sync"
)

// FileSet serves many local files (one record each, as in an ImageFolder
// tree) without holding a descriptor for every one: files are opened on
// first read and at most MaxOpen stay open.
type FileSet struct {
	paths   []string
	sizes   []int64
	opts    FileOptions
	maxOpen int

	mu   sync.Mutex
	open map[int]*fileRef
	tick uint64
}

type fileRef struct {
	f    *File
	refs int
	used uint64
}

// NewFileSet returns a set over paths whose sizes are already known (from
// the dataset's index), so that nothing is opened until it is read.
func NewFileSet(paths []string, sizes []int64, opts FileOptions, maxOpen int) *FileSet {
	if maxOpen <= 0 {
		maxOpen = 256
	}
	return &FileSet{paths: paths, sizes: sizes, opts: opts, maxOpen: maxOpen, open: map[int]*fileRef{}}
}

// Len is the number of files.
func (s *FileSet) Len() int { return len(s.paths) }

// Object returns a Reader for file i. It costs nothing until it is read.
func (s *FileSet) Object(i int) Reader { return setFile{s, i} }

func (s *FileSet) acquire(i int) (*File, error) {
	s.mu.Lock()
	s.tick++
	if r, ok := s.open[i]; ok {
		r.refs++
		r.used = s.tick
		s.mu.Unlock()
		return r.f, nil
	}
	s.mu.Unlock()
	f, err := OpenFile(s.paths[i], s.opts)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.open[i]; ok { // another reader opened it meanwhile
		f.Close()
		r.refs++
		return r.f, nil
	}
	s.open[i] = &fileRef{f: f, refs: 1, used: s.tick}
	s.evictLocked()
	return f, nil
}

// evictLocked closes least recently used idle files beyond maxOpen.
func (s *FileSet) evictLocked() {
	for len(s.open) > s.maxOpen {
		victim, oldest := -1, ^uint64(0)
		for i, r := range s.open {
			if r.refs == 0 && r.used < oldest {
				victim, oldest = i, r.used
			}
		}
		if victim < 0 {
			return // every open file is being read; allow the overshoot
		}
		s.open[victim].f.Close()
		delete(s.open, victim)
	}
}

func (s *FileSet) release(i int) {
	s.mu.Lock()
	if r, ok := s.open[i]; ok {
		r.refs--
	}
	s.evictLocked()
	s.mu.Unlock()
}

// Close closes every open file.
func (s *FileSet) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.open {
		r.f.Close()
		delete(s.open, i)
	}
	return nil
}

type setFile struct {
	s *FileSet
	i int
}

func (f setFile) Name() string { return f.s.paths[f.i] }
func (f setFile) Size() int64  { return f.s.sizes[f.i] }
func (f setFile) Close() error { return nil }
func (f setFile) Alignment() int {
	if f.s.opts.Direct {
		return DirectAlign
	}
	return 1
}

func (f setFile) ReadAt(ctx context.Context, p []byte, off int64) error {
	file, err := f.s.acquire(f.i)
	if err != nil {
		return err
	}
	defer f.s.release(f.i)
	return file.ReadAt(ctx, p, off)
}
