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
     the selection itself. A row without top-k whose boundary lies past its first 256 ranked tokens finds its nucleus
     over the whole row by a histogram of its weights' mass and a selection by mass inside one bucket (no sort of the
     vocabulary), and draws by blocks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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

/* in id order, the token where the kept probabilities' cumulative sum passes u times their total (fp64) */
static int64_t draw_kept(Kept *kept, int64_t count, double u) {
    qsort(kept, count, sizeof(Kept), by_id);
    double total = 0.0, run = 0.0;
    for (int64_t j = 0; j < count; j++) total += kept[j].p;
    const double target = u * total;
    for (int64_t j = 0; j < count; j++) {
        run += kept[j].p;
        if (run > target && kept[j].p > 0.0) return kept[j].i;
    }
    for (int64_t j = count - 1; j > 0; j--)  /* rounding ran past the end: the last token of any weight */
        if (kept[j].p > 0.0) return kept[j].i;
    return kept[0].i;
}

/* The prefix of the k most likely tokens (by rank) that top-k, top-p (the mass strictly above a token below p; of
   a top-k row, p of the top-k's mass, as llama.cpp and transformers renormalise) and min-p (at least min_p times the
   first's probability) keep, the first always, into `kept`; probabilities in fp64 from the row's max and
   normaliser. `topk`: k is the row's top-k (else the first tokens ranked of an open row). Returns whether a filter
   cut the ranked tokens short (else k were all kept). */
static int kept_prefix(const float *x, int64_t n, int64_t k, int topk, float t, double top_p, double min_p,
                       Entry *h, int64_t *rank, Kept *kept, int64_t *count) {
    const float m = row_max(x, n);
    const double sum = exp_sum(x, n, m, t);
    top_row(x, n, k, h, rank);
    double before = 0.0, first = 0.0, nucleus = top_p;
    if (topk && top_p < 1.0) {
        double mass = 0.0;
        for (int64_t j = 0; j < k; j++)
            mass += exp((double)(x[rank[j]] / t - m / t)) / sum;
        nucleus = top_p * mass;
    }
    *count = 0;
    for (int64_t j = 0; j < k; j++) {
        const double p = exp((double)(x[rank[j]] / t - m / t)) / sum;
        if (j == 0)
            first = p;
        else if ((top_p < 1.0 && before >= nucleus) || p < min_p * first)
            return 1;  /* ranked by probability: every later token fails the same test */
        kept[(*count)++] = (Kept){rank[j], p};
        before += p;
    }
    return 0;
}

typedef struct {
    float w;
    int32_t i;
} Weight;

/* a ranks before b: a larger weight, or an equal one at a smaller id (a strict total order) */
static inline int ahead(Weight a, Weight b) { return a.w > b.w || (a.w == b.w && a.i < b.i); }

/* The last token the nucleus keeps, in rank order: the first whose mass with everything ranked before it reaches
   `target` (the last of all when rounding never reaches it). Selection by mass over a scratch copy: O(n) expected. */
static Weight nucleus_end(Weight *a, int64_t n, double target) {
    int64_t lo = 0, hi = n;  /* the answer lies in a[lo, hi); `base`, the mass ranked before it, stays below target */
    double base = 0.0;
    while (lo < hi) {
        Weight tmp = a[lo + (hi - lo) / 2];
        a[lo + (hi - lo) / 2] = a[hi - 1];
        a[hi - 1] = tmp;
        const Weight pivot = tmp;
        int64_t i = lo;
        double above = 0.0;
        for (int64_t q = lo; q < hi - 1; q++)
            if (ahead(a[q], pivot)) {
                above += a[q].w;
                tmp = a[i]; a[i] = a[q]; a[q] = tmp;
                i++;
            }
        a[hi - 1] = a[i];
        a[i] = pivot;
        if (base + above >= target) {
            hi = i;
        } else if (base + above + pivot.w >= target) {
            return pivot;
        } else {
            base += above + pivot.w;
            lo = i + 1;
        }
    }
    Weight last = a[0];  /* rounding: the whole row's mass stayed below target */
    for (int64_t q = 1; q < n; q++)
        if (ahead(last, a[q])) last = a[q];
    return last;
}

