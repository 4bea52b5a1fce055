/* Parley's CPU product over weights kept in GGUF-like blocks: y (R, N) = x (R, K) @ Wᵀ, W never dequantized.

   Weights: per row n, unsigned codes u (one byte each, or two 4-bit codes a byte), and per group of G (16 or 32)
   weights an fp16 scale s and offset o: w = s·u + o. Symmetric formats store no offsets: o = -zero·s.
   A 4-bit block of 32 is 16 bytes, byte j holding weight j (low nibble) and weight j + 16 (high nibble).

   Activations are quantized per block of 32, as llama.cpp does for its quantized dot products: x ≈ d·a with
   a in int8, d = max|x| / 127. A block's dot is then d·(s·Σ u·a) + o·d·Σa (one integer dot product per block and
   per group: VNNI's vpdpbusd, u8 × s8). Every row of a step is multiplied against a weight block while it is in
   registers, so a step reads the weights once for all of its rows. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#define QB 32   /* activation block */

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }

static inline __m256i load_codes(const uint8_t *w, int bits, int b) {
    if (bits == 8)
        return _mm256_loadu_si256((const __m256i *)(w + (size_t)b * QB));
    __m128i v = _mm_loadu_si128((const __m128i *)(w + (size_t)b * (QB / 2)));
    __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* Σ u·a over each 4 consecutive bytes, eight int32 lanes. `wide`: codes may exceed 127, where AVX2's saturating
   pairwise add could overflow; there the codes are taken as u - 128 (the caller adds 128·Σa back). */
static inline __m256i dot4(__m256i u, __m256i a, int wide) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)wide;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, a);
#elif defined(__AVXVNNI__)
    (void)wide;
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, a);
#else
    __m256i ones = _mm256_set1_epi16(1);
    if (wide) {  /* q = u - 128 as int8; |q|·sign(a, q) stays within maddubs' int16 pair sums */
        __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q)), ones);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), ones);
#endif
}

#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define WIDE_SHIFT 0
#else
#define WIDE_SHIFT 128
#endif

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The scales of block b as eight lanes: each lane covers 4 weights, so a group of 16 owns four lanes. */
static inline __m256 block_scales(const uint16_t *s, int group, int64_t b) {
    if (group == 32)
        return _mm256_set1_ps(h2f(s[b]));
    return _mm256_set_m128(_mm_set1_ps(h2f(s[2 * b + 1])), _mm_set1_ps(h2f(s[2 * b])));
}

typedef struct {
    const int8_t *a;     /* (R, K) activation codes */
    const float *d;      /* (R, K/32) activation scales */
    const float *dsum;   /* (R, K/group) d·Σa per weight group (offset formats) */
    const int32_t *corr; /* (R, K/4) start of each lane's integer sum: -zero·Σa of its group in the group's first
                            lane (symmetric formats), so Σ(u - zero)·a comes out of the dot product itself */
    int64_t K;
} Acts;

#if defined(__AVX512VL__)
#define TILE 8  /* rows held in registers against one weight block (32 vector registers) */
#else
#define TILE 4
#endif

static inline float dot_f32(const float *p, const float *q, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(p + i), _mm256_loadu_ps(q + i), acc);
    float tail = 0.0f;
    for (; i < n; i++) tail += p[i] * q[i];
    return hsum(acc) + tail;
}

/* NR rows of y against one weight row: y[r] = Σ_b d_rb·Σ_lanes(s·dot) (+ Σ_g o_g·dsum_rg). NR is a constant at each
   call site, so the accumulators stay in registers. `of`: the row's offsets as fp32, or NULL. */
static inline __attribute__((always_inline)) void tile(const Acts *x, int64_t r0, const int NR, const uint8_t *w,
        const uint16_t *s, const float *of, int bits, int group, int wide, float *y, int64_t ystride) {
    const int64_t K = x->K, nb = K / QB, ng = K / group;
    __m256 acc[TILE];
    for (int i = 0; i < NR; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m256i u = load_codes(w, bits, (int)b);
        __m256 sv = block_scales(s, group, b);
        for (int i = 0; i < NR; i++) {
            const int64_t r = r0 + i;
            __m256i av = _mm256_loadu_si256((const __m256i *)(x->a + r * K + b * QB));
            __m256i c = _mm256_loadu_si256((const __m256i *)(x->corr + r * (K / 4) + b * 8));
            __m256i dp = _mm256_add_epi32(c, dot4(u, av, wide));
            __m256 f = _mm256_mul_ps(sv, _mm256_set1_ps(x->d[r * nb + b]));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), f, acc[i]);
        }
    }
    for (int i = 0; i < NR; i++)
        y[(r0 + i) * ystride] = hsum(acc[i]) + (of ? dot_f32(of, x->dsum + (r0 + i) * ng, ng) : 0.0f);
}

