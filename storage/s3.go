package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a Store of objects in an S3-compatible object store, named
// s3://bucket/key. Reads are ranged GETs, many in flight (as many as
// Little's law says keep the store busy: the bandwidth seen times the
// latency seen), retried with exponential backoff and jitter on 5xx, 429
// and reset connections, each with a deadline, and pinned to the ETag the
// object had when it was opened, so that an object replaced under a job is
// an error, not a mix of two versions.
type S3 struct {
	c        *minio.Client
	endpoint string
	opts     S3Options
	stats    s3Stats
	lim      *limiter // the store's requests in flight
}

type s3Stats struct{ gets, bytes, retries atomic.Int64 }

// S3Stats count what a store fetched: the object store's "device bytes".
type S3Stats struct {
	Gets, Bytes, Retries int64
}

// Stats returns the GETs made, the bytes they fetched and the retries.
func (s *S3) Stats() S3Stats {
	return S3Stats{Gets: s.stats.gets.Load(), Bytes: s.stats.bytes.Load(), Retries: s.stats.retries.Load()}
}

// Stream returns the whole object in one GET, read in order: the
// sequential baseline a loader of object storage is measured against.
func (s *S3) Stream(ctx context.Context, name string) (io.ReadCloser, error) {
	bucket, key, err := splitS3(name)
	if err != nil {
		return nil, err
	}
	obj, err := s.c.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, &Error{Op: "read", Object: name, Err: err}
	}
	s.stats.gets.Add(1)
	return &countingReader{obj, &s.stats.bytes}, nil
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// S3Options configures an S3 store. The zero value takes the endpoint,
// region and credentials from the usual AWS environment variables and
// files (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
// AWS_REGION, AWS_ENDPOINT_URL, ~/.aws/credentials and AWS_PROFILE).
type S3Options struct {
	// Endpoint is the store's URL (http://127.0.0.1:7070); default
	// $RIFFLE_S3_ENDPOINT, $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else
	// AWS's.
	Endpoint string
	Region   string
	// Retries is how many times a failed request is tried again; default 6.
	Retries int
	// Timeout bounds one request; default 30s.
	Timeout time.Duration
	// Transport, if set, carries the requests (a test's fault proxy sits
	// behind the endpoint instead).
	Transport http.RoundTripper
}

// IsS3 reports whether name is an s3:// URL.
func IsS3(name string) bool { return strings.HasPrefix(name, "s3://") }

// splitS3 splits s3://bucket/key.
func splitS3(name string) (bucket, key string, err error) {
	rest, ok := strings.CutPrefix(name, "s3://")
	if !ok {
		return "", "", fmt.Errorf("%q is not an s3:// URL", name)
	}
	bucket, key, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("%q names no bucket", name)
	}
	return bucket, key, nil
}

// NewS3 connects to an S3-compatible store.
func NewS3(opts S3Options) (*S3, error) {
	ep := opts.Endpoint
	for _, v := range []string{"RIFFLE_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"} {
		if ep == "" {
			ep = os.Getenv(v)
		}
	}
	region := opts.Region
	for _, v := range []string{"AWS_REGION", "AWS_DEFAULT_REGION"} {
		if region == "" {
			region = os.Getenv(v)
		}
	}
	secure, host := true, "s3.amazonaws.com"
	if ep != "" {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("S3 endpoint %q is not a URL (http://host:port)", ep)
		}
		secure, host = u.Scheme == "https", u.Host
	} else if region != "" {
		host = "s3." + region + ".amazonaws.com"
	}
	if opts.Retries == 0 {
		opts.Retries = 6
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
	})
	mo := &minio.Options{Creds: creds, Secure: secure, Region: region, Transport: opts.Transport, MaxRetries: 1}
	if ep != "" {
		mo.BucketLookup = minio.BucketLookupPath
	}
	c, err := minio.New(host, mo)
	if err != nil {
		return nil, fmt.Errorf("S3 client for %s: %w", host, err)
	}
	return &S3{c: c, endpoint: host, opts: opts, lim: newLimiter(s3StartDepth, s3MaxDepth)}, nil
}

