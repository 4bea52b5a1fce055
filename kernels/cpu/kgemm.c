/* Parley's CPU product over K-quant super-blocks kept as the file stores them (Q4_K, Q6_K): y (R, N) = x (R, K) @ Wᵀ.

   A super-block holds 256 weights of one row.
   Q4_K (144 bytes): fp16 d and dmin, eight 6-bit (scale, min) pairs in 12 bytes, 128 bytes of 4-bit codes;
        w = d·sc_j·q − dmin·m_j over sub-blocks j of 32.
   Q6_K (210 bytes): 128 bytes of low 4 bits, 64 of high 2 bits, sixteen int8 scales, fp16 d;
        w = d·sc_j·(q − 32) over sub-blocks of 16.

   Activations are quantized per 256, as llama.cpp does for these types: x ≈ d_a·a, a in int8. Within a super-block
   the sum is integer: pairs of u·a (u8 × s8 → int16) times the sub-block's scale (int16) into int32 lanes, then one
   conversion and one product per super-block and row. The minimums (Q6_K: the 32) are per sub-block offsets o_j,
   added as Σ_j o_j·d_a·Σa_j into the same fp32 lanes. Every row of a step is multiplied against a
   super-block while it is in registers, so a step reads the weights once for all of its rows. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

#define QK 256

enum { Q4_K = 4, Q6_K = 6 };  /* the `kind` argument: the type's bits */

static inline int sb_bytes(int kind) { return kind == Q4_K ? 144 : 210; }
static inline int sb_groups(int kind) { return kind == Q4_K ? 8 : 16; }

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Q4_K's eight 6-bit scales and minimums from their 12 bytes, eight bytes each (a byte per sub-block): the first
   four in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), the last four in bytes 8-11's nibbles with the top
   2 bits of bytes 0-7. */
static inline void q4k_scale_min(const uint8_t *p, uint64_t *sc, uint64_t *mn) {
    uint32_t w[3];
    memcpy(w, p, 12);
    const uint32_t m6 = 0x3f3f3f3fu, m4 = 0x0f0f0f0fu, m2 = 0x03030303u;
    *sc = (uint64_t)(w[0] & m6) | (uint64_t)((w[2] & m4) | (((w[0] >> 6) & m2) << 4)) << 32;
    *mn = (uint64_t)(w[1] & m6) | (uint64_t)(((w[2] >> 4) & m4) | (((w[1] >> 6) & m2) << 4)) << 32;
}

/* Eight fp32 of k·(byte), the bytes unsigned. */
static inline __m256 bytes_f32(uint64_t v, float k) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v))), _mm256_set1_ps(k));
}

/* Activations per super-block, super-block-major so that a tile's rows sit together: a (nsb, R, 256) int8,
   d (nsb, R) their scales, dsum (R, ng) d·Σa per sub-block. */
typedef struct {
    const int8_t *a;
    const float *d;
    const float *dsum;
    int64_t R, nsb, ng;
} KActs;

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static void quantize_rows(const float *x, int64_t R, int64_t K, int group, int8_t *a, float *d, float *dsum) {
    const int64_t nsb = K / QK, ng = K / group;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t b = 0; b < nsb; b++) {
            const float *xb = x + r * K + b * QK;
            __m256 mx = _mm256_setzero_ps();
            for (int i = 0; i < QK; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + i)));
            const float amax = hmax8(mx);
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            int8_t *ab = a + (b * R + r) * QK;
            for (int i = 0; i < QK; i += 32) {  /* round to nearest even, as lrintf; |x|·inv ≤ 127 */
                __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i), inv));
                __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 8), inv));
                __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 16), inv));
                __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + i + 24), inv));
                __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
                p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  /* packs interleave */
                _mm256_storeu_si256((__m256i *)(ab + i), p);
            }
            const float db = amax / 127.0f;
            d[b * R + r] = db;
            for (int g = 0; g < QK / group; g++) {
                int sum = 0;
                for (int i = 0; i < group; i++) sum += ab[g * group + i];
                dsum[r * ng + b * (QK / group) + g] = db * (float)sum;
            }
        }
    }
}

