package transform

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image"
	"image/draw"
	_ "image/png" // PNG records decode too
	"math"
	"math/bits"
	"sync"
)

func init() {
	Register(Entry{
		Name: "image", Version: 2,
		Params: map[string]string{"size": "256", "crop": "224"},
		Doc: "decode a JPEG or PNG, resize its shorter side to size and crop the center crop x crop, as torchvision's " +
			"Resize(size) and CenterCrop(crop) on a PIL image (antialiased bilinear): uint8 height x width x RGB",
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
			return &centerCrop{size: size, crop: crop}, nil
		},
	})
	Register(Entry{
		Name: "random_resized_crop", Version: 1,
		Params: map[string]string{"size": "224", "min_scale": "0.08", "max_scale": "1", "min_ratio": "0.75",
			"max_ratio": "1.3333333333333333", "flip": "0.5"},
		Doc: "decode a JPEG or PNG, take a random box and resize it to size x size, mirrored with probability flip, " +
			"as torchvision's RandomResizedCrop(size, scale=(min_scale, max_scale), ratio=(min_ratio, max_ratio)) " +
			"and RandomHorizontalFlip(flip): uint8 height x width x RGB. The box and the flip are a function of the " +
			"job's seed, the epoch and the record, so a resumed or shared job sees the same crops",
		New: func(s Spec) (Transform, error) {
			size, err := s.Int("size", 224, 1, 8192)
			if err != nil {
				return nil, err
			}
			t := &randomCrop{size: size}
			for _, p := range []struct {
				key    string
				v      *float64
				lo, hi float64
			}{{"min_scale", &t.scale[0], 0, 1}, {"max_scale", &t.scale[1], 0, 1}, {"min_ratio", &t.ratio[0], 1e-3, 1e3},
				{"max_ratio", &t.ratio[1], 1e-3, 1e3}, {"flip", &t.flip, 0, 1}} {
				if *p.v, err = s.Float(p.key, p.lo, p.hi); err != nil {
					return nil, err
				}
			}
			if t.scale[0] > t.scale[1] || t.ratio[0] > t.ratio[1] || t.scale[1] == 0 {
				return nil, fmt.Errorf("transform random_resized_crop: scale [%g, %g] and ratio [%g, %g] must each "+
					"be an interval, and the scale not empty", t.scale[0], t.scale[1], t.ratio[0], t.ratio[1])
			}
			return t, nil
		},
	})
}

// box is the part of a source image that becomes an output, in the
// source's pixels (fractional: a resize maps pixel edges, not centres),
// and the image the resize acts on: the whole source, or (crop) the box
// itself, cut out first as torchvision's crops are.
type box struct {
	x0, y0, x1, y1 float64
	crop           bool
}

// A picker chooses the box of an image of w x h pixels, and whether the
// output is mirrored left to right.
type picker func(w, h int) (b box, flip bool)

// centerCrop is torchvision's Resize(size) then CenterCrop(crop): the
// crop's box in the source is where the crop lands in the resized image,
// so only that box is decoded and resampled, and with the resize's own
// scale on each axis, to the same pixels.
type centerCrop struct {
	size, crop int
	mem        *Memory // decodes charge their memory here (memory.go)
}

func (t *centerCrop) Size() int { return t.crop * t.crop * 3 }

func (t *centerCrop) Shape() (string, []int) { return "|u1", []int{t.crop, t.crop, 3} }

func (t *centerCrop) Apply(raw, out []byte) error {
	return render(t.mem, raw, t.box, t.crop, t.crop, out)
}

// box follows torchvision 0.14's Resize (the shorter side becomes size,
// the longer int(size * long / short)) and CenterCrop (the offset
// int(round((side - crop) / 2)), Python's round: half to even).
func (t *centerCrop) box(w, h int) (box, bool) {
	rw, rh := t.size, t.size
	if w <= h {
		rh = int(float64(t.size) * float64(h) / float64(w))
	} else {
		rw = int(float64(t.size) * float64(w) / float64(h))
	}
	left := math.RoundToEven(float64(rw-t.crop) / 2)
	top := math.RoundToEven(float64(rh-t.crop) / 2)
	sx, sy := float64(w)/float64(rw), float64(h)/float64(rh)
	return box{left * sx, top * sy, (left + float64(t.crop)) * sx, (top + float64(t.crop)) * sy, false}, false
}

// randomCrop is torchvision's RandomResizedCrop then RandomHorizontalFlip,
// drawing from a generator seeded by the record's draw instead of torch's
// global one.
type randomCrop struct {
	size         int
	scale, ratio [2]float64
	flip         float64
	mem          *Memory // decodes charge their memory here (memory.go)
}

func (t *randomCrop) Size() int { return t.size * t.size * 3 }

func (t *randomCrop) Shape() (string, []int) { return "|u1", []int{t.size, t.size, 3} }

// Apply is the output of draw 0; a loader calls ApplyRandom.
func (t *randomCrop) Apply(raw, out []byte) error { return t.ApplyRandom(raw, out, 0) }

