package share

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/RoaringBitmap/roaring/v2"
)

// readSet reads the set of records a saved state holds, a roaring bitmap
// in its portable format (RoaringFormatSpec), from the front of b, and
// returns it and the bytes after it. A state crosses the socket from a
// client, so every byte of the bitmap is checked before roaring reads it,
// in one pass: roaring's reader takes the counts it is given (a run of
// 2^27 records is a few bytes), and its Validate is quadratic in a
// container's runs and checks no cardinality of one. The set must hold
// only ids below records, the dataset's: what it would cost is then
// bounded by the dataset the state claims to describe.
func readSet(b []byte, records int) (*roaring.Bitmap, []byte, error) {
	bad := func(format string, args ...any) (*roaring.Bitmap, []byte, error) {
		return nil, nil, fmt.Errorf("a roaring set: "+format, args...)
	}
	const (
		cookieRuns   = 12347 // and the containers less one, in the high half
		cookieNoRuns = 12346
		noOffsets    = 4 // with runs, fewer containers have no offsets
		arrayMax     = 4096
	)
	at := 0
	u16 := func() (int, bool) {
		if len(b)-at < 2 {
			return 0, false
		}
		at += 2
		return int(binary.LittleEndian.Uint16(b[at-2:])), true
	}
	if len(b) < 4 {
		return bad("truncated")
	}
	cookie := binary.LittleEndian.Uint32(b)
	at = 4
	var size int
	var runs []byte
	offsets := true
	switch {
	case cookie&0xffff == cookieRuns:
		size = int(cookie>>16) + 1
		if len(b)-at < (size+7)/8 {
			return bad("truncated")
		}
		runs, at = b[at:at+(size+7)/8], at+(size+7)/8
		offsets = size >= noOffsets
	case cookie == cookieNoRuns:
		if len(b)-at < 4 {
			return bad("truncated")
		}
		size, at = int(binary.LittleEndian.Uint32(b[at:])), at+4
		if size > 1<<16 {
			return bad("%d containers", size)
		}
	default:
		return bad("cookie %08x", cookie)
	}
	head := at
	if len(b)-at < 4*size {
		return bad("truncated")
	}
	at += 4 * size
	if offsets {
		if len(b)-at < 4*size {
			return bad("truncated")
		}
		at += 4 * size
	}
	last := -1 // the greatest id so far
	for i := range size {
		key := int(binary.LittleEndian.Uint16(b[head+4*i:]))
		card := int(binary.LittleEndian.Uint16(b[head+4*i+2:])) + 1
		if key<<16 <= last {
			return bad("container %d's key %d is not after the one before", i, key)
		}
		n := 0 // the container's ids, counted
		top := -1
		switch {
		case runs != nil && runs[i/8]&(1<<(i%8)) != 0:
			nr, ok := u16()
			if !ok || nr == 0 || len(b)-at < 4*nr {
				return bad("container %d's runs truncated or none", i)
			}
			for r := range nr {
				start := int(binary.LittleEndian.Uint16(b[at+4*r:]))
				length := int(binary.LittleEndian.Uint16(b[at+4*r+2:])) + 1
				if start <= top || start+length > 1<<16 {
					return bad("container %d's run %d (%d+%d) is out of order or past its container", i, r, start, length)
				}
				n += length
				top = start + length - 1
			}
			at += 4 * nr
		case card > arrayMax:
			if len(b)-at < 1<<13 {
				return bad("container %d's bitmap truncated", i)
			}
			for w := range 1 << 10 {
				x := binary.LittleEndian.Uint64(b[at+8*w:])
				if x != 0 {
					n += bits.OnesCount64(x)
					top = 64*w + 63 - bits.LeadingZeros64(x)
				}
			}
			at += 1 << 13
		default:
			if len(b)-at < 2*card {
				return bad("container %d's array truncated", i)
			}
			for k := range card {
				v := int(binary.LittleEndian.Uint16(b[at+2*k:]))
				if v <= top {
					return bad("container %d's array is out of order", i)
				}
				top = v
			}
			n = card
			at += 2 * card
		}
		if n != card {
			return bad("container %d holds %d ids, its header says %d", i, n, card)
		}
		last = key<<16 | top
	}
	if last >= records {
		return bad("record %d, of a dataset of %d", last, records)
	}
	set := roaring.New()
	if _, err := set.ReadFrom(bytes.NewReader(b[:at])); err != nil {
		return bad("%v", err)
	}
	return set, b[at:], nil
}
