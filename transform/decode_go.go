//go:build !turbojpeg

package transform

import (
	"image"
	_ "image/jpeg"
)

// Decoder names the image decoder this build uses.
const Decoder = "go"

func decodeImage(raw []byte) (image.Image, error) { return decodeGo(raw) }
