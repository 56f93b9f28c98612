// The C side of decode_turbo.go: see jpeg_turbo.c.
#ifndef RIFFLE_JPEG_TURBO_H
#define RIFFLE_JPEG_TURBO_H

#define RF_PRECISION 22 // transform/resample.go's precisionBits
#define RF_SPLIT 11     // hpass_avx2 splits a weight into 16-bit halves at this bit

typedef struct rf_dec rf_dec;


rf_dec *rf_new(void);
void rf_free(rf_dec *s);
const char *rf_msg(rf_dec *s);
int rf_header(rf_dec *s, const unsigned char *buf, unsigned long n, int *w, int *h, int *cmyk);
void rf_limit(rf_dec *s, long bytes);
int rf_scaled(rf_dec *s, int num, int *w, int *h);
int rf_region(rf_dec *s, int num, int x0, int y0, int x1, int y1, unsigned char *out, int stride, int *ax0);
// rf_resample's kernels are transform/resample.go's: output pixel i reads
// taps[i] source pixels from first[i], weighted by w[i*k ...]. The
// vertical kernel reads source rows [0, rows).
void rf_resample(const unsigned char *src, int ss, int ow, const int *xfirst, const int *xtaps, const int *xw, int xk,
                 int oh, const int *yfirst, const int *ytaps, const int *yw, int yk, int rows, int flip,
                 unsigned char *out, unsigned char *tmp, int *acc);

#endif
