/* A sparse mixture-of-experts MLP in one library call: the router, each row's top-k experts, their gated MLPs over
   K-quant super-blocks, and the weighted sum. Routing decides which products run, so done in Python it syncs on the
   host every layer and keeps CPU decode steps out of the tapes (engine/cpu_tape.py); here it is data, not control
   flow, and a tape replays the step.

   Per row, alone (so greedy batched == alone holds): logits l_e = x·router_e (eight lanes, then in order), softmax
   p = exp(l − max) / Σ (or with `sigmoid` p = σ(l), GLM-4.5's), the k largest (ties: the lower expert; by p_e + bias_e
   where a selection bias is given, the weights still p), renormalised over the chosen with `norm_topk`, times
   `scale`; then
   the row's experts in ascending order, out = Σ w·down_e(act(gate_e(x)) · up_e(x)) from 0. The products run grouped:
   every (row, expert) pair of the call, grouped by expert, through parley_kgemm_grouped (each row exactly kgemm's).
   parley_moe_codes is the same over experts in the codes layout (parley_qgemm_grouped; gpt-oss's MXFP4), with a
   router bias, experts' biases and gpt-oss's clamped activation. */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

#include "simd.h"

int parley_kgemm_grouped(const float *x, int64_t R, int64_t K, const uint8_t *const *mats, const int64_t *first,
                         const int64_t *count, int64_t M, int kind, int64_t N, float *y, int threads);
int parley_qgemm_grouped(const float *x, int64_t R, int64_t K, const uint8_t *const *codes,
                         const uint16_t *const *scales, int bits, const uint8_t *lut, int group, int zero,
                         const float *const *bias, const int64_t *first, const int64_t *count, int64_t M, int64_t N,
                         float *y, int threads);
void parley_clamped_glu(const float *gate, const float *up, int64_t R, int64_t I, int64_t stride, float alpha,
                        float limit, float *out);
int parley_kgemm(const float *x, int64_t R, int64_t K, const uint8_t *blocks, int kind, int64_t N, const float *bias,
                 float *y, int threads);
void parley_gated_act(const float *gate, const float *up, int64_t R, int64_t I, int64_t stride, int act, float *out);

/* Row r's picks: experts ascending in ids[0..k), their weights in w. `bias` (E,) or NULL: added to each p for the
   choice only; `logit_bias` (E,) or NULL: the router's own bias, added to each logit (gpt-oss). */
static void route_row(const float *x, int64_t D, const float *router, const float *logit_bias, const float *bias,
                      int64_t E, int k, int norm_topk, int sigmoid, float scale, float *logits, int *ids, float *w) {
    float top = -INFINITY;
    for (int64_t e = 0; e < E; e++) {
        logits[e] = dot_f32(x, router + e * D, D);
        if (logit_bias) logits[e] += logit_bias[e];
        if (logits[e] > top) top = logits[e];
    }
    float total = sigmoid ? 1.0f : 0.0f;
    for (int64_t e = 0; e < E; e++) {
        logits[e] = sigmoid ? 1.0f / (1.0f + expf(-logits[e])) : expf(logits[e] - top);
        if (!sigmoid) total += logits[e];
    }
    float picked = 0.0f;
    for (int i = 0; i < k; i++) {  /* the k largest, best first; a taken expert is marked taken */
        int best = -1;
        float best_score = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            if (logits[e] < 0.0f) continue;
            const float score = bias ? logits[e] / total + bias[e] : logits[e];
            if (best < 0 || score > best_score) { best = (int)e; best_score = score; }
        }
        ids[i] = best;
        w[i] = logits[best] / total;
        picked += w[i];
        logits[best] = -1.0f;
    }
    if (norm_topk)
        for (int i = 0; i < k; i++) w[i] /= picked;
    if (scale != 1.0f)
        for (int i = 0; i < k; i++) w[i] *= scale;
    for (int i = 1; i < k; i++)  /* ascending experts: the order the sum runs in */
        for (int j = i; j > 0 && ids[j] < ids[j - 1]; j--) {
            const int t = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = t;
            const float f = w[j]; w[j] = w[j - 1]; w[j - 1] = f;
        }
}

