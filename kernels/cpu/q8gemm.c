/* Parley's CPU product over byte codes in blocks of 32 with an fp16 scale (Q8_0, Q5_0 and the re-quantized types:
   w = s·(u − 128)), the codes interleaved in units: y (R, N) = x (R, K) @ Wᵀ, W never dequantized.

   A row is cut into units of 256 weights (the last one 128 when K is an odd number of 128s). In a unit of W weights
   the 16 int32 lanes of a 64-byte chunk's integer dot each own one group of G = W/16 weights: weight G·g + 4c + t
   (chunk c, t < 4) sits at position 64c + 4g + t (kernels/kquant_layout.interleave_units). After the unit's chunks
   the lanes hold their groups' sums Σu·a, and the scales apply once per unit in fp32 lanes: one conversion and two
   products per row and unit, where the block-by-block kernel (qgemm.c) takes three float operations per block.

   Activations are quantized per block of 32 as llama.cpp does (x ≈ d·a, d = max|x| / 127) and laid out in the same
   order; each lane's 128·Σa is kept so that VNNI's u8 × s8 dot gives Σ(u − 128)·a exactly after one subtraction.
   AVX2 without VNNI multiplies |u − 128| by a with a's sign moved over, which cannot saturate its int16 pairs.

   Q5_0 is held in 5 bits (`bits` 5, 40 bytes a chunk instead of 64): a chunk's 32 bytes of nibbles, position p in
   byte p's low nibble and 32 + p in its high one, then 8 bytes whose bit p is position p's fifth bit (its 16). A
   chunk is unpacked in registers to the bytes u = q + 112 (zero 128) that the 8-bit layout holds, then the same dot. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

#define UNIT 256
#define PREFETCH 2048  /* bytes ahead on the weight stream */

/* Activations per unit, unit-major so that a tile's rows sit together: a (units, R, 256) int8 in the interleaved
   order, dl (units, R, 16) each lane's block scale, zs (units, R, 16) each lane's 128·Σa. */
typedef struct {
    const int8_t *a;
    const float *dl;
    const int32_t *zs;
    int64_t R, K, units;
} UActs;

static inline int unit_width(int64_t K, int64_t u) { return K - UNIT * u >= UNIT ? UNIT : 128; }

static void quantize_rows(const float *x, int64_t R, int64_t K, int64_t units, int8_t *a, float *dl, int32_t *zs) {
    for (int64_t r = 0; r < R; r++) {
        for (int64_t u = 0; u < units; u++) {
            const int64_t at = u * R + r;
            int sums[16];
            quantize_unit(x + r * K + UNIT * u, unit_width(K, u), a + at * UNIT, dl + at * 16, sums);
            for (int g = 0; g < 16; g++) zs[at * 16 + g] = 128 * sums[g];
        }
    }
}

/* The fp16 block scales of a unit as fp32 lanes over its groups: lane g → s[g / (16 / blocks)]. */
static inline __m128i lane_halves(const uint16_t *s, int W, int half) {
    if (W == UNIT) {  /* 8 blocks, two lanes each: lanes 8·half .. take blocks 4·half .. 4·half + 3 */
        const __m128i v = _mm_loadl_epi64((const __m128i *)(s + 4 * half));
        return _mm_unpacklo_epi16(v, v);
    }
    uint32_t pair;  /* 4 blocks, four lanes each: lanes 8·half .. take blocks 2·half, 2·half + 1 */
    memcpy(&pair, s + 2 * half, 4);
    const __m128i v = _mm_cvtsi32_si128((int)pair), d = _mm_unpacklo_epi16(v, v);
    return _mm_unpacklo_epi32(d, d);
}

/* Unit u (W weights) of a weight row and of the row after it (row_bytes on), both streams prefetched PREFETCH bytes
   ahead: the first row's unit. */
static inline const uint8_t *unit_pair(const uint8_t *w, int64_t row_bytes, int64_t u, int W, int bits) {
    const uint8_t *wu = w + UNIT / 8 * bits * u;
    for (int l = 0; l < W / 8 * bits; l += 64) {
        _mm_prefetch((const char *)(wu + PREFETCH + l), _MM_HINT_T0);
        _mm_prefetch((const char *)(wu + row_bytes + PREFETCH + l), _MM_HINT_T0);
    }
    return wu;
}