/* w[i] = exp(x[i] / t − top) in fp32 lanes (0 where the exponent is below −87, where expf underflows, or NaN: a
   masked or broken logit is never drawn); returns their sum, fp64 over blocks */
static double row_weights(const float *x, int64_t n, float t, float top, float *w) {
    const __m256 tv = _mm256_set1_ps(t), mv = _mm256_set1_ps(top), lo = _mm256_set1_ps(-87.0f);
    double total = 0.0;
    for (int64_t b = 0; b < n; b += BLOCK) {
        const int64_t end = b + BLOCK < n ? b + BLOCK : n;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = b;
        for (; i + 8 <= end; i += 8) {
            const __m256 a = _mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), tv), mv);
            const __m256 e = _mm256_and_ps(exp8(a), _mm256_cmp_ps(a, lo, _CMP_GE_OQ));
            _mm256_storeu_ps(w + i, e);
            acc = _mm256_add_ps(acc, e);
        }
        double sum = hsum8(acc);
        for (; i < end; i++) {
            const float a = x[i] / t - top;
            w[i] = a >= -87.0f ? expf(a) : 0.0f;
            sum += w[i];
        }
        total += sum;
    }
    return total;
}

#define BUCKETS 1024  /* a weight's top bits (exponent, 3 of the mantissa) from 2^-40 up: ordered as the weights */
#define LOWEST_BITS (87 << 4)  /* bits >> 19 of 2^-40: every smaller weight (a negligible mass) shares bucket 0 */
#define COPIES 4  /* histograms filled in turn: a run of weights in one bucket does not wait on its last sum */

static inline int bucket_of(float w) {
    uint32_t bits;
    memcpy(&bits, &w, sizeof bits);
    const int b = w > 0.0f ? (int)(bits >> 19) - LOWEST_BITS : 0;  /* weights are at most 1: bucket 640 at most */
    return b > 0 ? b : 0;
}

/* bucket_of for each weight, into `out` */
static void buckets(const float *w, int64_t n, int32_t *out) {
    const __m256i lowest = _mm256_set1_epi32(LOWEST_BITS), zero = _mm256_setzero_si256();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(w + i);
        __m256i b = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_castps_si256(v), 19), lowest);
        b = _mm256_and_si256(_mm256_max_epi32(b, zero), _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ)));
        _mm256_storeu_si256((__m256i *)(out + i), b);
    }
    for (; i < n; i++) out[i] = bucket_of(w[i]);
}

/* The nucleus's last token (`nucleus_end`) without ordering the row: a histogram of the weights' mass by bucket
   finds the bucket where the mass ranked before reaches `target`, and the selection runs over that bucket only.
   `scratch`: n Weights (their memory holds the buckets first). */
static Weight nucleus_end_by_buckets(const float *w, int64_t n, double target, Weight *scratch) {
    int32_t *bucket = (int32_t *)scratch + n;  /* the upper half: the bucket's Weights fill the lower from the start */
    buckets(w, n, bucket);
    double mass[COPIES][BUCKETS] = {{0.0}};
    int64_t i = 0;
    for (; i + COPIES <= n; i += COPIES)
        for (int c = 0; c < COPIES; c++) mass[c][bucket[i + c]] += w[i + c];
    for (; i < n; i++) mass[0][bucket[i]] += w[i];
    for (int c = 1; c < COPIES; c++)
        for (int b = 0; b < BUCKETS; b++) mass[0][b] += mass[c][b];
    double base = 0.0;  /* the mass of every bucket above b */
    int b = BUCKETS - 1;
    while (b > 0 && base + mass[0][b] < target) base += mass[0][b--];
    int64_t m = 0;
    for (i = 0; i < n; i++)  /* Weight m (8 bytes) ends at or before bucket i's int32: nothing unread is overwritten */
        if (bucket[i] == b) scratch[m++] = (Weight){w[i], (int32_t)i};
    if (!m) return (Weight){-1.0f, INT32_MAX};  /* no weight at all (a NaN row): every token, and the draw's fallback */
    return nucleus_end(scratch, m, target - base);
}