/* Activation codes per block of 32, their scales, and per weight group d·Σa and the dot products' start values
   (`zero`: the codes' zero for symmetric formats, else 0; a `wide` AVX2 dot already takes 128 off each code). */
static void quantize_rows(const float *x, int64_t R, int64_t K, int group, int zero, int wide, int8_t *a, float *d,
                          float *dsum, int32_t *corr) {
    const int64_t nb = K / QB, ng = K / group;
    const int lanes = group / 4, shift = zero - (wide ? 128 : 0);
    memset(corr, 0, sizeof(int32_t) * (size_t)(R * (K / 4)));
    for (int64_t r = 0; r < R; r++) {
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + r * K + b * QB;
            float amax = 0.0f;
            for (int i = 0; i < QB; i++) amax = fmaxf(amax, fabsf(xb[i]));
            const float db = amax / 127.0f, inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int sum[2] = {0, 0};
            for (int i = 0; i < QB; i++) {
                int q = (int)lrintf(xb[i] * inv);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                a[r * K + b * QB + i] = (int8_t)q;
                sum[i >= 16] += q;
            }
            d[r * nb + b] = db;
            const int64_t g0 = b * QB / group;
            for (int h = 0; h < QB / group; h++) {
                const int total = group == 16 ? sum[h] : sum[0] + sum[1];
                dsum[r * ng + g0 + h] = db * (float)total;
                corr[r * (K / 4) + (g0 + h) * lanes] = -shift * total;
            }
        }
    }
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ. codes (N, K·bits/8) uint8; scales, offsets (N, K/group) fp16 (offsets NULL:
   symmetric around `zero`). K a multiple of 32. Returns 0, or -1 when scratch could not be allocated. */
int parley_qgemm(const float *x, int64_t R, int64_t K, const uint8_t *codes, const uint16_t *scales,
                 const uint16_t *offsets, int bits, int group, int zero, int64_t N, float *y, int threads) {
    const int64_t ng = K / group, row_bytes = K * bits / 8;
    const int wide = bits == 8 && !offsets && zero == 128 && WIDE_SHIFT != 0;
    int8_t *a = malloc((size_t)(R * K));
    float *d = malloc(sizeof(float) * (size_t)(R * (K / QB)));
    float *dsum = malloc(sizeof(float) * (size_t)(R * ng));
    int32_t *corr = malloc(sizeof(int32_t) * (size_t)(R * (K / 4)));
    if (!a || !d || !dsum || !corr) {
        free(a); free(d); free(dsum); free(corr);
        return -1;
    }
    quantize_rows(x, R, K, group, offsets ? 0 : zero, wide, a, d, dsum, corr);
    const Acts acts = {a, d, dsum, corr, K};
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (N * K * (R < 8 ? R : 8) > (1 << 18))
    {
        float *of = offsets ? malloc(sizeof(float) * (size_t)ng) : NULL;
        if (offsets && !of) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t n = 0; n < N; n++) {
            if (offsets && !of) continue;
            const uint8_t *w = codes + n * row_bytes;
            const uint16_t *s = scales + n * ng;
            if (of)
                for (int64_t g = 0; g < ng; g++) of[g] = h2f(offsets[n * ng + g]);
            int64_t r0 = 0;
            for (; r0 + TILE <= R; r0 += TILE) tile(&acts, r0, TILE, w, s, of, bits, group, wide, y + n, N);
            switch (R - r0) {  /* constant row counts: each call keeps its accumulators in registers */
#if TILE > 4
                case 7: tile(&acts, r0, 7, w, s, of, bits, group, wide, y + n, N); break;
                case 6: tile(&acts, r0, 6, w, s, of, bits, group, wide, y + n, N); break;
                case 5: tile(&acts, r0, 5, w, s, of, bits, group, wide, y + n, N); break;
                case 4: tile(&acts, r0, 4, w, s, of, bits, group, wide, y + n, N); break;
#endif
                case 3: tile(&acts, r0, 3, w, s, of, bits, group, wide, y + n, N); break;
                case 2: tile(&acts, r0, 2, w, s, of, bits, group, wide, y + n, N); break;
                case 1: tile(&acts, r0, 1, w, s, of, bits, group, wide, y + n, N); break;
                default: break;
            }
        }
        free(of);
    }
    free(a); free(d); free(dsum); free(corr);
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
