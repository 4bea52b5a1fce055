/* One-row attention on the CPU, reading the KV cache in place: each query row (a decode step's token, a verify
   row) over its own list of cache rows. A row's result depends only on its query and its keys, in their order, never
   on the other rows of the call: batched == alone, and a verify row equals the one-token step at its position. */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

/* Softmax weights in place over n scores (max subtracted, exp, summed in eight lanes and then in order: one fixed
   order for a row's n); returns 1 / the sum (0 when n = 0). A NaN score makes the row NaN, as torch's softmax does.
   A finite `sink` (gpt-oss's per-head logit) joins the max and the sum only: it takes weight from every key. */
static inline float softmax_weights(float *p, int64_t n, float sink) {
    __m256 mv = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(p + j));
    float m = hmax8(mv);
    for (; j < n; j++) m = p[j] > m ? p[j] : m;
    const int sunk = sink > -INFINITY;
    if (sunk && sink > m) m = sink;
    const __m256 mb = _mm256_set1_ps(m);
    __m256 sv = _mm256_setzero_ps();
    for (j = 0; j + 8 <= n; j += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + j), mb));
        _mm256_storeu_ps(p + j, e);
        sv = _mm256_add_ps(sv, e);
    }
    float sum = hsum8(sv);
    for (; j < n; j++) {
        p[j] = expf(p[j] - m);
        sum += p[j];
    }
    if (sunk) sum += expf(sink - m);
    return n > 0 ? 1.0f / sum : 0.0f;
}

/* Lane t of the result: the sum of v[t]'s eight lanes (pairs, then fours, then the halves: one fixed order). */
static inline __m256 transpose_sum8(const __m256 *v) {
    const __m256 a0 = _mm256_hadd_ps(v[0], v[1]), a1 = _mm256_hadd_ps(v[2], v[3]);
    const __m256 a2 = _mm256_hadd_ps(v[4], v[5]), a3 = _mm256_hadd_ps(v[6], v[7]);
    const __m256 b0 = _mm256_hadd_ps(a0, a1), b1 = _mm256_hadd_ps(a2, a3);
    return _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
}

#define PREFETCH_KEYS 16  /* key rows asked for ahead of the eight scored (scores8) */

/* fp32 caches: parley_attend_rows */
#define KV_T float
#define KV_LOAD8(ptr) _mm256_loadu_ps(ptr)
#define KV_LOAD1(ptr) (*(ptr))
#define KV(name) name
#include "attend_kv.h"
#undef KV_T
#undef KV_LOAD8
#undef KV_LOAD1
#undef KV

/* fp16 caches (half the bytes a key and value row, as llama.cpp keeps them): parley_attend_rows_f16 */
#define KV_T uint16_t
#define KV_LOAD8(ptr) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ptr)))
#define KV_LOAD1(ptr) _cvtsh_ss(*(ptr))
#define KV(name) name##_f16
#include "attend_kv.h"
#undef KV_T
#undef KV_LOAD8
#undef KV_LOAD1
#undef KV
