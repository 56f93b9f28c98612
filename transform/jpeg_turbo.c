//go:build turbojpeg

// Decoding only the part of a JPEG an output needs, with libjpeg-turbo's
// libjpeg API (the TurboJPEG API of 2.1 has neither cropping nor skipping):
// DCT-domain scaling (scale_num/8) shrinks while decoding, as libvips'
// shrink-on-load does; jpeg_crop_scanline leaves out the iMCU columns left
// of the region and after it, and jpeg_skip_scanlines the rows above it
// (still entropy-decoded, since Huffman data has no index, but neither
// transformed nor colour-converted); the rows below are never decoded.

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>
#include "jpeg_turbo.h"

struct rf_dec {
	struct jpeg_decompress_struct d;
	struct jpeg_error_mgr em;
	jmp_buf jb;
	char msg[JMSG_LENGTH_MAX];
	int started;
};

static void rf_error_exit(j_common_ptr c) {
	rf_dec *s = (rf_dec *)c->client_data;
	(*c->err->format_message)(c, s->msg);
	longjmp(s->jb, 1);
}

// A premature end of the data is an error, as in Pillow (a truncated file
// is refused, not padded with grey); libjpeg's other warnings (extraneous
// bytes before a marker, common in real files) are not, as in Pillow.
static void rf_emit(j_common_ptr c, int level) {
	if (level < 0 && c->err->msg_code == JWRN_JPEG_EOF) {
		rf_error_exit(c);
	}
}

rf_dec *rf_new(void) {
	rf_dec *s = calloc(1, sizeof(rf_dec));
	if (s == NULL) {
		return NULL;
	}
	s->d.err = jpeg_std_error(&s->em);
	s->em.error_exit = rf_error_exit;
	s->em.emit_message = rf_emit;
	s->d.client_data = s;
	jpeg_create_decompress(&s->d);
	return s;
}

void rf_free(rf_dec *s) {
	jpeg_destroy_decompress(&s->d);
	free(s);
}

const char *rf_msg(rf_dec *s) { return s->msg; }

int rf_header(rf_dec *s, const unsigned char *buf, unsigned long n, int *w, int *h, int *cmyk) {
	if (setjmp(s->jb)) {
		return -1;
	}
	jpeg_mem_src(&s->d, buf, n);
	jpeg_read_header(&s->d, TRUE);
	*w = s->d.image_width;
	*h = s->d.image_height;
	*cmyk = s->d.jpeg_color_space == JCS_CMYK || s->d.jpeg_color_space == JCS_YCCK;
	return 0;
}

// rf_limit bounds the memory libjpeg may take for the decode (its
// max_memory_to_use): past it, what would be a large allocation (a
// progressive image's coefficients) fails, as there is no backing store.
void rf_limit(rf_dec *s, long bytes) { s->d.mem->max_memory_to_use = bytes; }

// rf_scaled gives the image's size decoded at num/8.
int rf_scaled(rf_dec *s, int num, int *w, int *h) {
	if (setjmp(s->jb)) {
		return -1;
	}
	s->d.scale_num = num;
	s->d.scale_denom = 8;
	jpeg_calc_output_dimensions(&s->d);
	*w = s->d.output_width;
	*h = s->d.output_height;
	return 0;
}

int rf_region(rf_dec *s, int num, int x0, int y0, int x1, int y1, unsigned char *out, int stride, int *ax0) {
	j_decompress_ptr d = &s->d;
	if (setjmp(s->jb)) {
		return -1;
	}
	d->scale_num = num;
	d->scale_denom = 8;
	d->out_color_space = JCS_RGB;
	d->dct_method = JDCT_ISLOW; // Pillow's default: its output is what we match
	jpeg_start_decompress(d);
	JDIMENSION xoff = x0, width = x1 - x0;
	if (x0 > 0 || (JDIMENSION)x1 < d->output_width) {
		jpeg_crop_scanline(d, &xoff, &width);
	}
	*ax0 = xoff;
	if (width * 3 > (JDIMENSION)stride) {
		snprintf(s->msg, sizeof s->msg, "cropped row of %u pixels exceeds its buffer", width);
		jpeg_abort_decompress(d);
		return -1;
	}
	if (y0 > 0) {
		jpeg_skip_scanlines(d, y0);
	}
	while (d->output_scanline < (JDIMENSION)y1) {
		JSAMPROW row = out + (size_t)(d->output_scanline - y0) * stride;
		if (jpeg_read_scanlines(d, &row, 1) != 1) {
			snprintf(s->msg, sizeof s->msg, "no scanline %u", d->output_scanline);
			jpeg_abort_decompress(d);
			return -1;
		}
	}
	jpeg_abort_decompress(d); // the rows below the region are not needed
	return 0;
}

