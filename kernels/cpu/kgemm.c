/* Parley's CPU product over K-quant super-blocks (Q4_K, Q5_K, Q6_K): y (R, N) = x (R, K) @ Wᵀ, W never dequantized.

   A super-block holds 256 weights of one row, in the file's bytes except for the order of its codes.
   Q4_K (144 bytes): fp16 d and dmin, eight 6-bit (scale, min) pairs in 12 bytes, 128 bytes of 4-bit codes;
        w = d·sc_j·q − dmin·m_j over sub-blocks j of 32.
   Q5_K (176 bytes): Q4_K's 16 header bytes, 32 bytes of fifth bits, 128 of low 4 bits; the same w with q < 32.
   Q6_K (210 bytes): 128 bytes of low 4 bits, 64 of high 2 bits, sixteen int8 scales, fp16 d;
        w = d·sc_g·(q − 32) over groups g of 16.
   The codes are interleaved at load (engine/quant/block_codes.interleave): weight 16g + 4c + t (group g of 16,
   chunk c of 4, t < 4) sits at position 64c + 4g + t, so that in a chunk's integer dot (u8 × s8, four bytes into
   each of 16 int32 lanes) lane g only ever sums group g: after the four chunks, the lanes hold the 16 groups' integer
   sums, and the scales apply once per super-block, in fp32 lanes. The low 4 bits of chunks 2P and 2P + 1 share the
   64 bytes of pair P (low and high nibble). Q5_K's fifth bits are re-ordered in the file's qh bytes (16-47): byte p
   holds chunk c's position p at bit c and position p + 32 at bit 4 + c, so that one copy of the 32 bytes shifted
   left by 4 (positions < 32) or as is (positions ≥ 32), shifted right by c and masked with 0x10, is chunk c's
   fifth bits in place. Q6_K's top 2 bits: 64 bytes, byte p chunk c's position p at bits 2c.

   Activations are quantized per 32, as llama.cpp does for its 32-blocks (x ≈ d_j·a, d_j = max|x| / 127), and laid
   out in the same interleaved order. Per super-block and row: four integer dots, then one conversion and two
   products; the minimums (Q6_K: the 32) are offsets per group added as Σ o_g·d_j·Σa_g into the same lanes. Every
   row of a step is multiplied against a super-block while it is in registers, so a step reads its weights once. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <immintrin.h>

#include "simd.h"

#define QK 256
#define PREFETCH 2048  /* bytes ahead on the weight stream (a prefetch never faults past the end) */

enum { Q4_K = 4, Q5_K = 5, Q6_K = 6 };  /* the `kind` argument: the type's bits */

static inline int sb_bytes(int kind) { return kind == Q4_K ? 144 : kind == Q5_K ? 176 : 210; }
static inline int sb_groups(int kind) { return kind == Q6_K ? 16 : 8; }
static inline int codes_at(int kind) { return kind == Q4_K ? 16 : kind == Q5_K ? 48 : 0; }  /* the low 4 bits */

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Q4_K's (and Q5_K's) eight 6-bit scales and minimums from their 12 bytes, eight bytes each (a byte per sub-block):
   the first four in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), the last four in bytes 8-11's nibbles with
   the top 2 bits of bytes 0-7. */
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

/* Activations per super-block, super-block-major so that a tile's rows sit together: a (nsb, R, 256) int8 in the
   weights' interleaved order, dl (nsb, R, 16) lane g's scale d_{g/2}, dsum (R, ng) d·Σa per weight group. */
typedef struct {
    const int8_t *a;
    const float *dl;
    const float *dsum;
    int64_t R, nsb, ng;
} KActs;

static void quantize_rows(const float *x, int64_t R, int64_t K, int group, int8_t *a, float *dl, float *dsum) {
    const int64_t nsb = K / QK, ng = K / group;
    for (int64_t r = 0; r < R; r++) {
        for (int64_t b = 0; b < nsb; b++) {
            const float *db = dl + (b * R + r) * 16;
            int sums[16];  /* lane g: group g of 16 */
            quantize_unit(x + r * K + b * QK, QK, a + (b * R + r) * QK, dl + (b * R + r) * 16, sums);
            float *ds = dsum + r * ng + b * (QK / group);
            for (int g = 0; g < 16; g++) {
                if (group == 16)
                    ds[g] = db[g] * (float)sums[g];
                else if (g % 2 == 0)  /* a group of 32: two lanes of the same block */
                    ds[g / 2] = db[g] * (float)(sums[g] + sums[g + 1]);
            }
        }
    }
}

