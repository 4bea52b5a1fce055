/* Parley's CPU product over Q4_K and Q5_K super-blocks on Intel's AMX tiles: y (R, N) = x (R, K) @ Wᵀ, W never
   dequantized (kgemm.c is the vector units' product over the same types).

   Layout (kernels/kquant_layout.tile_superblocks): the columns in groups of 16; per group and super-block of 256
   weights, the 16 columns' fp16 d, their fp16 dmin, their 12 bytes of packed 6-bit scales and minimums, byte k of
   column c at 16·k + c (256 bytes: one vector of a byte k for all 16 columns, unpacked in registers), Q5_K's fifth
   bits (per sub-block, 64 bytes whose bit p is code p's), then the 4-bit codes: per pair of sub-blocks (2P, 2P + 1),
   512 bytes in the tiles' pair-of-words form, byte 64·i + 4·c + t holding column c's weight 4·i + t of sub-block 2P
   in its low nibble and of 2P + 1 in its high one. The file's bytes, 144 (Q4_K) or 176 (Q5_K) a column and
   super-block: a decode reads no more than the file holds.

   w = d·sc_j·q − dmin·m_j. Activations are quantized per 32 as kgemm.c does (x ≈ d_j·a). Per sub-block, one tile
   multiply (signed activations × unsigned codes) gives its integer sums whole; then per row and 16 columns one
   conversion, one scale product and two FMAs (the sums times d·sc_j·d_j, the minimums times d_j·Σa), in sub-block
   order. Up to 8 rows take AVX-512 VNNI over the same codes: the same integers, the same float steps, so a row's bits
   depend on its own activations only (batched == alone). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "simd.h"
#include "amx.h"

#ifdef PARLEY_AMX
#define QK 256
#define SUB_CODES 512  /* one sub-block of 32 weights × 16 columns, one byte a code once unpacked */
#define HEAD 256  /* d[16], dmin[16] fp16, the packed scales' bytes [12][16] */
#define PREFETCH 2048  /* bytes ahead on the weight stream */
#define VNNI_ROWS 8

enum { Q4_K = 4, Q5_K = 5 };  /* the `kind` argument: the type's bits */

static inline int64_t group_block_bytes(int kind) { return kind == Q4_K ? 16 * 144 : 16 * 176; }
static inline int codes_at(int kind) { return kind == Q4_K ? HEAD : HEAD + 8 * 64; }

/* Q5_K's fifth bits of sub-block j's codes vector l over its low 4 bits u. */
static inline __m512i with_fifths(__m512i u, const uint8_t *s, int j, int l) {
    uint64_t bits;
    memcpy(&bits, s + HEAD + 64 * j + 8 * l, 8);
    return _mm512_or_si512(u, _mm512_maskz_mov_epi8(_cvtu64_mask64(bits), _mm512_set1_epi8(0x10)));
}

/* Sub-block j's codes, vector l (columns' weights 4l .. 4l + 3), unsigned, from a group's super-block at s. */
static inline __m512i sub_codes(const uint8_t *s, int j, int l, const int kind) {
    const __m512i v = _mm512_loadu_si512((const void *)(s + codes_at(kind) + 512 * (j / 2) + 64 * l));
    const __m512i u = _mm512_and_si512(j % 2 ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F));
    return kind == Q5_K ? with_fifths(u, s, j, l) : u;
}

/* A group's codes, one byte each, as the tiles read them: super-block b's sub-block j at 512·(8b + j); each byte of
   a pair's codes read once for both its sub-blocks. */
static void unpack_group(const uint8_t *wg, int64_t S, const int kind, uint8_t *out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < S; b++) {
        const uint8_t *s = wg + b * group_block_bytes(kind);
        for (int j = 0; j < 8; j += 2)
            for (int l = 0; l < 8; l++) {
                const __m512i v = _mm512_loadu_si512((const void *)(s + codes_at(kind) + 256 * j + 64 * l));
                __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
                if (kind == Q5_K) lo = with_fifths(lo, s, j, l), hi = with_fifths(hi, s, j + 1, l);
                _mm512_store_si512((void *)(out + SUB_CODES * (8 * b + j) + 64 * l), lo);
                _mm512_store_si512((void *)(out + SUB_CODES * (8 * b + j + 1) + 64 * l), hi);
            }
    }
}

/* Sub-block j's 6-bit scales and minimums for 16 columns from the packed bytes q[k] (one vector of byte k each): the
   first four in the low 6 bits of bytes 0-3 (scales) and 4-7 (minimums), the last four in bytes 8-11's nibbles with the
   top 2 bits of bytes 0-7 (16-bit shifts, each byte's part masked). */