static inline unsigned char clip8(int v) {
	v >>= RF_PRECISION;
	return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v;
}

// The horizontal pass of one row: each output pixel is a weighted sum of
// n neighbouring source pixels.
static void hpass(const unsigned char *row, int ow, const int *xfirst, const int *xtaps, const int *xw, int xk,
                  unsigned char *t) {
	const int half = 1 << (RF_PRECISION - 1);
	for (int x = 0; x < ow; x++) {
		const unsigned char *p = row + (size_t)xfirst[x] * 3;
		const int *w = xw + (size_t)x * xk;
		int n = xtaps[x], r = half, g = half, b = half;
		for (int i = 0; i < n; i++) {
			r += p[i * 3] * w[i];
			g += p[i * 3 + 1] * w[i];
			b += p[i * 3 + 2] * w[i];
		}
		t[x * 3] = clip8(r);
		t[x * 3 + 1] = clip8(g);
		t[x * 3 + 2] = clip8(b);
	}
}

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

// hpass with SSE4.1: a pixel's three channels (and a fourth lane that is
// never stored) are one vector of 32-bit sums, one multiply-add per tap
// instead of three. It reads one byte past a tap's pixel and writes one
// past an output pixel: the region and tmp buffers have a byte to spare.
__attribute__((target("sse4.1"))) static void hpass_sse41(const unsigned char *row, int ow, const int *xfirst,
                                                           const int *xtaps, const int *xw, int xk,
                                                           unsigned char *t) {
	const __m128i half = _mm_set1_epi32(1 << (RF_PRECISION - 1));
	for (int x = 0; x < ow; x++) {
		const unsigned char *p = row + (size_t)xfirst[x] * 3;
		const int *w = xw + (size_t)x * xk;
		int n = xtaps[x];
		__m128i acc = half;
		for (int i = 0; i < n; i++) {
			int v;
			memcpy(&v, p + i * 3, 4);
			__m128i px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
			acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(w[i])));
		}
		acc = _mm_srai_epi32(acc, RF_PRECISION);
		__m128i s16 = _mm_packs_epi32(acc, acc);
		int o = _mm_cvtsi128_si32(_mm_packus_epi16(s16, s16));
		memcpy(t + x * 3, &o, 4);
	}
}

// hpass with AVX2: two output pixels a vector, and two taps a multiply.
// A 22-bit weight does not fit vpmaddwd's 16-bit lanes, so each is split
// as w = hi * 2^11 + lo (hi at most 2^11, lo below it) and the pass sums
// Σ p*hi and Σ p*lo, each over a pair of taps a vpmaddwd, as
// (Σ p*hi << 11) + Σ p*lo: Σ p*w to the bit, Pillow's sum. (One vpmulld,
// two micro-ops of ten cycles' latency, a tap and channel was the pass's
// cost before: 14% of a daemon's CPU on JPEGs.) A pixel's channels and
// the byte after them are lanes of 16 bits, a tap and the next side by
// side: R R' G G' B B' x x' for the first output pixel, the same for the
// second. The pixel with fewer taps, and an odd count's last pair,
// multiply by zero weights; each pair's weights are laid out once for all
// rows (wv: for tap pair q, 16 lanes of hi and 16 of lo). Two pairs are
// summed at once so one's multiplies wait on the other's adds. A pair
// whose taps would reach past the row's sw pixels goes one pixel at a
// time.
__attribute__((target("avx2"))) static __m256i pair_avx2(const unsigned char *row, const int *xfirst, int x,
                                                          const short *wv, int nq) {
	const unsigned char *p0 = row + (size_t)xfirst[x] * 3, *p1 = row + (size_t)xfirst[x + 1] * 3;
	__m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
	for (int q = 0; q < nq; q++, p0 += 6, p1 += 6) {
		int a0, b0, a1, b1;
		memcpy(&a0, p0, 4);
		memcpy(&b0, p0 + 3, 4);
		memcpy(&a1, p1, 4);
		memcpy(&b1, p1 + 3, 4);
		__m128i i0 = _mm_unpacklo_epi8(_mm_cvtsi32_si128(a0), _mm_cvtsi32_si128(b0));
		__m128i i1 = _mm_unpacklo_epi8(_mm_cvtsi32_si128(a1), _mm_cvtsi32_si128(b1));
		__m256i px = _mm256_cvtepu8_epi16(_mm_unpacklo_epi64(i0, i1));
		const __m256i *w = (const __m256i *)(wv + (size_t)q * 32);
		hi = _mm256_add_epi32(hi, _mm256_madd_epi16(px, _mm256_loadu_si256(w)));
		lo = _mm256_add_epi32(lo, _mm256_madd_epi16(px, _mm256_loadu_si256(w + 1)));
	}
	__m256i acc = _mm256_add_epi32(_mm256_slli_epi32(hi, RF_SPLIT), lo);
	acc = _mm256_add_epi32(acc, _mm256_set1_epi32(1 << (RF_PRECISION - 1)));
	return _mm256_srai_epi32(acc, RF_PRECISION);
}