/* PARLEY_YMM: the 256-bit tile on an AVX-512 CPU too (what AVX-VNNI CPUs run; the tests build it this way) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(PARLEY_YMM)
#define TILE 8

/* Chunk c of a unit as 64 codes u (zero 128): as held (8 bits), or unpacked from 5 bits (see the top). */
static inline __m512i chunk_codes(const uint8_t *wu, int c, const int bits) {
    if (bits == 8) return _mm512_loadu_si512((const void *)(wu + 64 * c));
    return fifths_chunk(wu + 40 * c);
}

/* NR rows of y against one weight row (NR a constant at each call site: accumulators in registers). */
static inline __attribute__((always_inline)) void utile(const UActs *x, int64_t r0, const int NR, const uint8_t *w,
        const uint16_t *s, float *y, int64_t ystride, const int bits) {
    const int64_t R = x->R;
    __m512 facc[TILE];
    for (int i = 0; i < NR; i++) facc[i] = _mm512_setzero_ps();
    for (int64_t u = 0; u < x->units; u++) {
        const int W = unit_width(x->K, u), C = W / 64;
        const uint8_t *wu = w + UNIT / 8 * bits * u;
        for (int l = 0; l < W / 8 * bits; l += 64) _mm_prefetch((const char *)(wu + PREFETCH + l), _MM_HINT_T0);
        const uint16_t *su = s + 8 * u;
        const __m512 wsc = _mm512_cvtph_ps(_mm256_set_m128i(lane_halves(su, W, 1), lane_halves(su, W, 0)));
        const int64_t at = u * R + r0;
        __m512i codes[4];
        for (int c = 0; c < C; c++) codes[c] = chunk_codes(wu, c, bits);
        for (int i = 0; i < NR; i++) {
            const int8_t *ai = x->a + (at + i) * UNIT;
            const __m512i zs = _mm512_loadu_si512((const void *)(x->zs + (at + i) * 16));
            __m512i acc = _mm512_sub_epi32(_mm512_setzero_si512(), zs);
            for (int c = 0; c < C; c++)
                acc = _mm512_dpbusd_epi32(acc, codes[c], _mm512_loadu_si512((const void *)(ai + 64 * c)));
            const __m512 scale = _mm512_mul_ps(wsc, _mm512_loadu_ps(x->dl + (at + i) * 16));
            facc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), scale, facc[i]);
        }
    }
    for (int i = 0; i < NR; i++) y[(r0 + i) * ystride] = _mm512_reduce_add_ps(facc[i]);
}

/* utile for two neighbouring weight rows (w, w + row_bytes; y's columns n, n + 1): each activation chunk loaded once
   for both and two weight streams in flight, each column's steps exactly utile's (the same bits). One row: 1.08-1.22x
   utile alone, 40 rows 0.95-1.07x (bench/cpu_kernel_ab.py, the embedded model's shapes). */
static inline __attribute__((always_inline)) void utile2(const UActs *x, int64_t r0, const int NR, const uint8_t *w,
        int64_t row_bytes, const uint16_t *s, int64_t srow, float *y, int64_t ystride, const int bits) {
    const int64_t R = x->R;
    __m512 f0[TILE], f1[TILE];
    for (int i = 0; i < NR; i++) f0[i] = f1[i] = _mm512_setzero_ps();
    for (int64_t u = 0; u < x->units; u++) {
        const int W = unit_width(x->K, u), C = W / 64;
        const uint8_t *wu = unit_pair(w, row_bytes, u, W, bits), *wv = wu + row_bytes;
        const uint16_t *su = s + 8 * u, *sv = su + srow;
        const __m512 wsc0 = _mm512_cvtph_ps(_mm256_set_m128i(lane_halves(su, W, 1), lane_halves(su, W, 0)));
        const __m512 wsc1 = _mm512_cvtph_ps(_mm256_set_m128i(lane_halves(sv, W, 1), lane_halves(sv, W, 0)));
        const int64_t at = u * R + r0;
        __m512i c0[4], c1[4];
        for (int c = 0; c < C; c++) {
            c0[c] = chunk_codes(wu, c, bits);
            c1[c] = chunk_codes(wv, c, bits);
        }
        for (int i = 0; i < NR; i++) {
            const int8_t *ai = x->a + (at + i) * UNIT;
            const __m512i zs = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                _mm512_loadu_si512((const void *)(x->zs + (at + i) * 16)));
            __m512i a0 = zs, a1 = zs;
            for (int c = 0; c < C; c++) {
                const __m512i av = _mm512_loadu_si512((const void *)(ai + 64 * c));
                a0 = _mm512_dpbusd_epi32(a0, c0[c], av);
                a1 = _mm512_dpbusd_epi32(a1, c1[c], av);
            }
            const __m512 dl = _mm512_loadu_ps(x->dl + (at + i) * 16);
            f0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(wsc0, dl), f0[i]);
            f1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(wsc1, dl), f1[i]);
        }
    }
    for (int i = 0; i < NR; i++) {
        y[(r0 + i) * ystride] = _mm512_reduce_add_ps(f0[i]);
        y[(r0 + i) * ystride + 1] = _mm512_reduce_add_ps(f1[i]);
    }
}
#define PAIR_ROWS TILE  /* columns() takes weight rows two at a time at every tile */
#define PAIR_FIFTHS 1
#else
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define TILE 4
#else
#define TILE 8
#endif

