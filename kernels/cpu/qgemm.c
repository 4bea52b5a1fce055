/* Parley's CPU product over weights kept in GGUF-like blocks: y (R, N) = x (R, K) @ Wᵀ, W never dequantized.

   Weights: per row n, unsigned codes u (one byte each, or two 4-bit codes a byte), and per group of G (16 or 32)
   weights an fp16 scale s and offset o: w = s·u + o. Symmetric formats store no offsets: o = -zero·s.
   A 4-bit block of 32 is 16 bytes, byte j holding weight j (low nibble) and weight j + 16 (high nibble); a 5-bit
   block (Q5_1, Q5_K) is those 16 bytes then 4 whose bit j is weight j's fifth bit (16), as GGUF's Q5 blocks.
   With a `lut` (MXFP4's 4-bit floats), a 4-bit code is an index: its code is lut[index] (one byte shuffle).

   Activations are quantized per block of 32, as llama.cpp does for its quantized dot products: x ≈ d·a with
   a in int8, d = max|x| / 127. A block's dot is then d·(s·Σ u·a) + o·d·Σa (one integer dot product per block and
   per group: VNNI's vpdpbusd, u8 × s8). Every row of a step is multiplied against a weight block while it is in
   registers, so a step reads the weights once for all of its rows. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

#define QB 32   /* activation block */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline __m256i load_codes(const uint8_t *w, int bits, int b, const uint8_t *lut) {
    if (bits == 8)
        return _mm256_loadu_si256((const __m256i *)(w + (size_t)b * QB));
    const uint8_t *p = w + (size_t)b * (QB / 8 * bits);
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_set1_epi8(0x0F);
    __m256i u = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
    if (bits == 5) {
        uint32_t high;
        memcpy(&high, p + QB / 2, 4);
        u = _mm256_or_si256(u, fifth_bits(high));
    }
    if (lut)  /* each nibble an index into the 16 codes (both 128-bit lanes look up the same table) */
        u = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lut)), u);
    return u;
}

/* c + Σ u·a over each 4 consecutive bytes, eight int32 lanes. `wide`: codes may exceed 127, where AVX2's saturating
   pairwise add could overflow; there the codes are taken as u - 128 (the caller's c adds 128·Σa back). */
static inline __m256i dot4(__m256i c, __m256i u, __m256i a, int wide) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)wide;
    return _mm256_dpbusd_epi32(c, u, a);
#elif defined(__AVXVNNI__)
    (void)wide;
    return _mm256_dpbusd_avx_epi32(c, u, a);
#else
    __m256i ones = _mm256_set1_epi16(1);
    if (wide) {  /* q = u - 128 as int8; |q|·sign(a, q) stays within maddubs' int16 pair sums */
        __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
        u = _mm256_sign_epi8(q, q);
        a = _mm256_sign_epi8(a, q);
    }
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones));
#endif
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define WIDE_SHIFT 0
#else
#define WIDE_SHIFT 128
#endif

/* The scales of block b as eight lanes: each lane covers 4 weights, so a group of 16 owns four lanes. */
static inline __m256 block_scales(const uint16_t *s, int group, int64_t b) {
    if (group == 32)
        return _mm256_set1_ps(h2f(s[b]));
    return _mm256_set_m128(_mm_set1_ps(h2f(s[2 * b + 1])), _mm_set1_ps(h2f(s[2 * b])));
}

/* Activations in chunks of 64 (two blocks), chunk-major so that a tile's rows sit at fixed offsets:
   a (K64/64, R, 64) codes, dl (K64/64, R, 16) each block's scale repeated over its eight lanes (zeros past K). */
typedef struct {
    const int8_t *a;
    const float *dl;
    const float *dsum;   /* (R, K/group) d·Σa per weight group */
    int64_t R, K;
} Acts;

#define CH 64

/* out[i] = k·h[i] for fp16 h, eight at a time. */
static inline void halves_to_f32(float *out, const uint16_t *h, int64_t n, float k) {
    const __m256 kv = _mm256_set1_ps(k);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(kv, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)))));
    for (; i < n; i++) out[i] = k * h2f(h[i]);
}