/* a token the draw keeps: at or before the nucleus's end in rank order, at least min-p's floor, of some weight */
static inline int kept_token(float w, int64_t i, Weight end, float floor) {
    return w >= floor && w > 0.0f && !ahead(end, (Weight){w, (int32_t)i});
}

/* Σ of the kept weights of w[lo, lo + len): fp32 lanes */
static double kept_block(const float *w, int64_t lo, int64_t len, Weight end, float floor) {
    const __m256 ew = _mm256_set1_ps(end.w), fl = _mm256_set1_ps(floor), zero = _mm256_setzero_ps();
    const __m256i ei = _mm256_set1_epi32(end.i), step = _mm256_set1_epi32(8);
    __m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int32_t)lo), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 acc = zero;
    int64_t i = lo;
    for (; i + 8 <= lo + len; i += 8, idx = _mm256_add_epi32(idx, step)) {
        const __m256 v = _mm256_loadu_ps(w + i);
        const __m256 tie = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(idx, ei)),
                                            _mm256_cmp_ps(v, ew, _CMP_EQ_OQ));  /* equal weight, id not after */
        __m256 keep = _mm256_or_ps(_mm256_cmp_ps(v, ew, _CMP_GT_OQ), tie);
        keep = _mm256_and_ps(keep, _mm256_and_ps(_mm256_cmp_ps(v, fl, _CMP_GE_OQ), _mm256_cmp_ps(v, zero, _CMP_GT_OQ)));
        acc = _mm256_add_ps(acc, _mm256_and_ps(v, keep));
    }
    double sum = hsum8(acc);
    for (; i < lo + len; i++)
        if (kept_token(w[i], i, end, floor)) sum += w[i];
    return sum;
}

/* In id order, the kept token where the kept weights' cumulative sum passes u times their total: the block found
   by blocks' sums (`sums`: one per BLOCK), the token inside it in fp64, as draw_row finds it. */
static int64_t draw_kept_row(const float *w, int64_t n, Weight end, float floor, double u, double *sums) {
    const int64_t blocks = (n + BLOCK - 1) / BLOCK;
    double total = 0.0;
    for (int64_t b = 0; b < blocks; b++)
        total += sums[b] = kept_block(w, b * BLOCK, n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK, end, floor);
    const double target = u * total;
    double below = 0.0;
    int64_t b = 0;
    while (b + 1 < blocks && (below + sums[b] <= target || sums[b] <= 0.0)) below += sums[b++];
    while (b > 0 && sums[b] <= 0.0) below -= sums[--b];  /* rounding past the end: the last block of any weight */
    const int64_t lo = b * BLOCK, len = n - lo < BLOCK ? n - lo : BLOCK;
    double inner = 0.0;
    for (int64_t i = lo; i < lo + len; i++)
        if (kept_token(w[i], i, end, floor)) inner += w[i];
    const double want = sums[b] > 0.0 ? (target - below) / sums[b] * inner : 0.0;  /* where in the block, as found */
    double run = 0.0;
    int64_t last = -1;
    for (int64_t i = lo; i < lo + len; i++) {
        if (!kept_token(w[i], i, end, floor)) continue;
        last = i;
        run += w[i];
        if (run > want) return i;
    }
    return last >= 0 ? last : lo;  /* rounding ran past the block's end: its last kept token */
}

/* An open row (no top-k) whose boundary lies past its first `k` ranked tokens: the whole row's weights
   w = exp(x / t − max / t), the nucleus's last token by mass, then the draw in id order over the kept tokens.
   `w`: n floats; `scratch`: n Weights. */
static int64_t open_draw(const float *x, int64_t n, float t, double top_p, double min_p, double u, float *w,
                         Weight *scratch) {
    const float m = row_max(x, n), top = m / t;
    const double total = row_weights(x, n, t, top, w);
    Weight end = {-1.0f, INT32_MAX};  /* top-p 1: every token */
    if (top_p < 1.0) end = nucleus_end_by_buckets(w, n, top_p * total, scratch);
    return draw_kept_row(w, n, end, (float)min_p, u, (double *)scratch);  /* min-p: the first's weight is exp(0) = 1 */
}