// Hints: a ranged GET costs a round trip, so neighbouring records are read
// together across gaps of up to 64 KiB, and block-aware orders use 64 KiB
// blocks. (A gap of 256 KiB was faster on a loopback store, where requests
// cost more than bytes, but fetched 19 bytes per byte of 4 KiB records in a
// global shuffle: BENCHMARKS.md.)
//
// Its Depth is where the store's depth starts; the limiter adapts it, up to
// s3MaxDepth requests (the engine's pool grows to serve them).
func (s *S3) Hints() Hints {
	return Hints{Depth: s3StartDepth, CoalesceGap: 64 << 10, BlockSize: 64 << 10, Align: 1}
}

// retryable says whether a failed request may succeed if tried again.
func retryable(err error) bool {
	var er minio.ErrorResponse
	if errors.As(err, &er) {
		return er.StatusCode >= 500 || er.StatusCode == http.StatusTooManyRequests || er.StatusCode == 0
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) // timeouts and other network errors
}

// try runs op with retries: exponential backoff from 25ms, full jitter,
// each attempt under the request deadline.
func (s *S3) try(ctx context.Context, op func(ctx context.Context) error) error {
	var err error
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		err = op(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err) || attempt >= s.opts.Retries {
			if ctx.Err() != nil && err != nil {
				return fmt.Errorf("%w (%v)", ctx.Err(), err)
			}
			if err != nil && attempt > 0 {
				return fmt.Errorf("after %d tries: %w", attempt+1, err)
			}
			return err
		}
		s.stats.retries.Add(1)
		backoff := min(25*time.Millisecond<<attempt, 5*time.Second)
		t := time.NewTimer(rand.N(backoff) + time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

func notFound(err error) bool {
	var er minio.ErrorResponse
	return errors.As(err, &er) && (er.StatusCode == http.StatusNotFound || er.Code == "NoSuchKey")
}

// Open opens an object, pinned to the ETag it has now.
func (s *S3) Open(ctx context.Context, name string) (Reader, error) {
	bucket, key, err := splitS3(name)
	if err != nil {
		return nil, &Error{Op: "open", Object: name, Err: err}
	}
	var st minio.ObjectInfo
	err = s.try(ctx, func(ctx context.Context) (err error) {
		st, err = s.c.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
		return err
	})
	if err != nil {
		if notFound(err) {
			err = fmt.Errorf("%w: %v", os.ErrNotExist, err)
		}
		return nil, &Error{Op: "open", Object: name, Err: err}
	}
	return &s3Object{s: s, name: name, bucket: bucket, key: key, size: st.Size, etag: st.ETag, modified: st.LastModified}, nil
}

// errReplaced: the object's modification time is not the one it had.
var errReplaced = errors.New("modified since it was opened")

// s3Object is one object, read by ranges.
type s3Object struct {
	s                 *S3
	name, bucket, key string
	size              int64
	etag              string
	modified          time.Time // pins reads where the store gives no ETag
}

var _ Reader = (*s3Object)(nil)

func (o *s3Object) Size() int64     { return o.size }
func (o *s3Object) Name() string    { return o.name }
func (o *s3Object) Close() error    { return nil }
func (o *s3Object) Version() string { return s3Version(o.etag, o.modified, o.size) }

// s3Version names one version of an object: its ETag and size, or where
// the store gives no ETag its modification time and size. Open, Stat and
// Walk all say it so, so that what a catalogue recorded from a listing
// matches what a read pins.
func s3Version(etag string, modified time.Time, size int64) string {
	if etag == "" {
		return modified.UTC().Format(time.RFC3339Nano) + ":" + fmt.Sprint(size)
	}
	return etag + ":" + fmt.Sprint(size)
}
func (o *s3Object) Hints() Hints { return o.s.Hints() }

// ReadAt reads len(p) bytes at off with one ranged GET (retried), if the
// object still has the ETag it was opened with.
func (o *s3Object) ReadAt(ctx context.Context, p []byte, off int64) error {
	if len(p) == 0 {
		return nil
	}
	if off < 0 || off+int64(len(p)) > o.size {
		return &Error{Op: "read", Object: o.name, Offset: off, Len: len(p), Err: fmt.Errorf("past the object's %d bytes: %w", o.size, io.ErrUnexpectedEOF)}
	}
	if err := o.s.lim.acquire(ctx); err != nil {
		return &Error{Op: "read", Object: o.name, Offset: off, Len: len(p), Err: err}
	}
	err := o.s.try(ctx, func(ctx context.Context) error {
		var opts minio.GetObjectOptions
		if err := opts.SetRange(off, off+int64(len(p))-1); err != nil {
			return err
		}
		if o.etag != "" {
			if err := opts.SetMatchETag(o.etag); err != nil {
				return err
			}
		}
		obj, err := o.s.c.GetObject(ctx, o.bucket, o.key, opts)
		if err != nil {
			return err
		}
		defer obj.Close()
		if o.etag == "" {
			// Some stores (a POSIX gateway over files written beside it)
			// give no ETag: the modification time in the answer pins the
			// object then. (If-Unmodified-Since cannot: it has whole
			// seconds, the files' times do not.)
			st, err := obj.Stat()
			if err != nil {
				return err
			}
			if !st.LastModified.Equal(o.modified) {
				return errReplaced
			}
		}
		o.s.stats.gets.Add(1)
		n, err := io.ReadFull(obj, p)
		o.s.stats.bytes.Add(int64(n))
		return err
	})
	o.s.lim.release(err == nil)
	if err != nil {
		var er minio.ErrorResponse
		if errors.Is(err, errReplaced) || errors.As(err, &er) && er.StatusCode == http.StatusPreconditionFailed {
			err = fmt.Errorf("%w: the object was replaced since it was opened (ETag %s)", ErrChanged, o.etag)
		}
		return &Error{Op: "read", Object: o.name, Offset: off, Len: len(p), Err: fmt.Errorf("bucket %s key %s range %d-%d: %w", o.bucket, o.key, off, off+int64(len(p))-1, err)}
	}
	return nil
}

// Stat describes an object, or a prefix as a directory.
func (s *S3) Stat(ctx context.Context, name string) (ObjectInfo, error) {
	bucket, key, err := splitS3(name)
	if err != nil {
		return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: err}
	}
	if key != "" && !strings.HasSuffix(key, "/") {
		var st minio.ObjectInfo
		err = s.try(ctx, func(ctx context.Context) (err error) {
			st, err = s.c.StatObject(ctx, bucket, key, minio.StatObjectOptions{})
			return err
		})
		if err == nil {
			return ObjectInfo{Name: name, Size: st.Size, ModTime: st.LastModified, Version: s3Version(st.ETag, st.LastModified, st.Size)}, nil
		}
		if !notFound(err) {
			return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: err}
		}
	}
	// A prefix with objects under it is a directory.
	prefix := strings.TrimSuffix(key, "/") + "/"
	if key == "" {
		prefix = ""
	}
	for o := range s.c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, MaxKeys: 1}) {
		if o.Err != nil {
			return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: o.Err}
		}
		return ObjectInfo{Name: strings.TrimSuffix(name, "/"), Dir: true}, nil
	}
	return ObjectInfo{}, &Error{Op: "stat", Object: name, Err: os.ErrNotExist}
}