/* c + Σ (u − 128)·a over each 4 consecutive bytes, eight int32 lanes; z the lanes' 128·Σa. */
static inline __m256i dot4(__m256i c, __m256i u, __m256i a) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(c, u, a);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(c, u, a);
#else
    const __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));  /* u − 128 as int8 */
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q)),
                                                 _mm256_set1_epi16(1)));
#endif
}

/* Half h (positions 32h ..) of chunk c of a unit as 32 codes u (zero 128): as held, or unpacked from 5 bits. */
static inline __m256i half_codes(const uint8_t *wu, int c, int h, const int bits) {
    if (bits == 8) return _mm256_loadu_si256((const __m256i *)(wu + 64 * c + 32 * h));
    const uint8_t *p = wu + 40 * c;
    const __m256i nib = _mm256_loadu_si256((const __m256i *)p), m = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_and_si256(h ? _mm256_srli_epi16(nib, 4) : nib, m);
    uint32_t high;
    memcpy(&high, p + 32 + 4 * h, 4);
    return _mm256_add_epi8(_mm256_add_epi8(v, _mm256_set1_epi8(112)), fifth_bits(high));
}

#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define ZERO_SUMS 1  /* the u8 × s8 dot sums u·a: take 128·Σa back */
#else
#define ZERO_SUMS 0
#endif

static inline __attribute__((always_inline)) void utile(const UActs *x, int64_t r0, const int NR, const uint8_t *w,
        const uint16_t *s, float *y, int64_t ystride, const int bits) {
    const int64_t R = x->R;
    __m256 facc[TILE];
    for (int i = 0; i < NR; i++) facc[i] = _mm256_setzero_ps();
    for (int64_t u = 0; u < x->units; u++) {
        const int W = unit_width(x->K, u), C = W / 64;
        const uint8_t *wu = w + UNIT / 8 * bits * u;
        for (int l = 0; l < W / 8 * bits; l += 64) _mm_prefetch((const char *)(wu + PREFETCH + l), _MM_HINT_T0);
        const int64_t at = u * R + r0;
        for (int h = 0; h < 2; h++) {  /* lanes 8h .. 8h + 7 */
            const __m256 wsc = _mm256_cvtph_ps(lane_halves(s + 8 * u, W, h));
            __m256i codes[4];
            for (int c = 0; c < C; c++) codes[c] = half_codes(wu, c, h, bits);
            for (int i = 0; i < NR; i++) {
                const int8_t *ai = x->a + (at + i) * UNIT + 32 * h;
                __m256i acc = ZERO_SUMS ? _mm256_sub_epi32(_mm256_setzero_si256(),
                        _mm256_loadu_si256((const __m256i *)(x->zs + (at + i) * 16 + 8 * h))) : _mm256_setzero_si256();
                for (int c = 0; c < C; c++)
                    acc = dot4(acc, codes[c], _mm256_loadu_si256((const __m256i *)(ai + 64 * c)));
                facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc),
                                          _mm256_mul_ps(wsc, _mm256_loadu_ps(x->dl + (at + i) * 16 + 8 * h)), facc[i]);
            }
        }
    }
    for (int i = 0; i < NR; i++) y[(r0 + i) * ystride] = hsum8(facc[i]);
}

/* utile for two neighbouring weight rows at a decode's one row (16 registers: each chunk's codes are read as they are
   used, the activation chunk once for both); each column's steps exactly utile's (the same bits). */
