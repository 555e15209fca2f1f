/* Row kernels (float32) for the sparse attention normalizers: one pass over a row in L1 per Newton step. */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Branch-free expf / logf (Cephes polynomials, ~1 ulp on the ranges used): they vectorise, and unlike
   libm's vector versions have no slow path for the zeros and -inf that masked attention rows are full of. */
#pragma omp declare simd notinbranch
static inline float exp_f(float xin) {           /* 0 below -87, as float32 underflows there */
    float x = xin < -87.0f ? -87.0f : (xin > 88.0f ? 88.0f : xin);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    x = x - n * 0.693359375f + n * 2.12194440e-4f;
    float z = x * x;
    float y = ((((1.9875691500E-4f * x + 1.3981999507E-3f) * x + 8.3334519073E-3f) * x + 4.1665795894E-2f) * x
               + 1.6666665459E-1f) * x + 5.0000001201E-1f;
    y = y * z + x + 1.0f;
    union { int32_t i; float f; } u = { ((int32_t)n + 127) << 23 };
    return xin < -87.0f ? 0.0f : y * u.f;
}

#pragma omp declare simd notinbranch
static inline float log_f(float x) {             /* x > 0 and normal */
    union { float f; int32_t i; } u = { x };
    float e = (float)(((u.i >> 23) & 0xff) - 126);
    u.i = (u.i & 0x007fffff) | 0x3f000000;        /* mantissa in [0.5, 1) */
    float m = u.f;
    int small = m < 0.707106781186547524f;
    e -= (float)small;
    m = small ? m + m - 1.0f : m - 1.0f;
    float z = m * m;
    float y = ((((((((7.0376836292E-2f * m - 1.1514610310E-1f) * m + 1.1676998740E-1f) * m - 1.2420140846E-1f) * m
               + 1.4249322787E-1f) * m - 1.6668057665E-1f) * m + 2.0000714765E-1f) * m - 2.4999993993E-1f) * m
               + 3.3333331174E-1f) * m * z;
    y += -2.12194440e-4f * e;
    y += -0.5f * z;
    return m + y + 0.693359375f * e;
}

static inline float row_max(const float* x, long n) {
    float m = -INFINITY;
    #pragma omp simd reduction(max:m)
    for (long j = 0; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

static void sparsemax_fwd_rows(const float* X, float* P, long rows, long n) {
    for (long r = 0; r < rows; r++) {
        const float* x = X + r * n; float* p = P + r * n;
        float m = row_max(x, n);
        if (!(m > -INFINITY)) { memset(p, 0, n * sizeof(float)); continue; }
        float zs = 0;                                      /* start: max(mean(z) - 1/n, max(z) - 1) <= tau*, as the torch path */
        #pragma omp simd reduction(+:zs)
        for (long j = 0; j < n; j++) { float z = x[j] - m; zs += z > -1e4f ? z : -1e4f; }
        float tau = (zs - 1) / n; tau = tau > -1 ? tau : -1; long k = -1;   /* Michelot from the left */
        for (long it = 0; it <= n; it++) {
            float s = 0; int c = 0;
            #pragma omp simd reduction(+:s, c)
            for (long j = 0; j < n; j++) { float d = x[j] - m - tau; s += d > 0 ? d : 0; c += d > 0; }
            if (c == k) break;                             /* support stable: tau is exact */
            k = c; tau += (s - 1) / c;
        }
        #pragma omp simd
        for (long j = 0; j < n; j++) { float d = x[j] - m - tau; p[j] = d > 0 ? d : 0; }
    }
}

static void sparsemax_bwd_rows(const float* P, const float* G, float* DX, long rows, long n) {
    for (long r = 0; r < rows; r++) {
        const float* p = P + r * n; const float* g = G + r * n; float* dx = DX + r * n;
        float s = 0; int c = 0;
        #pragma omp simd reduction(+:s, c)
        for (long j = 0; j < n; j++) { s += p[j] > 0 ? g[j] : 0; c += p[j] > 0; }
        float mean = c ? s / c : 0;
        #pragma omp simd
        for (long j = 0; j < n; j++) dx[j] = p[j] > 0 ? g[j] - mean : 0;
    }
}

/* alpha-entmax with one alpha per row (A): Newton from the left on sum(max(z - tau, 0)^beta) = 1, beta = 1/(alpha-1).
   tau only grows, so a key that falls out of the support stays out: the iterations run over the keys with z > -1 only
   (copied, branch-free, into the scratch row ZB, padded to whole vectors). Each iteration costs an exp and a log
   per key, so this pays here. */
static void entmax_alpha_fwd_rows(const float* X, float* P, const float* A, float* ZB, long rows, long n, long max_iter, float tol) {
    for (long r = 0; r < rows; r++) {
        const float* x = X + r * n; float* p = P + r * n;
        float m = row_max(x, n);
        if (!(m > -INFINITY)) { memset(p, 0, n * sizeof(float)); continue; }
        float am1 = A[r] - 1, beta = 1 / am1, bm1 = beta - 1;
        long c = 0;                                        /* z = (x - max)(alpha - 1) <= 0, f(-1) >= 0 */
        for (long j = 0; j < n; j++) { float z = (x[j] - m) * am1; ZB[c] = z; c += z > -1.0f; }
        for (long j = c; j < ((c + 15) & ~15L); j++) ZB[j] = -2.0f;   /* pad to whole vectors with keys below tau */
        c = (c + 15) & ~15L;
        float tau = -1;
        for (long it = 0; it < max_iter; it++) {
            float s1 = 0, s2 = 0;
            #pragma omp simd reduction(+:s1, s2)
            for (long j = 0; j < c; j++) {
                float d = ZB[j] - tau; int on = d > 0;
                float dp = on ? exp_f(bm1 * log_f(on ? d : 1.0f)) : 0.0f;   /* d^(beta-1) */
                s1 += dp; s2 += dp * (on ? d : 0.0f);
            }
            float step = (s2 - 1) / (beta * s1);
            tau += step;
            if (fabsf(step) <= tol) break;
        }
        float s = 0;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < n; j++) {
            float d = (x[j] - m) * am1 - tau; int on = d > 0;
            p[j] = on ? exp_f(beta * log_f(on ? d : 1.0f)) : 0.0f; s += p[j];
        }
        float inv = 1 / s;
        #pragma omp simd
        for (long j = 0; j < n; j++) p[j] *= inv;
    }
}

/* backward of alpha-entmax, w = p^(2-alpha) on the support: dx = w*g - w*<w,g>/sum(w).
   A: alpha per row, or NULL for alpha = 1.5 (w = sqrt p). DA (may be NULL): per-row d loss / d alpha, from
   dp/dalpha = (p - s)/(alpha-1)^2 - (p log p - s <p, log p>)/(alpha-1), s = w/sum(w). One log and one exp per key:
   w is kept in DX and p log p in the scratch row PL between the passes. */
static void entmax_bwd_rows(const float* P, const float* G, float* DX, const float* A, float* DA, float* PL, long rows, long n) {
    for (long r = 0; r < rows; r++) {
        const float* p = P + r * n; const float* g = G + r * n; float* dx = DX + r * n;
        float a = A ? A[r] : 1.5f, e = 2 - a, sw = 0, swg = 0, ent = 0;
        if (A) {
            #pragma omp simd reduction(+:sw, swg, ent)
            for (long j = 0; j < n; j++) {
                int on = p[j] > 0;
                float lp = log_f(on ? p[j] : 1.0f);
                float w = on ? exp_f(e * lp) : 0.0f, pl = on ? p[j] * lp : 0.0f;
                dx[j] = w; PL[j] = pl; sw += w; swg += w * g[j]; ent += pl;
            }
        } else {
            #pragma omp simd reduction(+:sw, swg)
            for (long j = 0; j < n; j++) { float w = p[j] > 0 ? sqrtf(p[j]) : 0.0f; dx[j] = w; sw += w; swg += w * g[j]; }
        }
        float q = sw > 0 ? swg / sw : 0;
        if (DA) {
            float am1 = a - 1, da = 0, isw = sw > 0 ? 1 / sw : 0;
            #pragma omp simd reduction(+:da)
            for (long j = 0; j < n; j++) {
                float skew = dx[j] * isw;
                da += g[j] * ((p[j] - skew) / (am1 * am1) - (PL[j] - skew * ent) / am1);
            }
            DA[r] = da;
        }
        #pragma omp simd
        for (long j = 0; j < n; j++) dx[j] = dx[j] * (g[j] - q);
    }
}

static void softmax_bwd_rows(const float* P, const float* G, float* DX, long rows, long n) {
    for (long r = 0; r < rows; r++) {
        const float* p = P + r * n; const float* g = G + r * n; float* dx = DX + r * n;
        float s = 0;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < n; j++) s += p[j] * g[j];
        #pragma omp simd
        for (long j = 0; j < n; j++) dx[j] = p[j] * (g[j] - s);
    }
}

