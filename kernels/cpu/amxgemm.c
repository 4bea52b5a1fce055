/* Parley's CPU product over byte codes in blocks of 32 with an fp16 scale (Q8_0, Q5_0, and the types re-quantized to
   Q8_0: w = s·q) on Intel's AMX tiles: y (R, N) = x (R, K) @ Wᵀ, W never dequantized.

   Where it runs (Sapphire Rapids and later Xeons, the Xeon W workstations), one tile multiply sums 16 rows × 16
   columns × 32 bytes; the vector units' integer dots (q8gemm.c) take ~30× the instructions for it, so a step of many
   rows (speculative verify steps, prefill) was bound by them where the weights' reads now bound it.

   Layout (kernels/kquant_layout.tile_codes): the codes in groups of 16 columns; per group and block of 32 weights,
   512 codes in the tiles' pair-of-words form, code 64·i + 4·n + t = q of column n, weight 4·i + t of the block, as
   signed bytes (`bits` 8), or Q5_0's q + 16 packed in 5 bits as kernels/kquant_layout.pack_fifths packs each 64
   (`bits` 5: 320 bytes, unpacked in registers, through a buffer for the tiles); the scales per group and block, 16
   fp16 in column order. A block's sums come whole out of one tile multiply, and its
   scale applies once per block in fp32 lanes (one conversion, one product, one FMA per row and 16 columns), in block
   order: a row's result depends on its own activations only, so batched == alone bit for bit.

   Activations are quantized per block of 32 as llama.cpp does (x ≈ d·a, d = max|x| / 127, a in -127..127). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>

#include "simd.h"
#include "amx.h"

#ifdef PARLEY_AMX
#include <unistd.h>
#include <sys/syscall.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define GROUP_CODES 512  /* one group of 16 columns × one block of 32 weights */
#define PREFETCH 2048  /* bytes ahead on the weight stream */
#define VNNI_ROWS 4  /* calls of up to this many rows take group_rows_vnni (as fast as the tiles at 4, faster below) */

/* 1 where the tiles run here: the CPU has them (the build's -march=native says so) and Linux lets this process use
   their state (asked once; it is the process's from then on). */
int parley_amx_ready(void) {
    static int granted = -1;  /* the process's answer: asked at the first call (a race asks twice, harmlessly) */
    if (granted < 0) granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return granted;
}

/* Codes vector l (64 of a group's block) of the block at w as u = q + 128, from bytes held signed or 5 bits. */
static inline __m512i unsigned_codes(const int8_t *w, int l, const int bits) {
    if (bits == 8)
        return _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64 * l)), _mm512_set1_epi8((char)0x80));
    return fifths_chunk((const uint8_t *)w + 40 * l);
}

/* Block b of a group's codes as the tiles read them, signed: held so (bits 8), or unpacked into buf (bits 5). */
static inline const int8_t *signed_codes(const int8_t *wg, int64_t b, const int bits, int8_t *buf) {
    const int8_t *w = wg + b * GROUP_CODES / 8 * bits;
    for (int l = 0; l < GROUP_CODES / 8 * bits; l += 64) _mm_prefetch((const char *)(w + PREFETCH + l), _MM_HINT_T0);
    if (bits == 8) return w;
    for (int l = 0; l < 8; l++)
        _mm512_store_si512((void *)(buf + 64 * l),
                           _mm512_xor_si512(unsigned_codes(w, l, 5), _mm512_set1_epi8((char)0x80)));
    return buf;
}

/* Block b's sums into tile C: its activations into A, its signed codes into W (as held, or unpacked into `unpacked`,
   one buffer a block in flight). */
#define MULTIPLY(A, W, C, b)                                                                                  \
    do {                                                                                                      \
        _tile_loadd(A, a + r0 * K + 32 * (b), K);                                                             \
        _tile_loadd(W, signed_codes(wg, b, bits, unpacked + GROUP_CODES * ((b) & 3)), 64);                    \
        _tile_zero(C);                                                                                        \
        _tile_dpbssd(C, A, W);                                                                                \
    } while (0)

/* Block b's sums in tile C, scaled into the rows' accumulators. */
#define SCALE(C, b)                                                                                           \
    do {                                                                                                      \
        _tile_stored(C, sums, 64);                                                                            \
        const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sg + 16 * (b))));              \
        for (int i = 0; i < nr; i++)                                                                          \
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + 16 * i)),                    \
                                     _mm512_mul_ps(ws, _mm512_set1_ps(d[(r0 + i) * nb + (b)])), acc[i]);      \
    } while (0)