/* x's rows quantized for `kind`'s groups into fresh scratch (release_acts frees it); 0, or -1 without memory. */
static int quantize_acts(const float *x, int64_t R, int64_t K, int kind, KActs *acts) {
    const int64_t nsb = K / QK, ng = nsb * sb_groups(kind);
    int8_t *a = malloc((size_t)(R * K));
    float *dl = malloc(sizeof(float) * (size_t)(R * nsb * 16));
    float *dsum = malloc(sizeof(float) * (size_t)(R * ng));
    if (!a || !dl || !dsum) {
        free(a); free(dl); free(dsum);
        return -1;
    }
    quantize_rows(x, R, K, QK / sb_groups(kind), a, dl, dsum);
    const KActs made = {a, dl, dsum, R, nsb, ng};
    *acts = made;
    return 0;
}

static void release_acts(const KActs *acts) {
    free((void *)acts->a); free((void *)acts->dl); free((void *)acts->dsum);
}

/* c + Σ u·a over each 4 consecutive bytes, eight int32 lanes (u ≤ 63: AVX2's int16 pair sums cannot saturate). */
static inline __m256i dot4(__m256i c, __m256i u, __m256i a) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(c, u, a);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(c, u, a);
#else
    return _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1)));
#endif
}

/* Q4_K's scales as fp32 lanes over the interleaved groups: lane g → d·sc_{g/2}, 16 lanes as two halves of 8. */
static inline __m128i q4k_lane_bytes(uint64_t sc) {
    const __m128i v = _mm_cvtsi64_si128((long long)sc);
    return _mm_unpacklo_epi8(v, v);
}

/* Super-block b of a weight row (its bytes, its codes) and the activations of a tile's rows from r0 against it;
   the weight stream is prefetched PREFETCH bytes ahead. */
typedef struct {
    const uint8_t *s, *codes;
    const int8_t *a;
    const float *dl, *ds;
} Block;

static inline __attribute__((always_inline)) Block block_at(const KActs *x, const uint8_t *w, int64_t b, int64_t r0,
                                                             const int kind) {
    const uint8_t *s = w + b * sb_bytes(kind);
    for (int l = 0; l < sb_bytes(kind); l += 64) _mm_prefetch((const char *)(s + PREFETCH + l), _MM_HINT_T0);
    const Block blk = {s, s + codes_at(kind), x->a + (b * x->R + r0) * QK, x->dl + (b * x->R + r0) * 16,
                       x->dsum + r0 * x->ng + b * sb_groups(kind)};
    return blk;
}

/* PARLEY_YMM: the 256-bit tile on an AVX-512 CPU too (what AVX-VNNI CPUs run; the tests build it this way) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(PARLEY_YMM)
#define TILE 8

/* Q5_K: the fifth bits (the top of this file) into bit 4 of the four chunks' codes; the 32 bytes twice in a zmm. */
static inline void q5k_fifths(__m512i u[4], const uint8_t *f) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)f);
    const __m512i hv = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_slli_epi16(v, 4)), v, 1);
    const __m512i m = _mm512_set1_epi8(0x10);
    for (int c = 0; c < 4; c++) u[c] = _mm512_or_si512(u[c], _mm512_and_si512(_mm512_srli_epi16(hv, c), m));
}