static void route_rows(const float *x, int64_t R, int64_t D, const float *router, const float *logit_bias,
                       const float *bias, int64_t E, int k, int norm_topk, int sigmoid, float scale, float *logits,
                       int *ids, float *w, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (R * E * D > (1 << 20))
    for (int64_t r = 0; r < R; r++)
        route_row(x + r * D, D, router, logit_bias, bias, E, k, norm_topk, sigmoid, scale, logits + r * E,
                  ids + r * k, w + r * k);
}

/* The R·k (row, expert) pairs grouped by expert, experts ascending and rows ascending within one: at (P + 4E) holds
   pos (P: pair p's place), then per group its expert (E), per expert a scratch count (E), per group its first pair
   and count (E each); x's rows gathered into xg in that order. Returns the group count M. */
static int64_t group_pairs(const float *x, int64_t R, int64_t D, int k, int64_t E, const int *ids, int64_t *at,
                           float *xg) {
    const int64_t P = R * k;
    int64_t *pos = at, *gexp = at + P, *first = at + P + E, *gfirst = at + P + 2 * E, *gcount = at + P + 3 * E;
    for (int64_t e = 0; e < E; e++) gcount[e] = 0;  /* each expert's pair count, for now */
    for (int64_t p = 0; p < P; p++) gcount[ids[p]]++;
    int64_t M = 0, next = 0;
    for (int64_t e = 0; e < E; e++) {  /* the experts some row chose, ascending: one group each */
        first[e] = next;
        next += gcount[e];
        if (gcount[e]) gexp[M++] = e;
    }
    for (int64_t m = 0; m < M; m++) {
        gfirst[m] = first[gexp[m]];
        gcount[m] = (m + 1 < M ? first[gexp[m + 1]] : P) - gfirst[m];
    }
    for (int64_t p = 0; p < P; p++) {  /* rows ascending within an expert's group */
        pos[p] = first[ids[p]]++;
        memcpy(xg + pos[p] * D, x + p / k * D, sizeof(float) * (size_t)D);
    }
    return M;
}

/* out row r = Σ_i w[r·k + i] · y[pos[r·k + i]], its experts ascending, from 0. */
static void weigh_rows(int64_t R, int64_t D, int k, const float *w, const int64_t *pos, const float *y, float *out) {
    for (int64_t r = 0; r < R; r++) {
        float *o = out + r * D;
        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
        for (int i = 0; i < k; i++) {
            const float wi = w[r * k + i], *yi = y + pos[r * k + i] * D;
            for (int64_t d = 0; d < D; d++) o[d] += wi * yi[d];
        }
    }
}

/* out (R, D) += σ(x·gate) · down(act(gate_up(x))): Qwen2-MoE's shared expert, every row through it (gate_up 2I rows
   of `gu_kind`, down D rows of `dn_kind`, gate (D,) fp32, or NULL: ungated, as ERNIE 4.5's). Returns as parley_moe. */
static int shared_expert(const float *x, int64_t R, int64_t D, const uint8_t *gate_up, int gu_kind, int64_t I,
                         const uint8_t *down, int dn_kind, const float *gate, int act, float *out, int threads) {
    float *gu = malloc(sizeof(float) * (size_t)(R * 2 * I)), *a = malloc(sizeof(float) * (size_t)(R * I));
    float *y = malloc(sizeof(float) * (size_t)(R * D));
    int rc = -1;
    if (gu && a && y && (rc = parley_kgemm(x, R, D, gate_up, gu_kind, 2 * I, NULL, gu, threads)) == 0) {
        parley_gated_act(gu, gu + I, R, I, 2 * I, act, a);
        rc = parley_kgemm(a, R, I, down, dn_kind, D, NULL, y, threads);
    }
    if (rc == 0)
        for (int64_t r = 0; r < R; r++) {
            const float g = gate ? 1.0f / (1.0f + expf(-dot_f32(x + r * D, gate, D))) : 1.0f;
            for (int64_t d = 0; d < D; d++) out[r * D + d] += g * y[r * D + d];
        }
    free(gu); free(a); free(y);
    return rc;
}