/* One block (32 weights) of NR rows: acc[i] += Σ u·a · s·d, eight lanes. */
static inline __attribute__((always_inline)) void block8(__m256 *acc, const int NR, __m256i u, __m256 sv,
        const int8_t *a, const float *dl, int wide) {
    for (int i = 0; i < NR; i++) {
        __m256i dp = dot4(_mm256_setzero_si256(), u, _mm256_loadu_si256((const __m256i *)(a + i * CH)), wide);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_mul_ps(sv, _mm256_loadu_ps(dl + i * 16)), acc[i]);
    }
}

/* PARLEY_YMM: the 256-bit tile on an AVX-512 CPU too (what AVX-VNNI CPUs run; the tests build it this way) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(PARLEY_YMM)
#define TILE 8  /* rows held in registers against one weight chunk (32 vector registers) */

/* Two blocks of codes in one register: block b in lanes 0-7, b + 1 in lanes 8-15. */
static inline __m512i load_codes2(const uint8_t *w, int bits, int64_t b, const uint8_t *lut) {
    if (bits == 8)
        return _mm512_loadu_si512((const void *)(w + b * QB));
    if (bits == 5)
        return _mm512_inserti64x4(_mm512_castsi256_si512(load_codes(w, 5, (int)b, NULL)),
                                  load_codes(w, 5, (int)b + 1, NULL), 1);
    __m256i v = _mm256_loadu_si256((const __m256i *)(w + b * (QB / 2)));
    __m256i m = _mm256_set1_epi8(0x0F);
    __m512i lo = _mm512_castsi256_si512(_mm256_and_si256(v, m));
    __m512i hi = _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(v, 4), m));
    __m512i u = _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi);
    if (lut)
        u = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)lut)), u);
    return u;
}

static inline __m512 block_scales2(const uint16_t *s, int group, int64_t b) {
    if (group == 32) {
        uint32_t pair;
        memcpy(&pair, s + b, 4);
        __m512 f = _mm512_cvtph_ps(_mm256_set1_epi32((int)pair));
        return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0), f);
    }
    uint64_t quad;
    memcpy(&quad, s + 2 * b, 8);
    __m512 f = _mm512_cvtph_ps(_mm256_set1_epi64x((long long)quad));
    return _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), f);
}

/* NR rows of y against one weight row: y[r] = Σ_b Σ_lanes(d·s·Σu·a) + Σ_g o_g·dsum_rg, `of` holding the row's
   offsets o_g as fp32 (-zero·s_g for symmetric formats). NR is a constant at each call site, so the accumulators
   stay in registers. */
static inline __attribute__((always_inline)) void tile(const Acts *x, int64_t r0, const int NR, const uint8_t *w,
        const uint16_t *s, const float *of, int bits, const uint8_t *lut, int group, int wide, float *y,
        int64_t ystride) {
    const int64_t R = x->R, K = x->K, nb = K / QB, ng = K / group;
    __m512 acc[TILE];
    __m256 tail[TILE];
    for (int i = 0; i < NR; i++) acc[i] = _mm512_setzero_ps();
    const int8_t *a = x->a + r0 * CH;
    const float *dl = x->dl + r0 * 16;
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, a += R * CH, dl += R * 16) {
        __m512i u = load_codes2(w, bits, b, lut);
        __m512 sv = block_scales2(s, group, b);
        for (int i = 0; i < NR; i++) {
            __m512i dp = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                             _mm512_loadu_si512((const void *)(a + i * CH)));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(sv, _mm512_loadu_ps(dl + i * 16)),
                                     acc[i]);
        }
    }
    for (int i = 0; i < NR; i++) tail[i] = _mm256_setzero_ps();
    if (b < nb)  /* an odd last block: the first half of its chunk */
        block8(tail, NR, load_codes(w, bits, (int)b, lut), block_scales(s, group, b), a, dl, wide);
    for (int i = 0; i < NR; i++)
        y[(r0 + i) * ystride] = _mm512_reduce_add_ps(acc[i]) + hsum8(tail[i])
            + dot_f32(of, x->dsum + (r0 + i) * ng, ng);
}
#else
#define TILE 4