/* A super-block's codes as the four chunks' 64 bytes (16 lanes), its lanes' scales and its groups' offsets. */
static inline __attribute__((always_inline)) void kweights(const uint8_t *s, const uint8_t *codes, const int kind,
                                                           __m512i u[4], __m512 *wsc, __m512 *off) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    for (int p = 0; p < 2; p++) {
        const __m512i v = _mm512_loadu_si512((const void *)(codes + 64 * p));
        u[2 * p] = _mm512_and_si512(v, m4);
        u[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    if (kind == Q5_K) q5k_fifths(u, s + 16);
    if (kind != Q6_K) {
        uint64_t sc, mn;
        q4k_scale_min(s + 4, &sc, &mn);
        *wsc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q4k_lane_bytes(sc))), _mm512_set1_ps(half_at(s)));
        *off = _mm512_zextps256_ps512(bytes_f32(mn, -half_at(s + 2)));
    } else {
        const __m512i hv = _mm512_loadu_si512((const void *)(s + 128));
        for (int c = 0; c < 4; c++)
            u[c] = _mm512_or_si512(u[c], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hv, 2 * c), m2), 4));
        *wsc = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(s + 192)))),
                             _mm512_set1_ps(half_at(s + 208)));
        *off = _mm512_mul_ps(*wsc, _mm512_set1_ps(-32.0f));
    }
}

/* A row's group sums Σd·a (Q4_K/Q5_K: eight in the low lanes, the rest zero; Q6_K: sixteen). */
static inline __attribute__((always_inline)) __m512 group_sums(const float *ds, const int kind) {
    return kind != Q6_K ? _mm512_zextps256_ps512(_mm256_loadu_ps(ds)) : _mm512_loadu_ps(ds);
}

/* One row's four chunk dots against a super-block's codes (the row's activations a, 256 bytes). */
static inline __attribute__((always_inline)) __m512i kdot(const __m512i u[4], const int8_t *a) {
    __m512i acc = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u[0], _mm512_loadu_si512((const void *)a));
    acc = _mm512_dpbusd_epi32(acc, u[1], _mm512_loadu_si512((const void *)(a + 64)));
    acc = _mm512_dpbusd_epi32(acc, u[2], _mm512_loadu_si512((const void *)(a + 128)));
    return _mm512_dpbusd_epi32(acc, u[3], _mm512_loadu_si512((const void *)(a + 192)));
}

/* NR rows of y against one weight row (`kind` and NR constants at each call site: accumulators in registers). */
static inline __attribute__((always_inline)) void ktile(const KActs *x, int64_t r0, const int NR, const uint8_t *w,
        const int kind, float *y, int64_t ystride) {
    __m512 facc[TILE];
    for (int i = 0; i < NR; i++) facc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < x->nsb; b++) {
        const Block blk = block_at(x, w, b, r0, kind);
        __m512i u[4];
        __m512 wsc, off;
        kweights(blk.s, blk.codes, kind, u, &wsc, &off);
        for (int i = 0; i < NR; i++) {
            const __m512i acc = kdot(u, blk.a + i * QK);
            facc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(wsc, _mm512_loadu_ps(blk.dl + i * 16)),
                                      facc[i]);
            facc[i] = _mm512_fmadd_ps(off, group_sums(blk.ds + i * x->ng, kind), facc[i]);
        }
    }
    for (int i = 0; i < NR; i++) y[(r0 + i) * ystride] = _mm512_reduce_add_ps(facc[i]);
}

/* ktile for two neighbouring weight rows (w, w + row_bytes; y's columns n, n + 1): each activation chunk loaded once
   for both and two weight streams in flight, each column's steps exactly ktile's (the same bits). */
static inline __attribute__((always_inline)) void ktile2(const KActs *x, int64_t r0, const int NR, const uint8_t *w,
        int64_t row_bytes, const int kind, float *y, int64_t ystride) {
    __m512 f0[TILE], f1[TILE];
    for (int i = 0; i < NR; i++) f0[i] = f1[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < x->nsb; b++) {
        const Block b0 = block_at(x, w, b, r0, kind), b1 = block_at(x, w + row_bytes, b, r0, kind);
        __m512i u0[4], u1[4];
        __m512 wsc0, off0, wsc1, off1;
        kweights(b0.s, b0.codes, kind, u0, &wsc0, &off0);
        kweights(b1.s, b1.codes, kind, u1, &wsc1, &off1);
        for (int i = 0; i < NR; i++) {
            const int8_t *ai = b0.a + i * QK;
            __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                const __m512i av = _mm512_loadu_si512((const void *)(ai + 64 * c));
                a0 = _mm512_dpbusd_epi32(a0, u0[c], av);
                a1 = _mm512_dpbusd_epi32(a1, u1[c], av);
            }
            const __m512 dl = _mm512_loadu_ps(b0.dl + i * 16), dsv = group_sums(b0.ds + i * x->ng, kind);
            f0[i] = _mm512_fmadd_ps(off0, dsv, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a0), _mm512_mul_ps(wsc0, dl), f0[i]));
            f1[i] = _mm512_fmadd_ps(off1, dsv, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a1), _mm512_mul_ps(wsc1, dl), f1[i]));
        }
    }
    for (int i = 0; i < NR; i++) {
        y[(r0 + i) * ystride] = _mm512_reduce_add_ps(f0[i]);
        y[(r0 + i) * ystride + 1] = _mm512_reduce_add_ps(f1[i]);
    }
}
#define PAIR_ROWS 4  /* 5-8 rows: two columns' accumulators no longer fit the 32 registers */
#else
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define TILE 4
#else
#define TILE 8  /* AVX2 alone: eight rows a weight row's unpacking (8 sessions: 2.65x -> 3.13x llama.cpp's one, 1B) */
#endif

