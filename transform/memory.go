package transform

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/dustin/go-humanize"
)

// The memory a decode takes, bounded before it is taken (issue 46).
//
// A few hundred bytes of header may claim an image of any size, and a
// compressed image may be small: an 11,585 x 11,585 PNG of one colour is
// 415 KB, and decodes to 1.27 GB of pixels (just under maxPixels), Go's
// decoder and the RGB conversion taking more. One such record among 7
// JPEGs got a daemon OOM-killed in a 1 GiB cgroup; four at once, on four
// workers, took 5.6 GB. So before a decode allocates, the memory it will
// take is worked out from the header (cost: the decoded planes, the
// decoder's own buffers, the conversion to RGB) and charged to a Memory,
// the daemon's part of its budget for decodes: decodes wait for each
// other's room, so all of them at once never take more than the part, and
// a record whose decode alone would take more is refused, a DataError
// that names it (the loader adds its file and offset). What a worker keeps
// for the next record (its scratch buffers) is bounded too: a buffer grown
// past keepScratch goes back to the collector with its decode.

// ErrTooLarge says an image's decode would take more memory than the
// decodes of the daemon (or process) may take at once.
var ErrTooLarge = errors.New("image too large to decode in the memory for decodes")

// keepScratch is the most a worker's scratch buffers keep between records.
const keepScratch = 8 << 20

// Memory bounds the bytes the image decodes of a process take at once:
// each charges its cost before it allocates, waiting while others hold the
// room. It is safe for concurrent use; a nil *Memory bounds nothing but
// each image's pixels (maxPixels).
type Memory struct {
	limit int64

	mu   sync.Mutex
	cond *sync.Cond
	used int64
	peak int64
}

// NewMemory makes a Memory of limit bytes.
func NewMemory(limit int64) *Memory {
	m := &Memory{limit: max(1, limit)}
	m.cond = sync.NewCond(&m.mu)
	return m
}

// MemoryStats is what a Memory holds.
type MemoryStats struct {
	Limit, Used, Peak int64
}