/* ---- Short rows: 16 rows at a time, one per vector lane. ------------------------------------------------------
   A row of 17 keys is one full vector plus one scalar leftover, and each Newton step ends in a horizontal sum: most
   of the time goes to overhead. Transposed into a [n][16] block, every step is n plain vector operations across 16
   rows, with per-lane sums and thresholds and no horizontal work. Lanes past the last row repeat it (discarded). */
#define LN 16

/* Full blocks move 16 x 16 tiles through registers where the CPU has AVX-512 (a transpose in 64 shuffles instead of 256
   scalar loads and stores); the rest of a row, short blocks and other CPUs go element by element. Only data moves, so
   results are the same either way. */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) { t[2*i] = _mm512_unpacklo_ps(r[2*i], r[2*i+1]); t[2*i+1] = _mm512_unpackhi_ps(r[2*i], r[2*i+1]); }
    for (int i = 0; i < 4; i++) {
        r[4*i]   = _mm512_shuffle_ps(t[4*i],   t[4*i+2], _MM_SHUFFLE(1, 0, 1, 0));
        r[4*i+1] = _mm512_shuffle_ps(t[4*i],   t[4*i+2], _MM_SHUFFLE(3, 2, 3, 2));
        r[4*i+2] = _mm512_shuffle_ps(t[4*i+1], t[4*i+3], _MM_SHUFFLE(1, 0, 1, 0));
        r[4*i+3] = _mm512_shuffle_ps(t[4*i+1], t[4*i+3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        t[i]    = _mm512_shuffle_f32x4(r[i],   r[4+i],  0x88);
        t[4+i]  = _mm512_shuffle_f32x4(r[i],   r[4+i],  0xdd);
        t[8+i]  = _mm512_shuffle_f32x4(r[8+i], r[12+i], 0x88);
        t[12+i] = _mm512_shuffle_f32x4(r[8+i], r[12+i], 0xdd);
    }
    for (int i = 0; i < 4; i++) {
        r[i]    = _mm512_shuffle_f32x4(t[i],   t[8+i],  0x88);
        r[4+i]  = _mm512_shuffle_f32x4(t[4+i], t[12+i], 0x88);
        r[8+i]  = _mm512_shuffle_f32x4(t[i],   t[8+i],  0xdd);
        r[12+i] = _mm512_shuffle_f32x4(t[4+i], t[12+i], 0xdd);
    }
}
#endif

static void load_lanes(const float* X, long r0, long L, long n, float* Z) {
    long j0 = 0;
#if defined(__AVX512F__)
    if (L == LN) for (; j0 + 16 <= n; j0 += 16) {
        __m512 r[16];
        for (int l = 0; l < 16; l++) r[l] = _mm512_loadu_ps(X + (r0 + l) * n + j0);
        transpose16(r);
        for (int j = 0; j < 16; j++) _mm512_storeu_ps(Z + (j0 + j) * LN, r[j]);
    }
#endif
    for (long l = 0; l < LN; l++) {
        const float* x = X + (r0 + (l < L ? l : L - 1)) * n;
        for (long j = j0; j < n; j++) Z[j * LN + l] = x[j];
    }
}

static void store_lanes(float* P, long r0, long L, long n, const float* Z) {
    long j0 = 0;
#if defined(__AVX512F__)
    if (L == LN) for (; j0 + 16 <= n; j0 += 16) {
        __m512 r[16];
        for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_ps(Z + (j0 + j) * LN);
        transpose16(r);
        for (int l = 0; l < 16; l++) _mm512_storeu_ps(P + (r0 + l) * n + j0, r[l]);
    }
#endif
    for (long l = 0; l < L; l++) {
        float* p = P + (r0 + l) * n;
        for (long j = j0; j < n; j++) p[j] = Z[j * LN + l];
    }
}

/* row max per lane; Z becomes (Z - max) * scale; `dead` marks lanes whose row has no finite key */
static void center_lanes(float* Z, long n, float scale, float* m, int* dead) {
    for (long l = 0; l < LN; l++) m[l] = -INFINITY;
    for (long j = 0; j < n; j++) {
        #pragma omp simd
        for (long l = 0; l < LN; l++) m[l] = Z[j * LN + l] > m[l] ? Z[j * LN + l] : m[l];
    }
    for (long l = 0; l < LN; l++) { dead[l] = !(m[l] > -INFINITY); if (dead[l]) m[l] = 0; }
    for (long j = 0; j < n; j++) {
        #pragma omp simd
        for (long l = 0; l < LN; l++) Z[j * LN + l] = (Z[j * LN + l] - m[l]) * scale;
    }
}

static void normalise_lanes(float* Z, long n, const int* dead) {
    float s[LN];
    for (long l = 0; l < LN; l++) s[l] = 0;
    for (long j = 0; j < n; j++) {
        #pragma omp simd
        for (long l = 0; l < LN; l++) s[l] += Z[j * LN + l];
    }
    for (long l = 0; l < LN; l++) s[l] = dead[l] ? 0 : 1 / s[l];
    for (long j = 0; j < n; j++) {
        #pragma omp simd
        for (long l = 0; l < LN; l++) Z[j * LN + l] *= s[l];
    }
}

static void sparsemax_fwd_lanes(const float* X, float* P, float* Z, long rows, long n) {
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], tau[LN], s[LN]; int dead[LN], k[LN], c[LN], done[LN];
        load_lanes(X, r0, L, n, Z);
        center_lanes(Z, n, 1.0f, m, dead);
        for (long l = 0; l < LN; l++) s[l] = 0;
        for (long j = 0; j < n; j++) {                 /* start: max(mean(z) - 1/n, -1), as the row kernel */
            #pragma omp simd
            for (long l = 0; l < LN; l++) { float z = Z[j * LN + l]; s[l] += z > -1e4f ? z : -1e4f; }
        }
        int left = 0;
        for (long l = 0; l < LN; l++) { tau[l] = (s[l] - 1) / n; tau[l] = tau[l] > -1 ? tau[l] : -1; k[l] = -1; done[l] = dead[l]; left += !done[l]; }
        for (long it = 0; it <= n && left; it++) {
            for (long l = 0; l < LN; l++) { s[l] = 0; c[l] = 0; }
            for (long j = 0; j < n; j++) {
                #pragma omp simd
                for (long l = 0; l < LN; l++) { float d = Z[j * LN + l] - tau[l]; s[l] += d > 0 ? d : 0; c[l] += d > 0; }
            }
            left = 0;
            for (long l = 0; l < LN; l++) {
                if (done[l]) continue;
                if (c[l] == k[l]) { done[l] = 1; continue; }
                k[l] = c[l]; tau[l] += (s[l] - 1) / c[l]; left++;
            }
        }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) { float d = Z[j * LN + l] - tau[l]; Z[j * LN + l] = dead[l] ? 0 : (d > 0 ? d : 0); }
        }
        store_lanes(P, r0, L, n, Z);
    }
}

