package storage

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Router is the Store of every name riffle takes: s3:// URLs go to an S3
// store (made when the first one is named, from the environment's
// configuration), anything else to the local one.
type Router struct {
	Local *Local
	rs    *remoteStore
}

// remoteStore is the S3 store, made once, shared by copies of a Router.
type remoteStore struct {
	opts  S3Options
	tier  func(Store) Store
	once  sync.Once
	made  atomic.Bool
	s3    *S3
	front Store // s3, or the tiers in front of it
	err   error
}

// NewRouter routes s3:// names to an S3 store configured by opts (wrapped
// by tier, if set: the tiers in front of it, which storage/stack makes)
// and the rest to local.
func NewRouter(local *Local, opts S3Options, tier func(Store) Store) *Router {
	return &Router{Local: local, rs: &remoteStore{opts: opts, tier: tier}}
}

// WithLocal is r with another local store (O_DIRECT, say), the same S3.
func (r *Router) WithLocal(l *Local) *Router {
	return &Router{Local: l, rs: r.rs}
}

func (r *Router) remote() (Store, error) {
	rs := r.rs
	if rs == nil {
		return nil, fmt.Errorf("no object store configured for s3:// names")
	}
	rs.once.Do(func() {
		defer rs.made.Store(true)
		if rs.s3, rs.err = NewS3(rs.opts); rs.err == nil {
			rs.front = rs.s3
			if rs.tier != nil {
				rs.front = rs.tier(rs.s3)
			}
		}
	})
	return rs.front, rs.err
}

func (r *Router) pick(name string) (Store, error) {
	if IsS3(name) {
		return r.remote()
	}
	return r.Local, nil
}

func (r *Router) Open(ctx context.Context, name string) (Reader, error) {
	s, err := r.pick(name)
	if err != nil {
		return nil, err
	}
	return s.Open(ctx, name)
}

func (r *Router) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	s, err := r.pick(name)
	if err != nil {
		return ObjectInfo{}, err
	}
	return s.Stat(ctx, name)
}

func (r *Router) Glob(ctx context.Context, pattern string) ([]string, error) {
	s, err := r.pick(pattern)
	if err != nil {
		return nil, err
	}
	return s.Glob(ctx, pattern)
}

func (r *Router) Walk(ctx context.Context, root string, fn func(name string, info ObjectInfo) error) error {
	s, err := r.pick(root)
	if err != nil {
		return err
	}
	return s.Walk(ctx, root, fn)
}

func (r *Router) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	s, err := r.pick(name)
	if err != nil {
		return nil, err
	}
	return s.ReadFile(ctx, name, max)
}

func (r *Router) WriteFile(ctx context.Context, name string, b []byte) error {
	s, err := r.pick(name)
	if err != nil {
		return err
	}
	return s.WriteFile(ctx, name, b)
}

// Hints are the local store's; a remote object's Reader gives its own.
func (r *Router) Hints() Hints { return r.Local.Hints() }

// Close closes the local store.
func (r *Router) Close() error { return r.Local.Close() }

// RemoteMade says whether an s3:// name has been used (and the S3 store
// made), without making it.
func (r *Router) RemoteMade() bool { return r.rs != nil && r.rs.made.Load() }

// Remote is the S3 store s3:// names go to (not the tiers in front of
// it), made if it was not yet.
func (r *Router) Remote() (*S3, error) {
	if _, err := r.remote(); err != nil {
		return nil, err
	}
	return r.rs.s3, nil
}

// Stream opens a whole object to read in order: one GET from an object
// store, the file itself locally, advised that it is read in order.
func (r *Router) Stream(ctx context.Context, name string) (io.ReadCloser, error) {
	if IsS3(name) {
		s3, err := r.Remote()
		if err != nil {
			return nil, err
		}
		return s3.Stream(ctx, name)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	return f, nil
}
