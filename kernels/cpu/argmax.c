/* Greedy ids on the CPU: each row's first index of its maximum, as torch.argmax (a NaN counts as the maximum). Four
   independent sets of eight lanes (no loop-carried wait between loads) and rows split across threads: torch's CPU
   argmax is scalar, 0.22 ms over a 262k vocabulary. The answer is exact whatever the order of comparisons. */
#include <stdint.h>
#include <math.h>
#include <immintrin.h>

#define SETS 4

/* The lanes' best (value, index) pairs folded into `best`: a larger value, or an equal one at a smaller index. */
static inline int64_t fold(const float *x, __m256 mv, __m256i mi, int64_t best) {
    float vals[8];
    int32_t ids[8];
    _mm256_storeu_ps(vals, mv);
    _mm256_storeu_si256((__m256i *)ids, mi);
    for (int l = 0; l < 8; l++)
        if (best < 0 || vals[l] > x[best] || (vals[l] == x[best] && ids[l] < best)) best = ids[l];
    return best;
}

static int64_t argmax_row(const float *x, int64_t n) {
    int64_t i = 0, best = -1;
    const int64_t span = 8 * SETS;
    if (n >= span && n < INT32_MAX) {
        __m256 mv[SETS], nan = _mm256_setzero_ps();
        __m256i mi[SETS], idx[SETS];
        const __m256i step = _mm256_set1_epi32(span);
        for (int s = 0; s < SETS; s++) {
            mv[s] = _mm256_loadu_ps(x + 8 * s);
            idx[s] = mi[s] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * s));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(mv[s], mv[s], _CMP_UNORD_Q));
        }
        for (i = span; i + span <= n; i += span) {
            for (int s = 0; s < SETS; s++) {
                idx[s] = _mm256_add_epi32(idx[s], step);
                const __m256 v = _mm256_loadu_ps(x + i + 8 * s);
                const __m256 gt = _mm256_cmp_ps(v, mv[s], _CMP_GT_OQ);  /* strictly: a lane keeps its first max */
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
                mv[s] = _mm256_blendv_ps(mv[s], v, gt);
                mi[s] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(mi[s]), _mm256_castsi256_ps(idx[s]),
                                                             gt));
            }
        }
        if (_mm256_movemask_ps(nan)) {  /* rare: the first NaN is the answer */
            for (int64_t j = 0; j < n; j++)
                if (isnan(x[j])) return j;
        }
        for (int s = 0; s < SETS; s++) best = fold(x, mv[s], mi[s], best);
    }
    for (; i < n; i++) {
        if (isnan(x[i])) return i;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best;
}

/* x (R, n) fp32, n ≥ 1 -> ids (R,) int64. */
void parley_argmax_rows(const float *x, int64_t R, int64_t n, int64_t *ids, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static) if (R > 1 && R * n > (1 << 16))
    for (int64_t r = 0; r < R; r++) ids[r] = argmax_row(x + r * n, n);
}