func (t *randomCrop) ApplyRandom(raw, out []byte, draw uint64) error {
	return render(t.mem, raw, func(w, h int) (box, bool) { return t.Box(draw, w, h) }, t.size, t.size, out)
}

// Decode is raw decoded whole, as packed RGB with its size after it (and
// whether its box could be shrunk while decoding, for a JPEG).
func (t *randomCrop) Decode(raw []byte) ([]byte, error) {
	pix, w, h, err := decodeRGB(t.mem, raw)
	if err != nil {
		return nil, err
	}
	wf := uint32(w)
	if len(raw) > 2 && raw[0] == 0xff && raw[1] == 0xd8 {
		wf |= 1 << 31
	}
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(pix, wf), uint32(h)), nil
}

// FromDecoded cuts draw's box from a decoded image: the bytes ApplyRandom
// gives, unless the box is one render would decode shrunk.
func (t *randomCrop) FromDecoded(dec, out []byte, draw uint64) (bool, error) {
	if len(dec) < 9 {
		return false, fmt.Errorf("image: a decoded form of %d bytes", len(dec))
	}
	wf, h := binary.LittleEndian.Uint32(dec[len(dec)-8:]), int(binary.LittleEndian.Uint32(dec[len(dec)-4:]))
	w := int(wf &^ (1 << 31))
	if len(dec) != w*h*3+9 {
		return false, fmt.Errorf("image: a decoded form of %d bytes for %dx%d pixels", len(dec), w, h)
	}
	b, flip := t.Box(draw, w, h)
	if wf>>31 != 0 && dctScale(b, t.size, t.size) < 8 {
		return false, nil
	}
	kx, ky, x0, y0, _, y1 := layout(b, 1, w, h, t.size, t.size)
	kx.shift(x0)
	ky.shift(y0)
	resample(dec[(y0*w+x0)*3:], w*3, kx, ky, y1-y0, flip, out)
	return true, nil
}

// Box is the crop of draw on an image of w x h pixels, and its flip:
// torchvision 0.14's RandomResizedCrop.get_params, ten tries at a box of a
// random area and log-uniform aspect ratio inside the image, else the
// centre box of the nearest allowed ratio; then the flip with probability
// flip.
func (t *randomCrop) Box(draw uint64, w, h int) (box, bool) {
	r := rng{draw}
	area := float64(w * h)
	lr0, lr1 := math.Log(t.ratio[0]), math.Log(t.ratio[1])
	var b box
	found := false
	for range 10 {
		target := area * (t.scale[0] + r.float()*(t.scale[1]-t.scale[0]))
		aspect := math.Exp(lr0 + r.float()*(lr1-lr0))
		cw := int(math.RoundToEven(math.Sqrt(target * aspect)))
		ch := int(math.RoundToEven(math.Sqrt(target / aspect)))
		if 0 < cw && cw <= w && 0 < ch && ch <= h {
			i, j := r.intn(h-ch+1), r.intn(w-cw+1)
			b, found = box{float64(j), float64(i), float64(j + cw), float64(i + ch), true}, true
			break
		}
	}
	if !found {
		cw, ch := w, h
		switch in := float64(w) / float64(h); {
		case in < t.ratio[0]:
			ch = int(math.RoundToEven(float64(cw) / t.ratio[0]))
		case in > t.ratio[1]:
			cw = int(math.RoundToEven(float64(ch) * t.ratio[1]))
		}
		i, j := (h-ch)/2, (w-cw)/2
		b = box{float64(j), float64(i), float64(j + cw), float64(i + ch), true}
	}
	return b, r.float() < t.flip
}

// rng is splitmix64: a draw seeds a short stream of its own, so each
// record's crop is independent of every other's and of the order records
// are transformed in.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	z := r.s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// float is uniform in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

// intn is uniform in [0, n), n > 0 (Lemire's multiply, whose bias at image
// sizes is below 2^-40).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.next(), uint64(n))
	return int(hi)
}

// layout places box b of an image of w x h pixels, decoded at scale f into
// sw x sh pixels, onto ow x oh: the kernels of both axes, and the region
// of the decoded image they read.
func layout(b box, f float64, sw, sh, ow, oh int) (kx, ky kernel, x0, y0, x1, y1 int) {
	lx, hx, ly, hy := 0, sw, 0, sh
	if b.crop {
		// The crop's pixels at scale f: exact at f = 1, the nearest whole
		// pixels of a shrunk decode otherwise.
		lx, hx = int(math.Round(b.x0*f)), min(int(math.Round(b.x1*f)), sw)
		ly, hy = int(math.Round(b.y0*f)), min(int(math.Round(b.y1*f)), sh)
	}
	kx = newKernel(b.x0*f, b.x1*f, lx, hx, ow)
	ky = newKernel(b.y0*f, b.y1*f, ly, hy, oh)
	x0, x1 = kx.span()
	y0, y1 = ky.span()
	return
}

// scratch is one render's working memory, reused.
type scratch struct {
	region, tmp []byte
	acc         []int32
}