static void entmax15_fwd_lanes(const float* X, float* P, float* Z, long rows, long n, long max_iter, float tol) {
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], tau[LN], s1[LN], s2[LN]; int dead[LN], done[LN];
        load_lanes(X, r0, L, n, Z);
        center_lanes(Z, n, 0.5f, m, dead);
        int left = 0;
        for (long l = 0; l < LN; l++) { tau[l] = -1; done[l] = dead[l]; left += !done[l]; }
        for (long it = 0; it < max_iter && left; it++) {
            for (long l = 0; l < LN; l++) { s1[l] = 0; s2[l] = 0; }
            for (long j = 0; j < n; j++) {
                #pragma omp simd
                for (long l = 0; l < LN; l++) { float d = Z[j * LN + l] - tau[l]; d = d > 0 ? d : 0; s1[l] += d; s2[l] += d * d; }
            }
            left = 0;
            for (long l = 0; l < LN; l++) {
                if (done[l]) continue;
                float step = (s2[l] - 1) / (2 * s1[l]);
                tau[l] += step;
                if (fabsf(step) <= tol) done[l] = 1; else left++;
            }
        }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) { float d = Z[j * LN + l] - tau[l]; d = d > 0 ? d : 0; Z[j * LN + l] = dead[l] ? 0 : d * d; }
        }
        normalise_lanes(Z, n, dead);
        store_lanes(P, r0, L, n, Z);
    }
}

/* learned-alpha entmax in lanes: the row kernel's Newton steps, 16 rows at a time with one alpha per lane. The two
   loops with exp/log are separate functions: inlined into the Newton loop, gcc does not vectorise them. */