/* c + Σ over each pair of int16 lanes p·s, eight int32 lanes. */
static inline __m256i madd16(__m256i c, __m256i p, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(c, p, s);
#elif defined(__AVXVNNI__)
    return _mm256_dpwssd_avx_epi32(c, p, s);
#else
    return _mm256_add_epi32(c, _mm256_madd_epi16(p, s));
#endif
}

/* Two int16 scales over the halves of 16 lanes: lo on lanes 0-7, hi on 8-15. */
static inline __m256i two_scales(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16((short)hi), _mm_set1_epi16((short)lo));
}

/* PARLEY_YMM: the 256-bit tile on an AVX-512 CPU too (what AVX-VNNI CPUs run; the tests build it this way) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(PARLEY_YMM)
#define TILE 8

/* Chunk c (weights 64c..64c+63) of a Q4_K super-block's codes: the low nibbles of its 32 bytes, then the high. */
static inline __m512i q4k_chunk(const uint8_t *qs) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)qs), m = _mm256_set1_epi8(0x0F);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, m)),
                              _mm256_and_si256(_mm256_srli_epi16(v, 4), m), 1);
}

/* Half h of a Q6_K super-block (128 weights) as two chunks of 64: ql's low nibbles with qh's bits 0-1 (then 2-3),
   and ql's high nibbles with qh's bits 4-5 (then 6-7). */
static inline void q6k_half(const uint8_t *ql, const uint8_t *qh, __m512i *lo, __m512i *hi) {
    const __m512i l = _mm512_loadu_si512((const void *)ql);
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    const __m512i h2 = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    *lo = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(_mm512_and_si512(h2, m2), 4));
    *hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                          _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h2, 4), m2), 4));
}

/* acc[i] += (u·a pairs)·s for NR rows of 64 activations each. */
static inline __attribute__((always_inline)) void chunk_rows(__m512i *acc, const int NR, __m512i u, __m512i s,
                                                             const int8_t *a) {
    for (int i = 0; i < NR; i++)
        acc[i] = _mm512_dpwssd_epi32(acc[i], _mm512_maddubs_epi16(u, _mm512_loadu_si512((const void *)(a + i * QK))),
                                     s);
}

/* int16 lanes t of 32 holding scale first + t / span of the (int16) scales in v. */
static inline __m512i spread(__m512i v, int first, int shift) {
    const __m512i t = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                       11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(_mm512_srli_epi16(t, shift), _mm512_set1_epi16((short)first)), v);
}

/* NR rows of y against one weight row (`kind` and NR constants at each call site: accumulators in registers).
   facc's lanes take both the integer sums' products and the offsets' Σ_j o_j·dsum_j; y is the sum of its lanes. */
