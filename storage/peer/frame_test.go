package peer

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"
)

// stalled reads b, then fails with err: a connection whose deadline
// passed in the middle of a frame.
type stalled struct {
	b   []byte
	err error
}

func (s *stalled) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, s.err
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// A frame that stops in the middle because the stream ended is malformed
// (ErrFrame); one that stops because the connection's deadline passed, or
// it was reset, is that error and no other: a slow peer's answer is not
// reported as a malformed frame.
func TestFrameCutShort(t *testing.T) {
	answer := AppendAnswer(nil, 7, StatusOK, make([]byte, 100))
	request := (&Request{Tag: 7, Object: "s3://bkt/o", Version: "v"}).Append(nil)
	hello := AppendHello(nil, "token")
	reads := map[string]func(io.Reader) error{
		"answer":  func(r io.Reader) error { _, err := ReadAnswer(r, 100); return err },
		"request": func(r io.Reader) error { _, err := ReadRequest(r); return err },
		"hello":   func(r io.Reader) error { _, err := ReadHello(r); return err },
	}
	frames := map[string][]byte{"answer": answer, "request": request, "hello": hello}
	for name, read := range reads {
		cut := frames[name][:len(frames[name])-3]
		if err := read(bytes.NewReader(cut)); !errors.Is(err, ErrFrame) {
			t.Errorf("%s cut short by the end of the stream: %v, want ErrFrame", name, err)
		}
		err := read(&stalled{b: cut, err: os.ErrDeadlineExceeded})
		if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, ErrFrame) {
			t.Errorf("%s cut short by a deadline: %v, want the deadline's error alone", name, err)
		}
	}
}