__attribute__((noinline)) static void alpha_newton_sums(const float* Z, const float* tau, const float* bm1, float* s1, float* s2, long n) {
    for (long l = 0; l < LN; l++) { s1[l] = 0; s2[l] = 0; }
    for (long j = 0; j < n; j++) {
        #pragma omp simd
        for (long l = 0; l < LN; l++) {
            float d = Z[j * LN + l] - tau[l]; int on = d > 0;
            float dp = on ? exp_f(bm1[l] * log_f(on ? d : 1.0f)) : 0.0f;   /* d^(beta-1) */
            s1[l] += dp; s2[l] += dp * (on ? d : 0.0f);
        }
    }
}

__attribute__((noinline)) static void alpha_powers(float* Z, const float* tau, const float* beta, long n) {
    for (long j = 0; j < n; j++) {
        #pragma omp simd
        for (long l = 0; l < LN; l++) {
            float d = Z[j * LN + l] - tau[l]; int on = d > 0;
            Z[j * LN + l] = on ? exp_f(beta[l] * log_f(on ? d : 1.0f)) : 0.0f;   /* d^beta */
        }
    }
}

static void entmax_alpha_fwd_lanes(const float* X, float* P, const float* A, float* Z, long rows, long n, long max_iter, float tol) {
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], tau[LN], s1[LN], s2[LN], am1[LN], beta[LN], bm1[LN]; int dead[LN], done[LN];
        load_lanes(X, r0, L, n, Z);
        center_lanes(Z, n, 1.0f, m, dead);
        for (long l = 0; l < LN; l++) { am1[l] = A[r0 + (l < L ? l : L - 1)] - 1; beta[l] = 1 / am1[l]; bm1[l] = beta[l] - 1; }
        for (long j = 0; j < n; j++) {                 /* z = (x - max)(alpha - 1) <= 0, f(-1) >= 0 */
            #pragma omp simd
            for (long l = 0; l < LN; l++) Z[j * LN + l] *= am1[l];
        }
        int left = 0;
        for (long l = 0; l < LN; l++) { tau[l] = -1; done[l] = dead[l]; left += !done[l]; }
        for (long it = 0; it < max_iter && left; it++) {
            alpha_newton_sums(Z, tau, bm1, s1, s2, n);
            left = 0;
            for (long l = 0; l < LN; l++) {
                if (done[l]) continue;
                float step = (s2[l] - 1) / (beta[l] * s1[l]);
                tau[l] += step;
                if (fabsf(step) <= tol) done[l] = 1; else left++;
            }
        }
        for (long l = 0; l < LN; l++) if (dead[l]) tau[l] = INFINITY;          /* no key of a dead lane is on */
        alpha_powers(Z, tau, beta, n);
        normalise_lanes(Z, n, dead);
        store_lanes(P, r0, L, n, Z);
    }
}

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
/* the first split: the (1 - (k - 1/2) / nv) quantile of a normal with the row's mean and spread, the probit taken as
   0.6 times the logit (a guess, so a rough one serves: within 0.04 of the probit for shares from 0.1 to 0.9) */
static inline int32_t normal_split(int32_t lo, int32_t hi, float s1, float s2, int nv, int k, int32_t half) {
    float mean = s1 / nv, var = s2 / nv - mean * mean, sd = var > 0 ? sqrtf(var) : 0;
    float q = ((float)k - 0.5f) / (float)nv;                 /* the share above the split, in (0, 1) */
    float v = mean + 0.6f * log_f((1.0f - q) / q) * sd;
    if (!isfinite(v)) return half;
    int32_t m = value_key(v);
    return m > lo && m <= hi ? m : half;
}
/* where to split (lo, hi]: cl keys >= lo, ch keys > hi, the k-th largest wanted; `half` (key halving) the
   fallback */
