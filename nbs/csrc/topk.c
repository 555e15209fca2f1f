/* Top-k softmax: softmax over the keys scoring at least the k-th largest of the row, k = max(1, ceil(ratio * valid keys)). */

/* top-k: per lane, the k-th largest by counting (short rows) or by a search on order-preserving integer keys, all
   lanes together, keeping "lo and hi are keys of the row, >= k keys >= lo, < k keys > hi". Each step counts the keys
   >= a split point in (lo, hi] and moves lo up to the smallest key above it or hi down to the largest key below it, so
   ties and outliers cost no extra steps. The first split is where the k-th score would lie if the row's scores were
   normal with their mean and spread; the next GUESS_STEPS interpolate the ranks at the interval's ends (clamped
   inside it); then halving the keys ends the search in 32 steps at most (infinite or NaN values use it at once). Any
   split inside the interval keeps the invariant, so the threshold, and every output bit, is the one halving alone
   finds. Rows of 97 normal scores take ~5 steps per 16 rows, where halving took 14-17 (31 with ties). */
#define GUESS_STEPS 16
static inline float key_value(int32_t key) { union { int32_t i; float f; } u = { key ^ ((key >> 31) & 0x7fffffff) }; return u.f; }
static inline int32_t value_key(float v) { union { float f; int32_t i; } u = { v }; return u.i ^ ((u.i >> 31) & 0x7fffffff); }
/* the middle of [lo, hi], lo + ceil((hi - lo) / 2) = hi - floor((hi - lo) / 2): hi - lo < 2^32 is exact in uint32, so
   no int64 (which halves the lanes per vector); only lanes with lo <= hi (the open ones, and lo == hi) use it */
static inline int32_t half_split(int32_t lo, int32_t hi) { return (int32_t)((uint32_t)hi - (((uint32_t)hi - (uint32_t)lo) >> 1)); }
/* the first split: the (1 - (k - 1/2) / nv) quantile of a normal with the row's mean and spread, the probit taken as
   0.6 times the logit (a guess, so a rough one serves: within 0.04 of the probit for shares from 0.1 to 0.9) */
static inline int32_t normal_split(int32_t lo, int32_t hi, float s1, float s2, int nv, int k, int32_t half) {
    float mean = s1 / nv, var = s2 / nv - mean * mean, sd = var > 0 ? sqrtf(var) : 0;
    float q = ((float)k - 0.5f) / (float)nv;                 /* the share above the split, in (0, 1) */
    float v = mean + 0.6f * log_f((1.0f - q) / q) * sd;
    int32_t m = value_key(v);
    return isfinite(v) && m > lo && m <= hi ? m : half;      /* selects, not branches: the lanes stay in vectors */
}
/* where to split (lo, hi]: cl keys >= lo, ch keys > hi, the k-th largest wanted; `half` (key halving) the
   fallback */
static inline int32_t guess_split(int32_t lo, int32_t hi, int cl, int ch, int k, int32_t half) {
    float a = key_value(lo), b = key_value(hi);
    float t = cl - ch <= 1 ? 0.5f : ((float)(k - ch) - 0.5f) / (float)(cl - ch - 1);   /* share from the top */
    t = t < 0.0625f ? 0.0625f : (t > 0.9375f ? 0.9375f : t);
    float v = b - t * (b - a);
    int32_t m = value_key(v);
    return isfinite(v) && isfinite(b - a) && m > lo && m <= hi ? m : half;
}

