package peer

// The peer protocol, version 1: how one node's daemon asks another's for
// bytes of a block. It is not the client protocol (package wire): a peer
// can only say hello and ask for blocks, so its frames are binary and of
// fixed shape, with every length bounded before anything is read or
// allocated. All integers are little-endian.
//
//	hello   -> "RFLP" | version u8 | token length u16 | token
//	request -> tag u64 | block i64 | offset i64 | length i64 |
//	           object length u16 | version length u16 | object | version
//	answer  <- tag u64 | status u8 | length u32 | length bytes
//
// The hello's answer has tag 0 and, if it is not StatusOK, a message. A
// request's answer is, with StatusOK, exactly the bytes asked for; with
// StatusError or StatusChanged, a message. The magic, read as the client
// protocol's 4-byte header length, is far more than a hello header may
// be (wire.MaxHelloHeader), so a daemon that shares its TCP port tells a
// peer from a client by the first four bytes. This file imports nothing
// of riffle's (habit 18): it is the whole format.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Magic opens every peer connection.
const Magic = "RFLP"

// ProtocolVersion is the version a hello carries.
const ProtocolVersion = 1

// Bounds of a frame's variable parts. An s3:// name is at most a bucket of
// 63 bytes and a key of 1024; a version is an ETag and a size; a token is
// whatever the operator chose, and a hello is read before the peer has
// proved anything, so it stays small.
const (
	MaxToken   = 1024
	MaxObject  = 2048
	MaxVersion = 256
	MaxMessage = 4096
)

// Status says what an answer holds.
type Status uint8

const (
	StatusOK      Status = 0 // the bytes asked for
	StatusError   Status = 1 // a message: the request failed
	StatusChanged Status = 2 // a message: the object is not at the version asked for
)

// ErrFrame says a peer sent something that is not a frame of this
// protocol (or not one this side may accept).
var ErrFrame = errors.New("peer: malformed frame")

// Request asks for Length bytes from Offset of block Block of Object at
// Version (Length 0: the rest of the block). The numbers are as the asking
// node sent them, unchecked: Cluster.Serve checks them against the object.
type Request struct {
	Tag     uint64
	Object  string
	Version string
	Block   int64
	Offset  int64
	Length  int64
}

const (
	helloHead   = len(Magic) + 1 + 2
	requestHead = 8 + 8 + 8 + 8 + 2 + 2
	answerHead  = 8 + 1 + 4
)

// AppendHello appends a hello carrying token to b.
func AppendHello(b []byte, token string) []byte {
	b = append(b, Magic...)
	b = append(b, ProtocolVersion)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(token)))
	return append(b, token...)
}

// ReadHello reads a hello and returns its token. A wrong magic, another
// version or a token longer than MaxToken is an error wrapping ErrFrame.
func ReadHello(r io.Reader) (string, error) {
	var h [helloHead]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", err
	}
	if string(h[:len(Magic)]) != Magic {
		return "", fmt.Errorf("%w: no peer hello", ErrFrame)
	}
	if v := h[len(Magic)]; v != ProtocolVersion {
		return "", fmt.Errorf("%w: peer protocol version %d, this daemon speaks %d", ErrFrame, v, ProtocolVersion)
	}
	n := binary.LittleEndian.Uint16(h[len(Magic)+1:])
	if n > MaxToken {
		return "", fmt.Errorf("%w: a token of %d bytes, at most %d", ErrFrame, n, MaxToken)
	}
	tok := make([]byte, n)
	if _, err := io.ReadFull(r, tok); err != nil {
		return "", cut(err)
	}
	return string(tok), nil
}