static inline __attribute__((always_inline)) void ktile(const KActs *x, int64_t r0, const int NR, const uint8_t *w,
        const int kind, float *y, int64_t ystride) {
    const int64_t R = x->R;
    __m512 facc[TILE];
    __m512i acc[TILE];
    for (int i = 0; i < NR; i++) facc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < x->nsb; b++) {
        const uint8_t *s = w + b * sb_bytes(kind);
        const int8_t *a = x->a + (b * R + r0) * QK;
        const float *ds = x->dsum + r0 * x->ng + b * sb_groups(kind);
        for (int i = 0; i < NR; i++) acc[i] = _mm512_setzero_si512();
        float d;
        if (kind == Q4_K) {
            uint64_t sc, mn;
            q4k_scale_min(s + 4, &sc, &mn);
            d = half_at(s);
            const __m512i sc16 = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_cvtsi64_si128((long long)sc)));
            for (int c = 0; c < 4; c++)  /* chunk c: sub-blocks 2c (lanes 0-15) and 2c + 1 */
                chunk_rows(acc, NR, q4k_chunk(s + 16 + 32 * c), spread(sc16, 2 * c, 4), a + 64 * c);
            const __m512 off = _mm512_zextps256_ps512(bytes_f32(mn, -half_at(s + 2)));
            for (int i = 0; i < NR; i++)
                facc[i] = _mm512_fmadd_ps(off, _mm512_zextps256_ps512(_mm256_loadu_ps(ds + i * x->ng)), facc[i]);
        } else {
            d = half_at(s + 208);
            const __m128i scb = _mm_loadu_si128((const __m128i *)(s + 192));
            const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scb));
            for (int h = 0; h < 2; h++) {
                __m512i lo, hi;
                q6k_half(s + 64 * h, s + 128 + 32 * h, &lo, &hi);
                chunk_rows(acc, NR, lo, spread(sc16, 8 * h, 3), a + 128 * h);  /* sub-blocks 8h .. 8h + 3 */
                chunk_rows(acc, NR, hi, spread(sc16, 8 * h + 4, 3), a + 128 * h + 64);
            }
            const __m512 off = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scb)), _mm512_set1_ps(-32.0f * d));
            for (int i = 0; i < NR; i++) facc[i] = _mm512_fmadd_ps(off, _mm512_loadu_ps(ds + i * x->ng), facc[i]);
        }
        const float *da = x->d + b * R + r0;
        for (int i = 0; i < NR; i++)
            facc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i]), _mm512_set1_ps(d * da[i]), facc[i]);
    }
    for (int i = 0; i < NR; i++) y[(r0 + i) * ystride] = _mm512_reduce_add_ps(facc[i]);
}
#else
#define TILE 4

/* acc[i] += (u·a pairs)·s for NR rows of 32 activations each. */
static inline __attribute__((always_inline)) void half_rows(__m256i *acc, const int NR, __m256i u, __m256i s,
                                                            const int8_t *a) {
    for (int i = 0; i < NR; i++)
        acc[i] = madd16(acc[i], _mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(a + i * QK))), s);
}

static inline __attribute__((always_inline)) void ktile(const KActs *x, int64_t r0, const int NR, const uint8_t *w,
        const int kind, float *y, int64_t ystride) {
    const int64_t R = x->R;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 facc[TILE];
    __m256i acc[TILE];
    for (int i = 0; i < NR; i++) facc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x->nsb; b++) {
        const uint8_t *s = w + b * sb_bytes(kind);
        const int8_t *a = x->a + (b * R + r0) * QK;
        const float *ds = x->dsum + r0 * x->ng + b * sb_groups(kind);
        for (int i = 0; i < NR; i++) acc[i] = _mm256_setzero_si256();
        float d;
        if (kind == Q4_K) {
            uint64_t sc, mn;
            q4k_scale_min(s + 4, &sc, &mn);
            d = half_at(s);
            for (int c = 0; c < 4; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(s + 16 + 32 * c));
                half_rows(acc, NR, _mm256_and_si256(v, m4), _mm256_set1_epi16((short)((sc >> (16 * c)) & 0xFF)),
                          a + 64 * c);
                half_rows(acc, NR, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4),
                          _mm256_set1_epi16((short)((sc >> (16 * c + 8)) & 0xFF)), a + 64 * c + 32);
            }
            const __m256 off = bytes_f32(mn, -half_at(s + 2));
            for (int i = 0; i < NR; i++) facc[i] = _mm256_fmadd_ps(off, _mm256_loadu_ps(ds + i * x->ng), facc[i]);
        } else {
            d = half_at(s + 208);
            const int8_t *sc = (const int8_t *)(s + 192);
            for (int h = 0; h < 2; h++) {
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(s + 64 * h));
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(s + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
                for (int q = 0; q < 4; q++) {  /* 32 weights each: (l0 lo, l1 lo, l0 hi, l1 hi) with qh bits 2q */
                    const __m256i l = q % 2 ? l1 : l0;
                    const __m256i low = q < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    const __m256i top = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * q), m2);
                    const int g = 8 * h + 2 * q;
                    half_rows(acc, NR, _mm256_or_si256(low, _mm256_slli_epi16(top, 4)), two_scales(sc[g], sc[g + 1]),
                              a + 128 * h + 32 * q);
                }
            }
            const __m128i scb = _mm_loadu_si128((const __m128i *)sc);
            const __m256 k32 = _mm256_set1_ps(-32.0f * d);
            const __m256 off0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb)), k32);
            const __m256 off1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(scb, 8))), k32);
            for (int i = 0; i < NR; i++) {
                facc[i] = _mm256_fmadd_ps(off0, _mm256_loadu_ps(ds + i * x->ng), facc[i]);
                facc[i] = _mm256_fmadd_ps(off1, _mm256_loadu_ps(ds + i * x->ng + 8), facc[i]);
            }
        }
        const float *da = x->d + b * R + r0;
        for (int i = 0; i < NR; i++)
            facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i]), _mm256_set1_ps(d * da[i]), facc[i]);
    }
    for (int i = 0; i < NR; i++) y[(r0 + i) * ystride] = hsum8(facc[i]);
}
#endif

