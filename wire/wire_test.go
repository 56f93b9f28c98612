package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	msgs := []*Msg{
		{Op: OpHello, Version: Version, Token: "t"},
		{Op: OpOpen, Spec: &JobSpec{Paths: []string{"/a", "/b"}, Shuffle: true, Seed: 1 << 60, World: 4, Rank: 3, BatchSize: 256}},
		{Op: OpBatch, Job: 2, Seq: 9, Epoch: 1, Index: 7, Last: true, N: 256, DataOff: 4096, DataLen: 1 << 20, MetaOff: 1<<20 + 4096, Labels: true},
		{Op: OpError, Message: "bad", Path: "/x", Offset: 960},
	}
	var buf bytes.Buffer
	for _, m := range msgs {
		if err := Write(&buf, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, want := range msgs {
		got, err := Read(&buf)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("got %+v, want %+v", got, want)
		}
	}
	if _, err := Read(&buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v", err)
	}
}

func TestPayloadFollowsHeader(t *testing.T) {
	var buf bytes.Buffer
	Write(&buf, &Msg{Op: OpBatch, Payload: 5}, []byte("hello"))
	Write(&buf, &Msg{Op: OpEnd})
	m, err := Read(&buf)
	if err != nil || m.Payload != 5 {
		t.Fatal(m, err)
	}
	p := make([]byte, m.Payload)
	io.ReadFull(&buf, p)
	if string(p) != "hello" {
		t.Fatalf("payload %q", p)
	}
	if m, err := Read(&buf); err != nil || m.Op != OpEnd {
		t.Fatal(m, err)
	}
}

func TestBadFrames(t *testing.T) {
	for name, b := range map[string][]byte{
		"huge length": {0xff, 0xff, 0xff, 0xff},
		"not json":    append([]byte{3, 0, 0, 0}, "abc"...),
		"no op":       append([]byte{2, 0, 0, 0}, "{}"...),
		"cut short":   append([]byte{9, 0, 0, 0}, `{"op"`...),
	} {
		if _, err := Read(bytes.NewReader(b)); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", name, err)
		}
	}
}

func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	Write(&buf, &Msg{Op: OpNext, Job: 1})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Read(bytes.NewReader(b))
		if err != nil {
			return
		}
		if m.Op == "" {
			t.Fatal("accepted a message without op")
		}
		again, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		if m2, err := Read(bytes.NewReader(again)); err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-encoding changed the message: %v", err)
		}
	})
}
