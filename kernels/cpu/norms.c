/* RMSNorm rows on the CPU: one call instead of torch's seven small ops per norm (a decode step of Gemma 3 270M runs
   109 of them). Each row computes alone, in the same order whatever the batch. */
#include <stdint.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

void parley_rms_norm(const float *x, int64_t rows, int d, const float *w, float eps, float *out) {
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * d, w, eps, d, out + r * d);
}

/* A block's residual step: h_out = h + pre(delta) (pre NULL: + delta), x_out = norm(h_out) (norm NULL: none).
   `scratch` holds one row. */
void parley_add_norm(const float *h, const float *delta, int64_t rows, int d, const float *pre, const float *norm,
                     float eps, float *h_out, float *x_out, float *scratch) {
    for (int64_t r = 0; r < rows; r++) {
        const float *hr = h + r * d, *dr = delta + r * d;
        float *ho = h_out + r * d;
        if (pre) {
            norm_row(dr, pre, eps, d, scratch);
            dr = scratch;
        }
        for (int i = 0; i < d; i++) ho[i] = hr[i] + dr[i];
        if (norm) norm_row(ho, norm, eps, d, x_out + r * d);
    }
}
