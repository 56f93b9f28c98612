package transform

import "math"

// Resampling as Pillow does it, which is what torchvision's Resize and
// RandomResizedCrop run on a PIL image (antialias always on): a separable
// triangle filter whose support widens with the reduction, so every source
// pixel under an output pixel counts, in fixed point with 22 fraction bits,
// a horizontal pass into 8-bit rows and then a vertical pass. Computing the
// same weights with the same rounding is what lets riffle's output equal
// torchvision's, not just look like it (Pillow's src/libImaging/Resample.c:
// precompute_coeffs, normalize_coeffs_8bpc, ImagingResampleHorizontal_8bpc).

// precisionBits is Pillow's fixed-point precision for 8-bit images.
const precisionBits = 32 - 8 - 2

// kernel is one axis's weights: output pixel i takes source pixels
// first[i] .. first[i]+taps[i]-1 with weights w[i*k : i*k+taps[i]].
type kernel struct {
	first, taps []int32
	w           []int32
	k           int
}

// newKernel weighs the source span [in0, in1) onto outSize pixels, for a
// resize of the image of source pixels [lo, hi): the pixels it may read
// (torchvision resizes the whole image for Resize, and only the crop for
// RandomResizedCrop, whose edges then take no pixels from outside it).
// The arithmetic is Pillow's on that image, in its own coordinates.
func newKernel(in0, in1 float64, lo, hi, outSize int) kernel {
	scale := (in1 - in0) / float64(outSize)
	fscale := max(scale, 1)
	support := fscale // the triangle's support is 1
	k := int(math.Ceil(support))*2 + 1
	kn := kernel{first: make([]int32, outSize), taps: make([]int32, outSize), w: make([]int32, outSize*k), k: k}
	pre := make([]float64, k)
	inSize := hi - lo
	for i := range outSize {
		center := in0 - float64(lo) + (float64(i)+0.5)*scale
		xmin := max(int(center-support+0.5), 0)
		n := min(int(center+support+0.5), inSize) - xmin
		total := 0.0
		for x := range n {
			d := math.Abs((float64(x+xmin) - center + 0.5) / fscale)
			w := 0.0
			if d < 1 {
				w = 1 - d
			}
			pre[x] = w
			total += w
		}
		ws := kn.w[i*k : i*k+k]
		for x := range n {
			v := pre[x]
			if total != 0 {
				v /= total
			}
			if v < 0 {
				ws[x] = int32(-0.5 + v*(1<<precisionBits))
			} else {
				ws[x] = int32(0.5 + v*(1<<precisionBits))
			}
		}
		kn.first[i], kn.taps[i] = int32(lo+xmin), int32(max(n, 0))
	}
	return kn
}

// span is the source pixels the kernel reads: [lo, hi).
func (kn kernel) span() (lo, hi int) {
	lo, hi = math.MaxInt, 0
	for i, f := range kn.first {
		if kn.taps[i] > 0 {
			lo, hi = min(lo, int(f)), max(hi, int(f+kn.taps[i]))
		}
	}
	if lo > hi {
		return 0, 0
	}
	return lo, hi
}

// shift moves the kernel's source positions d pixels to the left, for a
// source that starts d pixels into the axis.
func (kn kernel) shift(d int) {
	for i := range kn.first {
		kn.first[i] -= int32(d)
	}
}

func clip8(v int32) byte {
	v >>= precisionBits
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return byte(v)
}

// resampleGo scales the RGB rows src (rows of stride ss) through kx then
// ky into out (packed RGB, len(kx.first) x len(ky.first)), mirrored left
// to right if flip. The kernels read source rows [0, rows); tmp holds the
// horizontal pass of each. It is the reference the C path (turbojpeg
// builds) is tested against, and the path of builds without it.
func resampleGo(src []byte, ss int, kx, ky kernel, rows int, flip bool, out, tmp []byte) {
	ow, oh := len(kx.first), len(ky.first)
	ts := ow * 3
	half := int32(1) << (precisionBits - 1)
	for y := range rows {
		row := src[y*ss:]
		t := tmp[y*ts:]
		for x := range ow {
			f, n := int(kx.first[x]), int(kx.taps[x])
			w := kx.w[x*kx.k:]
			r, g, b := half, half, half
			for i := range n {
				p := row[(f+i)*3:]
				r += int32(p[0]) * w[i]
				g += int32(p[1]) * w[i]
				b += int32(p[2]) * w[i]
			}
			t[x*3], t[x*3+1], t[x*3+2] = clip8(r), clip8(g), clip8(b)
		}
	}
	for y := range oh {
		f, n := int(ky.first[y]), int(ky.taps[y])
		w := ky.w[y*ky.k:]
		o := out[y*ts : (y+1)*ts]
		for x := range ts {
			v := half
			for i := range n {
				v += int32(tmp[(f+i)*ts+x]) * w[i]
			}
			o[x] = clip8(v)
		}
		if flip {
			mirror(o)
		}
	}
}

// mirror reverses a packed RGB row's pixels.
func mirror(row []byte) {
	for i, j := 0, len(row)-3; i < j; i, j = i+3, j-3 {
		row[i], row[j] = row[j], row[i]
		row[i+1], row[j+1] = row[j+1], row[i+1]
		row[i+2], row[j+2] = row[j+2], row[i+2]
	}
}