__attribute__((target("avx2"))) static void store_pair(unsigned char *t, __m256i acc) {
	__m128i s16 = _mm_packs_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
	__m128i s8 = _mm_packus_epi16(s16, s16);
	int o0 = _mm_cvtsi128_si32(s8), o1 = _mm_extract_epi32(s8, 1);
	memcpy(t, &o0, 4); // the fourth byte is the next pixel's, written next
	memcpy(t + 3, &o1, 4);
}

// fits says a pair whose first pixels are at f0 and f1 can read nq tap
// pairs (a byte past the last) inside a row of sw pixels.
static inline int fits(int f0, int f1, int nq, int sw) { return f0 + 2 * nq <= sw && f1 + 2 * nq <= sw; }

__attribute__((target("avx2"))) static void hpass_avx2(const unsigned char *row, int sw, int ow, const int *xfirst,
                                                        const int *xtaps, const int *xw, int xk, const short *wv,
                                                        const int *wn, unsigned char *t) {
	int x = 0, pairs = ow / 2, xq = (xk + 1) / 2;
	for (int p = 0; p < pairs; p++, x += 2) {
		int nq = wn[p];
		if (nq < 0 || !fits(xfirst[x], xfirst[x + 1], nq, sw)) {
			hpass_sse41(row, 2, xfirst + x, xtaps + x, xw + (size_t)x * xk, xk, t + x * 3);
			continue;
		}
		const short *w = wv + (size_t)p * xq * 32;
		if (p + 1 < pairs && wn[p + 1] == nq && fits(xfirst[x + 2], xfirst[x + 3], nq, sw)) {
			__m256i a = pair_avx2(row, xfirst, x, w, nq), b = pair_avx2(row, xfirst, x + 2, w + xq * 32, nq);
			store_pair(t + x * 3, a);
			store_pair(t + x * 3 + 6, b);
			p++, x += 2;
			continue;
		}
		store_pair(t + x * 3, pair_avx2(row, xfirst, x, w, nq));
	}
	if (x < ow) {
		hpass_sse41(row, ow - x, xfirst + x, xtaps + x, xw + (size_t)x * xk, xk, t + x * 3);
	}
}