static inline int32_t guess_split(int32_t lo, int32_t hi, int cl, int ch, int k, int32_t half) {
    float a = key_value(lo), b = key_value(hi);
    float t = cl - ch <= 1 ? 0.5f : ((float)(k - ch) - 0.5f) / (float)(cl - ch - 1);   /* share from the top */
    t = t < 0.0625f ? 0.0625f : (t > 0.9375f ? 0.9375f : t);
    float v = b - t * (b - a);
    if (!isfinite(v) || !isfinite(b - a)) return half;
    int32_t m = value_key(v);
    return m > lo && m <= hi ? m : half;
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
        if (n <= 32) {                                 /* short rows: the smallest value with fewer than k above it */
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
        for (long l = 0; l < LN; l++) { cl[l] = nv[l]; ch[l] = 0; }
        for (int it = 0; it < 33 + GUESS_STEPS; it++) {
            int open = 0;
            int32_t mid[LN], low[LN], high[LN];        /* the smallest key >= mid, the largest below it */
            #pragma omp simd reduction(+:open)
            for (long l = 0; l < LN; l++) {
                int32_t half = (int32_t)(lo[l] + ((int64_t)hi[l] - lo[l] + 1) / 2);
                int32_t guess = it == 0 ? normal_split(lo[l], hi[l], s1[l], s2[l], nv[l], k[l], half)
                                        : guess_split(lo[l], hi[l], cl[l], ch[l], k[l], half);
                mid[l] = it < GUESS_STEPS ? guess : half;
                c[l] = 0; low[l] = INT32_MAX; high[l] = INT32_MIN; open += lo[l] < hi[l];
            }
            if (!open) break;
            for (long j = 0; j < n; j++) {
                #pragma omp simd
                for (long l = 0; l < LN; l++) {
                    int32_t key = K[j * LN + l]; int above = key >= mid[l];
                    int32_t up = above ? key : INT32_MAX, down = above ? INT32_MIN : key;
                    c[l] += above; low[l] = up < low[l] ? up : low[l]; high[l] = down > high[l] ? down : high[l];
                }
            }
            for (long l = 0; l < LN; l++) {
                if (lo[l] >= hi[l]) continue;
                if (c[l] == k[l]) lo[l] = hi[l] = low[l];   /* exactly k keys >= mid: the smallest of them is the k-th */
                else if (c[l] > k[l]) { lo[l] = low[l]; cl[l] = c[l]; } else { hi[l] = high[l]; ch[l] = c[l]; }
            }
        }
        for (long l = 0; l < LN; l++) {
            if (n > 32) thr[l] = key_value(lo[l]);
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

/* ---- Entry points: rows or lanes, whichever measured faster for the row length (sparsemax in lanes loses at long
   rows; learned-alpha entmax in lanes only for short rows).
   W: scratch of 32 * (n + 16) floats. */
void sparsemax_fwd(const float* X, float* P, float* W, long rows, long n) {
    if (n <= 32) sparsemax_fwd_lanes(X, P, W, rows, n); else sparsemax_fwd_rows(X, P, rows, n);
}
void entmax15_fwd(const float* X, float* P, float* W, long rows, long n, long max_iter, float tol) {
    entmax15_fwd_lanes(X, P, W, rows, n, max_iter, tol);
}
void entmax_alpha_fwd(const float* X, float* P, const float* A, float* W, long rows, long n, long max_iter, float tol) {
    if (n <= 32) entmax_alpha_fwd_lanes(X, P, A, W, rows, n, max_iter, tol); else entmax_alpha_fwd_rows(X, P, A, W, rows, n, max_iter, tol);
}
void topk_softmax_fwd(const float* X, float* P, int32_t* BAD, float* W, long rows, long n, double ratio) {
    topk_softmax_fwd_lanes(X, P, BAD, W, rows, n, ratio);
}

/* Backward passes of short rows in lanes: W holds the p, g and output blocks. kind 0: sparsemax, 1: entmax-1.5
   (w = sqrt p), 2: softmax. */
static void bwd_lanes(int kind, const float* P, const float* G, float* DX, float* W, long rows, long n) {
    float *Zp = W, *Zg = W + n * LN;
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float a[LN], b[LN];
        load_lanes(P, r0, L, n, Zp); load_lanes(G, r0, L, n, Zg);
        for (long l = 0; l < LN; l++) { a[l] = 0; b[l] = 0; }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) {
                float p = Zp[j * LN + l], g = Zg[j * LN + l];
                float w = kind == 0 ? (float)(p > 0) : (kind == 1 ? (p > 0 ? sqrtf(p) : 0.0f) : p);
                Zp[j * LN + l] = w; a[l] += w * g; b[l] += w;
            }
        }
        for (long l = 0; l < LN; l++) a[l] = kind == 2 ? a[l] : (b[l] > 0 ? a[l] / b[l] : 0);   /* softmax: sum p = 1 */
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) Zp[j * LN + l] = Zp[j * LN + l] * (Zg[j * LN + l] - a[l]);
        }
        store_lanes(DX, r0, L, n, Zp);
    }
}

void sparsemax_bwd(const float* P, const float* G, float* DX, float* W, long rows, long n) {
    if (n <= 32) bwd_lanes(0, P, G, DX, W, rows, n); else sparsemax_bwd_rows(P, G, DX, rows, n);
}
void softmax_bwd(const float* P, const float* G, float* DX, float* W, long rows, long n) {
    if (n <= 32) bwd_lanes(2, P, G, DX, W, rows, n); else softmax_bwd_rows(P, G, DX, rows, n);
}
void entmax_bwd(const float* P, const float* G, float* DX, const float* A, float* DA, float* W, long rows, long n) {
    if (n <= 32 && !A) bwd_lanes(1, P, G, DX, W, rows, n); else entmax_bwd_rows(P, G, DX, A, DA, W, rows, n);
}

/* ---- Fused attention: scores -> normaliser -> weighted values, one (batch, head) at a time, inside the cache. --------
   The torch path sends the scores, the weights and their gradients through memory as [B, H, T, T] tensors and runs
   T x D x T products as tiny batched GEMMs. Here a head's T x T block lives in a scratch buffer (37 KB at T = 97)
   from the scores to the weighted values, and back in the backward. Only the weights P leave it (the backward needs
   them). The sums run in another order than torch's GEMMs, so results agree to float32 rounding, not bit for bit.
   QKV: [B, T, 3, H, D], the fused projection's output as it comes; O: [B, T, H, D]; P: [B, H, T, T].
   kind: 0 softmax, 1 sparsemax, 2 entmax-1.5, 3 alpha-entmax (ALPHA[h]), 4 top-k softmax (ratio). KM: [B, T] key
   mask (nonzero = valid) or NULL. Blocks lo..hi of the B x H (batch, head) pairs. W: scratch of attention_scratch(T, D)
   floats. The head size D is at most ATTENTION_MAX_HEAD. */
#define ATTENTION_MAX_HEAD 64
static void softmax_fwd_rows(const float* X, float* P, long rows, long n) {
    for (long r = 0; r < rows; r++) {
        const float* x = X + r * n; float* p = P + r * n;
        float m = row_max(x, n), s = 0;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < n; j++) { p[j] = exp_f(x[j] - m); s += p[j]; }
        float inv = 1 / s;
        #pragma omp simd
        for (long j = 0; j < n; j++) p[j] *= inv;
    }
}

static void softmax_fwd_lanes(const float* X, float* P, float* Z, long rows, long n) {
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN]; int dead[LN];
        load_lanes(X, r0, L, n, Z);
        center_lanes(Z, n, 1.0f, m, dead);
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) Z[j * LN + l] = exp_f(Z[j * LN + l]);
        }
        normalise_lanes(Z, n, dead);
        store_lanes(P, r0, L, n, Z);
    }
}

/* softmax's NaN rows: a NaN or +inf score, or no finite one, makes the whole row NaN (as _finish does) */
static void nan_bad_rows(const float* S, float* P, const int32_t* BAD, long rows, long n) {
    for (long r = 0; r < rows; r++) {
        const float* s = S + r * n; int bad;
        if (BAD) bad = BAD[r];
        else {
            int c = 0; float m = -INFINITY;
            #pragma omp simd reduction(+:c) reduction(max:m)
            for (long j = 0; j < n; j++) { c += !(s[j] < INFINITY); m = s[j] > m ? s[j] : m; }
            bad = c > 0 || !(m > -INFINITY);
        }
        if (bad) for (long j = 0; j < n; j++) P[r * n + j] = NAN;
    }
}