/* x (R, D) fp32 -> out (R, D). router (E, D) fp32, select_bias (E,) fp32 or NULL, sigmoid and scale as route_row's;
   gate_up[e] the expert's fused gate|up super-blocks (2I rows of
   `gu_kind`, K = D), down[e] its down (D rows of `dn_kind`, K = I); act as parley_gated_act's. A shared expert
   (shared_gate_up not NULL: 2·SI rows of `sgu_kind`, shared_down of `sdn_kind`, shared_gate (D,) fp32 or NULL) adds
   its (gated) output to every row's. Returns 0, −1 without scratch memory, −2 for shapes the products do not take. */
int parley_moe(const float *x, int64_t R, int64_t D, const float *router, const float *select_bias, int64_t E, int k,
               int norm_topk, int sigmoid, float scale,
               const uint8_t *const *gate_up, int gu_kind, int64_t I, const uint8_t *const *down, int dn_kind,
               int act, const uint8_t *shared_gate_up, int sgu_kind, int64_t SI, const uint8_t *shared_down,
               int sdn_kind, const float *shared_gate, float *out, int threads) {
    if (k < 1 || k > E) return -2;
    if (R == 0) return 0;
    const int64_t P = R * k;
    int *ids = malloc(sizeof(int) * (size_t)P);
    float *w = malloc(sizeof(float) * (size_t)P);
    float *logits = malloc(sizeof(float) * (size_t)(E * R));
    int64_t *at = malloc(sizeof(int64_t) * (size_t)(P + 4 * E));  /* pair p's position; per expert its count and
                                                                     first pair; per group its first and count */
    float *xg = malloc(sizeof(float) * (size_t)(P * D));
    float *gu = malloc(sizeof(float) * (size_t)(P * 2 * I));
    float *a = malloc(sizeof(float) * (size_t)(P * I));
    float *y = malloc(sizeof(float) * (size_t)(P * D));
    const uint8_t **mats = malloc(sizeof(void *) * (size_t)(2 * E));
    int rc = -1;
    if (!ids || !w || !logits || !at || !xg || !gu || !a || !y || !mats) goto done;

    route_rows(x, R, D, router, NULL, select_bias, E, k, norm_topk, sigmoid, scale, logits, ids, w, threads);
    int64_t *pos = at, *gfirst = at + P + 2 * E, *gcount = at + P + 3 * E, *gexp = at + P;  /* gexp: count's room */
    const int64_t M = group_pairs(x, R, D, k, E, ids, at, xg);
    for (int64_t m = 0; m < M; m++) {
        mats[m] = gate_up[gexp[m]];
        mats[E + m] = down[gexp[m]];
    }

    rc = parley_kgemm_grouped(xg, P, D, mats, gfirst, gcount, M, gu_kind, 2 * I, gu, threads);
    if (rc != 0) goto done;
    parley_gated_act(gu, gu + I, P, I, 2 * I, act, a);
    rc = parley_kgemm_grouped(a, P, I, mats + E, gfirst, gcount, M, dn_kind, D, y, threads);
    if (rc != 0) goto done;
    weigh_rows(R, D, k, w, pos, y, out);
    if (shared_gate_up)
        rc = shared_expert(x, R, D, shared_gate_up, sgu_kind, SI, shared_down, sdn_kind, shared_gate, act, out, threads);
done:
    free(ids); free(w); free(logits); free(at); free(xg); free(gu); free(a); free(y); free((void *)mats);
    return rc;
}