// list returns every key under prefix, sorted.
func (s *S3) list(ctx context.Context, bucket, prefix string) ([]minio.ObjectInfo, error) {
	var out []minio.ObjectInfo
	for o := range s.c.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, o.Err
		}
		out = append(out, o)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Glob returns the objects a pattern (path.Match syntax over the key)
// names; a name without wildcards is returned as it is if it exists.
func (s *S3) Glob(ctx context.Context, pattern string) ([]string, error) {
	bucket, key, err := splitS3(pattern)
	if err != nil {
		return nil, err
	}
	i := strings.IndexAny(key, "*?[")
	if i < 0 {
		if _, err := s.Stat(ctx, pattern); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, nil
			}
			return nil, err
		}
		return []string{strings.TrimSuffix(pattern, "/")}, nil
	}
	objs, err := s.list(ctx, bucket, key[:i])
	if err != nil {
		return nil, &Error{Op: "glob", Object: pattern, Err: err}
	}
	var out []string
	for _, o := range objs {
		if ok, _ := path.Match(key, o.Key); ok {
			out = append(out, "s3://"+bucket+"/"+o.Key)
		}
	}
	return out, nil
}

// Walk calls fn for every object under root and for each "directory" (a
// common prefix) before the objects in it, in lexical order.
func (s *S3) Walk(ctx context.Context, root string, fn func(name string, info ObjectInfo) error) error {
	bucket, key, err := splitS3(root)
	if err != nil {
		return err
	}
	prefix := strings.TrimSuffix(key, "/") + "/"
	if key == "" {
		prefix = ""
	}
	objs, err := s.list(ctx, bucket, prefix)
	if err != nil {
		return &Error{Op: "walk", Object: root, Err: err}
	}
	seen := map[string]bool{}
	skip := ""
	for _, o := range objs {
		rel := strings.TrimPrefix(o.Key, prefix)
		if skip != "" && strings.HasPrefix(rel, skip) {
			continue
		}
		parts := strings.Split(rel, "/")
		hidden := false
		for _, p := range parts {
			if strings.HasPrefix(p, ".") {
				hidden = true
			}
		}
		if hidden || rel == "" {
			continue
		}
		dir := ""
		skipped := false
		for _, p := range parts[:len(parts)-1] {
			dir += p + "/"
			if seen[dir] {
				continue
			}
			seen[dir] = true
			err := fn("s3://"+bucket+"/"+prefix+strings.TrimSuffix(dir, "/"), ObjectInfo{Name: strings.TrimSuffix(dir, "/"), Dir: true})
			if errors.Is(err, SkipDir) {
				skip, skipped = dir, true
				break
			}
			if err != nil {
				return err
			}
		}
		if skipped {
			continue
		}
		if err := fn("s3://"+bucket+"/"+o.Key, ObjectInfo{Name: o.Key, Size: o.Size, ModTime: o.LastModified,
			Version: s3Version(o.ETag, o.LastModified, o.Size)}); err != nil {
			return err
		}
	}
	return nil
}

