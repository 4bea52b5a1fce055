/* One-row attention on the CPU, reading the KV cache in place: each query row (a decode step's token, a verify
   row) over its own list of cache rows. A row's result depends only on its query and its keys, in their order, never
   on the other rows of the call: batched == alone, and a verify row equals the one-token step at its position. */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

/* out += p·v, eight lanes at a time (the same lanes for every row: the order never depends on the batch). */
static inline void axpy(float *out, float p, const float *v, int n) {
    const __m256 pv = _mm256_set1_ps(p);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(out + i)));
    for (; i < n; i++) out[i] += p * v[i];
}

/* q (T, H, D); caches (rows, Hkv, D) fp32; keys: the cache rows, concatenated; table (S, 3) int64: per query row
   its row in q, the offset of its keys in `keys` and their count. out (T, H, D): rows the table names are written.
   Returns 0, or -1 when scratch could not be allocated. */
int parley_attend_rows(const float *q, const float *kc, const float *vc, const int64_t *keys, const int64_t *table,
                       int64_t S, int H, int Hkv, int D, float scale, float *out, int threads) {
    const int G = H / Hkv;
    int64_t most = 0;
    for (int64_t s = 0; s < S; s++) most = table[3 * s + 2] > most ? table[3 * s + 2] : most;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (S * Hkv * most > 4096)
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
            float *oh = out + (row * H + h) * D;
            float m = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                p[j] = scale * dot_f32(qh, kc + (keys[at + j] * Hkv + kvh) * D, D);
                m = p[j] > m ? p[j] : m;
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                p[j] = expf(p[j] - m);
                sum += p[j];
            }
            for (int i = 0; i < D; i++) oh[i] = 0.0f;
            for (int64_t j = 0; j < n; j++) axpy(oh, p[j], vc + (keys[at + j] * Hkv + kvh) * D, D);
            const float inv = n > 0 ? 1.0f / sum : 0.0f;
            for (int i = 0; i < D; i++) oh[i] *= inv;
        }
        free(p);
    }
    return failed ? -1 : 0;
}