static inline __attribute__((always_inline)) void utile2(const UActs *x, int64_t r0, const int NR, const uint8_t *w,
        int64_t row_bytes, const uint16_t *s, int64_t srow, float *y, int64_t ystride, const int bits) {
    const int64_t R = x->R;
    for (int i = 0; i < NR; i++) {
        __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
        for (int64_t u = 0; u < x->units; u++) {
            const int W = unit_width(x->K, u), C = W / 64;
            const uint8_t *wu = unit_pair(w, row_bytes, u, W, bits), *wv = wu + row_bytes;
            const int64_t at = u * R + r0 + i;
            for (int h = 0; h < 2; h++) {
                const int8_t *ai = x->a + at * UNIT + 32 * h;
                const __m256i z = ZERO_SUMS ? _mm256_sub_epi32(_mm256_setzero_si256(),
                        _mm256_loadu_si256((const __m256i *)(x->zs + at * 16 + 8 * h))) : _mm256_setzero_si256();
                __m256i a0 = z, a1 = z;
                for (int c = 0; c < C; c++) {
                    const __m256i av = _mm256_loadu_si256((const __m256i *)(ai + 64 * c));
                    a0 = dot4(a0, half_codes(wu, c, h, bits), av);
                    a1 = dot4(a1, half_codes(wv, c, h, bits), av);
                }
                const __m256 dl = _mm256_loadu_ps(x->dl + at * 16 + 8 * h);
                f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a0), _mm256_mul_ps(_mm256_cvtph_ps(lane_halves(s + 8 * u, W, h)), dl),
                                     f0);
                f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a1),
                                     _mm256_mul_ps(_mm256_cvtph_ps(lane_halves(s + srow + 8 * u, W, h)), dl), f1);
            }
        }
        y[(r0 + i) * ystride] = hsum8(f0);
        y[(r0 + i) * ystride + 1] = hsum8(f1);
    }
}
#define PAIR_ROWS 1  /* more rows share a weight row's codes in registers, which two columns' would not fit */
#define PAIR_FIFTHS ZERO_SUMS  /* AVX2 alone: 5-bit unpacking and its sign steps spill (0.81-0.93x paired) */
#endif

/* Every column n of y: codes rows of K·bits/8 bytes; `bits` a constant at each call, so the tiles unpack or not.
   Blocks of columns (block_cols), each tile of x's rows against the whole block before the next tile. */
static inline __attribute__((always_inline)) void columns(const UActs *acts, const uint8_t *codes,
        const uint16_t *scales, int64_t N, const float *bias, float *y, int threads, const int bits) {
    const int64_t R = acts->R, K = acts->K, row_bytes = K / 8 * bits;
    const int64_t cols = block_cols(row_bytes + K / 16), nblk = (N + cols - 1) / cols;
    #pragma omp parallel for schedule(dynamic, block_chunk(R, TILE, N, threads, cols)) num_threads(threads) \
        if (worth_threads(N, K, R))
    for (int64_t j = 0; j < nblk; j++) {
        const int64_t n0 = j * cols, n1 = n0 + cols < N ? n0 + cols : N;
#define UTILE(r0, nr) \
        do { \
            int64_t n = n0; \
            if ((nr) <= PAIR_ROWS && (PAIR_FIFTHS || bits == 8)) \
                for (; n + 1 < n1; n += 2) \
                    utile2(acts, r0, nr, codes + n * row_bytes, row_bytes, scales + n * (K / 32), K / 32, y + n, N, \
                           bits); \
            for (; n < n1; n++) utile(acts, r0, nr, codes + n * row_bytes, scales + n * (K / 32), y + n, N, bits); \
        } while (0)
        EACH_TILE(R, TILE, UTILE);
#undef UTILE
        if (bias) add_bias(y, bias, R, N, n0, n1);
    }
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ (+ bias (N,) fp32 unless NULL). codes (N, K·bits/8) uint8 interleaved in units,
   `bits` 8 (bytes) or 5 (Q5_0's packing, see the top), scales (N, K/32) fp16, K a multiple of 128. Returns 0; -1 when
   scratch could not be allocated; -2 for a K or `bits` it does not take. */
int parley_q8gemm(const float *x, int64_t R, int64_t K, const uint8_t *codes, const uint16_t *scales, int bits,
                  int64_t N, const float *bias, float *y, int threads) {
    if (K % 128 != 0 || (bits != 8 && bits != 5)) return -2;
    const int64_t units = (K + UNIT - 1) / UNIT;
    int8_t *a = calloc((size_t)(units * R), UNIT);
    float *dl = malloc(sizeof(float) * (size_t)(units * R * 16));
    int32_t *zs = malloc(sizeof(int32_t) * (size_t)(units * R * 16));
    if (!a || !dl || !zs) {
        free(a); free(dl); free(zs);
        return -1;
    }
    quantize_rows(x, R, K, units, a, dl, zs);
    const UActs acts = {a, dl, zs, R, K, units};
    if (bits == 5)
        columns(&acts, codes, scales, N, bias, y, threads, 5);
    else
        columns(&acts, codes, scales, N, bias, y, threads, 8);
    free(a); free(dl); free(zs);
    return 0;
}
