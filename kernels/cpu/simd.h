/* Small vector and row helpers shared by Parley's CPU kernels. */
#ifndef PARLEY_SIMD_H
#define PARLEY_SIMD_H
#include <stdint.h>
#include <math.h>
#include <immintrin.h>

/* The sum of eight lanes, in a fixed order. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Σ a[i]·b[i]: eight lanes, then the tail in order. */
static inline float dot_f32(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return hsum8(acc) + tail;
}

/* out = (x · rsqrt(mean(x²) + eps)) · w, as torch's RMSNorm rounds it: two products. */
static inline void norm_row(const float *x, const float *w, float eps, int d, float *out) {
    const float r = 1.0f / sqrtf(dot_f32(x, x, d) / (float)d + eps);
    for (int i = 0; i < d; i++) out[i] = (x[i] * r) * w[i];
}
#endif