// Stats reads the Memory's bytes charged now and at most.
func (m *Memory) Stats() MemoryStats {
	if m == nil {
		return MemoryStats{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return MemoryStats{Limit: m.limit, Used: m.used, Peak: m.peak}
}

// take charges n bytes for a decode of what (a sentence: "its 11585x11585
// pixels (PNG)"), waiting for room; it returns the function that gives
// them back, or ErrTooLarge if n is more than the whole limit. Decodes end
// on their own, so the wait does too.
func (m *Memory) take(n int64, what string) (func(), error) {
	if m == nil {
		return func() {}, nil
	}
	if n > m.limit {
		return nil, fmt.Errorf("image: decoding %s takes %s (its pixels, the decoder's buffers and the RGB conversion), "+
			"more than the %s the daemon gives all decodes at once: %w", what, humanize.IBytes(uint64(n)),
			humanize.IBytes(uint64(m.limit)), ErrTooLarge)
	}
	m.mu.Lock()
	for m.used+n > m.limit {
		m.cond.Wait()
	}
	m.used += n
	m.peak = max(m.peak, m.used)
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		m.used -= n
		m.mu.Unlock()
		m.cond.Broadcast()
	}, nil
}

// WithMemory is t drawing its decodes' memory from m: an image transform
// bound to m, any other transform itself.
func WithMemory(t Transform, m *Memory) Transform {
	switch t := t.(type) {
	case *centerCrop:
		c := *t
		c.mem = m
		return &c
	case *randomCrop:
		c := *t
		c.mem = m
		return &c
	}
	return t
}

// header is what an image's header says of its decode.
type header struct {
	format string // "jpeg", "png", or "" for another
	w, h   int
	// A JPEG's components, their sampling factors, and whether it is
	// progressive (its coefficients are kept whole while it is decoded).
	comps       int
	hs, vs      [4]int
	progressive bool
	// A PNG's bytes a pixel decoded by Go (image.Gray to NRGBA64), and
	// whether it is interlaced (decoded a pass at a time, then merged).
	bpp        int
	interlaced bool
}

// readHeader reads raw's header: a JPEG's frame (SOFn), a PNG's IHDR.
func readHeader(raw []byte) (header, error) {
	switch {
	case len(raw) >= 2 && raw[0] == 0xff && raw[1] == 0xd8:
		return jpegHeader(raw)
	case len(raw) >= 8 && string(raw[:8]) == "\x89PNG\r\n\x1a\n":
		return pngHeader(raw)
	}
	return header{}, nil
}

func jpegHeader(raw []byte) (header, error) {
	for at := 2; at+4 <= len(raw); {
		if raw[at] != 0xff {
			return header{}, fmt.Errorf("image: JPEG: no marker at byte %d", at)
		}
		marker := raw[at+1]
		if marker == 0xff { // fill bytes
			at++
			continue
		}
		if marker == 0xd8 || marker >= 0xd0 && marker <= 0xd7 || marker == 0x01 {
			at += 2
			continue
		}
		n := int(binary.BigEndian.Uint16(raw[at+2:]))
		if n < 2 || at+2+n > len(raw) {
			break
		}
		seg := raw[at+4 : at+2+n]
		switch {
		case marker >= 0xc0 && marker <= 0xcf && marker != 0xc4 && marker != 0xc8 && marker != 0xcc:
			if len(seg) < 6 {
				return header{}, errors.New("image: JPEG: a frame header cut short")
			}
			h := header{format: "jpeg", h: int(binary.BigEndian.Uint16(seg[1:])), w: int(binary.BigEndian.Uint16(seg[3:])),
				comps: int(seg[5]), progressive: marker == 0xc2 || marker == 0xc6 || marker == 0xca || marker == 0xce}
			if h.comps < 1 || h.comps > 4 || len(seg) < 6+3*h.comps {
				return header{}, fmt.Errorf("image: JPEG: a frame of %d components", h.comps)
			}
			for c := range h.comps {
				s := seg[6+3*c+1]
				h.hs[c], h.vs[c] = max(1, int(s>>4)), max(1, int(s&15))
			}
			return h, nil
		case marker == 0xda:
			return header{}, errors.New("image: JPEG: a scan before its frame header")
		}
		at += 2 + n
	}
	return header{}, errors.New("image: JPEG: no frame header")
}

func pngHeader(raw []byte) (header, error) {
	if len(raw) < 29 || string(raw[12:16]) != "IHDR" {
		return header{}, errors.New("image: PNG: no IHDR")
	}
	h := header{format: "png", w: int(binary.BigEndian.Uint32(raw[16:])), h: int(binary.BigEndian.Uint32(raw[20:])),
		interlaced: raw[28] == 1}
	if h.w > 1<<30 || h.h > 1<<30 {
		return header{}, fmt.Errorf("image: PNG of %dx%d pixels", h.w, h.h)
	}
	deep := raw[24] == 16
	switch raw[25] { // colour type
	case 0, 3: // grey, paletted
		h.bpp = 1
		if deep && raw[25] == 0 {
			h.bpp = 2
		}
	default: // RGB, grey with alpha, RGBA: RGBA or NRGBA
		h.bpp = 4
		if deep {
			h.bpp = 8
		}
	}
	return h, nil
}

// what says what a decode of h is, for errors.
func (h header) what() string {
	return fmt.Sprintf("its %dx%d pixels (%s)", h.w, h.h, h.format)
}

// samples is a JPEG's component samples at full size, each component
// padded to whole blocks of its MCUs, as the decoders allocate them.
func (h header) samples() int64 {
	hmax, vmax := 1, 1
	for c := range h.comps {
		hmax, vmax = max(hmax, h.hs[c]), max(vmax, h.vs[c])
	}
	mx := int64((h.w + 8*hmax - 1) / (8 * hmax))
	my := int64((h.h + 8*vmax - 1) / (8 * vmax))
	var n int64
	for c := range h.comps {
		n += mx * int64(8*h.hs[c]) * my * int64(8*h.vs[c])
	}
	return n
}

// goCost is the memory Go's decoders take for h, and the conversion of
// the whole image to RGBA and to packed RGB after (rgbOf): a JPEG's planes
// (a byte a sample), its coefficients if progressive (an int32 each), a
// CMYK one's conversion; a PNG's image, twice if interlaced (its passes).
func (h header) goCost() int64 {
	px := int64(h.w) * int64(h.h)
	if px > maxPixels {
		// checkSize refuses such an image before it is charged; past the
		// bound a PNG header's 32-bit sides would overflow the sums below
		// into a negative cost, so no header may ask for less than all.
		return math.MaxInt64
	}
	var dec int64
	switch h.format {
	case "jpeg":
		s := h.samples()
		dec = s
		if h.progressive {
			dec += 4 * s
		}
		if h.comps == 4 {
			dec += 4 * px
		}
	case "png":
		dec = int64(h.bpp) * px
		if h.interlaced {
			dec *= 2
		}
	default:
		dec = 8 * px // another format: as much as the deepest
	}
	return dec + 7*px + 64<<10
}

// trim drops sc's buffers grown past keepScratch: a worker keeps at most
// that much between records.
func (sc *scratch) trim() {
	if cap(sc.region) > keepScratch {
		sc.region = nil
	}
	if cap(sc.tmp) > keepScratch {
		sc.tmp = nil
	}
	if cap(sc.acc) > keepScratch/4 {
		sc.acc = nil
	}
}
