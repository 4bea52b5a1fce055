/* Sampling on the CPU, rows split across threads.
   - parley_top_rows: per row the k largest logits (descending; equal values: the smaller index first) and the
     softmax's normaliser at the row's temperature t, Σ exp(x / t − max / t). Three passes over the row (max, the
     exponentials' sum, a selection that compares eight logits at a time with the k-th largest so far) instead of
     torch's softmax and top-k over the whole row.
   - parley_draw_rows: per row the token where softmax(x / t)'s cumulative sum passes u · its total, without the
     softmax written out: blocks of 512 summed (fp32 lanes, fp64 over blocks), the block found, the token inside it
     in fp64 (engine/sampling.py `_inverse_cdf` is the same rule in torch).
   - parley_sample_top: per row a whole top-k / top-p / min-p draw in one call (the selection of parley_top_rows, the
     filters and the draw over the kept tokens in fp64), where torch's dozen small operations on them cost more than
     the selection itself. */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <immintrin.h>
#include "simd.h"

typedef struct {
    float v;
    int64_t i;
} Entry;

/* a ranks below b: a smaller value, or an equal one at a larger index */
static inline int below(Entry a, Entry b) { return a.v < b.v || (a.v == b.v && a.i > b.i); }

/* restores the min-heap (root: the lowest-ranked kept entry) from position p down */
static void sift(Entry *h, int64_t k, int64_t p) {
    for (;;) {
        int64_t c = 2 * p + 1;
        if (c >= k) return;
        if (c + 1 < k && below(h[c + 1], h[c])) c++;
        if (!below(h[c], h[p])) return;
        Entry t = h[p];
        h[p] = h[c];
        h[c] = t;
        p = c;
    }
}

static int by_rank(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    return below(*y, *x) ? -1 : below(*x, *y) ? 1 : 0;
}

static float row_max(const float *x, int64_t n) {
    int64_t i = 0;
    float m = -INFINITY;
    if (n >= 8) {
        __m256 mv = _mm256_loadu_ps(x);
        for (i = 8; i + 8 <= n; i += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(x + i));
        m = hmax8(mv);
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

#define BLOCK 512

/* Σ exp(x / t − top) over one block (n ≤ BLOCK): fp32 lanes */
static double block_sum(const float *x, int64_t n, float t, float top) {
    const __m256 mv = _mm256_set1_ps(top), tv = _mm256_set1_ps(t);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), tv), mv)));
    double total = hsum8(acc);
    for (; i < n; i++) total += expf(x[i] / t - top);
    return total;
}

/* Σ exp(x / t − m / t), rounded as torch's softmax of x / t rounds its inputs: the blocks' sums added in fp64 */
static double exp_sum(const float *x, int64_t n, float m, float t) {
    double total = 0.0;
    for (int64_t b = 0; b < n; b += BLOCK) total += block_sum(x + b, n - b < BLOCK ? n - b : BLOCK, t, m / t);
    return total;
}

static int64_t draw_row(const float *x, int64_t n, float t, double u, double *sums) {
    const float top = row_max(x, n) / t;
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t len = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        total += sums[b] = block_sum(x + b * BLOCK, len, t, top);
    }
    const double target = u * total;
    double below = 0.0;
    int64_t b = 0;
    while (b + 1 < blocks && (below + sums[b] <= target || sums[b] <= 0.0)) below += sums[b++];
    while (b > 0 && sums[b] <= 0.0) below -= sums[--b];  /* rounding past the end: the last block of any weight */
    const float *xb = x + b * BLOCK;
    const int64_t len = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
    double inner = 0.0;
    for (int64_t i = 0; i < len; i++) inner += exp((double)(xb[i] / t - top));
    const double want = sums[b] > 0.0 ? (target - below) / sums[b] * inner : 0.0;  /* where in the block, as found */
    double run = 0.0;
    int64_t last = -1;
    for (int64_t i = 0; i < len; i++) {
        const double w = exp((double)(xb[i] / t - top));
        if (w > 0.0) last = i;
        run += w;
        if (run > want && w > 0.0) return b * BLOCK + i;
    }
    return b * BLOCK + (last >= 0 ? last : 0);  /* rounding ran past the block's end: its last token of any weight */
}

/* x (R, n) fp32, t (R,) > 0, u (R,) in [0, 1) -> ids (R,). Returns 0, or -1 without memory for the block sums. */
int parley_draw_rows(const float *x, int64_t R, int64_t n, const float *t, const double *u, int64_t *ids,
                     int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (R > 1)
    {
        double *sums = malloc(sizeof(double) * (size_t)((n + BLOCK - 1) / BLOCK));
        if (!sums) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++)
            if (sums) ids[r] = draw_row(x + r * n, n, t[r], u[r], sums);
        free(sums);
    }
    return failed ? -1 : 0;
}