// pair_weights lays each pair of output pixels' tap weights out as
// hpass_avx2's lanes (wv), split into hi and lo, and their count of tap
// pairs (wn; -1 if a weight does not split into 16-bit halves), once for
// all rows.
static void pair_weights(int ow, const int *xtaps, const int *xw, int xk, short *wv, int *wn) {
	int xq = (xk + 1) / 2;
	const int lomask = (1 << RF_SPLIT) - 1;
	for (int p = 0; p < ow / 2; p++) {
		int x = 2 * p, n = xtaps[x] > xtaps[x + 1] ? xtaps[x] : xtaps[x + 1];
		wn[p] = (n + 1) / 2;
		const int *w[2] = {xw + (size_t)x * xk, xw + (size_t)(x + 1) * xk};
		short *v = wv + (size_t)p * xq * 32;
		for (int q = 0; q < xq; q++) {
			for (int tap = 0; tap < 2; tap++) {
				int i = 2 * q + tap;
				for (int o = 0; o < 2; o++) {
					int wi = i < xk ? w[o][i] : 0, hi = wi >> RF_SPLIT;
					if (hi > 32767 || hi < -32768) {
						wn[p] = -1;
					}
					for (int c = 0; c < 4; c++) {
						v[q * 32 + o * 8 + c * 2 + tap] = (short)hi;
						v[q * 32 + 16 + o * 8 + c * 2 + tap] = (short)(wi & lomask);
					}
				}
			}
		}
	}
}
#endif

// The vertical pass of one output row: a weighted sum of n rows of the
// horizontal pass, across the whole row at once (the compiler vectorizes
// it, for AVX2's or SSE4.1's 32-bit multiply where the CPU has one).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "sse4.1", "default")))
#endif
static void vpass(const unsigned char *tmp, int ts, const int *w, int f, int n, int *acc, unsigned char *o) {
	const int half = 1 << (RF_PRECISION - 1);
	for (int x = 0; x < ts; x++) {
		acc[x] = half;
	}
	for (int i = 0; i < n; i++) {
		const unsigned char *r = tmp + (size_t)(f + i) * ts;
		int wi = w[i];
		for (int x = 0; x < ts; x++) {
			acc[x] += r[x] * wi;
		}
	}
	for (int x = 0; x < ts; x++) {
		o[x] = clip8(acc[x]);
	}
}

// rf_resample is transform/resample.go's resampleGo in C, with the same
// arithmetic, on AVX2 or SSE4.1 where the CPU has them. A row of src is ss
// bytes, all of them readable.
void rf_resample(const unsigned char *src, int ss, int ow, const int *xfirst, const int *xtaps, const int *xw, int xk,
                 int oh, const int *yfirst, const int *ytaps, const int *yw, int yk, int rows, int flip,
                 unsigned char *out, unsigned char *tmp, int *acc) {
	int ts = ow * 3;
	int simd = 0;
#if defined(__x86_64__) || defined(__i386__)
	simd = __builtin_cpu_supports("avx2") ? 2 : __builtin_cpu_supports("sse4.1") ? 1 : 0;
#endif
	short *wv = NULL;
	int *wn = NULL;
#if defined(__x86_64__) || defined(__i386__)
	if (simd == 2) {
		wv = malloc(sizeof(short) * (size_t)(ow / 2 + 1) * ((xk + 1) / 2) * 32);
		wn = malloc(sizeof(int) * (size_t)(ow / 2 + 1));
		if (wv == NULL || wn == NULL) {
			free(wv), free(wn);
			wv = NULL, wn = NULL;
			simd = 1;
		} else {
			pair_weights(ow, xtaps, xw, xk, wv, wn);
		}
	}
#endif
	for (int y = 0; y < rows; y++) {
		const unsigned char *row = src + (size_t)y * ss;
		unsigned char *t = tmp + (size_t)y * ts;
#if defined(__x86_64__) || defined(__i386__)
		if (simd == 2) {
			hpass_avx2(row, ss / 3, ow, xfirst, xtaps, xw, xk, wv, wn, t);
			continue;
		}
		if (simd == 1) {
			hpass_sse41(row, ow, xfirst, xtaps, xw, xk, t);
			continue;
		}
#endif
		hpass(row, ow, xfirst, xtaps, xw, xk, t);
	}
	free(wv);
	free(wn);
	for (int y = 0; y < oh; y++) {
		unsigned char *o = out + (size_t)y * ts;
		const int *w = yw + (size_t)y * yk;
		vpass(tmp, ts, w, yfirst[y], ytaps[y], acc, o);
		if (flip) {
			for (int i = 0, j = ts - 3; i < j; i += 3, j -= 3) {
				unsigned char r = o[i], g = o[i + 1], b = o[i + 2];
				o[i] = o[j], o[i + 1] = o[j + 1], o[i + 2] = o[j + 2];
				o[j] = r, o[j + 1] = g, o[j + 2] = b;
			}
		}
	}
}