static inline __attribute__((always_inline)) void tile(const Acts *x, int64_t r0, const int NR, const uint8_t *w,
        const uint16_t *s, const float *of, int bits, const uint8_t *lut, int group, int wide, float *y,
        int64_t ystride) {
    const int64_t R = x->R, K = x->K, nb = K / QB, ng = K / group;
    __m256 acc[TILE];
    for (int i = 0; i < NR; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int64_t at = (b / 2) * R + r0, half = b % 2;
        block8(acc, NR, load_codes(w, bits, (int)b, lut), block_scales(s, group, b), x->a + at * CH + half * QB,
               x->dl + at * 16 + half * 8, wide);
    }
    for (int i = 0; i < NR; i++)
        y[(r0 + i) * ystride] = hsum8(acc[i]) + dot_f32(of, x->dsum + (r0 + i) * ng, ng);
}
#endif

/* Activation codes per block of 32 and their lane scales, chunk-major, and d·Σa per weight group. */
static void quantize_rows(const float *x, int64_t R, int64_t K, int group, int8_t *a, float *dl, float *dsum) {
    const int64_t nb = K / QB, ng = K / group, nc = (K + CH - 1) / CH;
    memset(a, 0, (size_t)(nc * R * CH));
    memset(dl, 0, sizeof(float) * (size_t)(nc * R * 16));
    for (int64_t r = 0; r < R; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * K + b * QB;
            const int64_t at = (b / 2) * R + r, half = b % 2;
            int8_t *ab = a + at * CH + half * QB;
            float amax = 0.0f;
            for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const float db = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int sum[2] = {0, 0};
            for (int i = 0; i < QB; i++) {
                int q = (int)lrintf(xb[i] * inv);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                ab[i] = (int8_t)q;
                sum[i >= 16] += q;
            }
            for (int i = 0; i < 8; i++) dl[at * 16 + half * 8 + i] = db;
            if (group == 16) {
                dsum[r * ng + 2 * b] = db * (float)sum[0];
                dsum[r * ng + 2 * b + 1] = db * (float)sum[1];
            } else {
                dsum[r * ng + b] = db * (float)(sum[0] + sum[1]);
            }
        }
    }
}

/* x's activations quantized for the products (quantize_rows) in scratch of their own: 0, or -1 without memory. */
static int make_acts(const float *x, int64_t R, int64_t K, int group, Acts *acts) {
    const int64_t nc = (K + CH - 1) / CH;
    int8_t *a = malloc((size_t)(nc * R * CH));
    float *dl = malloc(sizeof(float) * (size_t)(nc * R * 16));
    float *dsum = malloc(sizeof(float) * (size_t)(R * (K / group)));
    if (!a || !dl || !dsum) {
        free(a); free(dl); free(dsum);
        return -1;
    }
    quantize_rows(x, R, K, group, a, dl, dsum);
    *acts = (Acts){a, dl, dsum, R, K};
    return 0;
}