/* Rows r0 .. r0 + nr - 1 (nr ≤ 16; the tiles hold `rows` ≥ nr, the rest zero) against one group of 16 columns. */
static inline __attribute__((always_inline)) void group_rows(const int8_t *a, const float *d, int64_t r0,
        const int nr, int64_t K, const int8_t *wg, const uint16_t *sg, float *y, int64_t N, int32_t *sums,
        const int bits, int8_t *unpacked) {
    const int64_t nb = K / 32;
    __m512 acc[16];
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
    /* four blocks in flight: block b's multiply into tile 4 + b % 4, its activations and codes in 0/2 or 1/3 */
    int64_t b = 0;
    for (; b + 4 <= nb; b += 4) {
        MULTIPLY(0, 2, 4, b);
        MULTIPLY(1, 3, 5, b + 1);
        MULTIPLY(0, 2, 6, b + 2);
        MULTIPLY(1, 3, 7, b + 3);
        SCALE(4, b);
        SCALE(5, b + 1);
        SCALE(6, b + 2);
        SCALE(7, b + 3);
    }
    for (; b < nb; b++) {
        MULTIPLY(0, 2, 4, b);
        SCALE(4, b);
    }
    for (int i = 0; i < nr; i++) _mm512_storeu_ps(y + (r0 + i) * N, acc[i]);
}

/* group_rows without the tiles, for a few rows (a decode's: the tiles' stores cost more than their multiply saves):
   a block's codes as u = q + 128 in eight registers, each row's four activation bytes broadcast into VNNI's u8 × s8
   dot, 128·Σa taken back. The same integer sums, then the same float steps: the same bits as group_rows. */
static inline __attribute__((always_inline)) void group_rows_vnni(const int8_t *a, const float *d, const int32_t *zs,
        int64_t r0, const int nr, int64_t K, const int8_t *wg, const uint16_t *sg, float *y, int64_t N,
        const int bits) {
    const int64_t nb = K / 32;
    __m512 acc[VNNI_ROWS];
    for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *wb = wg + b * GROUP_CODES / 8 * bits;
        for (int l = 0; l < GROUP_CODES / 8 * bits; l += 64)
            _mm_prefetch((const char *)(wb + PREFETCH + l), _MM_HINT_T0);
        __m512i u[8];
        for (int l = 0; l < 8; l++) u[l] = unsigned_codes(wb, l, bits);
        const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sg + 16 * b)));
        for (int i = 0; i < nr; i++) {
            const int64_t at = (r0 + i) * nb + b;
            const int32_t *words = (const int32_t *)(a + (r0 + i) * K + 32 * b);
            __m512i sum = _mm512_set1_epi32(-zs[at]);
            for (int l = 0; l < 8; l++) sum = _mm512_dpbusd_epi32(sum, u[l], _mm512_set1_epi32(words[l]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(ws, _mm512_set1_ps(d[at])), acc[i]);
        }
    }
    for (int i = 0; i < nr; i++) _mm512_storeu_ps(y + (r0 + i) * N, acc[i]);
}

/* Per row and block: the int8 activations, their scale d and 128·Σa (group_rows_vnni's). */
static void quantize_rows(const float *x, int64_t R, int64_t K, int8_t *a, float *d, int32_t *zs) {
    const int64_t nb = K / 32;
    for (int64_t r = 0; r < R; r++)
        for (int64_t b = 0; b < nb; b++)
            zs[r * nb + b] = 128 * quantize32(x + r * K + 32 * b, a + r * K + 32 * b, d + r * nb + b);
}

/* Every row against one group: tiles of 16 rows, then the rest, each with a constant row count (accumulators in
   registers). */
static inline __attribute__((always_inline)) void tile_rows(const int8_t *a, const float *d, int64_t R, int64_t K,
        const int8_t *wg, const uint16_t *sg, float *y, int64_t N, int32_t *sums, const int bits, int8_t *unpacked) {
#define GROUP(r0, n) group_rows(a, d, r0, n, K, wg, sg, y, N, sums, bits, unpacked)
    EACH_ROW_TILE(R, GROUP);
#undef GROUP
}

/* The rows of a call of at most VNNI_ROWS against one group, on the vector units. */
static inline __attribute__((always_inline)) void vnni_rows(const int8_t *a, const float *d, const int32_t *zs,
        int64_t R, int64_t K, const int8_t *wg, const uint16_t *sg, float *y, int64_t N, const int bits) {
    switch ((int)R) {
#define ROWS(n) case n: group_rows_vnni(a, d, zs, 0, n, K, wg, sg, y, N, bits); break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4)
#undef ROWS
        default: break;
    }
}

