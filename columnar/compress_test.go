package columnar

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
)

// packBuffer is one buffer as an IPC writer compresses it: its length,
// then its frame (or, with raw, the bytes as they are and -1).
func packBuffer(t testing.TB, codec Codec, b []byte, raw bool) []byte {
	var out bytes.Buffer
	n := int64(len(b))
	if raw {
		n = -1
	}
	binary.Write(&out, binary.LittleEndian, n)
	switch {
	case raw:
		out.Write(b)
	case codec == CodecLZ4:
		w := lz4.NewWriter(&out)
		w.Write(b)
		w.Close()
	default:
		w, err := zstd.NewWriter(&out)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(b)
		w.Close()
	}
	return out.Bytes()
}

// packBody lays buffers out as a compressed body: each 8-byte aligned.
func packBody(t testing.TB, codec Codec, bufs ...[]byte) ([]byte, []BufferLoc) {
	var body []byte
	var locs []BufferLoc
	for i, b := range bufs {
		p := []byte(nil)
		if len(b) > 0 {
			p = packBuffer(t, codec, b, i == 1)
		}
		locs = append(locs, BufferLoc{int64(len(body)), int64(len(p))})
		body = append(body, p...)
		for len(body)%8 != 0 {
			body = append(body, 0)
		}
	}
	return body, locs
}

// Buffers decompress to their bytes, laid out 8-byte aligned; a raw
// buffer (-1) and an empty one are kept as they are.
func TestDecompress(t *testing.T) {
	want := [][]byte{[]byte(strings.Repeat("riffle ", 300)), []byte("stored as it is"), nil, bytes.Repeat([]byte{0}, 1<<17)}
	for _, codec := range []Codec{CodecLZ4, CodecZstd} {
		body, locs := packBody(t, codec, want...)
		out, bufs, err := Decompress(codec, locs, body)
		if err != nil {
			t.Fatalf("%v: %v", codec, err)
		}
		for i, w := range want {
			b := bufs[i]
			if b.Offset%8 != 0 || !bytes.Equal(out[b.Offset:b.Offset+b.Length], w) {
				t.Fatalf("%v: buffer %d at %d: %d bytes, want %d", codec, i, b.Offset, b.Length, len(w))
			}
		}
	}
}

// A damaged buffer is a BufferError at its place in the body, never a
// panic or an allocation of what a corrupt length claims.
func TestDecompressCorrupt(t *testing.T) {
	data := []byte(strings.Repeat("abcdefgh", 200))
	for _, codec := range []Codec{CodecLZ4, CodecZstd} {
		body, locs := packBody(t, codec, []byte("x"), nil, data)
		at := locs[2].Offset
		for _, c := range []struct {
			name   string
			damage func(b []byte, l []BufferLoc) ([]byte, []BufferLoc)
		}{
			{"cut short", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { l[2].Length -= 5; return b, l }},
			{"no prefix", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { l[2].Length = 5; return b, l }},
			{"outside", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { l[2].Length += 100; return b, l }},
			{"longer", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { b[at]++; return b, l }},
			{"shorter", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { b[at]--; return b, l }},
			{"huge", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { b[at+6] = 0x7f; return b, l }},
			{"negative", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) { b[at+7] = 0x80; return b, l }},
			{"frame", func(b []byte, l []BufferLoc) ([]byte, []BufferLoc) {
				for i := at + 8 + 12; i < at+l[2].Length; i += 3 {
					b[i] ^= 0x33
				}
				return b, l
			}},
		} {
			b, l := c.damage(append([]byte(nil), body...), append([]BufferLoc(nil), locs...))
			_, _, err := Decompress(codec, l, b)
			var be *BufferError
			if !errors.As(err, &be) || be.Buffer != 2 || be.Offset != at {
				t.Fatalf("%v %s: %v, want an error at buffer 2, body byte %d", codec, c.name, err, at)
			}
		}
	}
	if _, _, err := Decompress(CodecNone, nil, nil); !errors.Is(err, ErrCodec) {
		t.Fatalf("no codec: %v", err)
	}
}

// Any bytes as a one-buffer body of either codec are an error or the
// buffer's stated length; never a panic.
func FuzzDecompress(f *testing.F) {
	for _, codec := range []Codec{CodecLZ4, CodecZstd} {
		body, _ := packBody(f, codec, []byte(strings.Repeat("fuzz", 50)))
		f.Add(byte(codec), body)
	}
	f.Fuzz(func(t *testing.T, codec byte, body []byte) {
		c := Codec(codec%2 + 1)
		out, bufs, err := Decompress(c, []BufferLoc{{0, int64(len(body))}}, body)
		if err == nil && (len(bufs) != 1 || bufs[0].Length > int64(len(out))) {
			t.Fatalf("%d bytes out, buffers %v", len(out), bufs)
		}
	})
}

// Decompression throughput of a body of typical buffers (floats, short
// strings, zeros), in decompressed bytes.
func BenchmarkDecompress(b *testing.B) {
	floats := make([]byte, 1<<20)
	for i := range floats {
		floats[i] = byte(i * 7919 >> 3)
	}
	words := []byte(strings.Repeat("word12 word345 w6 ", 1<<16))
	zeros := make([]byte, 1<<20)
	for _, codec := range []Codec{CodecLZ4, CodecZstd} {
		body, locs := packBody(b, codec, floats, nil, words, zeros)
		b.Run(codec.String(), func(b *testing.B) {
			b.SetBytes(int64(len(floats) + len(words) + len(zeros)))
			for b.Loop() {
				if _, _, err := Decompress(codec, locs, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