/* Q5_K: the fifth bits (the top of this file) into bit 4 of half h of the four chunks' codes. */
static inline void q5k_fifths(__m256i u[4], const uint8_t *f, int h) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)f);
    const __m256i hv = h == 0 ? _mm256_slli_epi16(v, 4) : v;
    const __m256i m = _mm256_set1_epi8(0x10);
    for (int c = 0; c < 4; c++) u[c] = _mm256_or_si256(u[c], _mm256_and_si256(_mm256_srli_epi16(hv, c), m));
}

/* Σ u·a over the four chunks (a's chunks 64 bytes apart), eight int32 lanes. AVX2 alone widens once a super-block
   half: maddubs' int16 pair sums added across chunks first (u ≤ 31: four chunks ≤ 4·2·31·127 = 31,496; Q6_K's
   u ≤ 63: two), the same integers in three fewer widenings a row. */
static inline __attribute__((always_inline)) __m256i chunks_dot(const __m256i u[4], const int8_t *a, const int kind) {
#define A(c) _mm256_loadu_si256((const __m256i *)(a + 64 * (c)))
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
    return dot4(dot4(dot4(dot4(_mm256_setzero_si256(), u[0], A(0)), u[1], A(1)), u[2], A(2)), u[3], A(3));
#else
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], A(0)), _mm256_maddubs_epi16(u[1], A(1)));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], A(2)), _mm256_maddubs_epi16(u[3], A(3)));
    if (kind != Q6_K) return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones);
    return _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones));
#endif
#undef A
}

/* Half h of the groups (8h .. 8h + 7) at a time: eight lanes each. */
static inline __attribute__((always_inline)) void ktile(const KActs *x, int64_t r0, const int NR, const uint8_t *w,
        const int kind, float *y, int64_t ystride) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 facc[TILE];
    for (int i = 0; i < NR; i++) facc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < x->nsb; b++) {
        const Block blk = block_at(x, w, b, r0, kind);
        const uint8_t *s = blk.s, *codes = blk.codes;
        const int8_t *a = blk.a;
        const float *dl = blk.dl, *ds = blk.ds;
        uint64_t sc = 0, mn = 0;
        if (kind != Q6_K) q4k_scale_min(s + 4, &sc, &mn);
        for (int h = 0; h < 2; h++) {
            __m256i u[4];
            for (int p = 0; p < 2; p++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + 64 * p + 32 * h));
                u[2 * p] = _mm256_and_si256(v, m4);
                u[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            __m256 wsc;
            if (kind == Q5_K) q5k_fifths(u, s + 16, h);
            if (kind != Q6_K) {
                const __m128i lanes = q4k_lane_bytes(sc);  /* a constant shift: h is no immediate in a rolled loop */
                wsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(lanes, 8) : lanes)),
                                    _mm256_set1_ps(half_at(s)));
            } else {
                const __m256i hv = _mm256_loadu_si256((const __m256i *)(s + 128 + 32 * h));
                for (int c = 0; c < 4; c++)
                    u[c] = _mm256_or_si256(u[c],
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * c), m2), 4));
                const __m128i scb = _mm_loadl_epi64((const __m128i *)(s + 192 + 8 * h));
                wsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(scb)), _mm256_set1_ps(half_at(s + 208)));
                const __m256 off = _mm256_mul_ps(wsc, _mm256_set1_ps(-32.0f));
                for (int i = 0; i < NR; i++)
                    facc[i] = _mm256_fmadd_ps(off, _mm256_loadu_ps(ds + i * x->ng + 8 * h), facc[i]);
            }
            for (int i = 0; i < NR; i++) {
                const __m256i acc = chunks_dot(u, a + i * QK + 32 * h, kind);
                const __m256 scale = _mm256_mul_ps(wsc, _mm256_loadu_ps(dl + i * 16 + 8 * h));
                facc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), scale, facc[i]);
            }
        }
        if (kind != Q6_K) {
            const __m256 off = bytes_f32(mn, -half_at(s + 2));
            for (int i = 0; i < NR; i++) facc[i] = _mm256_fmadd_ps(off, _mm256_loadu_ps(ds + i * x->ng), facc[i]);
        }
    }
    for (int i = 0; i < NR; i++) y[(r0 + i) * ystride] = hsum8(facc[i]);
}

