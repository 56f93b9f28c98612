package transform

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/riffle-ml/riffle/libsvm"
)

func TestParse(t *testing.T) {
	sp, e, err := Parse("image:crop=128,size=160")
	if err != nil || e.Name != "image" || sp.String() != "image:crop=128,size=160" {
		t.Fatalf("parse: %v %v %v", sp, e, err)
	}
	if sp, _, _ := Parse("image"); sp.String() != "image:crop=224,size=256" {
		t.Fatalf("defaults: %s", sp)
	}
	for _, bad := range []string{"nope", "image:size", "image:colour=red", "image:size=x", "image:size=100,crop=200", "libsvm_dense"} {
		if _, _, err := New(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, key, _ := New("libsvm_dense:n_features=3"); key != "libsvm_dense:n_features=3,zero_based=false@v1" {
		t.Fatalf("key %q", key)
	}
}

func floats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func TestLibsvmDense(t *testing.T) {
	tf, _, err := New("libsvm_dense:n_features=4")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, tf.Size())
	if err := tf.Apply([]byte("-1 1:0.5 4:2 # c"), out); err != nil {
		t.Fatal(err)
	}
	if got := floats(out); got[0] != -1 || got[1] != 0.5 || got[2] != 0 || got[4] != 2 {
		t.Fatalf("dense %v", got)
	}
	for _, bad := range []string{"1 5:1", "1 0:1", "x 1:1", "1 2:1 1:1", ""} {
		if err := tf.Apply([]byte(bad), out); !errors.Is(err, libsvm.ErrSyntax) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func encode(t testing.TB, img image.Image, format string) []byte {
	var b bytes.Buffer
	var err error
	if format == "png" {
		err = png.Encode(&b, img)
	} else {
		err = jpeg.Encode(&b, img, &jpeg.Options{Quality: 90})
	}
	if err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A flat image stays flat, and the crop is the center of the resized
// image: a picture with a red left half and a blue right half keeps the
// split in the middle of the crop.
func TestImageResizeCrop(t *testing.T) {
	tf, _, err := New("image:size=64,crop=32")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, tf.Size())
	img := image.NewRGBA(image.Rect(0, 0, 200, 100))
	for y := range 100 {
		for x := range 200 {
			c := color.RGBA{200, 0, 0, 255}
			if x >= 100 {
				c = color.RGBA{0, 0, 200, 255}
			}
			img.Set(x, y, c)
		}
	}
	for _, format := range []string{"png", "jpeg"} {
		if err := tf.Apply(encode(t, img, format), out); err != nil {
			t.Fatal(err)
		}
		px := func(x, y int) []byte { return out[3*(y*32+x) : 3*(y*32+x)+3] }
		tol := 2
		if format == "jpeg" {
			tol = 40
		}
		near := func(p []byte, r, g, b int) bool {
			return abs(int(p[0])-r) <= tol && abs(int(p[1])-g) <= tol && abs(int(p[2])-b) <= tol
		}
		if !near(px(2, 16), 200, 0, 0) || !near(px(29, 16), 0, 0, 200) {
			t.Fatalf("%s: left %v right %v", format, px(2, 16), px(29, 16))
		}
	}
	if err := tf.Apply([]byte("not an image"), out); err == nil {
		t.Fatal("garbage decoded")
	}
}

// A truncated JPEG is an error in both transforms and both decoders, never
// an image padded with grey (libjpeg's warning, which its callers often
// ignore).
func TestTruncatedJPEG(t *testing.T) {
	raw := encode(t, photo(300, 200, 3), "jpeg")
	for _, spec := range []string{"image:size=64,crop=64", "random_resized_crop:size=64"} {
		tf, _, err := New(spec)
		if err != nil {
			t.Fatal(err)
		}
		out := make([]byte, tf.Size())
		if err := tf.Apply(raw, out); err != nil {
			t.Fatalf("%s: whole file: %v", spec, err)
		}
		if err := tf.Apply(raw[:len(raw)/2], out); err == nil {
			t.Errorf("%s (%s): half a JPEG decoded", spec, Decoder)
		}
	}
}

// The resample is Pillow's arithmetic: a flat image stays exactly flat at
// any scale, and a box the output's size with no scaling is a copy.
func TestResampleExact(t *testing.T) {
	w, h := 97, 61
	src := make([]byte, w*h*3)
	for i := range src {
		src[i] = byte(i * 7)
	}
	// Identity: the box at whole pixels, the output its size.
	kx, ky := newKernel(10, 50, 0, w, 40), newKernel(5, 35, 0, h, 30)
	kx.shift(0)
	out, tmp := make([]byte, 40*30*3), make([]byte, h*40*3)
	resampleGo(src, w*3, kx, ky, h, false, out, tmp)
	for y := range 30 {
		for x := range 40 * 3 {
			if out[y*120+x] != src[(y+5)*w*3+30+x] {
				t.Fatalf("identity resample: (%d, %d) is %d, want %d", x/3, y, out[y*120+x], src[(y+5)*w*3+30+x])
			}
		}
	}
	// Flat: every output pixel is the colour, at any reduction.
	for i := range src {
		src[i] = []byte{200, 17, 90}[i%3]
	}
	kx, ky = newKernel(3.3, 90.1, 0, w, 13), newKernel(0, 61, 0, h, 7)
	out, tmp = make([]byte, 13*7*3), make([]byte, h*13*3)
	resampleGo(src, w*3, kx, ky, h, true, out, tmp)
	for i, v := range out {
		if v != []byte{200, 17, 90}[i%3] {
			t.Fatalf("flat image: byte %d is %d", i, v)
		}
	}
}

// The resample the build runs (C and SIMD with libjpeg-turbo) gives the
// reference's bytes, resampleGo's, for boxes shrunk 1 to 12 times and
// grown, at any offset and width (pairs, odd pixels, a row's last pixel
// under a tap), flipped or not.
func TestResampleSameAsGo(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 27))
	for c := range 400 {
		w, h := 1+r.IntN(300), 1+r.IntN(200)
		src := make([]byte, w*h*3+1) // the byte to spare the SIMD passes read
		for i := range src {
			src[i] = byte(r.UintN(256))
		}
		if c%4 == 0 { // saturated: the clip at both ends
			for i := range src {
				src[i] = []byte{0, 255}[r.IntN(2)]
			}
		}
		ow, oh := 1+r.IntN(min(3*w, 260)), 1+r.IntN(min(3*h, 100))
		x0 := r.Float64() * float64(w) * 0.5
		x1 := x0 + (float64(w)-x0)*(0.05+0.95*r.Float64())
		y0 := r.Float64() * float64(h) * 0.5
		y1 := y0 + (float64(h)-y0)*(0.05+0.95*r.Float64())
		kx, ky := newKernel(x0, x1, 0, w, ow), newKernel(y0, y1, 0, h, oh)
		flip := r.IntN(2) == 0
		want, got := make([]byte, ow*oh*3), make([]byte, ow*oh*3)
		resampleGo(src, w*3, kx, ky, h, flip, want, make([]byte, h*ow*3))
		resample(src, w*3, kx, ky, h, flip, got)
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("case %d: %dx%d box x [%.2f, %.2f) y [%.2f, %.2f) onto %dx%d (taps %d x %d), flip %v: byte %d (pixel %d, %d) is %d, want %d",
				c, w, h, x0, x1, y0, y1, ow, oh, kx.k, ky.k, flip, i, i/3%ow, i/3/ow, got[i], want[i])
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// A random crop cut from the decoded form is the bytes the record gives,
// for every draw (shrunk-decode boxes excepted, which it declines), in
// JPEG and PNG, so jobs that share a decode deliver what each alone would.
func TestRandomCropFromDecoded(t *testing.T) {
	tf, _, err := New("random_resized_crop:size=128")
	if err != nil {
		t.Fatal(err)
	}
	sh := tf.(Shared)
	for _, format := range []string{"jpeg", "png"} {
		raw := encode(t, photo(331, 247, 5), format)
		dec, err := sh.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		a, b := make([]byte, tf.Size()), make([]byte, tf.Size())
		cut := 0
		for draw := range uint64(200) {
			if err := sh.ApplyRandom(raw, a, draw); err != nil {
				t.Fatal(err)
			}
			ok, err := sh.FromDecoded(dec, b, draw)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				continue
			}
			cut++
			if !bytes.Equal(a, b) {
				t.Fatalf("%s (%s) draw %d: the decoded form's crop differs from the record's", format, Decoder, draw)
			}
		}
		if cut < 50 {
			t.Fatalf("%s: only %d of 200 draws cut from the decoded form", format, cut)
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// photo makes an image with detail at every scale, as a photograph has.
func photo(w, h int, seed uint64) image.Image {
	r := rand.New(rand.NewPCG(seed, 1))
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	fx, fy := r.Float64()*0.1, r.Float64()*0.1
	for y := range h {
		for x := range w {
			v := math.Sin(float64(x)*fx)*math.Cos(float64(y)*fy)*60 + float64(r.IntN(40))
			img.Set(x, y, color.RGBA{uint8(128 + v), uint8(100 + v/2), uint8(90 - v/3), 255})
		}
	}
	return img
}

// BenchmarkImage decodes, resizes and crops an ImageNet-sized JPEG (500x375,
// quality 90). Build with -tags turbojpeg to measure libjpeg-turbo.
func BenchmarkImage(b *testing.B) {
	raw := encode(b, photo(500, 375, 7), "jpeg")
	tf, _, _ := New("image")
	out := make([]byte, tf.Size())
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if err := tf.Apply(raw, out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "images/s")
	b.Logf("decoder %s", Decoder)
}

// BenchmarkRandomResizedCrop is the training pipeline's transform on the
// same image, a new draw each time; BenchmarkDecodeFull the full decode
// they are measured against.
func BenchmarkRandomResizedCrop(b *testing.B) {
	raw := encode(b, photo(500, 375, 7), "jpeg")
	tf, _, _ := New("random_resized_crop")
	r := tf.(Random)
	out := make([]byte, tf.Size())
	draw := uint64(0)
	for b.Loop() {
		draw++
		if err := r.ApplyRandom(raw, out, draw); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "images/s")
}

func BenchmarkDecodeFull(b *testing.B) {
	raw := encode(b, photo(500, 375, 7), "jpeg")
	for b.Loop() {
		if _, _, err := DecodeFull(raw); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "images/s")
}

// BenchmarkDir runs one thread's full decode and both image transforms
// over the files of $RIFFLE_IMAGES (bench/images.py points it at the
// benchmark's JPEGs), in one run: the per-core rates bench/images.py
// compares with the daemon's.
func BenchmarkDir(b *testing.B) {
	dir := os.Getenv("RIFFLE_IMAGES")
	if dir == "" {
		b.Skip("RIFFLE_IMAGES names no directory of images")
	}
	var files [][]byte
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if raw, err := os.ReadFile(p); err == nil {
				files = append(files, raw)
			}
		}
		return nil
	})
	if len(files) == 0 {
		b.Fatalf("no files in %s", dir)
	}
	center, _, _ := New("image")
	crop, _, _ := New("random_resized_crop")
	out := make([]byte, max(center.Size(), crop.Size()))
	for _, c := range []struct {
		name string
		f    func(raw []byte, k int) error
	}{
		{"decode", func(raw []byte, _ int) error { _, _, err := DecodeFull(raw); return err }},
		{"image", func(raw []byte, _ int) error { return center.Apply(raw, out) }},
		{"random_resized_crop", func(raw []byte, k int) error {
			return crop.(Random).ApplyRandom(raw, out, Draw(1, 0, k))
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			k := 0
			for b.Loop() {
				if err := c.f(files[k%len(files)], k); err != nil {
					b.Fatal(err)
				}
				k++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "images/s")
		})
	}
}

func FuzzLibsvmDense(f *testing.F) {
	f.Add([]byte("1 1:0.5 3:2"))
	f.Add([]byte("-1 qid:3 2:1e9 # x"))
	f.Add([]byte("0,1 1:1"))
	tf, _, _ := New("libsvm_dense:n_features=8")
	out := make([]byte, tf.Size())
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := tf.Apply(b, out); err != nil && !errors.Is(err, libsvm.ErrSyntax) {
			t.Fatalf("error %v is not a syntax error", err)
		}
	})
}

func FuzzImage(f *testing.F) {
	f.Add(encode(f, photo(20, 10, 1), "jpeg"))
	f.Add(encode(f, photo(7, 9, 2), "png"))
	f.Add([]byte("\xff\xd8\xff"))
	tf, _, _ := New("image:size=16,crop=8")
	out := make([]byte, tf.Size())
	f.Fuzz(func(t *testing.T, b []byte) {
		tf.Apply(b, out) // an error is fine; a panic or a hang is not
	})
}

// An image whose header claims more pixels than a record may decode to
// is refused before any is allocated, in both decoders.
func TestImageBomb(t *testing.T) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewGray(image.Rect(0, 0, 4, 4))); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	// IHDR: length(4) "IHDR"(4) width(4) height(4) ... crc, after the 8-byte signature.
	binary.BigEndian.PutUint32(b[16:], 200000)
	binary.BigEndian.PutUint32(b[20:], 200000)
	binary.BigEndian.PutUint32(b[29:], crc32.ChecksumIEEE(b[12:29]))
	tr, _, err := New("image:size=32,crop=32")
	if err != nil {
		t.Fatal(err)
	}
	err = tr.Apply(b, make([]byte, tr.Size()))
	if err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("a 200000x200000 image: %v", err)
	}
}