/* Every group of 16 columns; `bits` a constant at each call, so that the codes unpack or not. 0, or -1 without
   scratch for a thread's unpacked group. */
static inline __attribute__((always_inline)) int groups_of(const int8_t *a, const float *d, const int32_t *zs,
        int64_t R, int64_t K, const int8_t *codes, const uint16_t *scales, int64_t N, const float *bias, float *y,
        int threads, const int bits) {
    const int64_t nb = K / 32, groups = N / 16;
    const int tiles = R > VNNI_ROWS;
    /* a decode: column_run's long runs; more rows: 16 chunks a thread, so that they end together */
    const int64_t chunk = R <= 16 ? (column_run(N, threads) + 15) / 16 : (groups + 16 * threads - 1) / (16 * threads);
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (worth_threads(N, K, R))
    {
        int32_t sums[256] __attribute__((aligned(64)));
        int8_t unpacked[4 * GROUP_CODES] __attribute__((aligned(64)));  /* bits 5: a block's codes, four in flight */
        /* bits 5 and more than 16 rows: a group's codes unpacked once for all its tiles of rows */
        int8_t *group = bits == 5 && R > 16 ? aligned_alloc(64, (size_t)(nb * GROUP_CODES)) : NULL;
        if (bits == 5 && R > 16 && !group) {
            #pragma omp atomic write
            failed = 1;
        }
        if (tiles) amx_configure(R > 16 ? 16 : (int)R, 32);
        #pragma omp for schedule(dynamic, chunk)
        for (int64_t g = 0; g < groups; g++) {
            if (bits == 5 && R > 16 && !group) continue;
            const int8_t *wg = codes + g * nb * GROUP_CODES / 8 * bits;
            const uint16_t *sg = scales + g * nb * 16;
            if (!tiles)
                vnni_rows(a, d, zs, R, K, wg, sg, y + 16 * g, N, bits);
            else if (group) {
                for (int64_t b = 0; b < nb; b++) signed_codes(wg, b, 5, group + b * GROUP_CODES);
                tile_rows(a, d, R, K, group, sg, y + 16 * g, N, sums, 8, unpacked);
            } else
                tile_rows(a, d, R, K, wg, sg, y + 16 * g, N, sums, bits, unpacked);
            if (bias)
                for (int64_t r = 0; r < R; r++)
                    for (int n = 0; n < 16; n++) y[r * N + 16 * g + n] += bias[16 * g + n];
        }
        if (tiles) _tile_release();
        free(group);
    }
    return failed ? -1 : 0;
}

/* y (R, N) fp32 = x (R, K) fp32 @ Wᵀ (+ bias (N,) fp32 unless NULL). codes (N/16, K/32, 512·bits/8) with `bits` 8 or
   5 and scales (N/16, K/32, 16) fp16 as the top says, N a multiple of 16, K of 32. Returns 0; -1 when scratch could
   not be allocated; -2 for a shape or `bits` it does not take, or where the tiles do not run (parley_amx_ready). */
int parley_amxgemm(const float *x, int64_t R, int64_t K, const int8_t *codes, const uint16_t *scales, int bits,
                   int64_t N, const float *bias, float *y, int threads) {
    if (K % 32 != 0 || N % 16 != 0 || (bits != 8 && bits != 5) || !parley_amx_ready()) return -2;
    const int64_t nb = K / 32, padded = R > 16 ? (R + 15) / 16 * 16 : R;
    int8_t *a = aligned_alloc(64, (size_t)((padded * K + 63) / 64 * 64));  /* rows past R: zero, never stored */
    float *d = calloc((size_t)(padded * nb), sizeof(float));
    int32_t *zs = malloc(sizeof(int32_t) * (size_t)(R * nb));
    if (!a || !d || !zs) {
        free(a); free(d); free(zs);
        return -1;
    }
    memset(a, 0, (size_t)(padded * K));
    quantize_rows(x, R, K, a, d, zs);
    const int rc = bits == 5 ? groups_of(a, d, zs, R, K, codes, scales, N, bias, y, threads, 5)
                             : groups_of(a, d, zs, R, K, codes, scales, N, bias, y, threads, 8);
    free(a); free(d); free(zs);
    return rc;
}
#else
int parley_amx_ready(void) { return 0; }

int parley_amxgemm(const float *x, int64_t R, int64_t K, const int8_t *codes, const uint16_t *scales, int bits,
                   int64_t N, const float *bias, float *y, int threads) {
    (void)x, (void)R, (void)K, (void)codes, (void)scales, (void)bits, (void)N, (void)bias, (void)y, (void)threads;
    return -2;
}
#endif
