package columnar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// Compressed record batches (Message.fbs, BodyCompression; the format's
// "Compression" section). With method BUFFER each buffer of the body is
// compressed alone: an int64 with its uncompressed length (-1: stored as
// it is), then an LZ4 frame or a ZSTD frame. No row can be read without
// decompressing whole buffers, so a compressed batch is read whole and
// decompressed once into a body laid out as an uncompressed one's, which
// the rest of this package reads as it reads a file's.

// Codec is a record batch's body compression: none, or the IPC codec.
type Codec int8

const (
	CodecNone Codec = iota
	CodecLZ4        // LZ4_FRAME
	CodecZstd       // ZSTD
)

func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "uncompressed"
	case CodecLZ4:
		return "LZ4_FRAME"
	case CodecZstd:
		return "ZSTD"
	}
	return fmt.Sprintf("codec %d", int8(c))
}

// parseCompression reads a BodyCompression table.
func parseCompression(t table) (Codec, error) {
	codec, err := t.uint8(0, 0)
	if err != nil {
		return 0, err
	}
	method, err := t.uint8(1, 0)
	if err != nil {
		return 0, err
	}
	if method != 0 {
		return 0, fmt.Errorf("%w: body compression method %d (the format defines BUFFER, 0)", ErrCodec, method)
	}
	switch codec {
	case 0:
		return CodecLZ4, nil
	case 1:
		return CodecZstd, nil
	}
	return 0, fmt.Errorf("%w: compression type %d (the format defines LZ4_FRAME, 0, and ZSTD, 1)", ErrCodec, codec)
}

// ErrCodec is a batch compressed in a way the format does not define.
var ErrCodec = errors.New("unknown IPC body compression")

// BufferError is a compressed buffer that does not decompress: Offset is
// where it starts in its batch's body.
type BufferError struct {
	Buffer int
	Offset int64
	Err    error
}

func (e *BufferError) Error() string {
	return fmt.Sprintf("compressed buffer %d at body byte %d: %v", e.Buffer, e.Offset, e.Err)
}

func (e *BufferError) Unwrap() error { return e.Err }

// Bounds on what a compressed buffer may claim to decompress to, checked
// before its bytes are allocated: a corrupt length is an error, not an
// allocation of terabytes. LZ4's sequences add at most 255 bytes of match
// per byte of input; ZSTD's RLE blocks (4 bytes for up to 128 KiB) make
// its bound 32768, which a column of zeros reaches.
const (
	lz4Ratio  = 256
	zstdRatio = 1 << 15
	ratioGap  = 1 << 16
)

// Decompress decompresses a record batch's body: bufs are the buffers'
// places in body as its message gives them. It returns a new body holding
// each buffer decompressed, 8-byte aligned, and their places there. Every
// buffer must decompress to exactly the length it states; a buffer of zero
// bytes stays empty. Safe for concurrent use.
func Decompress(codec Codec, bufs []BufferLoc, body []byte) ([]byte, []BufferLoc, error) {
	if codec != CodecLZ4 && codec != CodecZstd {
		return nil, nil, fmt.Errorf("%w: %v", ErrCodec, codec)
	}
	ratio := int64(lz4Ratio)
	if codec == CodecZstd {
		ratio = zstdRatio
	}
	out := make([]BufferLoc, len(bufs))
	var total int64
	for i, b := range bufs {
		if b.Offset < 0 || b.Length < 0 || b.Offset > int64(len(body)) || b.Length > int64(len(body))-b.Offset {
			return nil, nil, &BufferError{i, b.Offset, fmt.Errorf("%d bytes outside the body of %d", b.Length, len(body))}
		}
		n := int64(0)
		if b.Length > 0 {
			if b.Length < 8 {
				return nil, nil, &BufferError{i, b.Offset, fmt.Errorf("%d bytes, too short for its length prefix", b.Length)}
			}
			n = int64(binary.LittleEndian.Uint64(body[b.Offset:]))
			switch {
			case n == -1:
				n = b.Length - 8
			case n < 0 || n > ratio*(b.Length-8)+ratioGap:
				return nil, nil, &BufferError{i, b.Offset, fmt.Errorf("claims %d bytes decompressed from %d", n, b.Length-8)}
			}
		}
		out[i] = BufferLoc{total, n}
		total = (total + n + 7) &^ 7
	}
	dst := make([]byte, total)
	for i, b := range bufs {
		if b.Length == 0 {
			continue
		}
		src := body[b.Offset+8 : b.Offset+b.Length]
		to := dst[out[i].Offset : out[i].Offset+out[i].Length]
		var err error
		if int64(binary.LittleEndian.Uint64(body[b.Offset:])) == -1 {
			copy(to, src)
		} else if codec == CodecLZ4 {
			err = unLZ4(to, src)
		} else {
			err = unZstd(to, src)
		}
		if err != nil {
			return nil, nil, &BufferError{i, b.Offset, err}
		}
	}
	return dst, out, nil
}

var lz4Readers = sync.Pool{New: func() any { return lz4.NewReader(nil) }}

// unLZ4 decompresses the LZ4 frame src into dst, which it must fill
// exactly.
func unLZ4(dst, src []byte) (err error) {
	zr := lz4Readers.Get().(*lz4.Reader)
	in := bytes.NewReader(src)
	zr.Reset(in)
	defer func() {
		zr.Reset(nil)
		lz4Readers.Put(zr)
	}()
	n, err := io.ReadFull(zr, dst)
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return fmt.Errorf("LZ4 frame decompresses to %d bytes, its prefix says %d", n, len(dst))
	}
	if err != nil {
		return fmt.Errorf("LZ4 frame: %w", err)
	}
	var one [1]byte
	if m, err := zr.Read(one[:]); m > 0 || err != io.EOF {
		if err != nil && err != io.EOF {
			return fmt.Errorf("LZ4 frame: %w", err)
		}
		return fmt.Errorf("LZ4 frame decompresses to more than the %d bytes its prefix says", len(dst))
	}
	if in.Len() > 0 {
		return fmt.Errorf("%d bytes after the LZ4 frame", in.Len())
	}
	return nil
}

var zstdDecoder = sync.OnceValues(func() (*zstd.Decoder, error) {
	// DecodeAll with a capacity limit decodes no more than dst holds: a
	// frame that would write more is an error, not a larger allocation.
	return zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true), zstd.WithDecoderLowmem(true))
})

// unZstd decompresses the ZSTD frame src into dst, which it must fill
// exactly.
func unZstd(dst, src []byte) error {
	dec, err := zstdDecoder()
	if err != nil {
		return err
	}
	got, err := dec.DecodeAll(src, dst[:0:len(dst)])
	if err != nil {
		return fmt.Errorf("ZSTD frame: %w", err)
	}
	if len(got) != len(dst) {
		return fmt.Errorf("ZSTD frame decompresses to %d bytes, its prefix says %d", len(got), len(dst))
	}
	copy(dst, got) // got is dst (the capacity limit): a copy onto itself
	return nil
}
