//go:build !turbojpeg

package transform

// Decoder names the image decoder this build uses.
const Decoder = "go"

// render decodes raw, takes the box pick chooses and resamples it to
// ow x oh packed RGB in out.
func render(raw []byte, pick picker, ow, oh int, out []byte) error {
	return renderGo(raw, pick, ow, oh, out)
}

// DecodeFull decodes a whole image with Go's decoders, one thread: the
// baseline the image transforms are measured against. It returns the
// image's size.
func DecodeFull(raw []byte) (w, h int, err error) {
	img, err := decodeGo(raw)
	if err != nil {
		return 0, 0, err
	}
	return img.Bounds().Dx(), img.Bounds().Dy(), nil
}