static inline void scale_min(const uint8_t *q, int j, __m128i *sc, __m128i *m) {
#define Q(k) _mm_loadu_si128((const __m128i *)(q + 16 * (k)))
    const __m128i m6 = _mm_set1_epi8(0x3F), m4 = _mm_set1_epi8(0x0F), m2 = _mm_set1_epi8(3);
    if (j < 4) {
        *sc = _mm_and_si128(Q(j), m6);
        *m = _mm_and_si128(Q(j + 4), m6);
        return;
    }
    const __m128i low = Q(j + 4);
    *sc = _mm_or_si128(_mm_and_si128(low, m4), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(Q(j - 4), 6), m2), 4));
    *m = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(low, 4), m4),
                      _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(Q(j), 6), m2), 4));
#undef Q
}

/* A super-block's sub-block j scales (d·sc_j) and minimums (−dmin·m_j) for the group's 16 columns: exact in fp32. */
static inline void sub_scales(const uint8_t *s, int j, __m512 *ws, __m512 *mn) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)s));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + 32)));
    __m128i sc, m;
    scale_min(s + 64, j, &sc, &m);
    *ws = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)), d);
    *mn = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(m)), _mm512_sub_ps(_mm512_setzero_ps(), dmin));
}

/* One row's sums of a sub-block into its accumulator: the float steps both paths share. */
static inline __m512 scale_sums(__m512 acc, __m512i sums, __m512 ws, __m512 mn, float d, float dsum) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(ws, _mm512_set1_ps(d)), acc);
    return _mm512_fmadd_ps(mn, _mm512_set1_ps(dsum), acc);
}

/* Block blk (32 weights of K) into tile C: its activations into A, its unpacked codes into W. */
#define MULTIPLY(A, W, C, blk)                                                                                \
    do {                                                                                                      \
        _tile_loadd(A, a + r0 * K + 32 * (blk), K);                                                           \
        _tile_loadd(W, ub + SUB_CODES * (blk), 64);                                                           \
        _tile_zero(C);                                                                                        \
        _tile_dpbsud(C, A, W);                                                                                \
    } while (0)

/* Sub-block j of super-block b, its sums in tile C, scaled into the rows' accumulators. */
#define SCALE(C, b, j)                                                                                        \
    do {                                                                                                      \
        _tile_stored(C, sums, 64);                                                                            \
        __m512 ws, mn;                                                                                        \
        sub_scales(s, j, &ws, &mn);                                                                           \
        const int64_t blk = 8 * (b) + (j);                                                                    \
        for (int i = 0; i < nr; i++)                                                                          \
            acc[i] = scale_sums(acc[i], _mm512_load_si512(sums + 16 * i), ws, mn, d[(r0 + i) * nb + blk],     \
                                ds[(r0 + i) * nb + blk]);                                                     \
    } while (0)

/* Rows r0 .. r0 + nr - 1 (nr ≤ 16; the tiles hold `rows` ≥ nr, the rest zero) against one group of 16 columns whose
   codes are unpacked at ub. */
static inline __attribute__((always_inline)) void group_rows(const int8_t *a, const float *d, const float *ds,
        int64_t r0, const int nr, int64_t K, const uint8_t *wg, const uint8_t *ub, const int kind, float *y,
        int64_t N, int32_t *sums) {
    const int64_t nb = K / 32, S = K / QK;
    __m512 acc[16];
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < S; b++) {
        const uint8_t *s = wg + b * group_block_bytes(kind);
        for (int h = 0; h < 8; h += 4) {  /* four sub-blocks in flight, as amxgemm.c's blocks */
            MULTIPLY(0, 2, 4, 8 * b + h);
            MULTIPLY(1, 3, 5, 8 * b + h + 1);
            MULTIPLY(0, 2, 6, 8 * b + h + 2);
            MULTIPLY(1, 3, 7, 8 * b + h + 3);
            SCALE(4, b, h);
            SCALE(5, b, h + 1);
            SCALE(6, b, h + 2);
            SCALE(7, b, h + 3);
        }
    }
    for (int i = 0; i < nr; i++) _mm512_storeu_ps(y + (r0 + i) * N, acc[i]);
}

/* group_rows without the tiles, for a decode's few rows: a sub-block's codes in eight registers, each row's four
   activation bytes broadcast into VNNI's u8 × s8 dot. The same integers and float steps: the same bits. */
