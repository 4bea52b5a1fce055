/* attend.c's functions that read the KV cache, for one storage type: included once per type with KV_T (the element),
   KV_LOAD8 (eight elements as fp32), KV_LOAD1 (one) and KV(name) (the name with the type's suffix) defined. Every
   element is widened to fp32 exactly, so a row's sums are the same code over either type. */
/* a·b over n: four independent lanes of eight (the FMA latency hides), then eight, then the tail; one fixed order. */
static inline float KV(dot_wide)(const float *a, const KV_T *b, int n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KV_LOAD8(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), KV_LOAD8(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), KV_LOAD8(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), KV_LOAD8(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), KV_LOAD8(b + i), s0);
    float tail = 0.0f;
    for (; i < n; i++) tail = fmaf(a[i], KV_LOAD1(b + i), tail);  /* fmaf, not `+= a * b`: gcc contracted that for fp32 only */
    return hsum8(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3))) + tail;
}

/* out = inv · Σ_j p[j]·v_j over the keys, each output summed over j in order: eight outputs at a time, then the tail
   (the outputs weighted_sums' passes leave). v_j = vc + keys[j]·stride. */
static void KV(weighted_sum)(float *out, const float *p, const KV_T *vc, const int64_t *keys, int64_t n, int64_t stride,
                         int D, float inv) {
    int i = 0;
    for (; i + 8 <= D; i += 8) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++)
            acc = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), KV_LOAD8(vc + keys[j] * stride + i), acc);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(acc, _mm256_set1_ps(inv)));
    }
    for (; i < D; i++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n; j++) acc = fmaf(p[j], KV_LOAD1(vc + keys[j] * stride + i), acc);
        out[i] = acc * inv;
    }
}

/* weighted_sum for NG query heads of one KV head at once (each value row read once for all of them): head g's
   out_g = inv[g] · Σ_j p_g[j]·v_j, every output summed over j in order as weighted_sum sums it (the same bits).
   p_g = p + g·n, out_g = out + g·D. */
static inline __attribute__((always_inline)) void KV(weighted_sums)(float *out, const float *p, const KV_T *vc,
                                                                const int64_t *keys, int64_t n, int64_t stride, int D,
                                                                const float *inv, const int NG) {
    const int C = NG <= 2 ? 8 : 4;  /* eight-float chunks of D a pass: 16 accumulators at most */
    int i = 0;
    for (; i + 8 * C <= D; i += 8 * C) {
        __m256 acc[4][8];
        for (int g = 0; g < NG; g++)
            for (int c = 0; c < C; c++) acc[g][c] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++) {
            const KV_T *v = vc + keys[j] * stride + i;
            __m256 vv[8];
            for (int c = 0; c < C; c++) vv[c] = KV_LOAD8(v + 8 * c);
            for (int g = 0; g < NG; g++) {
                const __m256 pj = _mm256_set1_ps(p[g * n + j]);
                for (int c = 0; c < C; c++) acc[g][c] = _mm256_fmadd_ps(pj, vv[c], acc[g][c]);
            }
        }
        for (int g = 0; g < NG; g++)
            for (int c = 0; c < C; c++)
                _mm256_storeu_ps(out + g * D + i + 8 * c, _mm256_mul_ps(acc[g][c], _mm256_set1_ps(inv[g])));
    }
    for (int g = 0; g < NG; g++)  /* the rest of D (past the whole passes): one head at a time, in the same order */
        if (i < D) KV(weighted_sum)(out + g * D + i, p + g * n, vc + i, keys, n, stride, D - i, inv[g]);
}

/* Scores of keys j .. j + 7 for NG heads (D a multiple of 8): each key row loaded once for all heads, each score's
   eight lanes over D summed at once for the eight keys (transpose_sum8) instead of one horizontal sum a key; the key
   rows PREFETCH_KEYS ahead are asked for (they lie Hkv · D floats apart). p_g = p + g·n. */
