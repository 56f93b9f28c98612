package dataset

import (
	"bufio"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/riffle-ml/riffle/storage"
)

// TFRecord framing: uint64 length, uint32 masked CRC32C of the length, the
// data, uint32 masked CRC32C of the data. The index holds frame starts; the
// loader reads whole frames so both CRCs are checked on every read; with
// Options.SkipCRC the data's is not, but the length and its CRC still are
// (12 bytes, a CRC of 8): they say a frame starts at the index's offset
// and is the length the index says, so an index that is not the file's
// is an error at the record, never other bytes read as it.
const (
	tfHead = 12
	tfTail = 4
)

// maskedCRC is TFRecord's CRC: CRC32C rotated and offset so that CRCs of
// data that itself holds CRCs do not collide.
func maskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return ((c >> 15) | (c << 17)) + 0xa282ead8
}

// AppendTFRecord appends data framed as one TFRecord to dst.
func AppendTFRecord(dst, data []byte) []byte {
	var h [tfHead]byte
	binary.LittleEndian.PutUint64(h[:], uint64(len(data)))
	binary.LittleEndian.PutUint32(h[8:], maskedCRC(h[:8]))
	dst = append(dst, h[:]...)
	dst = append(dst, data...)
	return binary.LittleEndian.AppendUint32(dst, maskedCRC(data))
}

func init() {
	RegisterFormat(Format{Name: "tfrecord", Extensions: []string{".tfrecord", ".tfrecords", ".tfr"}, Indexed: true, OpenPart: openTFRecord})
}

// tfPart is a TFRecord file: an offsetPart whose records are read in their
// frames and checked (the data's CRC unless skipCRC).
type tfPart struct {
	offsetPart
	skipCRC bool
}

func (p *tfPart) Frame() (head, tail int) { return tfHead, tfTail }
func (p *tfPart) Verify(frame []byte, path string, off int64) error {
	return checkFrame(frame, path, off, !p.skipCRC)
}

// checkFrame verifies one whole frame read at off of path: its length
// and the length's CRC, and with data its data's CRC.
func checkFrame(frame []byte, path string, off int64, data bool) error {
	if len(frame) < tfHead+tfTail {
		return &FormatError{Path: path, Offset: off, Err: fmt.Errorf("TFRecord frame of %d bytes: %w", len(frame), ErrCorrupt)}
	}
	if got, want := binary.LittleEndian.Uint32(frame[8:]), maskedCRC(frame[:8]); got != want {
		return &FormatError{Path: path, Offset: off + 8, Err: fmt.Errorf("TFRecord length CRC %08x, computed %08x: %w", got, want, ErrCRC)}
	}
	n := binary.LittleEndian.Uint64(frame)
	if n != uint64(len(frame)-tfHead-tfTail) {
		return &FormatError{Path: path, Offset: off, Err: fmt.Errorf("TFRecord length %d, index says %d: %w", n, len(frame)-tfHead-tfTail, ErrCorrupt)}
	}
	if !data {
		return nil
	}
	body := frame[tfHead : len(frame)-tfTail]
	if got, want := binary.LittleEndian.Uint32(frame[len(frame)-tfTail:]), maskedCRC(body); got != want {
		return &FormatError{Path: path, Offset: off + int64(len(frame)-tfTail), Err: fmt.Errorf("TFRecord data CRC %08x, computed %08x: %w", got, want, ErrCRC)}
	}
	return nil
}

// tfScanner walks TFRecord frames across chunk boundaries, checking each
// length's CRC so that a corrupt length is caught where it is, not as a
// wild jump.
type tfScanner struct {
	path    string
	offs    []int64
	next    int64 // start of the next frame
	partial []byte
	err     error
}