#define OPEN_FIRST 256  /* tokens ranked first for an open row: a chat model's nucleus is mostly inside */

/* x (R, n) fp32; per row 0 ≤ k ≤ n (0: no top-k), t > 0, top_p in (0, 1], min_p in [0, 1), u in [0, 1) -> ids (R,).
   Returns 0, or -1 when memory for the selection could not be had. */
int parley_sample_top(const float *x, int64_t R, int64_t n, const int64_t *k, const float *t, const double *top_p,
                      const double *min_p, const double *u, int64_t *ids, int threads) {
    int64_t most = n < OPEN_FIRST ? n : OPEN_FIRST, open = 0;
    for (int64_t r = 0; r < R; r++) {
        most = k[r] > most ? k[r] : most;
        open |= k[r] == 0;
    }
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (R > 1)
    {
        Entry *h = malloc(sizeof(Entry) * (size_t)most);
        int64_t *rank = malloc(sizeof(int64_t) * (size_t)most);
        Kept *kept = malloc(sizeof(Kept) * (size_t)most);
        float *weights = open ? malloc(sizeof(float) * (size_t)n) : NULL;
        Weight *whole = open ? malloc(sizeof(Weight) * (size_t)n) : NULL;
        const int ok = h && rank && kept && ((weights && whole) || !open);
        if (!ok) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < R; r++) {
            if (!ok) continue;
            const float *row = x + r * n;
            const int64_t first = k[r] ? k[r] : most < OPEN_FIRST ? most : OPEN_FIRST;
            int64_t count = 0;
            const int cut = kept_prefix(row, n, first, k[r] != 0, t[r], top_p[r], min_p[r], h, rank, kept, &count);
            ids[r] = k[r] == 0 && !cut && first < n ? open_draw(row, n, t[r], top_p[r], min_p[r], u[r], weights, whole)
                                                     : draw_kept(kept, count, u[r]);
        }
        free(h);
        free(rank);
        free(kept);
        free(weights);
        free(whole);
    }
    return failed ? -1 : 0;
}

/* Repetition, presence and frequency penalties of P rows of x (·, n) fp32, in place: rows (P,) their indices, hist
   (P, H) int64 the ids each has seen (n or more: padding), params (P, 3) fp32 (repetition, presence, frequency),
   counts (P, H) fp32 each entry's id's count, or NULL without a frequency penalty; original (P, H) receives the values
   replaced. A row's seen logits are all read before any is written: an id seen twice is penalised once. With
   `restore`, `original` is written back instead. The operations and their rounding are engine/sampling.py's torch
   path's: a division or a product, then each subtraction apart. */
void parley_penalise_rows(float *x, int64_t n, int64_t P, const int64_t *rows, const int64_t *hist, int64_t H,
                          const float *params, const float *counts, float *original, int restore) {
    for (int64_t p = 0; p < P; p++) {
        float *row = x + rows[p] * n, *orig = original + p * H;
        const int64_t *ids = hist + p * H;
        if (restore) {
            for (int64_t h = 0; h < H; h++)
                if (ids[h] >= 0 && ids[h] < n) row[ids[h]] = orig[h];
            continue;
        }
        for (int64_t h = 0; h < H; h++) orig[h] = ids[h] >= 0 && ids[h] < n ? row[ids[h]] : 0.0f;
        const float rep = params[3 * p], presence = params[3 * p + 1], frequency = params[3 * p + 2];
        for (int64_t h = 0; h < H; h++) {
            if (ids[h] < 0 || ids[h] >= n) continue;
            float v = orig[h] > 0.0f ? orig[h] / rep : orig[h] * rep;
            v = v - presence;
            if (counts) {
                volatile float times = frequency * counts[p * H + h];  /* rounded apart, as torch's product: no FMA */
                v = v - times;
            }
            row[ids[h]] = v;
        }
    }
}
