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

var (
	_ storage.Store  = (*memStore)(nil)
	_ storage.Reader = (*memObject)(nil)
)

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
func (s *memStore) WriteFile(ctx context.Context, name string, b []byte) error {
	return fs.ErrPermission
}
func (s *memStore) Hints() storage.Hints { return storage.Hints{} }

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
func (o *memObject) Size() int64          { return int64(len(o.s.data)) }
func (o *memObject) Name() string         { return o.s.name }
func (o *memObject) Close() error         { return nil }
func (o *memObject) Version() string      { return "v1" }
func (o *memObject) Hints() storage.Hints { return storage.Hints{} }

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

// FuzzServeFrame: whatever bytes a peer sends as a request, parsing them
// never panics, a request parsed is the frame it came from, and serving
// it never panics and answers exactly the bytes asked for.
//
//	go test ./peer -run '^$' -fuzz FuzzServeFrame -fuzztime 20s
func FuzzServeFrame(f *testing.F) {
	for _, q := range []Request{
		{Object: fuzzObject, Version: "v1", Block: 0},
		{Object: fuzzObject, Version: "v1", Block: 3, Offset: 50, Length: 50},
		{Object: fuzzObject, Version: "v1", Block: 0, Offset: math.MaxInt64 - 10, Length: 100},
		{Object: fuzzObject, Version: "v1", Block: 1 << 62},
		{Object: fuzzObject, Version: "v1", Block: 1, Offset: 10, Length: math.MaxInt64 - 5},
		{Object: fuzzObject, Version: "v1", Block: -1, Offset: -1, Length: math.MinInt64},
		{Object: fuzzObject, Version: "v0", Block: 1},
		{Object: "/etc/passwd", Block: 0},
		{Tag: 7, Object: strings.Repeat("x", MaxObject+1), Version: "v1"},
	} {
		f.Add(q.Append(nil))
	}
	f.Add(AppendHello(nil, "t"))
	c0, _ := fuzzCluster(f, 0)
	c1, st := fuzzCluster(f, 1)
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := ReadRequest(bytes.NewReader(b))
		if err != nil {
			return
		}
		if again := q.Append(nil); !bytes.Equal(again, b[:min(len(again), len(b))]) {
			t.Fatalf("%+v was read from %q, and is written %q", q, b, again)
		}
		for _, c := range []*Cluster{c0, c1} {
			out, err := c.Serve(context.Background(), q.Object, q.Version, q.Block, q.Offset, q.Length)
			if errors.Is(err, ErrPanic) {
				t.Fatalf("block %d offset %d length %d: %v", q.Block, q.Offset, q.Length, err)
			}
			if err != nil {
				continue
			}
			// Served: the request was within the block, and the bytes are its.
			lo := q.Block*4096 + q.Offset
			if q.Block < 0 || q.Offset < 0 || lo < 0 || lo+int64(len(out)) > int64(len(st.data)) ||
				(q.Length != 0 && int64(len(out)) != q.Length) || !bytes.Equal(out, st.data[lo:lo+int64(len(out))]) {
				t.Fatalf("block %d offset %d length %d: served %d wrong bytes", q.Block, q.Offset, q.Length, len(out))
			}
		}
	})
}

// FuzzReadAnswer: whatever a peer answers, reading it never panics nor
// holds more than the bytes asked for or a message's bound.
func FuzzReadAnswer(f *testing.F) {
	f.Add(AppendAnswer(nil, 3, StatusOK, make([]byte, 100)))
	f.Add(AppendAnswer(nil, 3, StatusChanged, []byte("the object changed")))
	f.Add(AppendAnswer(nil, 3, StatusError, make([]byte, MaxMessage)))
	f.Add(appendAnswerHead(nil, 3, StatusOK, 1<<32-1))
	f.Add(appendAnswerHead(nil, 3, 9, 4))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ReadAnswer(bytes.NewReader(b), 100)
		if err != nil {
			return
		}
		if a.Status == StatusOK && len(a.Data) != 100 || len(a.Message) > MaxMessage {
			t.Fatalf("an answer of status %d, %d bytes and a message of %d", a.Status, len(a.Data), len(a.Message))
		}
	})
}

// FuzzReadHello: a hello is read, or refused, within its bounds.
func FuzzReadHello(f *testing.F) {
	f.Add(AppendHello(nil, "t"))
	f.Add(AppendHello(nil, strings.Repeat("t", MaxToken+1)))
	f.Add([]byte("RFLP\x02\x01\x00t"))
	f.Add([]byte("\x10\x00\x00\x00{\"op\":\"hello\"}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tok, err := ReadHello(bytes.NewReader(b))
		if err == nil && (len(tok) > MaxToken || !bytes.Equal(AppendHello(nil, tok), b[:helloHead+len(tok)])) {
			t.Fatalf("read %q from %q", tok, b)
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