static void topk_softmax_fwd_lanes(const float* X, float* P, int32_t* BAD, float* Z, long rows, long n, double ratio) {
    int32_t* K = (int32_t*)(Z + n * LN);               /* keys, [n][16], after the values */
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], thr[LN], s1[LN], s2[LN]; int32_t lo[LN], hi[LN]; int nv[LN], nan_inf[LN], k[LN], c[LN], cl[LN], ch[LN], dead[LN];
        load_lanes(X, r0, L, n, Z);
        for (long l = 0; l < LN; l++) { m[l] = -INFINITY; nv[l] = 0; nan_inf[l] = 0; s1[l] = 0; s2[l] = 0; lo[l] = INT32_MAX; hi[l] = INT32_MIN; }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) {
                float v = Z[j * LN + l];
                float fv = v > -INFINITY ? v : 0.0f;                 /* finite (or +inf) scores: count, mean, spread */
                m[l] = v > m[l] ? v : m[l]; nv[l] += v > -INFINITY; s1[l] += fv; s2[l] += fv * fv;
                nan_inf[l] |= v != v || v == INFINITY;
                int32_t key = value_key(v);
                K[j * LN + l] = key;
                lo[l] = key < lo[l] && v > -INFINITY ? key : lo[l]; hi[l] = key > hi[l] ? key : hi[l];
            }
        }
        for (long l = 0; l < LN; l++) {
            dead[l] = nv[l] == 0;
            if (l < L) BAD[r0 + l] = nan_inf[l] || dead[l];        /* softmax would give NaN: the caller makes it so */
            long kk = (long)ceil(round((double)nv[l] * ratio * 1e9) / 1e9); kk = kk < 1 ? 1 : (kk > nv[l] ? nv[l] : kk);
            k[l] = (int)kk;
        }
        if (n <= SHORT_ROW) {                               /* short rows: the smallest value with fewer than k above it */
            for (long l = 0; l < LN; l++) thr[l] = INFINITY;
            for (long i = 0; i < n; i++) {
                for (long l = 0; l < LN; l++) c[l] = 0;
                for (long j = 0; j < n; j++) {
                    #pragma omp simd
                    for (long l = 0; l < LN; l++) c[l] += Z[j * LN + l] > Z[i * LN + l];
                }
                #pragma omp simd
                for (long l = 0; l < LN; l++) thr[l] = (c[l] < k[l] && Z[i * LN + l] < thr[l]) ? Z[i * LN + l] : thr[l];
            }
            for (long l = 0; l < LN; l++) lo[l] = hi[l];   /* skip the bisection */
        }
        /* the search, short rows aside (their lo == hi): each step's split is computed in its own simd loop, the first
           (normal) one before the steps, the next at the end of each, so no loop holds a call or a branch on `it` */
        int32_t mid[LN];
        if (n > SHORT_ROW) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) { cl[l] = nv[l]; ch[l] = 0; mid[l] = normal_split(lo[l], hi[l], s1[l], s2[l], nv[l], k[l], half_split(lo[l], hi[l])); }
        }
        for (int it = 0; n > SHORT_ROW && it < 33 + GUESS_STEPS; it++) {
            int open = 0;
            int32_t low[LN], high[LN];                 /* the smallest key >= mid, the largest below it */
            #pragma omp simd reduction(+:open)
            for (long l = 0; l < LN; l++) { c[l] = 0; low[l] = INT32_MAX; high[l] = INT32_MIN; open += lo[l] < hi[l]; }
            if (!open) break;
            for (long j = 0; j < n; j++) {
                #pragma omp simd
                for (long l = 0; l < LN; l++) {
                    int32_t key = K[j * LN + l]; int above = key >= mid[l];
                    int32_t up = above ? key : INT32_MAX, down = above ? INT32_MIN : key;
                    c[l] += above; low[l] = up < low[l] ? up : low[l]; high[l] = down > high[l] ? down : high[l];
                }
            }
            #pragma omp simd
            for (long l = 0; l < LN; l++) {            /* closed lanes (lo >= hi) keep theirs */
                int on = lo[l] < hi[l], eq = on && c[l] == k[l], up = on && c[l] > k[l], down = on && c[l] < k[l];
                lo[l] = eq || up ? low[l] : lo[l];     /* exactly k keys >= mid: the smallest of them is the k-th */
                hi[l] = eq ? low[l] : (down ? high[l] : hi[l]);
                cl[l] = up ? c[l] : cl[l]; ch[l] = down ? c[l] : ch[l];
            }
            if (it + 1 < GUESS_STEPS) {
                #pragma omp simd
                for (long l = 0; l < LN; l++) mid[l] = guess_split(lo[l], hi[l], cl[l], ch[l], k[l], half_split(lo[l], hi[l]));
            } else {
                #pragma omp simd
                for (long l = 0; l < LN; l++) mid[l] = half_split(lo[l], hi[l]);
            }
        }
        for (long l = 0; l < LN; l++) {
            if (n > SHORT_ROW) thr[l] = key_value(lo[l]);
            if (dead[l]) m[l] = 0;
        }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) {
                float v = Z[j * LN + l]; int on = v >= thr[l] && !dead[l];
                Z[j * LN + l] = exp_f(on ? v - m[l] : 0.0f) * (float)on;
            }
        }
        normalise_lanes(Z, n, dead);
        store_lanes(P, r0, L, n, Z);
    }
}

void topk_softmax_fwd(const float* X, float* P, int32_t* BAD, float* W, long rows, long n, double ratio) {
    topk_softmax_fwd_lanes(X, P, BAD, W, rows, n, ratio);
}