static inline __attribute__((always_inline)) void group_rows_vnni(const int8_t *a, const float *d, const float *ds,
        const int nr, int64_t K, const uint8_t *wg, const int kind, float *y, int64_t N) {
    const int64_t nb = K / 32, S = K / QK;
    __m512 acc[VNNI_ROWS];
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < S; b++) {
        const uint8_t *s = wg + b * group_block_bytes(kind);
        for (int l = 0; l < group_block_bytes(kind); l += 64)
            _mm_prefetch((const char *)(s + PREFETCH + l), _MM_HINT_T0);
        for (int j = 0; j < 8; j++) {
            __m512i u[8];
            for (int l = 0; l < 8; l++) u[l] = sub_codes(s, j, l, kind);
            __m512 ws, mn;
            sub_scales(s, j, &ws, &mn);
            const int64_t blk = 8 * b + j;
            for (int i = 0; i < nr; i++) {
                const int32_t *words = (const int32_t *)(a + i * K + 32 * blk);
                __m512i sum = _mm512_setzero_si512();
                for (int l = 0; l < 8; l++) sum = _mm512_dpbusd_epi32(sum, u[l], _mm512_set1_epi32(words[l]));
                acc[i] = scale_sums(acc[i], sum, ws, mn, d[i * nb + blk], ds[i * nb + blk]);
            }
        }
    }
    for (int i = 0; i < nr; i++) _mm512_storeu_ps(y + i * N, acc[i]);
}

/* Per row and block of 32: the int8 activations, their scale d and d·Σa. */
static void quantize_rows(const float *x, int64_t R, int64_t K, int8_t *a, float *d, float *ds) {
    const int64_t nb = K / 32;
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int sum = quantize32(x + r * K + 32 * b, a + r * K + 32 * b, d + r * nb + b);
            ds[r * nb + b] = d[r * nb + b] * (float)sum;
        }
}

/* Every row against one group: tiles of 16 rows, then the rest, each with a constant row count. */
static inline __attribute__((always_inline)) void tile_rows(const int8_t *a, const float *d, const float *ds,
        int64_t R, int64_t K, const uint8_t *wg, const uint8_t *ub, const int kind, float *y, int64_t N,
        int32_t *sums) {
#define GROUP(r0, n) group_rows(a, d, ds, r0, n, K, wg, ub, kind, y, N, sums)
    EACH_ROW_TILE(R, GROUP);
#undef GROUP
}

static inline __attribute__((always_inline)) void vnni_rows(const int8_t *a, const float *d, const float *ds,
        int64_t R, int64_t K, const uint8_t *wg, const int kind, float *y, int64_t N) {
    switch ((int)R) {
#define ROWS(n) case n: group_rows_vnni(a, d, ds, n, K, wg, kind, y, N); break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
        default: break;
    }
}