/* BT[d][j] = B[j][d] for j < n (rows of B b_stride apart), zero past n up to np = n rounded up to 16 */
static void cols_of(const float* B, long b_stride, float* BT, long n, long D) {
    long np = (n + 15) & ~15L;
    for (long d = 0; d < D; d++) {
        for (long j = 0; j < n; j++) BT[d * np + j] = B[j * b_stride + d];
        for (long j = n; j < np; j++) BT[d * np + j] = 0;
    }
}

/* C[i][j] = sum_d (scale A_i[d]) B_j[d] for i, j < T (C is T x T): rows A_i, B_j of D floats, sa and sb apart.
   B goes through the scratch BT transposed, so each product is a broadcast of A_i[d] times 16 keys. */
static void row_products(const float* A, long sa, const float* B, long sb, float scale, float* BT, float* C, long T, long D) {
    long np = (T + 15) & ~15L;
    cols_of(B, sb, BT, T, D);
#if defined(__AVX512F__)
    if (D == 16) {                                                /* four rows at a time share each load of BT */
        long i = 0;
        for (; i < T; i += 4) {
            long R = T - i < 4 ? T - i : 4;
            const float* a[4]; for (long r = 0; r < 4; r++) a[r] = A + (i + (r < R ? r : 0)) * sa;
            for (long j0 = 0; j0 < np; j0 += 16) {
                __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
                for (int d = 0; d < 16; d++) {
                    __m512 b = _mm512_loadu_ps(BT + d * np + j0);
                    c0 = _mm512_fmadd_ps(_mm512_set1_ps(a[0][d] * scale), b, c0);
                    c1 = _mm512_fmadd_ps(_mm512_set1_ps(a[1][d] * scale), b, c1);
                    c2 = _mm512_fmadd_ps(_mm512_set1_ps(a[2][d] * scale), b, c2);
                    c3 = _mm512_fmadd_ps(_mm512_set1_ps(a[3][d] * scale), b, c3);
                }
                __mmask16 m = T - j0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (T - j0)) - 1);
                __m512 c[4] = {c0, c1, c2, c3};
                for (long r = 0; r < R; r++) _mm512_mask_storeu_ps(C + (i + r) * T + j0, m, c[r]);
            }
        }
        return;
    }
#endif
    for (long i = 0; i < T; i++) {
        const float* a = A + i * sa; float* c = C + i * T;
        for (long j0 = 0; j0 < np; j0 += 16) {
            float acc[16] = {0};
            for (long d = 0; d < D; d++) {
                float ad = a[d] * scale;
                #pragma omp simd
                for (long l = 0; l < 16; l++) acc[l] += ad * BT[d * np + j0 + l];
            }
            long L = T - j0 < 16 ? T - j0 : 16;
            for (long l = 0; l < L; l++) c[j0 + l] = acc[l];
        }
    }
}

/* O_r = scale sum_j M(r, j) B_j for r, j < T, M(r, j) = M[r mr + j mj] (mr = T, mj = 1: M; mr = 1, mj = T: its
   transpose): rows B_j of D floats sb apart, rows O_r so apart. */
static void mix_rows(const float* M, long mr, long mj, const float* B, long sb, float scale, float* O, long so, long T, long D) {
#if defined(__AVX512F__)
    if (D == 16) {                                                /* four output rows at a time share each load of B_j */
        __m512 s = _mm512_set1_ps(scale);
        for (long r0 = 0; r0 < T; r0 += 4) {
            long R = T - r0 < 4 ? T - r0 : 4;
            const float* m[4]; for (long r = 0; r < 4; r++) m[r] = M + (r0 + (r < R ? r : 0)) * mr;
            __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
            for (long j = 0; j < T; j++) {
                __m512 b = _mm512_loadu_ps(B + j * sb);
                c0 = _mm512_fmadd_ps(_mm512_set1_ps(m[0][j * mj]), b, c0);
                c1 = _mm512_fmadd_ps(_mm512_set1_ps(m[1][j * mj]), b, c1);
                c2 = _mm512_fmadd_ps(_mm512_set1_ps(m[2][j * mj]), b, c2);
                c3 = _mm512_fmadd_ps(_mm512_set1_ps(m[3][j * mj]), b, c3);
            }
            __m512 c[4] = {c0, c1, c2, c3};
            for (long r = 0; r < R; r++) _mm512_storeu_ps(O + (r0 + r) * so, _mm512_mul_ps(c[r], s));
        }
        return;
    }
#endif
    for (long r = 0; r < T; r++) {
        float acc[ATTENTION_MAX_HEAD] = {0};
        for (long j = 0; j < T; j++) {
            float w = M[r * mr + j * mj]; const float* b = B + j * sb;
            #pragma omp simd
            for (long d = 0; d < D; d++) acc[d] += w * b[d];
        }
        for (long d = 0; d < D; d++) O[r * so + d] = acc[d] * scale;
    }
}

/* Short rows: the normaliser runs on the rows of 16 heads at once, so its 16-row lane blocks are full (17 rows of one
   head would fill one block and leave the next with a single row). */
#define ATTENTION_GROUP_MAX 16
#define ATTENTION_GROUP(T) ((T) <= 32 ? ATTENTION_GROUP_MAX : 1)

long attention_scratch(long T, long D) {
    long G = ATTENTION_GROUP(T);
    return 2 * G * T * T + (T + 16) * D + 32 * (T + 16) + 3 * G * T + 16;
}

