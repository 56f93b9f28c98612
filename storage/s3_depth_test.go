package storage

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/riffle-ml/riffle/internal/s3test"
)

// A store's requests in flight are one limiter's, whichever objects they
// read, and stay within its depth while many readers press on it.
func TestS3DepthPerStore(t *testing.T) {
	srv := s3test.Start(t)
	srv.SetEnv(t)
	ctx := context.Background()
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	for _, k := range []string{"a.bin", "b.bin"} {
		if err := srv.Put(ctx, "bkt", k, data); err != nil {
			t.Fatal(err)
		}
	}
	s, err := NewS3(S3Options{Endpoint: srv.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Open(ctx, "s3://bkt/a.bin")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Open(ctx, "s3://bkt/b.bin")
	if err != nil {
		t.Fatal(err)
	}
	if a.(*s3Object).Limit() != s3StartDepth || b.(*s3Object).Limit() != s3StartDepth {
		t.Fatalf("limits %d and %d at the start, want the store's %d", a.(*s3Object).Limit(), b.(*s3Object).Limit(), s3StartDepth)
	}
	// Pin the store's depth low: 24 readers of two objects wait their turn.
	s.lim = newLimiter(3, 3)
	s.lim.ctl.pinned = true
	var wg sync.WaitGroup
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := []Reader{a, b}[i%2]
			off := int64(i * 4096)
			p := make([]byte, 4096)
			if err := r.ReadAt(ctx, p, off); err != nil {
				t.Error(err)
				return
			}
			if !bytes.Equal(p, data[off:off+4096]) {
				t.Errorf("read %d differs", i)
			}
		}()
	}
	wg.Wait()
	if p := s.lim.peak; p > 3 || p < 1 {
		t.Fatalf("%d requests of the store in flight at once, its depth 3", p)
	}
}