static void top_row(const float *x, int64_t n, int64_t k, Entry *h, int64_t *ids) {
    for (int64_t j = 0; j < k; j++) h[j] = (Entry){x[j], j};
    for (int64_t p = k / 2 - 1; p >= 0; p--) sift(h, k, p);
    int64_t i = k;
    for (; i + 8 <= n; i += 8) {  /* later indices never displace an equal value: only a larger one enters */
        const __m256 v = _mm256_loadu_ps(x + i);
        int mask = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(h[0].v), _CMP_GT_OQ));
        while (mask) {
            const int l = __builtin_ctz(mask);
            mask &= mask - 1;
            if (x[i + l] > h[0].v) {
                h[0] = (Entry){x[i + l], i + l};
                sift(h, k, 0);
            }
        }
    }
    for (; i < n; i++) {
        if (x[i] > h[0].v) {
            h[0] = (Entry){x[i], i};
            sift(h, k, 0);
        }
    }
    qsort(h, k, sizeof(Entry), by_rank);
    for (int64_t j = 0; j < k; j++) ids[j] = h[j].i;
}

/* x (R, n) fp32, 1 ≤ k ≤ n, temperatures t (R,) > 0 -> ids (R, k) int64 by rank, maxes (R,) fp32, sums (R,) fp64.
   Returns 0, or -1 when memory for the selection could not be had. */
int parley_top_rows(const float *x, int64_t R, int64_t n, int64_t k, const float *t, int64_t *ids, float *maxes,
                    double *sums, int threads) {
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (R > 1)
    {
        Entry *h = malloc(sizeof(Entry) * (size_t)k);
        if (!h) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            if (!h) continue;
            const float *row = x + r * n;
            maxes[r] = row_max(row, n);
            sums[r] = exp_sum(row, n, maxes[r], t[r]);
            top_row(row, n, k, h, ids + r * k);
        }
        free(h);
    }
    return failed ? -1 : 0;
}

typedef struct {
    int64_t i;
    double p;
} Kept;

static int by_id(const void *a, const void *b) {
    const int64_t x = ((const Kept *)a)->i, y = ((const Kept *)b)->i;
    return (x > y) - (x < y);
}

/* one row's draw among its k most likely tokens: probabilities in fp64 from the row's max and normaliser, the kept
   prefix by rank (top-k, top-p's mass strictly above a token below p, min-p's floor; the first always), then in id
   order the token where their cumulative sum passes u times their total */
static int64_t top_draw(const float *x, int64_t n, int64_t k, float t, double top_p, double min_p, double u,
                        Entry *h, int64_t *rank, Kept *kept) {
    const float m = row_max(x, n);
    const double sum = exp_sum(x, n, m, t);
    top_row(x, n, k, h, rank);
    double before = 0.0, first = 0.0, total = 0.0;
    int64_t count = 0;
    for (int64_t j = 0; j < k; j++) {
        const double p = exp((double)(x[rank[j]] / t - m / t)) / sum;
        if (j == 0)
            first = p;
        else if ((top_p < 1.0 && before >= top_p) || p < min_p * first)
            break;  /* ranked by probability: every later token fails the same test */
        kept[count++] = (Kept){rank[j], p};
        before += p;
    }
    qsort(kept, count, sizeof(Kept), by_id);
    for (int64_t j = 0; j < count; j++) total += kept[j].p;
    const double target = u * total;
    double run = 0.0;
    for (int64_t j = 0; j < count; j++) {
        run += kept[j].p;
        if (run > target && kept[j].p > 0.0) return kept[j].i;
    }
    for (int64_t j = count - 1; j > 0; j--)  /* rounding ran past the end: the last token of any weight */
        if (kept[j].p > 0.0) return kept[j].i;
    return kept[0].i;
}

/* x (R, n) fp32; per row 1 ≤ k ≤ n, t > 0, top_p in (0, 1], min_p in [0, 1), u in [0, 1) -> ids (R,).
   Returns 0, or -1 when memory for the selection could not be had. */
int parley_sample_top(const float *x, int64_t R, int64_t n, const int64_t *k, const float *t, const double *top_p,
                      const double *min_p, const double *u, int64_t *ids, int threads) {
    int64_t most = 1;
    for (int64_t r = 0; r < R; r++) most = k[r] > most ? k[r] : most;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (R > 1)
    {
        Entry *h = malloc(sizeof(Entry) * (size_t)most);
        int64_t *rank = malloc(sizeof(int64_t) * (size_t)most);
        Kept *kept = malloc(sizeof(Kept) * (size_t)most);
        if (!h || !rank || !kept) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++)
            if (h && rank && kept) ids[r] = top_draw(x + r * n, n, k[r], t[r], top_p[r], min_p[r], u[r], h, rank, kept);
        free(h);
        free(rank);
        free(kept);
    }
    return failed ? -1 : 0;
}
