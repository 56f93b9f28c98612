package transform

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image"
	"image/color"
	"image/jpeg"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// bombPNG is a w x h RGB PNG of one colour: a few hundred KB that decode
// to w*h*4 bytes of pixels. Its rows are written through zlib one at a
// time, so making it takes no more than a row.
func bombPNG(t testing.TB, w, h int) []byte {
	t.Helper()
	var buf bytes.Buffer
	chunk := func(kind string, data []byte) {
		binary.Write(&buf, binary.BigEndian, uint32(len(data)))
		c := crc32.NewIEEE()
		c.Write([]byte(kind))
		c.Write(data)
		buf.WriteString(kind)
		buf.Write(data)
		binary.Write(&buf, binary.BigEndian, c.Sum32())
	}
	buf.WriteString("\x89PNG\r\n\x1a\n")
	ihdr := make([]byte, 13)
	binary.BigEndian.PutUint32(ihdr, uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8], ihdr[9] = 8, 2 // 8 bits, RGB
	chunk("IHDR", ihdr)
	var idat bytes.Buffer
	z, _ := zlib.NewWriterLevel(&idat, zlib.BestCompression)
	row := make([]byte, 1+3*w) // filter 0, then black
	for range h {
		if _, err := z.Write(row); err != nil {
			t.Fatal(err)
		}
	}
	z.Close()
	chunk("IDAT", idat.Bytes())
	chunk("IEND", nil)
	return buf.Bytes()
}

// bigJPEG is a w x h baseline JPEG of a gradient.
func bigJPEG(t testing.TB, w, h, seed int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			img.Set(x, y, color.RGBA{uint8(x*7 + seed), uint8(y*3 + seed), uint8((x + y + seed) / 5), 255})
		}
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 85}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func imageTransform(t testing.TB, spec string, m *Memory) Transform {
	t.Helper()
	tf, _, err := New(spec)
	if err != nil {
		t.Fatal(err)
	}
	return WithMemory(tf, m)
}

// A decompression bomb is refused before its decode allocates, saying
// what it would take; both image transforms, and a shared decode (the
// whole image, for jobs to cut their crops from).
func TestDecodeBombRefused(t *testing.T) {
	bomb := bombPNG(t, 4096, 4096) // 64 MiB of RGBA pixels, from a PNG of about 50 KB
	m := NewMemory(32 << 20)
	var before, after runtime.MemStats
	for _, spec := range []string{"image", "random_resized_crop"} {
		tf := imageTransform(t, spec, m)
		runtime.ReadMemStats(&before)
		err := tf.Apply(bomb, make([]byte, tf.Size()))
		runtime.ReadMemStats(&after)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "4096x4096 pixels (png)") {
			t.Fatalf("%s of a bomb: %v", spec, err)
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
			t.Fatalf("%s: refusing a bomb allocated %d bytes", spec, grew)
		}
	}
	if _, err := imageTransform(t, "random_resized_crop", m).(Shared).Decode(bomb); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a shared decode of a bomb: %v", err)
	}
	if st := m.Stats(); st.Used != 0 || st.Peak != 0 {
		t.Fatalf("refusals charged the memory: %+v", st)
	}
}

// Large images that fit are decoded to the bytes they decode to without a
// bound, several at once on as many goroutines as a daemon has workers,
// never holding more than the bound between them; each waits for room.
func TestDecodeMemoryBounds(t *testing.T) {
	jpegs := [][]byte{bigJPEG(t, 2400, 1800, 1), bigJPEG(t, 1800, 2400, 2), bigJPEG(t, 3000, 2000, 3)}
	png := bombPNG(t, 1500, 1000)
	raws := append(jpegs, png)
	var most int64
	for _, raw := range raws {
		hd, err := readHeader(raw)
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, hd.goCost())
	}
	// Room for one Go decode of the largest and a little: two wait.
	m := NewMemory(most + most/2)
	for _, spec := range []string{"image", "random_resized_crop:size=128"} {
		free := imageTransform(t, spec, nil)
		want := make([][]byte, len(raws))
		for i, raw := range raws {
			want[i] = make([]byte, free.Size())
			if err := free.Apply(raw, want[i]); err != nil {
				t.Fatal(err)
			}
		}
		bound := imageTransform(t, spec, m)
		var wg sync.WaitGroup
		errs := make(chan error, 4*len(raws))
		for k := range 4 * len(raws) {
			wg.Go(func() {
				i := k % len(raws)
				out := make([]byte, bound.Size())
				if err := bound.Apply(raws[i], out); err != nil {
					errs <- err
				} else if !bytes.Equal(out, want[i]) {
					errs <- errors.New(spec + ": an output under the bound differs from the one without")
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	if st := m.Stats(); st.Used != 0 || st.Peak == 0 || st.Peak > st.Limit {
		t.Fatalf("memory after the decodes: %+v", st)
	}
}

// The headers say what the decoders allocate: a JPEG's planes padded to
// its MCUs, a PNG's pixels by colour type and depth.
func TestReadHeader(t *testing.T) {
	j, err := readHeader(bigJPEG(t, 1001, 999, 0))
	if err != nil || j.format != "jpeg" || j.w != 1001 || j.h != 999 || j.comps != 3 || j.progressive {
		t.Fatalf("JPEG header %+v, %v", j, err)
	}
	// Go's encoder subsamples chroma 4:2:0: Y padded to 16x16 MCUs,
	// Cb and Cr a quarter each.
	if got, want := j.samples(), int64(1008*1008+2*504*504); got != want {
		t.Fatalf("JPEG samples %d, want %d", got, want)
	}
	p, err := readHeader(bombPNG(t, 30, 20))
	if err != nil || p.format != "png" || p.w != 30 || p.h != 20 || p.bpp != 4 || p.interlaced {
		t.Fatalf("PNG header %+v, %v", p, err)
	}
	for _, bad := range [][]byte{{0xff, 0xd8, 0xff, 0xda, 0, 2}, {0xff, 0xd8, 0xff, 0xc0, 0, 5, 8}, []byte("\x89PNG\r\n\x1a\nshort")} {
		if _, err := readHeader(bad); err == nil {
			t.Errorf("header of %q read", bad)
		}
	}
}

// Any bytes: the header reader never panics, and a header it reads gives
// a cost that is not negative.
func FuzzReadHeader(f *testing.F) {
	f.Add(bigJPEG(f, 17, 9, 0)[:400])
	f.Add(bombPNG(f, 3, 2))
	f.Add([]byte{0xff, 0xd8, 0xff, 0xc2, 0, 17, 8, 0, 9, 0, 17, 3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1})
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, err := readHeader(raw)
		if err == nil && h.format != "" && (h.w < 0 || h.h < 0 || h.goCost() < 0) {
			t.Fatalf("header %+v of %d bytes: cost %d", h, len(raw), h.goCost())
		}
	})
}
