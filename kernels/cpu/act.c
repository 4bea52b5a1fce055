/* A gated MLP's activation on the CPU: out = act(gate) · up over a fused gate|up product, one call instead of torch's
   chunk, activation and product. Eight lanes a time with a polynomial exp, the tail in scalar code; each row alone. */
#include <stdint.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

enum { ACT_SILU = 0, ACT_GELU_TANH = 1 };

/* The argument whose sigmoid scales x: silu x·σ(x); gelu_tanh 0.5x(1 + tanh u) = x·σ(2u), u = √(2/π)(x + 0.044715x³). */
static inline __m256 gate_arg8(__m256 x, int act) {
    if (act == ACT_SILU) return x;
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    return _mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
}

static inline float gate_arg(float x, int act) {
    return act == ACT_SILU ? x : 1.5957691216057308f * (x + 0.044715f * x * x * x);
}

/* gate, up: R rows of I every `stride` floats (views of one fused product, or two); out (R, I) = act(gate) · up.
   act: 0 silu, 1 gelu_tanh. */
void parley_gated_act(const float *gate, const float *up, int64_t R, int64_t I, int64_t stride, int act, float *out) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t r = 0; r < R; r++) {
        const float *g = gate + r * stride, *u = up + r * stride;
        float *o = out + r * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gate_arg8(gv, act)));
            const __m256 a = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
        }
        for (; i < I; i++) o[i] = g[i] / (1.0f + expf(-gate_arg(g[i], act))) * u[i];
    }
}

/* gpt-oss's gated activation over a fused gate|up product: the gate capped at `limit`, the up clamped to ±limit, out
   (R, I) = gate · σ(alpha · gate) · (up + 1), each value as the scalar code computes it (expf), row by row. */
void parley_clamped_glu(const float *gate, const float *up, int64_t R, int64_t I, int64_t stride, float alpha,
                        float limit, float *out) {
    for (int64_t r = 0; r < R; r++) {
        const float *g = gate + r * stride, *u = up + r * stride;
        float *o = out + r * I;
        for (int64_t i = 0; i < I; i++) {
            const float gi = g[i] > limit ? limit : g[i];  /* a NaN stays NaN, as torch's clamp keeps it */
            const float ui = u[i] < -limit ? -limit : u[i] > limit ? limit : u[i];
            o[i] = gi / (1.0f + expf(-alpha * gi)) * (ui + 1.0f);
        }
    }
}
