/* Small vector and row helpers shared by Parley's CPU kernels. */
#ifndef PARLEY_SIMD_H
#define PARLEY_SIMD_H
#include <stdint.h>
#include <string.h>
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

/* 32 bits as 32 bytes: byte j is 16 where bit j is set (a 5-bit code's fifth bit), else 0. Each byte takes byte
   j / 8 of the word (a shuffle within 128-bit lanes of the word repeated), then tests its bit j % 8. */
static inline __m256i fifth_bits(uint32_t high) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)high),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
}

#if defined(__AVX512BW__)
/* 64 codes packed in 5 bits (kernels/kquant_layout.pack_fifths: 32 bytes of nibbles, position p in byte p's low
   nibble and 32 + p in its high one, then 8 bytes whose bit p is position p's fifth bit) as bytes u = q + 112 (zero
   128, as Q8_0's). */
static inline __m512i fifths_chunk(const uint8_t *p) {
    const __m256i nib = _mm256_loadu_si256((const __m256i *)p), m = _mm256_set1_epi8(0x0F);
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(nib, m)),
                                         _mm256_and_si256(_mm256_srli_epi16(nib, 4), m), 1);
    uint64_t high;
    memcpy(&high, p + 32, 8);
    const __m512i u = _mm512_add_epi8(v, _mm512_set1_epi8(112));
    return _mm512_mask_add_epi8(u, (__mmask64)high, u, _mm512_set1_epi8(16));
}
#endif

/* Columns a thread takes at a time in a product: four long runs a thread (each weight stream stays sequential),
   taken in turn, so that a core the machine's other work slows takes fewer of them. */
static inline int64_t column_run(int64_t N, int threads) {
    const int64_t run = N / (4 * (int64_t)threads);
    return run > 16 ? run : 16;
}

/* Columns a block of a product: about 128 KB of weight rows, which stay in L2 while every tile of x's rows meets them
   (a prefill's activations outgrow L2; read tile by tile against a block, they stream once a block, not once a
   column). A decode's rows are one tile: its blocks run one after another as one stream. */
static inline int64_t block_cols(int64_t row_bytes) {
    const int64_t fit = (128 << 10) / row_bytes;
    return fit > 4 ? fit : 4;
}

/* Blocks a thread takes at a time: a decode (rows in one tile, bound by memory) about column_run's columns, so each
   weight stream stays long; more rows (bound by arithmetic) one block, so the threads end together. */
static inline int64_t block_chunk(int64_t R, int tile, int64_t N, int threads, int64_t cols) {
    const int64_t chunk = column_run(N, threads) / cols;
    return R > tile || chunk < 1 ? 1 : chunk;
}

/* y's columns n0 .. n1 - 1 of every row plus bias, after the sums, as torch's y + b rounds it. */
static inline void add_bias(float *y, const float *bias, int64_t R, int64_t N, int64_t n0, int64_t n1) {
    for (int64_t r = 0; r < R; r++)
        for (int64_t n = n0; n < n1; n++) y[r * N + n] += bias[n];
}

/* Whether a product is worth the threads: small ones run on the calling thread. */
static inline int worth_threads(int64_t N, int64_t K, int64_t R) { return N * K * (R < 8 ? R : 8) > (1 << 18); }

/* Every row of a product: whole tiles of `tile` rows, then the rest, each call with a constant row count so that
   its accumulators stay in registers. CALL(r0, nr) runs rows r0 .. r0 + nr - 1; tile is 8 or 4. */
#define EACH_TILE(rows, tile, CALL)                                              \
    do {                                                                         \
        int64_t r0_ = 0;                                                         \
        for (; r0_ + (tile) <= (rows); r0_ += (tile)) CALL(r0_, tile);           \
        switch ((rows) - r0_) {                                                  \
            case 7: if ((tile) > 7) CALL(r0_, 7); break;                         \
            case 6: if ((tile) > 6) CALL(r0_, 6); break;                         \
            case 5: if ((tile) > 5) CALL(r0_, 5); break;                         \
            case 4: if ((tile) > 4) CALL(r0_, 4); break;                         \
            case 3: CALL(r0_, 3); break;                                         \
            case 2: CALL(r0_, 2); break;                                         \
            case 1: CALL(r0_, 1); break;                                         \
            default: break;                                                      \
        }                                                                        \
    } while (0)

/* The largest of eight lanes. */
static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* max |x[i]| over 32 values. */
static inline float absmax32(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 mx = _mm256_setzero_ps();
    for (int i = 0; i < 32; i += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    return hmax8(mx);
}

/* 32 values times inv, rounded to nearest even (as lrintf), as int8 (|x|·inv ≤ 127). */
static inline void round32(const float *x, float inv, int8_t *out) {
    const __m256 iv = _mm256_set1_ps(inv);
    __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), iv));
    __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), iv));
    __m256i q2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), iv));
    __m256i q3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), iv));
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  /* packs interleave */
    _mm256_storeu_si256((__m256i *)out, p);
}

/* A block of 32 activations quantized as llama.cpp's 32-blocks (x ≈ d·a, d = max|x| / 127, a in -127..127) into
   a and *d; returns Σa. */
static inline int quantize32(const float *x, int8_t *a, float *d) {
    const float amax = absmax32(x);
    *d = amax / 127.0f;
    round32(x, amax > 0.0f ? 127.0f / amax : 0.0f, a);
    int sum = 0;
    for (int i = 0; i < 32; i++) sum += a[i];
    return sum;
}

/* One unit of W = 256 or 128 activations quantized per block of 32 (d = max|x| / 127, as llama.cpp's 32-blocks) in
   the interleaved order of kgemm.c and q8gemm.c: natural weight G·g + 4c + t (G = W/16) at position 64c + 4g + t.
   dl[g] is lane g's block scale, sums[g] the integer Σa over lane g's G weights. */
static inline void quantize_unit(const float *x, int W, int8_t *a, float *dl, int sums[16]) {
    int8_t nat[256];
    const int G = W / 16;
    float d[8];
    for (int j = 0; j < W / 32; j++) {
        const float amax = absmax32(x + 32 * j);
        d[j] = amax / 127.0f;
        round32(x + 32 * j, amax > 0.0f ? 127.0f / amax : 0.0f, nat + 32 * j);
    }
    for (int g = 0; g < 16; g++) {
        int sum = 0;
        for (int i = 0; i < G; i++) sum += nat[G * g + i];
        dl[g] = d[G * g / 32];
        sums[g] = sum;
    }
    for (int w = 0; w < W / 4; w++)  /* natural word w: weights 4w .. 4w + 3, lane 4w / G, chunk 4w % G / 4 */
        memcpy(a + 64 * (4 * w % G / 4) + 4 * (4 * w / G), nat + 4 * w, 4);
}
/* e^x for x in float range (clamped to ±88; a NaN stays NaN): 2^n · p(r), r = x − n·ln2, Cephes' degree-6 polynomial
   (≤ 2 ulp). */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-87.0f), x));  /* x second: NaN passes */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#endif
