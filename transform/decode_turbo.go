//go:build turbojpeg

package transform

// libjpeg-turbo is linked statically (-l:libjpeg.a, Debian's
// libjpeg62-turbo-dev ships it; scripts/go-tags asks for this file only
// where the C compiler finds it), so every build of the daemon, the
// wheel's included, needs nothing at run time beyond the C library.

/*
#cgo CFLAGS: -O3
#cgo LDFLAGS: -l:libjpeg.a
#include <stdlib.h>
#include "jpeg_turbo.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"unsafe"
)

// Decoder names the image decoder this build uses.
const Decoder = "libjpeg-turbo"

// dctScales are the scales (n/8) a JPEG may be decoded at, largest
// reduction last tried first: libjpeg-turbo's 1/8, 1/4 and 1/2 are
// SIMD-accelerated; the n/8 between them are scalar IDCTs.
var dctScales = []int{1, 2, 4, 8}

// render decodes a JPEG's region that pick's box needs, at the smallest
// DCT scale that keeps at least ow x oh pixels in the box (so the resample
// still only reduces), and resamples it to ow x oh in C, its memory
// charged to m first. Other images, and CMYK JPEGs (which libjpeg does
// not convert to RGB), go through Go's decoders.
func render(m *Memory, raw []byte, pick picker, ow, oh int, out []byte) error {
	d, w, h, err := openJPEG(raw)
	if err != nil || d == nil {
		if err == nil {
			err = renderGo(m, raw, pick, ow, oh, out)
		}
		return err
	}
	defer C.rf_free(d)
	fail := func() error { return libjpegError(d) }
	b, flip := pick(w, h)
	num := dctScale(b, ow, oh)
	var sw, sh C.int
	if C.rf_scaled(d, C.int(num), &sw, &sh) != 0 {
		return fail()
	}
	kx, ky, x0, y0, x1, y1 := layout(b, float64(num)/8, int(sw), int(sh), ow, oh)
	// A cropped decode's edge pixels are upsampled from its own chroma only;
	// decoding a margin beyond what the kernels read keeps every pixel
	// they read the same as a whole decode's.
	x0, y0, x1, y1 = max(x0-edgeMargin, 0), max(y0-edgeMargin, 0), min(x1+edgeMargin, int(sw)), min(y1+edgeMargin, int(sh))
	// libjpeg starts a cropped row at the iMCU boundary at or left of x0:
	// at most 32 pixels more (two 16-pixel blocks at scale 16/8).
	stride := (x1 - x0 + 32) * 3
	rows := y1 - y0
	release, err := takeTurbo(m, d, raw, int64(stride)*int64(rows)+int64(rows)*int64(ow)*3)
	if err != nil {
		return err
	}
	defer release()
	sc := getScratch()
	defer putScratch(sc)
	sc.region = grown(sc.region, stride*rows+1) // SIMD reads a byte past the last pixel
	var ax0 C.int
	if C.rf_region(d, C.int(num), C.int(x0), C.int(y0), C.int(x1), C.int(y1),
		(*C.uchar)(unsafe.Pointer(&sc.region[0])), C.int(stride), &ax0) != 0 {
		return fail()
	}
	kx.shift(int(ax0))
	ky.shift(y0)
	resample(sc.region, stride, kx, ky, rows, flip, out)
	return nil
}

// dctScale is the scale (n/8) a JPEG's box is decoded at for an ow x oh
// output: the smallest that keeps at least ow x oh pixels in the box, so
// the resample still only reduces.
func dctScale(b box, ow, oh int) int {
	for _, n := range dctScales {
		if (b.x1-b.x0)*float64(n)/8 >= float64(ow) && (b.y1-b.y0)*float64(n)/8 >= float64(oh) {
			return n
		}
	}
	return 8
}

// resample is resampleGo in C (jpeg_turbo.c's rf_resample, SIMD): the
// same arithmetic, so the same bytes.
func resample(src []byte, ss int, kx, ky kernel, rows int, flip bool, out []byte) {
	ow, oh := len(kx.first), len(ky.first)
	sc := getScratch()
	defer putScratch(sc)
	sc.tmp = grown(sc.tmp, rows*ow*3+1) // SIMD writes a byte past the last pixel
	sc.acc = grown(sc.acc, ow*3)
	C.rf_resample((*C.uchar)(unsafe.Pointer(&src[0])), C.int(ss),
		C.int(ow), ints(kx.first), ints(kx.taps), ints(kx.w), C.int(kx.k),
		C.int(oh), ints(ky.first), ints(ky.taps), ints(ky.w), C.int(ky.k), C.int(rows), cbool(flip),
		(*C.uchar)(unsafe.Pointer(&out[0])), (*C.uchar)(unsafe.Pointer(&sc.tmp[0])), ints(sc.acc))
}

// decodeRGB decodes a whole image to packed RGB (with a byte to spare
// after it, for SIMD): JPEGs with libjpeg-turbo at full scale, other
// images with Go's decoders.
func decodeRGB(m *Memory, raw []byte) (pix []byte, w, h int, err error) {
	d, w, h, err := openJPEG(raw)
	if err != nil || d == nil {
		if err == nil {
			return decodeRGBGo(m, raw)
		}
		return nil, 0, 0, err
	}
	defer C.rf_free(d)
	release, err := takeTurbo(m, d, raw, int64(w)*int64(h)*3+1)
	if err != nil {
		return nil, 0, 0, err
	}
	defer release()
	pix = make([]byte, w*h*3+1)
	var ax0 C.int
	if C.rf_region(d, 8, 0, 0, C.int(w), C.int(h), (*C.uchar)(unsafe.Pointer(&pix[0])), C.int(w*3), &ax0) != 0 {
		return nil, 0, 0, libjpegError(d)
	}
	return pix, w, h, nil
}

// openJPEG reads raw's JPEG header into a new decoder (the caller frees
// it) and checks the size it claims. A nil decoder with no error says
// raw is for Go's decoders: not a JPEG, or a CMYK one (which libjpeg does
// not convert to RGB).
func openJPEG(raw []byte) (d *C.rf_dec, w, h int, err error) {
	if len(raw) < 3 || raw[0] != 0xff || raw[1] != 0xd8 {
		return nil, 0, 0, nil
	}
	if !ended(raw) {
		// Only a box's rows are decoded: a file cut below them would pass
		// unnoticed, where Pillow (and a whole decode) refuses it.
		return nil, 0, 0, errors.New("image: JPEG without its end marker (FF D9): the file is truncated")
	}
	if d = C.rf_new(); d == nil {
		return nil, 0, 0, errors.New("image: libjpeg: out of memory")
	}
	var cw, ch, cmyk C.int
	if C.rf_header(d, (*C.uchar)(unsafe.Pointer(&raw[0])), C.ulong(len(raw)), &cw, &ch, &cmyk) != 0 {
		err = libjpegError(d)
	} else if cmyk == 0 {
		err = checkSize(int(cw), int(ch))
	}
	if err != nil || cmyk != 0 {
		C.rf_free(d)
		return nil, 0, 0, err
	}
	return d, int(cw), int(ch), nil
}

// takeTurbo charges m a decode by d of raw into out bytes of Go's (the
// region, the resample's rows): those, and libjpeg's own, which it is held
// to (max_memory_to_use: a progressive JPEG's coefficients, kept whole
// while it is decoded, two bytes a sample, past which it fails rather
// than allocate), with room for its row buffers.
func takeTurbo(m *Memory, d *C.rf_dec, raw []byte, out int64) (func(), error) {
	hd, err := jpegHeader(raw)
	if err != nil {
		return nil, err
	}
	own := 128*int64(hd.w)*int64(hd.comps) + 1<<20
	if hd.progressive {
		own += 2 * hd.samples()
	}
	C.rf_limit(d, C.long(own))
	return m.take(out+own, hd.what())
}

func libjpegError(d *C.rf_dec) error {
	return fmt.Errorf("image: libjpeg: %s", C.GoString(C.rf_msg(d)))
}

// ended says whether a JPEG has its end-of-image marker near its end
// (writers may leave padding after it).
func ended(raw []byte) bool {
	tail := raw[max(0, len(raw)-4096):]
	for i := len(tail) - 2; i >= 0; i-- {
		if tail[i] == 0xff && tail[i+1] == 0xd9 {
			return true
		}
	}
	return false
}

// edgeMargin is the pixels decoded around a region beyond its kernels' reach.
const edgeMargin = 16

func ints(s []int32) *C.int { return (*C.int)(unsafe.Pointer(&s[0])) }

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