func (s *tfScanner) feed(off int64, b []byte) error {
	for {
		rel := s.next - off
		if rel >= int64(len(b)) {
			return nil // the frame starts in a later chunk
		}
		var h []byte
		switch {
		case len(s.partial) > 0:
			need := tfHead - len(s.partial)
			s.partial = append(s.partial, b[:min(need, len(b))]...)
			if len(s.partial) < tfHead {
				return nil
			}
			h = s.partial
		case rel+tfHead > int64(len(b)):
			s.partial = append(s.partial[:0], b[rel:]...)
			return nil
		default:
			h = b[rel : rel+tfHead]
		}
		n := binary.LittleEndian.Uint64(h)
		if got, want := binary.LittleEndian.Uint32(h[8:]), maskedCRC(h[:8]); got != want {
			return &FormatError{Path: s.path, Offset: s.next + 8, Err: fmt.Errorf("TFRecord length CRC %08x, computed %08x: %w", got, want, ErrCRC)}
		}
		if n > 1<<40 {
			return &FormatError{Path: s.path, Offset: s.next, Err: fmt.Errorf("TFRecord length %d is implausible: %w", n, ErrCorrupt)}
		}
		s.partial = s.partial[:0]
		s.offs = append(s.offs, s.next)
		s.next += tfHead + int64(n) + tfTail
	}
}

// CompressedError is a TFRecord file written compressed (TensorFlow's
// TFRecordOptions compression "GZIP" or "ZLIB") under a plain TFRecord
// name: it has no random access to its records. It is ErrUnsupported.
type CompressedError struct {
	Path  string
	Codec string // "GZIP" or "ZLIB"
}

func (e *CompressedError) Error() string {
	tool := "gzip -dc"
	if e.Codec == "ZLIB" {
		tool = "pigz -dz"
	}
	return fmt.Sprintf("%s: a %s-compressed TFRecord file, which has no random access to its records: %v; decompress it first (%s < %s > plain.tfrecord), or pack it once (riffle pack %s --out DIR)",
		e.Path, e.Codec, ErrUnsupported, tool, e.Path, e.Path)
}

func (e *CompressedError) Unwrap() error { return ErrUnsupported }

// tfCompression tells a compressed TFRecord file by its first bytes: a
// gzip member (1f 8b) or a zlib stream (78 and a level byte) where a
// plain file's first frame fails its length CRC; "" for a plain file.
func tfCompression(head []byte) string {
	if len(head) >= tfHead && binary.LittleEndian.Uint32(head[8:]) == maskedCRC(head[:8]) {
		return ""
	}
	switch {
	case len(head) >= 2 && head[0] == 0x1f && head[1] == 0x8b:
		return "GZIP"
	case len(head) >= 2 && head[0] == 0x78 && (head[1] == 0x01 || head[1] == 0x5e || head[1] == 0x9c || head[1] == 0xda):
		return "ZLIB"
	}
	return ""
}

func openTFRecord(ctx context.Context, f storage.Reader, opts Options) (Part, error) {
	head := make([]byte, min(tfHead, f.Size()))
	if err := f.ReadAt(ctx, head, 0); err != nil {
		return nil, err
	}
	if codec := tfCompression(head); codec != "" {
		return nil, &CompressedError{Path: f.Name(), Codec: codec}
	}
	variant := uint32(4)
	if opts.DropPartialTail {
		variant |= 1 << 8
	}
	t, err := loadOrBuild(ctx, f, variant, opts, shape{head: tfHead, min: tfHead + tfTail}, func() (table, error) {
		s := &tfScanner{path: f.Name()}
		if err := scanSeq(ctx, f, 0, opts.Progress, s.feed); err != nil {
			return table{}, err
		}
		end := s.next
		if end > f.Size() { // the last frame is cut short
			end = s.offs[len(s.offs)-1]
			s.offs = s.offs[:len(s.offs)-1]
		}
		if end != f.Size() && !opts.DropPartialTail {
			what := fmt.Sprintf("frame ends at %d", s.next)
			if s.next <= end { // the scan never read its length
				what = fmt.Sprintf("%d of its %d-byte header there", f.Size()-end, tfHead)
			}
			return table{}, &FormatError{Path: f.Name(), Offset: end,
				Err: fmt.Errorf("last TFRecord is cut short (file ends at %d, %s; --drop-partial or drop_partial=True drops it): %w", f.Size(), what, ErrPartial)}
		}
		return table{offs: append(s.offs, end)}, nil
	})
	if err != nil {
		return nil, err
	}
	return &tfPart{offsetPart: offsetPart{t: t, head: tfHead, tail: tfTail}, skipCRC: opts.SkipCRC}, nil
}