// Append appends q's frame to b. Names longer than MaxObject or
// MaxVersion make a frame ReadRequest refuses.
func (q *Request) Append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, q.Tag)
	b = binary.LittleEndian.AppendUint64(b, uint64(q.Block))
	b = binary.LittleEndian.AppendUint64(b, uint64(q.Offset))
	b = binary.LittleEndian.AppendUint64(b, uint64(q.Length))
	b = binary.LittleEndian.AppendUint16(b, uint16(min(len(q.Object), 1<<16-1)))
	b = binary.LittleEndian.AppendUint16(b, uint16(min(len(q.Version), 1<<16-1)))
	b = append(b, q.Object...)
	return append(b, q.Version...)
}

// ReadRequest reads one request. io.EOF before its first byte is the
// end of the connection; names past their bounds wrap ErrFrame.
func ReadRequest(r io.Reader) (Request, error) {
	var h [requestHead]byte
	if n, err := io.ReadFull(r, h[:]); err != nil {
		if n > 0 {
			err = cut(err)
		}
		return Request{}, err
	}
	le := binary.LittleEndian
	q := Request{Tag: le.Uint64(h[0:]), Block: int64(le.Uint64(h[8:])), Offset: int64(le.Uint64(h[16:])),
		Length: int64(le.Uint64(h[24:]))}
	on, vn := int(le.Uint16(h[32:])), int(le.Uint16(h[34:]))
	if on > MaxObject || vn > MaxVersion {
		return Request{}, fmt.Errorf("%w: an object name of %d bytes and a version of %d, at most %d and %d",
			ErrFrame, on, vn, MaxObject, MaxVersion)
	}
	names := make([]byte, on+vn)
	if _, err := io.ReadFull(r, names); err != nil {
		return Request{}, cut(err)
	}
	q.Object, q.Version = string(names[:on]), string(names[on:])
	return q, nil
}

// cut is an error met in the middle of a frame: the stream ending there
// made a malformed frame; any other error (a deadline that passed, a
// reset) is the connection's, and says so as it is.
func cut(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: cut short: %w", ErrFrame, err)
	}
	return err
}

// appendAnswerHead appends an answer's header: n bytes follow it.
func appendAnswerHead(b []byte, tag uint64, st Status, n int) []byte {
	b = binary.LittleEndian.AppendUint64(b, tag)
	b = append(b, byte(st))
	return binary.LittleEndian.AppendUint32(b, uint32(n))
}

// AppendAnswer appends a whole answer to b: data, or a message cut to
// MaxMessage.
func AppendAnswer(b []byte, tag uint64, st Status, data []byte) []byte {
	if st != StatusOK && len(data) > MaxMessage {
		data = data[:MaxMessage]
	}
	return append(appendAnswerHead(b, tag, st, len(data)), data...)
}

// Answer is a peer's answer: Data, or Message if Status is not StatusOK.
type Answer struct {
	Tag     uint64
	Status  Status
	Data    []byte
	Message string
}

// ReadAnswer reads one answer into a buffer of its own. An answer of
// StatusOK must hold want bytes, a message at most MaxMessage, an unknown
// status none: anything else wraps ErrFrame, and the connection is no
// longer in step.
func ReadAnswer(r io.Reader, want int) (Answer, error) {
	var h [answerHead]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Answer{}, err
	}
	a := Answer{Tag: binary.LittleEndian.Uint64(h[:]), Status: Status(h[8])}
	n := binary.LittleEndian.Uint32(h[9:])
	switch {
	case a.Status == StatusOK && int64(n) != int64(want):
		return Answer{}, fmt.Errorf("%w: an answer of %d bytes for %d", ErrFrame, n, want)
	case a.Status == StatusError || a.Status == StatusChanged:
		if n > MaxMessage {
			return Answer{}, fmt.Errorf("%w: a message of %d bytes, at most %d", ErrFrame, n, MaxMessage)
		}
	case a.Status != StatusOK:
		return Answer{}, fmt.Errorf("%w: answer status %d", ErrFrame, a.Status)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return Answer{}, cut(err)
	}
	if a.Status == StatusOK {
		a.Data = b
	} else {
		a.Message = string(b)
	}
	return a, nil
}
