//go:build turbojpeg

package transform

/*
#cgo LDFLAGS: -lturbojpeg
#include <stdlib.h>
#include <turbojpeg.h>
*/
import "C"

import (
	"errors"
	"image"
	_ "image/jpeg"
	"unsafe"
)

// Decoder names the image decoder this build uses.
const Decoder = "libjpeg-turbo"

// decodeImage decodes JPEGs with libjpeg-turbo straight to RGBA, and
// anything else with Go's decoders.
func decodeImage(raw []byte) (image.Image, error) {
	if len(raw) < 3 || raw[0] != 0xff || raw[1] != 0xd8 {
		return decodeGo(raw)
	}
	h := C.tjInitDecompress()
	if h == nil {
		return nil, errors.New("libjpeg-turbo: cannot start a decompressor")
	}
	defer C.tjDestroy(h)
	var w, ht, sub, cs C.int
	src := (*C.uchar)(unsafe.Pointer(&raw[0]))
	if C.tjDecompressHeader3(h, src, C.ulong(len(raw)), &w, &ht, &sub, &cs) != 0 {
		return nil, errors.New("libjpeg-turbo: " + C.GoString(C.tjGetErrorStr2(h)))
	}
	if err := checkSize(int(w), int(ht)); err != nil {
		return nil, err
	}
	img := image.NewRGBA(image.Rect(0, 0, int(w), int(ht)))
	if C.tjDecompress2(h, src, C.ulong(len(raw)), (*C.uchar)(unsafe.Pointer(&img.Pix[0])), w, C.int(img.Stride), ht,
		C.TJPF_RGBA, C.TJFLAG_FASTDCT) != 0 {
		return nil, errors.New("libjpeg-turbo: " + C.GoString(C.tjGetErrorStr2(h)))
	}
	return img, nil
}