var scratches = sync.Pool{New: func() any { return new(scratch) }}

func grown[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// getScratch takes a scratch from the pool; putScratch gives it back,
// keeping only small buffers (keepScratch).
func getScratch() *scratch { return scratches.Get().(*scratch) }

func putScratch(sc *scratch) {
	sc.trim()
	scratches.Put(sc)
}

// renderGo renders with Go's decoders: the whole image is decoded, and
// only the region the kernels read is converted to RGB.
func renderGo(m *Memory, raw []byte, pick picker, ow, oh int, out []byte) error {
	release, err := takeGo(m, raw)
	if err != nil {
		return err
	}
	defer release()
	src, err := decodeGo(raw)
	if err != nil {
		return err
	}
	bd := src.Bounds()
	w, h := bd.Dx(), bd.Dy()
	b, flip := pick(w, h)
	kx, ky, x0, y0, x1, y1 := layout(b, 1, w, h, ow, oh)
	sc := getScratch()
	defer putScratch(sc)
	sc.region = rgbOf(src, image.Rect(x0, y0, x1, y1), sc.region)
	kx.shift(x0)
	ky.shift(y0)
	resample(sc.region, (x1-x0)*3, kx, ky, y1-y0, flip, out)
	return nil
}

// rgbOf is r of img (in its own coordinates from 0) as packed RGB in buf,
// grown as needed, with a byte to spare after it (for SIMD).
func rgbOf(img image.Image, r image.Rectangle, buf []byte) []byte {
	rw, rh := r.Dx(), r.Dy()
	rgba := image.NewRGBA(image.Rect(0, 0, rw, rh))
	draw.Draw(rgba, rgba.Rect, img, img.Bounds().Min.Add(r.Min), draw.Src)
	buf = grown(buf, rw*rh*3+1)
	for i, j := 0, 0; i < len(rgba.Pix); i, j = i+4, j+3 {
		buf[j], buf[j+1], buf[j+2] = rgba.Pix[i], rgba.Pix[i+1], rgba.Pix[i+2]
	}
	return buf
}

// takeGo charges m the memory Go's decoders take for raw, after checking
// the size its header claims.
func takeGo(m *Memory, raw []byte) (func(), error) {
	hd, err := readHeader(raw)
	if err != nil {
		return nil, err
	}
	if hd.format == "" {
		cfg, format, err := image.DecodeConfig(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		hd = header{format: format, w: cfg.Width, h: cfg.Height}
	}
	if err := checkSize(hd.w, hd.h); err != nil {
		return nil, err
	}
	return m.take(hd.goCost(), hd.what())
}

// decodeRGBGo decodes a whole image to packed RGB with Go's decoders.
func decodeRGBGo(m *Memory, raw []byte) ([]byte, int, int, error) {
	release, err := takeGo(m, raw)
	if err != nil {
		return nil, 0, 0, err
	}
	defer release()
	img, err := decodeGo(raw)
	if err != nil {
		return nil, 0, 0, err
	}
	b := img.Bounds()
	return rgbOf(img, image.Rect(0, 0, b.Dx(), b.Dy()), nil), b.Dx(), b.Dy(), nil
}

// DecodeFull decodes a whole image to RGB at full size, one thread, as a
// plain decode does (libjpeg-turbo in turbojpeg builds): the baseline the
// image transforms are measured against. It returns the image's size.
func DecodeFull(raw []byte) (w, h int, err error) {
	_, w, h, err = decodeRGB(nil, raw)
	return w, h, err
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
		return nil, fmt.Errorf("image: %w", err)
	}
	if err := checkSize(cfg.Width, cfg.Height); err != nil {
		return nil, err
	}
	img, _, err := image.Decode(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return img, nil
}

// Crop is where an image transform takes its output from: a box of the
// source image, in its pixels, and whether the output is mirrored.
type Crop struct {
	Width  int     `json:"width"` // the source image's size
	Height int     `json:"height"`
	X0     float64 `json:"x0"`
	Y0     float64 `json:"y0"`
	X1     float64 `json:"x1"`
	Y1     float64 `json:"y1"`
	Flip   bool    `json:"flip"`
}

// CropOf says where t takes raw's output from for draw (ignored by a
// transform that does not draw); false if t is not an image transform.
func CropOf(t Transform, raw []byte, draw uint64) (Crop, bool, error) {
	var pick picker
	switch t := t.(type) {
	case *centerCrop:
		pick = t.box
	case *randomCrop:
		pick = func(w, h int) (box, bool) { return t.Box(draw, w, h) }
	default:
		return Crop{}, false, nil
	}
	cfg, _, err := image.DecodeConfig(bytes.NewReader(raw))
	if err != nil {
		return Crop{}, true, fmt.Errorf("image: %w", err)
	}
	b, flip := pick(cfg.Width, cfg.Height)
	return Crop{Width: cfg.Width, Height: cfg.Height, X0: b.x0, Y0: b.y0, X1: b.x1, Y1: b.y1, Flip: flip}, true, nil
}