/* Half h of a Q4_K/Q5_K super-block's codes as ktile unpacks them, and its lanes' scales. */
static inline __attribute__((always_inline)) void khalf(const uint8_t *s, const uint8_t *codes, uint64_t sc, int h,
                                                        const int kind, __m256i u[4], __m256 *wsc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int p = 0; p < 2; p++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(codes + 64 * p + 32 * h));
        u[2 * p] = _mm256_and_si256(v, m4);
        u[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    if (kind == Q5_K) q5k_fifths(u, s + 16, h);
    const __m128i lanes = q4k_lane_bytes(sc);
    *wsc = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(lanes, 8) : lanes)),
                         _mm256_set1_ps(half_at(s)));
}

/* ktile for two neighbouring Q4_K/Q5_K weight rows at a decode's one row: the activation chunks read once for both,
   two weight streams in flight; each column's steps exactly ktile's (the same bits). */
static inline __attribute__((always_inline)) void ktile2(const KActs *x, int64_t r0, const int NR, const uint8_t *w,
        int64_t row_bytes, const int kind, float *y, int64_t ystride) {
    for (int i = 0; i < NR; i++) {
        __m256 f0 = _mm256_setzero_ps(), f1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < x->nsb; b++) {
            const Block b0 = block_at(x, w, b, r0 + i, kind), b1 = block_at(x, w + row_bytes, b, r0 + i, kind);
            uint64_t sc0, mn0, sc1, mn1;
            q4k_scale_min(b0.s + 4, &sc0, &mn0);
            q4k_scale_min(b1.s + 4, &sc1, &mn1);
            for (int h = 0; h < 2; h++) {
                const __m256 dl = _mm256_loadu_ps(b0.dl + 8 * h);
                __m256i u[4];
                __m256 wsc;
                khalf(b0.s, b0.codes, sc0, h, kind, u, &wsc);
                f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(chunks_dot(u, b0.a + 32 * h, kind)), _mm256_mul_ps(wsc, dl), f0);
                khalf(b1.s, b1.codes, sc1, h, kind, u, &wsc);
                f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(chunks_dot(u, b0.a + 32 * h, kind)), _mm256_mul_ps(wsc, dl), f1);
            }
            const __m256 dsv = _mm256_loadu_ps(b0.ds);
            f0 = _mm256_fmadd_ps(bytes_f32(mn0, -half_at(b0.s + 2)), dsv, f0);
            f1 = _mm256_fmadd_ps(bytes_f32(mn1, -half_at(b1.s + 2)), dsv, f1);
        }
        y[(r0 + i) * ystride] = hsum8(f0);
        y[(r0 + i) * ystride + 1] = hsum8(f1);
    }
}
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define PAIR_ROWS 1  /* more rows share a weight row's unpacked codes, which two columns' would not fit */
#else
#define PAIR_ROWS 0  /* AVX2 alone: paired, 0.95-1.12x (geometric mean 1.01x): not worth a second path */
#endif
#endif

/* Weight rows n0 .. n1 - 1 (a block_cols block) against every row of x, each tile of x's rows against the whole block
   before the next tile. A row's value is the same whatever the order: each tile sums its rows apart. */
