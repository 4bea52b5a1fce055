/* Greedy ids on the CPU: each row's first index of its maximum, as torch.argmax (a NaN counts as the maximum), eight
   lanes a time: torch's CPU argmax is scalar, 0.22 ms over a 262k vocabulary. */
#include <stdint.h>
#include <math.h>
#include <immintrin.h>

static int64_t argmax_row(const float *x, int64_t n) {
    int64_t i = 0, best = 0;
    if (n >= 8) {
        __m256 mv = _mm256_loadu_ps(x);
        __m256i mi = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), idx = mi;
        __m256 nan = _mm256_cmp_ps(mv, mv, _CMP_UNORD_Q);
        const __m256i step = _mm256_set1_epi32(8);
        for (i = 8; i + 8 <= n && i < INT32_MAX - 16; i += 8) {
            idx = _mm256_add_epi32(idx, step);
            const __m256 v = _mm256_loadu_ps(x + i);
            const __m256 gt = _mm256_cmp_ps(v, mv, _CMP_GT_OQ);  /* strictly greater: a lane keeps its first max */
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            mv = _mm256_blendv_ps(mv, v, gt);
            mi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(mi), _mm256_castsi256_ps(idx), gt));
        }
        if (_mm256_movemask_ps(nan)) {  /* rare: the first NaN is the answer */
            for (int64_t j = 0; j < n; j++)
                if (isnan(x[j])) return j;
        }
        float vals[8];
        int32_t ids[8];
        _mm256_storeu_ps(vals, mv);
        _mm256_storeu_si256((__m256i *)ids, mi);
        best = ids[0];
        for (int l = 1; l < 8; l++)
            if (vals[l] > x[best] || (vals[l] == x[best] && ids[l] < best)) best = ids[l];
    }
    for (; i < n; i++) {
        if (isnan(x[i])) return i;
        if (x[i] > x[best]) best = i;
    }
    return best;
}

/* x (R, n) fp32 -> ids (R,) int64. */
void parley_argmax_rows(const float *x, int64_t R, int64_t n, int64_t *ids) {
    for (int64_t r = 0; r < R; r++) ids[r] = argmax_row(x + r * n, n);
}