/* One weight row against every row of x, tiles of TILE rows, the remainder with its own constant count. */
static inline __attribute__((always_inline)) void kcolumn(const KActs *x, const uint8_t *w, const int kind, float *y,
                                                          int64_t N) {
    int64_t r0 = 0;
    for (; r0 + TILE <= x->R; r0 += TILE) ktile(x, r0, TILE, w, kind, y, N);
    switch (x->R - r0) {
#if TILE > 4
        case 7: ktile(x, r0, 7, w, kind, y, N); break;
        case 6: ktile(x, r0, 6, w, kind, y, N); break;
        case 5: ktile(x, r0, 5, w, kind, y, N); break;
        case 4: ktile(x, r0, 4, w, kind, y, N); break;
#endif
        case 3: ktile(x, r0, 3, w, kind, y, N); break;
        case 2: ktile(x, r0, 2, w, kind, y, N); break;
        case 1: ktile(x, r0, 1, w, kind, y, N); break;
        default: break;
    }
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ (+ bias (N,) fp32 unless NULL), W (N, K/256 super-blocks) of `kind` 4 (Q4_K)
   or 6 (Q6_K) as the file stores them. Returns 0; -1 when scratch could not be allocated; -2 for a kind or K it does
   not take. */
int parley_kgemm(const float *x, int64_t R, int64_t K, const uint8_t *blocks, int kind, int64_t N, const float *bias,
                 float *y, int threads) {
    if ((kind != Q4_K && kind != Q6_K) || K % QK != 0) return -2;
    const int64_t nsb = K / QK, ng = nsb * sb_groups(kind), row_bytes = nsb * sb_bytes(kind);
    int8_t *a = malloc((size_t)(R * K));
    float *d = malloc(sizeof(float) * (size_t)(R * nsb));
    float *dsum = malloc(sizeof(float) * (size_t)(R * ng));
    if (!a || !d || !dsum) {
        free(a); free(d); free(dsum);
        return -1;
    }
    quantize_rows(x, R, K, QK / sb_groups(kind), a, d, dsum);
    const KActs acts = {a, d, dsum, R, nsb, ng};
    #pragma omp parallel for schedule(static) num_threads(threads) if (N * K * (R < 8 ? R : 8) > (1 << 18))
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *w = blocks + n * row_bytes;
        if (kind == Q4_K)
            kcolumn(&acts, w, Q4_K, y + n, N);
        else
            kcolumn(&acts, w, Q6_K, y + n, N);
        if (bias)  /* after the sum, as torch's y + b rounds it */
            for (int64_t r = 0; r < R; r++) y[r * N + n] += bias[n];
    }
    free(a); free(d); free(dsum);
    return 0;
}