/* parley_moe over experts in the codes layout (parley_qgemm's symmetric codes, groups of 32: one layout for every
   matrix, e.g. MXFP4's 4-bit indices with its `lut`): x (R, D) fp32 -> out (R, D). router (E, D) fp32 with
   router_bias (E,) or NULL added to its logits; softmax, the top k, renormalised with `norm_topk`. gu_codes[e],
   gu_scales[e]: the expert's fused gate|up (2I rows, K = D), gu_bias (E, 2I) fp32 or NULL; dn_* its down (D rows,
   K = I), dn_bias (E, D) or NULL. act: 0 silu, 1 gelu_tanh (parley_gated_act's), 2 gpt-oss's clamped activation
   (alpha, limit: parley_clamped_glu). Returns as parley_moe. */
int parley_moe_codes(const float *x, int64_t R, int64_t D, const float *router, const float *router_bias, int64_t E,
                     int k, int norm_topk, const uint8_t *const *gu_codes, const uint16_t *const *gu_scales,
                     const float *gu_bias, const uint8_t *const *dn_codes, const uint16_t *const *dn_scales,
                     const float *dn_bias, int bits, const uint8_t *lut, int zero, int64_t I, int act, float alpha,
                     float limit, float *out, int threads) {
    if (k < 1 || k > E || D % 32 || I % 32) return -2;
    if (R == 0) return 0;
    const int64_t P = R * k;
    int *ids = malloc(sizeof(int) * (size_t)P);
    float *w = malloc(sizeof(float) * (size_t)P);
    float *logits = malloc(sizeof(float) * (size_t)(E * R));
    int64_t *at = malloc(sizeof(int64_t) * (size_t)(P + 4 * E));
    float *xg = malloc(sizeof(float) * (size_t)(P * D));
    float *gu = malloc(sizeof(float) * (size_t)(P * 2 * I));
    float *a = malloc(sizeof(float) * (size_t)(P * I));
    float *y = malloc(sizeof(float) * (size_t)(P * D));
    const void **held = malloc(sizeof(void *) * (size_t)(6 * E));  /* per group: codes, scales, bias; gate|up, down */
    int rc = -1;
    if (!ids || !w || !logits || !at || !xg || !gu || !a || !y || !held) goto done;

    route_rows(x, R, D, router, router_bias, NULL, E, k, norm_topk, 0, 1.0f, logits, ids, w, threads);
    const int64_t M = group_pairs(x, R, D, k, E, ids, at, xg);
    const int64_t *pos = at, *gexp = at + P, *gfirst = at + P + 2 * E, *gcount = at + P + 3 * E;
    const uint8_t **guc = (const uint8_t **)held, **dnc = (const uint8_t **)held + E;
    const uint16_t **gus = (const uint16_t **)held + 2 * E, **dns = (const uint16_t **)held + 3 * E;
    const float **gub = (const float **)held + 4 * E, **dnb = (const float **)held + 5 * E;
    for (int64_t m = 0; m < M; m++) {
        const int64_t e = gexp[m];
        guc[m] = gu_codes[e]; gus[m] = gu_scales[e]; gub[m] = gu_bias ? gu_bias + e * 2 * I : NULL;
        dnc[m] = dn_codes[e]; dns[m] = dn_scales[e]; dnb[m] = dn_bias ? dn_bias + e * D : NULL;
    }
    rc = parley_qgemm_grouped(xg, P, D, guc, gus, bits, lut, 32, zero, gub, gfirst, gcount, M, 2 * I, gu, threads);
    if (rc != 0) goto done;
    if (act == 2)
        parley_clamped_glu(gu, gu + I, P, I, 2 * I, alpha, limit, a);
    else
        parley_gated_act(gu, gu + I, P, I, 2 * I, act, a);
    rc = parley_qgemm_grouped(a, P, I, dnc, dns, bits, lut, 32, zero, dnb, gfirst, gcount, M, D, y, threads);
    if (rc != 0) goto done;
    weigh_rows(R, D, k, w, pos, y, out);
done:
    free(ids); free(w); free(logits); free(at); free(xg); free(gu); free(a); free(y); free((void *)held);
    return rc;
}