static void free_acts(const Acts *acts) {
    free((void *)acts->a); free((void *)acts->dl); free((void *)acts->dsum);
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ (+ bias (N,) fp32 unless NULL). codes (N, K·bits/8) uint8, bits 4, 5 or 8;
   scales, offsets (N, K/group) fp16 (offsets NULL: symmetric around `zero`); lut: NULL, or with 4-bit codes the 16
   codes (at most 127) their indices stand for. K a multiple of 32. Returns 0, or -1 when scratch could not be
   allocated. */
int parley_qgemm(const float *x, int64_t R, int64_t K, const uint8_t *codes, const uint16_t *scales,
                 const uint16_t *offsets, int bits, const uint8_t *lut, int group, int zero, int64_t N,
                 const float *bias, float *y, int threads) {
    const int64_t ng = K / group, row_bytes = K * bits / 8;
    /* a `wide` AVX2 dot takes 128 off each code: the same as 128 more on the zero */
    const int wide = bits == 8 && !offsets && zero == 128 && WIDE_SHIFT != 0;
    const float zero_f = (float)(zero - (wide ? WIDE_SHIFT : 0));
    const int64_t cols = block_cols(row_bytes + 2 * ng * (offsets ? 2 : 1)), nblk = (N + cols - 1) / cols;
    Acts acts;
    if (make_acts(x, R, K, group, &acts) != 0) return -1;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (N * K * (R < 8 ? R : 8) > (1 << 18))
    {
        float *offs = malloc(sizeof(float) * (size_t)(ng * cols));  /* a block's offsets as fp32, a column's ng apart */
        if (!offs) {
            #pragma omp atomic write
            failed = 1;
        }
        /* long runs taken in turn: a core slowed by the VM's neighbours takes fewer; each tile of x meets a whole block */
        #pragma omp for schedule(dynamic, block_chunk(R, TILE, N, threads, cols))
        for (int64_t j = 0; j < nblk; j++) {
            if (!offs) continue;
            const int64_t n0 = j * cols, n1 = n0 + cols < N ? n0 + cols : N;
            for (int64_t n = n0; n < n1; n++) {
                if (offsets)
                    halves_to_f32(offs + (n - n0) * ng, offsets + n * ng, ng, 1.0f);
                else
                    halves_to_f32(offs + (n - n0) * ng, scales + n * ng, ng, -zero_f);
            }
#define QTILE(r0, nr)                                                                                        \
            for (int64_t n = n0; n < n1; n++)                                                                \
                tile(&acts, r0, nr, codes + n * row_bytes, scales + n * ng, offs + (n - n0) * ng, bits, lut, \
                     group, wide, y + n, N)
            EACH_TILE(R, TILE, QTILE);
#undef QTILE
            if (bias) add_bias(y, bias, R, N, n0, n1);
        }
        free(offs);
    }
    free_acts(&acts);
    return failed ? -1 : 0;
}

/* parley_qgemm over groups of rows, each against its own matrix: group m's rows first[m] .. first[m] + count[m] - 1
   of x times matrix m (codes[m], scales[m]: symmetric codes of one layout, as parley_qgemm's) plus bias[m] (N,)
   where `bias` and bias[m] are not NULL, into the same rows of y (R, N): a mixture of experts' chosen experts in one
   call, every group's weight rows shared out among the threads together. Each value is exactly parley_qgemm's for
   that weight row and x row. Returns 0; -1 without scratch memory; -2 for a group outside x. */
int parley_qgemm_grouped(const float *x, int64_t R, int64_t K, const uint8_t *const *codes,
                         const uint16_t *const *scales, int bits, const uint8_t *lut, int group, int zero,
                         const float *const *bias, const int64_t *first, const int64_t *count, int64_t M, int64_t N,
                         float *y, int threads) {
    int64_t widest = 0;
    for (int64_t m = 0; m < M; m++) {
        if (first[m] < 0 || count[m] < 1 || first[m] + count[m] > R) return -2;
        if (count[m] > widest) widest = count[m];
    }
    const int64_t ng = K / group, row_bytes = K * bits / 8;
    const int wide = bits == 8 && zero == 128 && WIDE_SHIFT != 0;
    const float zero_f = (float)(zero - (wide ? WIDE_SHIFT : 0));
    const int64_t total = M * N, run = column_run(total, threads);
    Acts acts;
    if (make_acts(x, R, K, group, &acts) != 0) return -1;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (worth_threads(total, K, widest))
    {
        float *of = malloc(sizeof(float) * (size_t)ng);
        if (!of) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, run)
        for (int64_t j = 0; j < total; j++) {
            if (!of) continue;
            const int64_t m = j / N, n = j - m * N, r = first[m];
            const uint8_t *w = codes[m] + n * row_bytes;
            const uint16_t *s = scales[m] + n * ng;
            halves_to_f32(of, s, ng, -zero_f);
#define GTILE(r0, nr) tile(&acts, r + (r0), nr, w, s, of, bits, lut, group, wide, y + n, N)
            EACH_TILE(count[m], TILE, GTILE);
#undef GTILE
            if (bias && bias[m])  /* after the sum, as parley_qgemm adds it */
                for (int64_t i = r; i < r + count[m]; i++) y[i * N + n] += bias[m][n];
        }
        free(of);
    }
    free_acts(&acts);
    return failed ? -1 : 0;
}

/* What this build multiplies with, for notices and the docs' tables. */
const char *parley_qgemm_isa(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return "avx512-vnni";
#elif defined(__AVXVNNI__)
    return "avx-vnni";
#else
    return "avx2";
#endif
}
