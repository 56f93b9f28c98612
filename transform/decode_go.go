//go:build !turbojpeg

package transform

// Decoder names the image decoder this build uses.
const Decoder = "go"

// render decodes raw, its memory charged to m, takes the box pick chooses
// and resamples it to ow x oh packed RGB in out.
func render(m *Memory, raw []byte, pick picker, ow, oh int, out []byte) error {
	return renderGo(m, raw, pick, ow, oh, out)
}

// dctScale is 8 (no DCT scaling): Go's decoder decodes whole images.
func dctScale(box, int, int) int { return 8 }

// resample is resampleGo.
func resample(src []byte, ss int, kx, ky kernel, rows int, flip bool, out []byte) {
	sc := getScratch()
	defer putScratch(sc)
	sc.tmp = grown(sc.tmp, rows*len(kx.first)*3)
	resampleGo(src, ss, kx, ky, rows, flip, out, sc.tmp)
}

// decodeRGB decodes a whole image to packed RGB with Go's decoders, its
// memory charged to m.
func decodeRGB(m *Memory, raw []byte) (pix []byte, w, h int, err error) { return decodeRGBGo(m, raw) }
