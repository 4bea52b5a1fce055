/* One-row attention on the CPU, reading the KV cache in place: each query row (a decode step's token, a verify
   row) over its own list of cache rows. A row's result depends only on its query and its keys, in their order, never
   on the other rows of the call: batched == alone, and a verify row equals the one-token step at its position. */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

/* a·b over n: four independent lanes of eight (the FMA latency hides), then eight, then the tail; one fixed order. */
static inline float dot_wide(const float *a, const float *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float tail = 0.0f;
    for (; i < n; i++) tail += a[i] * b[i];
    return hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))) + tail;
}

/* out = inv · Σ_j p[j]·v_j over the keys, each output summed over j in order. 64 outputs at a time stay in registers
   while every key passes (no store between keys), then 8, then the tail. v_j = vc + keys[j]·stride. */
static void weighted_sum(float *out, const float *p, const float *vc, const int64_t *keys, int64_t n, int64_t stride,
                         int D, float inv) {
    int i = 0;
    for (; i + 64 <= D; i += 64) {
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            const float *v = vc + keys[j] * stride + i;
            const __m256 pj = _mm256_set1_ps(p[j]);
            for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * c), acc[c]);
        }
        for (int c = 0; c < 8; c++) _mm256_storeu_ps(out + i + 8 * c, _mm256_mul_ps(acc[c], _mm256_set1_ps(inv)));
    }
    for (; i + 8 <= D; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(vc + keys[j] * stride + i), acc);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
    }
    for (; i < D; i++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; j++) acc = fmaf(p[j], vc[keys[j] * stride + i], acc);
        out[i] = acc * inv;
    }
}

/* q (T, H, D); caches (rows, Hkv, D) fp32; keys: the cache rows, concatenated; table (S, 3) int64: per query row
   its row in q, the offset of its keys in `keys` and their count. out (T, H, D): rows the table names are written.
   softcap > 0 caps each score as softcap · tanh(score / softcap) (Gemma 2). Returns 0, or -1 when scratch could not
   be allocated. */
int parley_attend_rows(const float *q, const float *kc, const float *vc, const int64_t *keys, const int64_t *table,
                       int64_t S, int H, int Hkv, int D, float scale, float softcap, float *out, int threads) {
    const int G = H / Hkv;
    int64_t most = 0;
    for (int64_t s = 0; s < S; s++) most = table[3 * s + 2] > most ? table[3 * s + 2] : most;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (S * H * most * D > (1 << 16))
    {
        float *p = malloc(sizeof(float) * (size_t)(most > 0 ? most : 1));
        if (!p) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t job = 0; job < S * H; job++) {
            if (!p) continue;
            const int64_t s = job / H, h = job % H, kvh = h / G;
            const int64_t row = table[3 * s], at = table[3 * s + 1], n = table[3 * s + 2];
            const float *qh = q + (row * H + h) * D;
            float m = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                p[j] = scale * dot_wide(qh, kc + (keys[at + j] * Hkv + kvh) * D, D);
                if (softcap > 0.0f) p[j] = softcap * tanhf(p[j] / softcap);
                m = p[j] > m ? p[j] : m;
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                p[j] = expf(p[j] - m);
                sum += p[j];
            }
            weighted_sum(out + (row * H + h) * D, p, vc + kvh * D, keys + at, n, (int64_t)Hkv * D, D,
                         n > 0 ? 1.0f / sum : 0.0f);
        }
        free(p);
    }
    return failed ? -1 : 0;
}