/* Every group of 16 columns, `kind` a constant at each call. 0, or -1 without scratch for a thread's codes. */
static inline __attribute__((always_inline)) int groups_of(const int8_t *a, const float *d, const float *ds,
        int64_t R, int64_t K, const uint8_t *blocks, int64_t N, const float *bias, float *y, int threads,
        const int kind) {
    const int64_t S = K / QK, groups = N / 16, group_bytes = S * group_block_bytes(kind);
    const int tiles = R > VNNI_ROWS;
    const int64_t chunk = R <= 16 ? (column_run(N, threads) + 15) / 16 : (groups + 16 * threads - 1) / (16 * threads);
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (worth_threads(N, K, R))
    {
        int32_t sums[256] __attribute__((aligned(64)));
        uint8_t *ub = tiles ? aligned_alloc(64, (size_t)(S * 8 * SUB_CODES)) : NULL;  /* a group's codes unpacked */
        if (tiles && !ub) {
            #pragma omp atomic write
            failed = 1;
        }
        if (tiles) amx_configure(R > 16 ? 16 : (int)R, 32);
        #pragma omp for schedule(dynamic, chunk)
        for (int64_t g = 0; g < groups; g++) {
            const uint8_t *wg = blocks + g * group_bytes;
            if (!tiles) {
                vnni_rows(a, d, ds, R, K, wg, kind, y + 16 * g, N);
            } else if (ub) {
                unpack_group(wg, S, kind, ub);
                tile_rows(a, d, ds, R, K, wg, ub, kind, y + 16 * g, N, sums);
            }
            if (bias)
                for (int64_t r = 0; r < R; r++)
                    for (int n = 0; n < 16; n++) y[r * N + 16 * g + n] += bias[16 * g + n];
        }
        if (tiles) _tile_release();
        free(ub);
    }
    return failed ? -1 : 0;
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ (+ bias (N,) fp32 unless NULL), W's `kind` 4 (Q4_K) or 5 (Q5_K) super-blocks
   in the tiles' groups as the top says, N a multiple of 16, K of 256. Returns 0; -1 when scratch could not be
   allocated; -2 for a shape or kind it does not take, or where the tiles do not run (parley_amx_ready). */
int parley_amxkgemm(const float *x, int64_t R, int64_t K, const uint8_t *blocks, int kind, int64_t N,
                    const float *bias, float *y, int threads) {
    if (K % QK != 0 || N % 16 != 0 || (kind != Q4_K && kind != Q5_K) || !parley_amx_ready()) return -2;
    const int64_t nb = K / 32, padded = R > 16 ? (R + 15) / 16 * 16 : R;
    int8_t *a = aligned_alloc(64, (size_t)((padded * K + 63) / 64 * 64));  /* rows past R: zero, never stored */
    float *d = calloc((size_t)(padded * nb), sizeof(float));
    float *ds = calloc((size_t)(padded * nb), sizeof(float));
    if (!a || !d || !ds) {
        free(a); free(d); free(ds);
        return -1;
    }
    memset(a, 0, (size_t)(padded * K));
    quantize_rows(x, R, K, a, d, ds);
    const int rc = kind == Q4_K ? groups_of(a, d, ds, R, K, blocks, N, bias, y, threads, Q4_K)
                                : groups_of(a, d, ds, R, K, blocks, N, bias, y, threads, Q5_K);
    free(a); free(d); free(ds);
    return rc;
}

/* The file's Q4_K/Q5_K super-blocks (rows of S each, rows a multiple of 16) in the tiles' groups as the top says
   (kernels/kquant_layout.tile_superblocks is the reference): per group and super-block, each column's d, dmin and
   packed scales' bytes spread over the group's vectors, Q5_K's fifth bits regrouped, and its codes moved as words of
   4 bytes (the
   file's byte 32P + l already pairs sub-blocks 2P and 2P + 1 as the tiles' bytes do). */
void parley_kq_tile(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t S, int kind, int threads) {
    const int size = kind == Q4_K ? 144 : 176, at = kind == Q4_K ? 16 : 48;
    const int64_t gsb = group_block_bytes(kind);
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t gb = 0; gb < rows / 16 * S; gb++) {
        const int64_t g = gb / S, b = gb % S;
        uint8_t *o = dst + gb * gsb;
        uint32_t qh[16][8];  /* Q5_K: each column's fifth-bit bytes, as words of 4 */
        for (int c = 0; c < 16; c++) {
            const uint8_t *f = src + ((16 * g + c) * S + b) * size;
            memcpy(o + 2 * c, f, 2);
            memcpy(o + 32 + 2 * c, f + 2, 2);
            for (int k = 0; k < 12; k++) o[64 + 16 * k + c] = f[4 + k];
            for (int P = 0; P < 4; P++)
                for (int i = 0; i < 8; i++)
                    memcpy(o + codes_at(kind) + 512 * P + 64 * i + 4 * c, f + at + 32 * P + 4 * i, 4);
            if (kind == Q5_K) memcpy(qh[c], f + 16, 32);
        }
        /* Q5_K: qh byte l = 4i + t, bit j (weight 32j + l's fifth) -> sub-block j's bit 64i + 4c + t: bits j of four
           bytes gathered into a nibble by one product (they land apart, no carries), 16 columns' into 8 bytes */
        for (int j = 0; kind == Q5_K && j < 8; j++)
            for (int i = 0; i < 8; i++) {
                uint64_t word = 0;
                for (int c = 0; c < 16; c++)
                    word |= (uint64_t)((((qh[c][i] >> j) & 0x01010101u) * 0x01020408u) >> 24 & 0xF) << 4 * c;
                memcpy(o + HEAD + 64 * j + 8 * i, &word, 8);
            }
    }
}
#else
void parley_kq_tile(const uint8_t *src, uint8_t *dst, int64_t rows, int64_t S, int kind, int threads) {
    (void)src, (void)dst, (void)rows, (void)S, (void)kind, (void)threads;
}

int parley_amxkgemm(const float *x, int64_t R, int64_t K, const uint8_t *blocks, int kind, int64_t N,
                    const float *bias, float *y, int threads) {
    (void)x, (void)R, (void)K, (void)blocks, (void)kind, (void)N, (void)bias, (void)y, (void)threads;
    return -2;
}
#endif