static inline __attribute__((always_inline)) void KV(scores8)(const float *qh, const KV_T *kc, const int64_t *keys,
                                                          int64_t j, int64_t n, int Hkv, int kvh, int D, float scale,
                                                          float *p, const int NG) {
    __m256 part[4][8];
    const KV_T *k[8];
    for (int t = 0; t < 8; t++) {
        k[t] = kc + (keys[j + t] * Hkv + kvh) * D;
        if (j + t + PREFETCH_KEYS < n) {
            const char *ahead = (const char *)(kc + (keys[j + t + PREFETCH_KEYS] * Hkv + kvh) * D);
            for (int b = 0; b < D * (int)sizeof(KV_T); b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
        }
        for (int g = 0; g < NG; g++) part[g][t] = _mm256_setzero_ps();
    }
    for (int i = 0; i < D; i += 8)  /* eight keys' chains side by side: no FMA waits on the one before it */
        for (int g = 0; g < NG; g++) {
            const __m256 qv = _mm256_loadu_ps(qh + g * D + i);
            for (int t = 0; t < 8; t++) part[g][t] = _mm256_fmadd_ps(qv, KV_LOAD8(k[t] + i), part[g][t]);
        }
    for (int g = 0; g < NG; g++)
        _mm256_storeu_ps(p + g * n + j, _mm256_mul_ps(transpose_sum8(part[g]), _mm256_set1_ps(scale)));
}

/* Query heads h0 .. h0 + ng - 1 (ng ≤ 4, all of KV head kvh) of one query row over its n keys: each key and value row
   is read once for all of them. A score's sum order depends only on its key's place in the row's own list (keys in
   eights, the rest and any D not a multiple of 8 one at a time), so a head's scores, weights and output are those it
   gets alone. p: ng · n floats. */
static void KV(attend_heads)(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *keys, int64_t n, int64_t row,
                         int h0, int ng, int kvh, int H, int Hkv, int D, float scale, float softcap,
                         const float *sinks, float *p, float *out) {
    const float *qh = q + (row * H + h0) * D;
    int64_t j = 0;
    if (D % 8 == 0)
        for (; j + 8 <= n; j += 8)
            switch (ng) {  /* a constant head count, so the partial sums stay in registers */
                case 4: KV(scores8)(qh, kc, keys, j, n, Hkv, kvh, D, scale, p, 4); break;
                case 3: KV(scores8)(qh, kc, keys, j, n, Hkv, kvh, D, scale, p, 3); break;
                case 2: KV(scores8)(qh, kc, keys, j, n, Hkv, kvh, D, scale, p, 2); break;
                default: KV(scores8)(qh, kc, keys, j, n, Hkv, kvh, D, scale, p, 1); break;
            }
    for (; j < n; j++) {
        const KV_T *k = kc + (keys[j] * Hkv + kvh) * D;
        for (int g = 0; g < ng; g++) p[g * n + j] = scale * KV(dot_wide)(qh + g * D, k, D);
    }
    if (softcap > 0.0f)
        for (int g = 0; g < ng; g++)
            for (int64_t i = 0; i < n; i++) p[g * n + i] = softcap * tanhf(p[g * n + i] / softcap);
    float inv[4];
    for (int g = 0; g < ng; g++) inv[g] = softmax_weights(p + g * n, n, sinks ? sinks[h0 + g] : -INFINITY);
    float *o = out + (row * H + h0) * D;
    const int64_t stride = (int64_t)Hkv * D;
    switch (ng) {  /* a constant head count, so the accumulators stay in registers */
        case 4: KV(weighted_sums)(o, p, vc + kvh * D, keys, n, stride, D, inv, 4); break;
        case 3: KV(weighted_sums)(o, p, vc + kvh * D, keys, n, stride, D, inv, 3); break;
        case 2: KV(weighted_sums)(o, p, vc + kvh * D, keys, n, stride, D, inv, 2); break;
        default: KV(weighted_sums)(o, p, vc + kvh * D, keys, n, stride, D, inv, 1); break;
    }
}

/* q (T, H, D) fp32; caches (rows, Hkv, D) of KV_T (fp32, or fp16 in parley_attend_rows_f16); keys: the cache rows, concatenated; table (S, 3) int64: per query row
   its row in q, the offset of its keys in `keys` and their count. out (T, H, D): rows the table names are written.
   softcap > 0 caps each score as softcap · tanh(score / softcap) (Gemma 2); sinks (H,), or NULL: a logit per query
   head that joins each row's softmax without a value (gpt-oss). A job is up to four query heads sharing a
   KV head (their keys and values read once), or one head where that would leave a thread without a job (a head's
   result is the same either way). Returns 0, or -1 when scratch could not be allocated. */
int KV(parley_attend_rows)(const float *q, const KV_T *kc, const KV_T *vc, const int64_t *keys, const int64_t *table,
                       int64_t S, int H, int Hkv, int D, float scale, float softcap, const float *sinks, float *out,
                       int threads) {
    const int G = H / Hkv;
    const int per_job = S * Hkv >= threads ? (G < 4 ? G : 4) : 1;  /* query heads a job takes */
    const int jobs_per_kv = (G + per_job - 1) / per_job;
    int64_t most = 0;
    for (int64_t s = 0; s < S; s++) most = table[3 * s + 2] > most ? table[3 * s + 2] : most;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (S * H * most * D > (1 << 16))
    {
        float *p = malloc(sizeof(float) * (size_t)per_job * (size_t)(most > 0 ? most : 1));
        if (!p) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(dynamic, 1)
        for (int64_t job = 0; job < S * Hkv * jobs_per_kv; job++) {
            if (!p) continue;
            const int64_t s = job / (Hkv * jobs_per_kv);
            const int kvh = (int)(job / jobs_per_kv % Hkv), h0 = kvh * G + (int)(job % jobs_per_kv) * per_job;
            const int ng = G - (h0 - kvh * G) < per_job ? G - (h0 - kvh * G) : per_job;
            const int64_t row = table[3 * s], at = table[3 * s + 1], n = table[3 * s + 2];
            KV(attend_heads)(q, kc, vc, keys + at, n, row, h0, ng, kvh, H, Hkv, D, scale, softcap, sinks, p, out);
        }
        free(p);
    }
    return failed ? -1 : 0;
}
