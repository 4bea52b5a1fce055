/* The attention prologue of a CPU step in one call: per row, the q and k heads' RMSNorm (when the model has them) and
   half-split rotary embedding, q into its own tensor, k and v written straight into the KV cache. Each row computes
   alone, in the same order whatever the batch. */
#include <stdint.h>
#include <string.h>

#include "simd.h"

/* out[i] = x[i]·c[i] − x[i+h]·s[i], out[i+h] = x[i+h]·c[i+h] + x[i]·s[i+h] (HF's rotate_half layout). */
static inline void rotate(const float *x, const float *c, const float *s, int d, float *out) {
    const int h = d / 2;
    for (int i = 0; i < h; i++) {
        const float lo = x[i], hi = x[i + h];
        out[i] = lo * c[i] - hi * s[i];
        out[i + h] = hi * c[i + h] + lo * s[i + h];
    }
}

/* One head: optional norm (w NULL: none), then rotary, into out. `tmp` holds one head. */
static inline void head(const float *x, const float *w, float eps, const float *c, const float *s, int d, float *tmp,
                        float *out) {
    if (w) {
        norm_row(x, w, eps, d, tmp);
        x = tmp;
    }
    rotate(x, c, s, d, out);
}

/* q, k, v: fp32 rows of H, Hkv, Hkv heads of D each, q's every `q_stride` floats, k's and v's every `kv_stride`
   (views of one fused product, or three); qw, kw the per-head norm weights (NULL: none); cos, sin (T, D) the rows'
   rotary tables; slots (T,) each row's cache row, into kc, vc (rows, Hkv, D) fp32. q_out (T, H, D). D ≤ 1024. */
void parley_qk_rope_write(const float *q, const float *k, const float *v, int64_t T, int64_t q_stride,
                          int64_t kv_stride, int H, int Hkv, int D, const float *qw, const float *kw, float eps, const float *cos, const float *sin,
                          const int64_t *slots, float *kc, float *vc, float *q_out) {
    float tmp[1024];
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * D, *s = sin + t * D;
        for (int h = 0; h < H; h++) head(q + t * q_stride + h * D, qw, eps, c, s, D, tmp, q_out + (t * H + h) * D);
        float *kt = kc + slots[t] * Hkv * D, *vt = vc + slots[t] * Hkv * D;
        for (int h = 0; h < Hkv; h++) head(k + t * kv_stride + h * D, kw, eps, c, s, D, tmp, kt + h * D);
        memcpy(vt, v + t * kv_stride, sizeof(float) * (size_t)(Hkv * D));
    }
}

/* src rounded to fp16 (to nearest even, as torch's .to(float16)) into dst. */
static inline void store_f16(uint16_t *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

/* parley_qk_rope_write into fp16 caches kc, vc (rows, Hkv, D): each k head computed in fp32 as there, then rounded. */
void parley_qk_rope_write_f16(const float *q, const float *k, const float *v, int64_t T, int64_t q_stride,
                              int64_t kv_stride, int H, int Hkv, int D, const float *qw, const float *kw, float eps,
                              const float *cos, const float *sin, const int64_t *slots, uint16_t *kc, uint16_t *vc,
                              float *q_out) {
    float tmp[1024], kh[1024];
    for (int64_t t = 0; t < T; t++) {
        const float *c = cos + t * D, *s = sin + t * D;
        for (int h = 0; h < H; h++) head(q + t * q_stride + h * D, qw, eps, c, s, D, tmp, q_out + (t * H + h) * D);
        uint16_t *kt = kc + slots[t] * Hkv * D, *vt = vc + slots[t] * Hkv * D;
        for (int h = 0; h < Hkv; h++) {
            head(k + t * kv_stride + h * D, kw, eps, c, s, D, tmp, kh);
            store_f16(kt + h * D, kh, D);
        }
        store_f16(vt, v + t * kv_stride, Hkv * D);
    }
}