void attention_fwd(const float* QKV, float* O, float* P, const float* ALPHA, const unsigned char* KM, float* W, long lo, long hi,
                   long T, long H, long D, float scale, long kind, double ratio, long max_iter, float tol) {
    long C3 = 3 * H * D, HD = H * D, np = (T + 15) & ~15L, G = ATTENTION_GROUP(T);
    float *S = W, *KT = S + G * T * T, *NW = KT + np * D, *A = NW + 32 * (T + 16);
    int32_t* BAD = (int32_t*)(A + G * T);
    for (long g0 = lo; g0 < hi; g0 += G) {                          /* G heads at a time: T G rows for the normaliser */
        long n = hi - g0 < G ? hi - g0 : G, rows = n * T;
        int empty[ATTENTION_GROUP_MAX];
        float* p = P + g0 * T * T;                                  /* the G heads' weights are contiguous */
        for (long k = 0; k < n; k++) {
            long b = (g0 + k) / H, h = (g0 + k) % H;
            const float* base = QKV + b * T * C3 + h * D;         /* query i at base + i C3, key at + HD, value at + 2 HD */
            float* s = S + k * T * T;
            row_products(base, C3, base + HD, C3, scale, KT, s, T, D);
            empty[k] = 0;
            if (KM) {                                              /* masked keys score -inf; no valid key: zero weights */
                const unsigned char* km = KM + b * T; long valid = 0;
                for (long j = 0; j < T; j++) valid += km[j] != 0;
                empty[k] = !valid;
                if (valid) for (long i = 0; i < T; i++) for (long j = 0; j < T; j++) if (!km[j]) s[i * T + j] = -INFINITY;
            }
            if (kind == 3) for (long i = 0; i < T; i++) A[k * T + i] = ALPHA[h];
        }
        switch (kind) {
            case 0: if (T <= 32) softmax_fwd_lanes(S, p, NW, rows, T); else softmax_fwd_rows(S, p, rows, T); break;
            case 1: sparsemax_fwd(S, p, NW, rows, T); break;
            case 2: entmax15_fwd(S, p, NW, rows, T, max_iter, tol); break;
            case 3: entmax_alpha_fwd(S, p, A, NW, rows, T, max_iter, tol); break;
            default: topk_softmax_fwd(S, p, BAD, NW, rows, T, ratio);
        }
        nan_bad_rows(S, p, kind == 4 ? BAD : 0, rows, T);
        for (long k = 0; k < n; k++) {
            long b = (g0 + k) / H, h = (g0 + k) % H;
            float* o = O + b * T * HD + h * D;
            if (empty[k]) {
                memset(p + k * T * T, 0, T * T * sizeof(float));
                for (long i = 0; i < T; i++) memset(o + i * HD, 0, D * sizeof(float));
                continue;
            }
            mix_rows(p + k * T * T, T, 1, QKV + b * T * C3 + h * D + 2 * HD, C3, 1.0f, o, HD, T, D);
        }
    }
}

/* dP = dO V^T; dS = the normaliser's backward; dV = P^T dO; dQ = scale dS K; dK = scale dS^T Q. DQKV like QKV.
   DALPHA (kind 3): d loss / d alpha of each (batch, head) block. */
void attention_bwd(const float* QKV, const float* P, const float* GO, float* DQKV, const float* ALPHA, float* DALPHA, float* W,
                   long lo, long hi, long T, long H, long D, float scale, long kind) {
    long C3 = 3 * H * D, HD = H * D, np = (T + 15) & ~15L, G = ATTENTION_GROUP(T);
    float *DS = W, *VT = DS + G * T * T, *DP = VT + np * D, *NW = DP + G * T * T, *A = NW + 32 * (T + 16), *DA = A + G * T;
    for (long g0 = lo; g0 < hi; g0 += G) {
        long n = hi - g0 < G ? hi - g0 : G, rows = n * T;
        const float* p = P + g0 * T * T;
        for (long k = 0; k < n; k++) {
            long b = (g0 + k) / H, h = (g0 + k) % H;
            row_products(GO + b * T * HD + h * D, HD, QKV + b * T * C3 + h * D + 2 * HD, C3, 1.0f, VT, DP + k * T * T, T, D);
            if (kind == 3) for (long i = 0; i < T; i++) A[k * T + i] = ALPHA[h];
        }
        switch (kind) {
            case 1: sparsemax_bwd(p, DP, DS, NW, rows, T); break;
            case 2: entmax_bwd(p, DP, DS, 0, 0, NW, rows, T); break;
            case 3: entmax_bwd(p, DP, DS, A, DALPHA ? DA : 0, NW, rows, T); break;
            default: softmax_bwd(p, DP, DS, NW, rows, T);
        }
        for (long k = 0; k < n; k++) {
            long b = (g0 + k) / H, h = (g0 + k) % H;
            const float* base = QKV + b * T * C3 + h * D; const float* go = GO + b * T * HD + h * D;
            float* dbase = DQKV + b * T * C3 + h * D;
            const float *pk = p + k * T * T, *ds = DS + k * T * T;
            if (kind == 3 && DALPHA) { float s = 0; for (long i = 0; i < T; i++) s += DA[k * T + i]; DALPHA[g0 + k] = s; }
            mix_rows(pk, 1, T, go, HD, 1.0f, dbase + 2 * HD, C3, T, D);          /* dV */
            mix_rows(ds, T, 1, base + HD, C3, scale, dbase, C3, T, D);          /* dQ */
            mix_rows(ds, 1, T, base, C3, scale, dbase + HD, C3, T, D);          /* dK */
        }
    }
}

/* Dropout masks from a counter-based generator: Philox4x64-10 (Salmon et al., SC 2011), bit for bit the stream of
   numpy.random.Philox(key=(k0, k1)) started at counter 0. Block b (counter b + 1, as numpy increments before it draws)
   gives four 64-bit words; each word is two 32-bit draws, low half first, so element i of the stream is half (i % 2) of
   word (i / 2) % 4 of block i / 8. Any element can be computed without the ones before it: chunks split freely. */
static inline uint64_t mulhilo64(uint64_t a, uint64_t b, uint64_t* hi) {
    __uint128_t p = (__uint128_t)a * b; *hi = (uint64_t)(p >> 64); return (uint64_t)p;
}