// TFRecordStream reads a TFRecord object's records one after another, from
// its start to its end, decompressing a GZIP or ZLIB one, and checks both
// CRCs of each: the one way to read a compressed TFRecord file, which has
// no random access (riffle pack rewrites it into shards that do).
type TFRecordStream struct {
	Path    string
	Codec   string // "GZIP", "ZLIB", or "" for a plain file
	Version string // the store's version of the object, as Info.Versions has it
	obj     storage.Reader
	z       io.Closer // the decompressor, if any
	r       *bufio.Reader
	off     int64 // of the next frame, in the decompressed bytes
	buf     []byte
}

// OpenTFRecordStream opens a TFRecord object for reading start to end.
// The caller closes it.
func OpenTFRecordStream(ctx context.Context, opts Options, name string) (*TFRecordStream, error) {
	obj, err := opts.store().Open(ctx, name)
	if err != nil {
		return nil, err
	}
	s := &TFRecordStream{Path: obj.Name(), Version: version(obj), obj: obj}
	head := make([]byte, min(tfHead, obj.Size()))
	if err := obj.ReadAt(ctx, head, 0); err != nil {
		obj.Close()
		return nil, err
	}
	s.Codec = tfCompression(head)
	var src io.Reader = bufio.NewReaderSize(&readerAt{ctx: ctx, r: obj}, 1<<20)
	switch s.Codec {
	case "GZIP":
		zr, err := gzip.NewReader(src)
		if err != nil {
			obj.Close()
			return nil, &FormatError{Path: s.Path, Err: fmt.Errorf("gzip: %v: %w", err, ErrCorrupt)}
		}
		s.z, src = zr, zr
	case "ZLIB":
		zr, err := zlib.NewReader(src)
		if err != nil {
			obj.Close()
			return nil, &FormatError{Path: s.Path, Err: fmt.Errorf("zlib: %v: %w", err, ErrCorrupt)}
		}
		s.z, src = zr, zr
	}
	s.r = bufio.NewReaderSize(src, 1<<20)
	return s, nil
}

// Next returns the next record's data, valid until the next call, or
// io.EOF after the last. An error names the offset in the decompressed
// bytes.
func (s *TFRecordStream) Next() ([]byte, error) {
	bad := func(off int64, err error) error {
		where := "decompressed "
		if s.Codec == "" {
			where = ""
		}
		return &FormatError{Path: s.Path, Offset: off, Err: fmt.Errorf("(%sbytes) %w", where, err)}
	}
	var h [tfHead]byte
	if n, err := io.ReadFull(s.r, h[:]); err != nil {
		if n == 0 && errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, bad(s.off, s.cut(err))
	}
	if got, want := binary.LittleEndian.Uint32(h[8:]), maskedCRC(h[:8]); got != want {
		return nil, bad(s.off+8, fmt.Errorf("TFRecord length CRC %08x, computed %08x: %w", got, want, ErrCRC))
	}
	n := binary.LittleEndian.Uint64(h[:])
	if n > 1<<31 {
		return nil, bad(s.off, fmt.Errorf("TFRecord length %d is implausible: %w", n, ErrCorrupt))
	}
	if uint64(cap(s.buf)) < n+tfTail {
		s.buf = make([]byte, n+tfTail)
	}
	s.buf = s.buf[:n+tfTail]
	if _, err := io.ReadFull(s.r, s.buf); err != nil {
		return nil, bad(s.off, s.cut(err))
	}
	data := s.buf[:n]
	if got, want := binary.LittleEndian.Uint32(s.buf[n:]), maskedCRC(data); got != want {
		return nil, bad(s.off+tfHead+int64(n), fmt.Errorf("TFRecord data CRC %08x, computed %08x: %w", got, want, ErrCRC))
	}
	s.off += tfHead + int64(n) + tfTail
	return data, nil
}

// cut says what a short read of a frame means.
func (s *TFRecordStream) cut(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("last TFRecord is cut short: %w", ErrPartial)
	}
	if s.Codec != "" {
		return fmt.Errorf("%s: %v: %w", s.Codec, err, ErrCorrupt)
	}
	return err
}

func (s *TFRecordStream) Close() error {
	var errs []error
	if s.z != nil {
		errs = append(errs, s.z.Close())
	}
	return errors.Join(append(errs, s.obj.Close())...)
}