// ReadFile reads a small object whole.
func (s *S3) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	r, err := s.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	if r.Size() > max {
		return nil, &Error{Op: "read", Object: name, Err: fmt.Errorf("%d bytes: %w", r.Size(), ErrTooLarge)}
	}
	b := make([]byte, r.Size())
	return b, r.ReadAt(ctx, b, 0)
}

// WriteFile puts a small object (S3 puts are atomic).
func (s *S3) WriteFile(ctx context.Context, name string, b []byte) error {
	bucket, key, err := splitS3(name)
	if err != nil {
		return err
	}
	err = s.try(ctx, func(ctx context.Context) error {
		_, err := s.c.PutObject(ctx, bucket, key, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{})
		return err
	})
	if err != nil {
		return &Error{Op: "write", Object: name, Err: err}
	}
	return nil
}

// limiter keeps as many requests to a store in flight as its depthControl
// chooses from the store's rate and latency (depth.go): an object store's
// depth is its bandwidth-delay product, rate × latency in requests, which
// neither a disk's constant nor a guess at the store's latency gives.
type limiter struct {
	mu       sync.Mutex
	cond     *sync.Cond
	ctl      *depthControl
	meter    depthMeter
	inflight int
	peak     int // the most requests in flight at once
}

func newLimiter(start, hi int) *limiter {
	l := &limiter{ctl: newDepthControl(start, hi, false)}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *limiter) acquire(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight >= l.ctl.Limit() {
		stop := context.AfterFunc(ctx, func() {
			l.mu.Lock()
			l.cond.Broadcast()
			l.mu.Unlock()
		})
		defer stop()
		for l.inflight >= l.ctl.Limit() {
			if err := ctx.Err(); err != nil {
				return err
			}
			l.cond.Wait()
		}
	}
	l.inflight++
	l.peak = max(l.peak, l.inflight)
	l.meter.advance(monoNow(), l.inflight)
	return nil
}

// release ends a request, and at the end of a window sets the depth.
func (l *limiter) release(ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := monoNow()
	l.inflight--
	if ok {
		l.meter.reads++
	}
	l.meter.advance(now, l.inflight)
	if s, done := l.meter.sample(now, l.ctl); done {
		if before := l.ctl.Limit(); l.ctl.observe(s) > before {
			l.cond.Broadcast()
		}
	}
	l.cond.Signal()
}

// Limit is the store's number of requests in flight allowed now.
func (o *s3Object) Limit() int { return o.s.lim.ctl.Limit() }

// A store's requests in flight start at s3StartDepth and stay within
// s3MaxDepth: each is a connection.
const (
	s3StartDepth = 64
	s3MaxDepth   = 1024
)
