package transform

import (
	"bytes"
	"fmt"
	"image"
	_ "image/png" // PNG records decode too
	"sync"
	"sync/atomic"

	"golang.org/x/image/draw"
)

func init() {
	Register(Entry{
		Name: "image", Version: 1,
		Params: map[string]string{"size": "256", "crop": "224"},
		Doc: "decode a JPEG or PNG, resize its shorter side to size (bilinear) and crop the center crop x crop: " +
			"uint8 height x width x RGB, the deterministic part of an ImageNet pipeline (random crops and flips stay in each job)",
		New: func(s Spec) (Transform, error) {
			size, err := s.Int("size", 256, 1, 8192)
			if err != nil {
				return nil, err
			}
			crop, err := s.Int("crop", 224, 1, 8192)
			if err != nil {
				return nil, err
			}
			if crop > size {
				return nil, fmt.Errorf("transform image: crop %d is larger than size %d", crop, size)
			}
			return &resizeCrop{size: size, crop: crop}, nil
		},
	})
}

// resizeCrop decodes an image, scales it so its shorter side is size and
// keeps the center crop x crop, as torchvision's Resize(size) then
// CenterCrop(crop). Only the source region that lands in the crop is
// scaled. Decoding is decodeImage: the pure-Go decoder, or libjpeg-turbo
// in a build with the turbojpeg tag.
type resizeCrop struct {
	size, crop int
	bufs       sync.Pool
}

func (t *resizeCrop) Size() int { return t.crop * t.crop * 3 }

func (t *resizeCrop) Shape() (string, []int) { return "|u1", []int{t.crop, t.crop, 3} }

func (t *resizeCrop) Apply(raw, out []byte) error {
	src, err := decodeImage(raw)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	if w == 0 || h == 0 {
		return fmt.Errorf("image: empty (%dx%d)", w, h)
	}
	// The scale that makes the shorter side size, and the source rectangle
	// that becomes the center crop.
	scale := float64(t.size) / float64(min(w, h))
	sw, sh := float64(t.crop)/scale, float64(t.crop)/scale
	x0 := float64(b.Min.X) + (float64(w)-sw)/2
	y0 := float64(b.Min.Y) + (float64(h)-sh)/2
	r := image.Rect(int(x0+0.5), int(y0+0.5), int(x0+sw+0.5), int(y0+sh+0.5)).Intersect(b)
	dst, _ := t.bufs.Get().(*image.RGBA)
	if dst == nil {
		dst = image.NewRGBA(image.Rect(0, 0, t.crop, t.crop))
	}
	defer t.bufs.Put(dst)
	scalerFor(t.crop, r.Dx(), r.Dy()).Scale(dst, dst.Rect, src, r, draw.Src, nil)
	// RGBA to packed RGB (HWC).
	p := dst.Pix
	for i, j := 0, 0; j+3 <= len(out); i, j = i+4, j+3 {
		out[j], out[j+1], out[j+2] = p[i], p[i+1], p[i+2]
	}
	return nil
}

// scalers keeps the bilinear scaler of each source size, up to maxScalers
// sizes: its kernel weights are computed once (most images of a dataset
// share a few sizes).
var (
	scalers  sync.Map
	nScalers atomic.Int64
)

const maxScalers = 4096

type scaleKey struct{ crop, w, h int }

func scalerFor(crop, w, h int) draw.Scaler {
	k := scaleKey{crop, w, h}
	if s, ok := scalers.Load(k); ok {
		return s.(draw.Scaler)
	}
	s := draw.BiLinear.NewScaler(crop, crop, w, h)
	if nScalers.Add(1) <= maxScalers {
		scalers.Store(k, s)
	}
	return s
}

// maxPixels bounds an image's decoded size (512 MiB as RGBA): a few bytes
// of header may claim any size, and a record must not take the daemon's
// memory with it.
const maxPixels = 1 << 27

// checkSize refuses empty images and those past maxPixels.
func checkSize(w, h int) error {
	if w <= 0 || h <= 0 {
		return fmt.Errorf("image: %dx%d pixels, empty", w, h)
	}
	if int64(w)*int64(h) > maxPixels {
		return fmt.Errorf("image: %dx%d pixels, more than the %d a record may decode to", w, h, maxPixels)
	}
	return nil
}

// decodeGo decodes with Go's image decoders, after checking the size the
// header claims.
func decodeGo(raw []byte) (image.Image, error) {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if err := checkSize(cfg.Width, cfg.Height); err != nil {
		return nil, err
	}
	img, _, err := image.Decode(bytes.NewReader(raw))
	return img, err
}
