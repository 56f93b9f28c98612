package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/storage"
	"github.com/riffle-ml/riffle/wire"
)

// memStore is an object store of one object held in memory, under an
// s3:// name (Serve serves only those). panicAt, if set, makes a read
// covering that offset panic: a bug below Serve.
type memStore struct {
	name    string
	data    []byte
	panicAt int64
}

type memObject struct {
	s *memStore
}

func (s *memStore) Open(ctx context.Context, name string) (storage.Reader, error) {
	if name != s.name {
		return nil, &storage.Error{Op: "open", Object: name, Err: fs.ErrNotExist}
	}
	return &memObject{s}, nil
}
func (s *memStore) Stat(ctx context.Context, name string) (storage.ObjectInfo, error) {
	return storage.ObjectInfo{Name: name, Size: int64(len(s.data)), Version: "v1"}, nil
}
func (s *memStore) Glob(ctx context.Context, p string) ([]string, error) { return []string{p}, nil }
func (s *memStore) Walk(ctx context.Context, root string, fn func(string, storage.ObjectInfo) error) error {
	return nil
}
func (s *memStore) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return nil, fs.ErrNotExist
}
func (s *memStore) WriteFile(ctx context.Context, name string, b []byte) error { return fs.ErrPermission }
func (s *memStore) Hints() storage.Hints                                      { return storage.Hints{} }

func (o *memObject) ReadAt(ctx context.Context, p []byte, off int64) error {
	if off < 0 || off > int64(len(o.s.data))-int64(len(p)) {
		return &storage.Error{Op: "read", Object: o.s.name, Offset: off, Len: len(p), Err: io.ErrUnexpectedEOF}
	}
	if o.s.panicAt > 0 && off <= o.s.panicAt && o.s.panicAt < off+int64(len(p)) {
		var m map[string]int
		m["a bug"]++ // a nil map: panics
	}
	copy(p, o.s.data[off:])
	return nil
}
func (o *memObject) Size() int64     { return int64(len(o.s.data)) }
func (o *memObject) Name() string    { return o.s.name }
func (o *memObject) Close() error    { return nil }
func (o *memObject) Version() string { return "v1" }

const fuzzObject = "s3://bkt/fuzz.bin"

func fuzzCluster(t testing.TB, self int) (*Cluster, *memStore) {
	data := make([]byte, 3*4096+100)
	for i := range data {
		data[i] = byte(i*31 + i>>8)
	}
	st := &memStore{name: fuzzObject, data: data}
	// Two nodes: block requests this node owns go through its memory,
	// the others straight to the store.
	c, err := New(st, Options{Peers: []string{"a:1", "b:1"}, Self: self, Token: "t", Budget: 1 << 20, Block: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, st
}

// frame is a request frame as a peer sends it.
func frame(m *wire.Msg) []byte {
	var b bytes.Buffer
	if err := wire.Write(&b, m); err != nil {
		panic(err)
	}
	return b.Bytes()
}

// FuzzServeFrame: whatever frame a peer sends, parsing it and serving a
// block request it holds never panics, and an answer is exactly the bytes
// asked for.
//
//	go test ./peer -run '^$' -fuzz FuzzServeFrame -fuzztime 20s
func FuzzServeFrame(f *testing.F) {
	for _, m := range []*wire.Msg{
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v1", Block: 0},
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v1", Block: 3, Offset: 50, Length: 50},
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v1", Block: 0, Offset: math.MaxInt64 - 10, Length: 100},
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v1", Block: 1 << 62},
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v1", Block: 1, Offset: 10, Length: math.MaxInt64 - 5},
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v1", Block: -1, Offset: -1, Length: math.MinInt64},
		{Op: wire.OpBlock, Object: fuzzObject, ObjectVersion: "v0", Block: 1},
		{Op: wire.OpBlock, Object: "/etc/passwd", Block: 0},
		{Op: wire.OpHello, Version: wire.Version, Token: "t"},
	} {
		f.Add(frame(m))
	}
	c0, _ := fuzzCluster(f, 0)
	c1, st := fuzzCluster(f, 1)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := wire.Read(bytes.NewReader(b))
		if err != nil || m.Op != wire.OpBlock {
			return
		}
		for _, c := range []*Cluster{c0, c1} {
			out, err := c.Serve(context.Background(), m.Object, m.ObjectVersion, m.Block, m.Offset, m.Length)
			if errors.Is(err, ErrPanic) {
				t.Fatalf("block %d offset %d length %d: %v", m.Block, m.Offset, m.Length, err)
			}
			if err != nil {
				continue
			}
			// Served: the request was within the block, and the bytes are its.
			lo := m.Block*4096 + m.Offset
			if m.Block < 0 || m.Offset < 0 || lo < 0 || lo+int64(len(out)) > int64(len(st.data)) ||
				(m.Length != 0 && int64(len(out)) != m.Length) || !bytes.Equal(out, st.data[lo:lo+int64(len(out))]) {
				t.Fatalf("block %d offset %d length %d: served %d wrong bytes", m.Block, m.Offset, m.Length, len(out))
			}
		}
	})
}

// A panic below Serve (here the store's) fails that request with
// ErrPanic; the next request is served, and a block whose fill panicked
// is not left claimed for ever.
func TestServeRecoversPanic(t *testing.T) {
	for self := range 2 {
		t.Run(fmt.Sprint("node", self), func(t *testing.T) {
			c, st := fuzzCluster(t, self)
			st.panicAt = 4096 + 10
			_, err := c.Serve(context.Background(), fuzzObject, "v1", 1, 0, 0)
			if !errors.Is(err, ErrPanic) || !strings.Contains(err.Error(), "block 1") {
				t.Fatalf("a panicking read: %v", err)
			}
			out, err := c.Serve(context.Background(), fuzzObject, "v1", 2, 0, 10)
			if err != nil || !bytes.Equal(out, st.data[8192:8202]) {
				t.Fatalf("the next request: %v", err)
			}
			st.panicAt = 0
			out, err = c.Serve(context.Background(), fuzzObject, "v1", 1, 0, 0)
			if err != nil || !bytes.Equal(out, st.data[4096:8192]) {
				t.Fatalf("the block whose read panicked, again: %v", err)
			}
		})
	}
}