static inline void philox4x64_10(uint64_t b, uint64_t k0, uint64_t k1, uint32_t out[8]) {   /* block b */
    uint64_t c0 = b + 1, c1 = b + 1 == 0, c2 = 0, c3 = 0;   /* numpy's 256-bit counter, carry into the next word */
    for (int r = 0; r < 10; r++) {
        if (r) { k0 += 0x9E3779B97F4A7C15ULL; k1 += 0xBB67AE8584CAA73BULL; }
        uint64_t hi0, hi1;
        uint64_t lo0 = mulhilo64(0xD2E7470EE14C6C93ULL, c0, &hi0);
        uint64_t lo1 = mulhilo64(0xCA5A826395121157ULL, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    uint64_t w[4] = {c0, c1, c2, c3};
    for (int j = 0; j < 4; j++) { out[2 * j] = (uint32_t)w[j]; out[2 * j + 1] = (uint32_t)(w[j] >> 32); }
}

/* Elements [first, first + count) of the stream, block by block; `emit` writes element i from its 32-bit draw. */
#define PHILOX_FOR_EACH(emit) do {                                                                    \
    uint32_t u[8]; long end = first + count;                                                          \
    for (long b = first / 8; b * 8 < end; b++) {                                                      \
        philox4x64_10((uint64_t)b, (uint64_t)k0, (uint64_t)k1, u);                                   \
        long lo = b * 8 < first ? first : b * 8, hi = b * 8 + 8 > end ? end : b * 8 + 8;              \
        for (long i = lo; i < hi; i++) { uint32_t d = u[i - b * 8]; emit; }                           \
    } } while (0)

/* The 32-bit draws themselves (what the tests compare with numpy). */
void philox_bits(uint32_t* out, long first, long count, long k0, long k1) {
    PHILOX_FOR_EACH(out[i - first] = d);
}

/* Dropout mask over elements [first, first + count): `scale` where the draw is below `keep_below`, else 0. */
void philox_dropout(float* out, long first, long count, long k0, long k1, long keep_below, float scale) {
    PHILOX_FOR_EACH(out[i - first] = (long)d < keep_below ? scale : 0.0f);
}

/* Dropout masks bit for bit as torch draws them with `torch.empty(n).bernoulli_(p)` on a CPU where its element loop
   serves (its non-MKL path, as on this AMD machine; `bernoulli_mask` checks that it applies): element i takes the next two 32-bit words a, b of the
   generator's MT19937 stream (Matsumoto & Nishimura, 1998), u = ((a << 32 | b) & (2^53 - 1)) * 2^-53, and is `scale`
   where u < p, else 0. `state` is the generator's `get_state()` bytes (int64 seed, int32 left, int32 seeded,
   uint64 next, then the 624 state words as uint64), advanced in place: `set_state` afterwards leaves the generator
   where bernoulli_ would have. Torch draws word `next` after a twist when `left` counts down to 0; here `avail` =
   left - 1 words remain from `pos` = next. The stream is sequential, so one thread fills the whole mask. */
#define MT_N 624
#define MT_M 397

static inline uint32_t mt_mix(uint32_t a, uint32_t b, uint32_t m) {
    uint32_t y = (a & 0x80000000u) | (b & 0x7fffffffu);
    return m ^ (y >> 1) ^ (-(y & 1u) & 0x9908b0dfu);
}

static void mt_twist(uint32_t* s) {                                  /* the standard loop, split where it wraps */
    for (int i = 0; i < MT_N - MT_M; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M]);
    for (int i = MT_N - MT_M; i < MT_N - 1; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M - MT_N]);
    s[MT_N - 1] = mt_mix(s[MT_N - 1], s[0], s[MT_M - 1]);
}

static void mt_temper(const uint32_t* s, uint32_t* t) {
    for (int i = 0; i < MT_N; i++) {
        uint32_t y = s[i];
        y ^= y >> 11; y ^= (y << 7) & 0x9d2c5680u; y ^= (y << 15) & 0xefc60000u; y ^= y >> 18;
        t[i] = y;
    }
}

void mt_bernoulli(float* out, long count, unsigned char* state, double p, float scale) {
    int32_t left; uint64_t next, words[MT_N];
    memcpy(&left, state + 8, 4); memcpy(&next, state + 16, 8); memcpy(words, state + 24, sizeof words);
    uint32_t s[MT_N], t[MT_N];
    for (int i = 0; i < MT_N; i++) s[i] = (uint32_t)words[i];
    long pos = (long)next, avail = left - 1;
    mt_temper(s, t);
    const uint64_t mask53 = (1ULL << 53) - 1;
    for (long i = 0; i < count;) {
        if (avail == 0) { mt_twist(s); mt_temper(s, t); pos = 0; avail = MT_N; }
        if (avail >= 2) {                                            /* whole pairs inside this block */
            long pairs = avail / 2 < count - i ? avail / 2 : count - i;
            const uint32_t* w = t + pos;
            for (long j = 0; j < pairs; j++) {
                uint64_t v = (((uint64_t)w[2 * j] << 32) | w[2 * j + 1]) & mask53;
                out[i + j] = (double)v * 0x1p-53 < p ? scale : 0.0f;
            }
            pos += 2 * pairs; avail -= 2 * pairs; i += pairs;
        } else {                                                     /* a pair across a twist */
            uint32_t a = t[pos];
            mt_twist(s); mt_temper(s, t); pos = 1; avail = MT_N - 1;
            uint64_t v = (((uint64_t)a << 32) | t[0]) & mask53;
            out[i++] = (double)v * 0x1p-53 < p ? scale : 0.0f;
        }
    }
    left = (int32_t)(avail + 1); next = (uint64_t)pos;
    for (int i = 0; i < MT_N; i++) words[i] = s[i];
    memcpy(state + 8, &left, 4); memcpy(state + 16, &next, 8); memcpy(state + 24, words, sizeof words);
}
