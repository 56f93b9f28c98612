package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"slices"
	"strings"
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

// Frames as the daemon reads them from a client (and a Go client its
// replies): any bytes give a message or an error, never a panic; a
// message re-encodes to itself; a field of the wrong type is named by a
// path that is one of the message's fields.
func FuzzRead(f *testing.F) {
	var buf bytes.Buffer
	Write(&buf, &Msg{Op: OpNext, Job: 1})
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Read(bytes.NewReader(b))
		var fe *FieldError
		if errors.As(err, &fe) {
			name, _, _ := strings.Cut(strings.TrimLeft(fe.Field, "."), ".")
			name, _, _ = strings.Cut(name, "[")
			if m == nil || m.Op == "" || !slices.Contains(msgFields(), strings.ToLower(name)) {
				t.Fatalf("a field error %q (%v) of %+v", fe.Field, err, m)
			}
			return
		}
		if err != nil {
			if m != nil || !errors.Is(err, ErrFrame) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("a failed read returned %+v, %v", m, err)
			}
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

// A whole frame with a field its type cannot hold decodes all the rest,
// and says which field, with what was wanted: the daemon answers it and
// keeps the connection.
func TestFieldErrors(t *testing.T) {
	for _, c := range []struct{ json, field, says string }{
		{`{"op":"check","tag":7,"spec":{"paths":["/d"],"seed":-1}}`, "spec.seed", "-1 is not an integer from 0 to 18446744073709551615"},
		{`{"op":"open","tag":7,"spec":{"paths":["/d"],"batch_size":1e30}}`, "spec.batch_size", "1e30 is not an integer from -9223372036854775808"},
		{`{"op":"open","tag":7,"spec":{"paths":["/d"],"seed":1.5}}`, "spec.seed", "1.5 is not an integer"},
		{`{"op":"open","tag":7,"spec":{"paths":"/d"}}`, "spec.paths", "a string is not a list"},
		{`{"op":"open","tag":7,"spec":{"paths":["/d"],"Shuffle":"yes"}}`, "spec.shuffle", "a string is not true or false"},
		{`{"op":"open","tag":7,"spec":{"paths":["/d"],"sampler_state":"not base64!"}}`, "spec.sampler_state", "illegal base64"},
		{`{"op":"open","tag":7,"spec":{"paths":["/d"],"delivered":[{"epoch":0},{"epoch":0,"sampler_state":"%%"}]}}`,
			"spec.delivered[1].sampler_state", "illegal base64"},
		{`{"op":"open","tag":7,"spec":{"mixture":[{"paths":["/a"],"weight":1},{"paths":["/b"],"weight":"heavy"}]}}`,
			"spec.mixture[1].weight", "a string is not a finite number"},
		{`{"op":"open","tag":7,"spec":{"paths":["/d"],"subset":{"ranges":[[0,1],[0,"9"]]}}}`, "spec.subset.ranges[1][1]", "a string is not an integer"},
		{`{"op":"next","tag":7,"job":"one"}`, "job", "a string is not an integer"},
	} {
		m, err := Decode([]byte(c.json))
		var fe *FieldError
		if !errors.As(err, &fe) || !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want a FieldError", c.json, err)
			continue
		}
		if m == nil || m.Tag != 7 || fe.Field != c.field || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: message %+v, field %q, %q; want tag 7, field %q saying %q", c.json, m, fe.Field, err, c.field, c.says)
		}
	}
	// Not JSON, or of no op: the peer does not speak the protocol.
	for _, b := range []string{`{"op":"open","tag":7,"spec":{"seed":NaN}}`, `{"tag":7,"job":"x"}`, `[1]`, `"open"`} {
		if m, err := Decode([]byte(b)); m != nil || !errors.Is(err, ErrFrame) || errors.As(err, new(*FieldError)) {
			t.Errorf("%s: %+v, %v; want a malformed frame", b, m, err)
		}
	}
}

// msgFields are Msg's fields by their JSON names, lower case as json
// matches them.
func msgFields() []string {
	t := reflect.TypeFor[Msg]()
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, strings.ToLower(name))
	}
	return out
}

// Frames as a reader gets them from a stream socket, in pieces of any
// size: whatever a message holds (any text, a payload of any length), a
// writer's frames and their payloads come out of the reader whole and in
// order, the same message. (A daemon's reply cut by a short write, or a
// client's read cut by the socket's buffer, is this case.)
func FuzzFrameStream(f *testing.F) {
	f.Add("opened", uint64(3), "/data/a.bin", "", []byte(nil), uint16(1))
	f.Add("batch", uint64(1<<40), "", "", []byte("records"), uint16(7))
	f.Add("error", uint64(9), "/d/\x00\"\u2028", "bad\xff", bytes.Repeat([]byte{0}, 5000), uint16(4096))
	f.Fuzz(func(t *testing.T, op string, tag uint64, path, message string, payload []byte, piece uint16) {
		if op == "" {
			op = OpBatch
		}
		msgs := []*Msg{
			{Op: op, Tag: tag, Message: message, Info: &Info{Paths: []string{path, path + path}}, Payload: int64(len(payload))},
			{Op: OpEnd, Tag: tag + 1},
		}
		var buf bytes.Buffer
		if err := Write(&buf, msgs[0], payload); err != nil {
			return // not JSON (an invalid UTF-8 op is written as U+FFFD, not refused)
		}
		Write(&buf, msgs[1])
		r := &pieces{b: buf.Bytes(), n: max(1, int(piece))}
		for i, want := range msgs {
			got, err := Read(r)
			if err != nil {
				t.Fatalf("frame %d: %v", i, err)
			}
			again, _ := Decode(mustJSON(t, want))
			if !reflect.DeepEqual(got, again) {
				t.Fatalf("frame %d: %+v, want %+v", i, got, again)
			}
			p := make([]byte, got.Payload)
			if _, err := io.ReadFull(r, p); err != nil || (i == 0 && !bytes.Equal(p, payload)) {
				t.Fatalf("frame %d's payload: %v", i, err)
			}
		}
		if _, err := Read(r); !errors.Is(err, io.EOF) {
			t.Fatalf("after the last frame: %v", err)
		}
	})
}

func mustJSON(t *testing.T, m *Msg) []byte {
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// pieces reads b at most n bytes at a time.
type pieces struct {
	b []byte
	n int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.b) == 0 {
		return 0, io.EOF
	}
	k := copy(b[:min(len(b), p.n)], p.b)
	p.b = p.b[k:]
	return k, nil
}