static inline __attribute__((always_inline)) void kcolumns(const KActs *x, const uint8_t *blocks, int64_t row_bytes,
        const int kind, int64_t n0, int64_t n1, float *y, int64_t N) {
#define KTILE(r0, nr)                                                                                     \
    do {                                                                                                  \
        int64_t n = n0;                                                                                   \
        if ((nr) <= PAIR_ROWS && kind != Q6_K) /* Q6_K's unpacking outgrows the registers paired */      \
            for (; n + 1 < n1; n += 2) ktile2(x, r0, nr, blocks + n * row_bytes, row_bytes, kind, y + n, N); \
        for (; n < n1; n++) ktile(x, r0, nr, blocks + n * row_bytes, kind, y + n, N);                     \
    } while (0)
    EACH_TILE(x->R, TILE, KTILE);
#undef KTILE
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ (+ bias (N,) fp32 unless NULL), W (N, K/256 super-blocks) of `kind` 4 (Q4_K),
   5 (Q5_K) or 6 (Q6_K), codes interleaved. Returns 0; -1 when scratch could not be allocated; -2 for a kind or K it
   does not take. */
int parley_kgemm(const float *x, int64_t R, int64_t K, const uint8_t *blocks, int kind, int64_t N, const float *bias,
                 float *y, int threads) {
    if ((kind != Q4_K && kind != Q5_K && kind != Q6_K) || K % QK != 0) return -2;
    const int64_t row_bytes = K / QK * sb_bytes(kind);
    KActs acts;
    if (quantize_acts(x, R, K, kind, &acts) != 0) return -1;
    const int64_t cols = block_cols(row_bytes), nblk = (N + cols - 1) / cols;
    #pragma omp parallel for schedule(dynamic, block_chunk(R, TILE, N, threads, cols)) num_threads(threads) \
        if (worth_threads(N, K, R))
    for (int64_t j = 0; j < nblk; j++) {
        const int64_t n0 = j * cols, n1 = n0 + cols < N ? n0 + cols : N;
        if (kind == Q4_K)
            kcolumns(&acts, blocks, row_bytes, Q4_K, n0, n1, y, N);
        else if (kind == Q5_K)
            kcolumns(&acts, blocks, row_bytes, Q5_K, n0, n1, y, N);
        else
            kcolumns(&acts, blocks, row_bytes, Q6_K, n0, n1, y, N);
        if (bias) add_bias(y, bias, R, N, n0, n1);
    }
    release_acts(&acts);
    return 0;
}

/* y (R, N) fp32 for x (R, K) whose rows come in M groups, group m rows first[m] .. first[m] + count[m] - 1 against
   its own matrix W_m (N, K/256 super-blocks of `kind`, codes interleaved) at mats[m]: a mixture of experts' chosen
   experts in one call, the rows that chose an expert gathered beside each other, every group's weight rows shared
   out among the threads together. Each value is exactly parley_kgemm's for that weight row and x row (the same
   quantized activations and row tiles). Returns 0; -1 without scratch memory; -2 for a kind or K it does not take,
   or a group outside x. */
int parley_kgemm_grouped(const float *x, int64_t R, int64_t K, const uint8_t *const *mats, const int64_t *first,
                         const int64_t *count, int64_t M, int kind, int64_t N, float *y, int threads) {
    if ((kind != Q4_K && kind != Q5_K && kind != Q6_K) || K % QK != 0) return -2;
    int64_t widest = 0;
    for (int64_t m = 0; m < M; m++) {
        if (first[m] < 0 || count[m] < 1 || first[m] + count[m] > R) return -2;
        if (count[m] > widest) widest = count[m];
    }
    const int64_t row_bytes = K / QK * sb_bytes(kind);
    KActs acts;
    if (quantize_acts(x, R, K, kind, &acts) != 0) return -1;
    const int64_t total = M * N, run = column_run(total, threads);
    #pragma omp parallel for schedule(dynamic, run) num_threads(threads) if (worth_threads(total, K, widest))
    for (int64_t j = 0; j < total; j++) {
        const int64_t m = j / N, n = j - m * N, r = first[m];
        const uint8_t *w = mats[m] + n * row_bytes;
#define GTILE(r0, nr) ktile(&acts, r + (r0), nr, w, kind_, y + n, N)
        if (kind == Q4_K) {
            const int kind_ = Q4_K;
            EACH_TILE(count[m], TILE, GTILE);
        } else if (kind == Q5_K) {
            const int kind_ = Q5_K;
            EACH_TILE(count[m], TILE, GTILE);
        } else {
            const int kind_ = Q6_K;
            EACH_TILE(count[m], TILE, GTILE);
        }
#undef GTILE
    }
    release_acts(&acts);
    return 0;
}

/* Eight consecutive 4-bit (shift 0 or 4) fields of p[0..7] as four bytes: field t low, field t + 4 high. */
static inline uint32_t nibble_word(const uint8_t *p, int shift) {
    uint64_t x;
    memcpy(&x, p, 8);
    const uint64_t y = (x >> shift) & 0x0F0F0F0F0F0F0F0Full;
    return (uint32_t)y | (uint32_t)(y >> 32) << 4;
}

/* Sixteen consecutive `bits`-wide fields (1 or 2 bits, at `shift`) of p[0..15] as four bytes: field t + 4c at bits
   c·bits of byte t. */
static inline uint32_t fields_word(const uint8_t *p, int shift, int bits) {
    const uint64_t m = bits == 2 ? 0x0303030303030303ull : 0x0101010101010101ull;
    uint64_t x0, x1;
    memcpy(&x0, p, 8);
    memcpy(&x1, p + 8, 8);
    const uint64_t y0 = (x0 >> shift) & m, y1 = (x1 >> shift) & m;
    return (uint32_t)y0 | (uint32_t)(y0 >> 32) << bits | (uint32_t)y1 << 2 * bits | (uint32_t)(y1 >> 32) << 3 * bits;
}

/* The file's super-blocks (nblocks of `kind`) with their codes interleaved as the product takes them (see the top of
   this file; engine/quant/block_codes.interleave is the reference). Output word (pair P, group g) holds natural
   weights 16g + 8P .. + 7, eight consecutive fields of eight consecutive file bytes; Q6_K's top-bit word g the 2-bit
   fields of weights 16g .. 16g + 15; Q5_K's fifth bits of group g (natural weights 16g + 4c + t: qh bytes 16(g % 2)
   + 4c + t, bit g / 2) the nibble 4(g / 8) of held bytes 4(g % 8) + t. */
void parley_kq_interleave(const uint8_t *src, uint8_t *dst, int64_t nblocks, int kind, int threads) {
    const int size = sb_bytes(kind);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < nblocks; i++) {
        const uint8_t *s = src + i * size;
        uint8_t *o = dst + i * size;
        memcpy(o, s, (size_t)size);
        uint8_t *codes = o + codes_at(kind);
        if (kind == Q5_K) memset(o + 16, 0, 32);
        for (int g = 0; g < 16; g++) {
            for (int p = 0; p < 2; p++) {
                const int n0 = 16 * g + 8 * p;
                uint32_t word;
                if (kind != Q6_K) {  /* file chunk of 64: bytes 32c' .. + 31, weights l low, l + 32 high */
                    const int off = n0 % 64;
                    word = nibble_word(s + codes_at(kind) + 32 * (n0 / 64) + off % 32, off < 32 ? 0 : 4);
                } else {  /* half h of 128: quarter q at ql[64h + l (+ 32 if q odd)], low nibbles for q < 2 */
                    const int h = n0 / 128, q = n0 % 128 / 32, l = n0 % 32;
                    word = nibble_word(s + 64 * h + l + (q % 2) * 32, q < 2 ? 0 : 4);
                }
                memcpy(codes + 64 * p + 4 * g, &word, 4);
            }
            if (kind == Q6_K) {
                const int n0 = 16 * g, h = n0 / 128, q = n0 % 128 / 32, l = n0 % 32;
                const uint32_t word = fields_word(s + 128 + 32 * h + l, 2 * q, 2);
                memcpy(o + 128 + 4 * g, &word, 4);
            }
            if (kind == Q5_K) {
                uint32_t word;
                memcpy(&word, o + 16 + 4 * (g % 8), 4);
                word |= fields_word(s + 16 + 16 * (g % 2), g / 2, 1) << 4 * (g / 8);
                memcpy(o + 16 + 4 * (g % 8), &word, 4);
            }
        }
    }
}
