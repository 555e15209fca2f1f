# %% [markdown]
# # Row kernels for the sparse normalizers
# > The hot loops of sparsemax, entmax-1.5, learned-α entmax and top-k softmax as small C functions, built on first use.

# %%
#| default_exp kernels

# %% [markdown]
# Every sparse normalizer here finds a per-row threshold $\tau$ by iterating over the row (Michelot for sparsemax,
# Newton for entmax). Written with torch operations, each iteration is several passes over the whole `[B, H, T, T]`
# tensor, with a temporary per pass: at $T = 97$ that is tens of megabytes streamed per iteration, and entmax-1.5 costs
# 10–40× a softmax. A row of at most a few hundred scores fits in the L1 cache, so the fast way is to run *all* the
# iterations of one row there, then move to the next row. That is what these kernels do: one plain C function per
# normalizer and direction, vectorised by the compiler (`#pragma omp simd`), compiled once with the system C compiler
# into a shared library that `ctypes` calls on the tensors' memory.
#
# * **Short rows** (≤ 32 keys — the 17 of the image datasets) are transposed and processed 16 at a time, one row per
#   vector lane: a row of 17 would otherwise be one vector plus one leftover element, with a horizontal sum at every
#   step. Learned-α entmax stays row by row (gcc does not vectorise its exp/log across lanes); instead its iterations
#   skip the keys that can no longer be in the support.
# * **Top-k** needs the k-th largest score of each row: by counting on short rows, by bisection on the scores' bits
#   mapped to order-preserving integers on long ones. No sort.
# * They handle **float32**, the training dtype (half precision is upcast to it by the normalizers). float64 and
#   non-CPU tensors take the torch path, which is what the float64 tests against the `entmax` package check.
# * `exp`/`log` are small branch-free polynomials (Cephes): libm's vector versions take a slow scalar path for the
#   zeros and $-\infty$ that masked or sparse rows are full of, and the compiler computes both sides of a select.
# * The math is the same as the torch path, step for step (same starting points, same stopping rules); the tests below
#   compare every kernel with it.
# * No compiler, a failed build or `SPARSE_REPRO_KERNELS=0` → the torch path, with one warning saying why.
#   `use_kernels(False)` switches them off for a block of code (benchmarks and tests compare both paths).

# %%
#| export
import ctypes, fcntl, hashlib, os, platform, shutil, subprocess, tempfile, warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
import torch

# %%
from fastcore.test import test_eq, test_close, test_fail

# %% [markdown]
# ## The C source

# %%
#| export
C_SOURCE = r"""
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
void entmax_alpha_fwd(const float* X, float* P, const float* A, float* ZB, long rows, long n, long max_iter, float tol) {
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

static void load_lanes(const float* X, long r0, long L, long n, float* Z) {
    for (long l = 0; l < LN; l++) {
        const float* x = X + (r0 + (l < L ? l : L - 1)) * n;
        for (long j = 0; j < n; j++) Z[j * LN + l] = x[j];
    }
}

static void store_lanes(float* P, long r0, long L, long n, const float* Z) {
    for (long l = 0; l < L; l++) {
        float* p = P + (r0 + l) * n;
        for (long j = 0; j < n; j++) p[j] = Z[j * LN + l];
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

/* top-k: per lane, the k-th largest by counting (short rows) or by bisection on order-preserving integer keys
   (32 steps at most, all lanes together) */
static void topk_softmax_fwd_lanes(const float* X, float* P, float* Z, long rows, long n, double ratio) {
    int32_t* K = (int32_t*)(Z + n * LN);               /* keys, [n][16], after the values */
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], thr[LN]; int32_t lo[LN], hi[LN]; int nv[LN], k[LN], c[LN], dead[LN];
        load_lanes(X, r0, L, n, Z);
        for (long l = 0; l < LN; l++) { m[l] = -INFINITY; nv[l] = 0; lo[l] = INT32_MAX; hi[l] = INT32_MIN; }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) {
                float v = Z[j * LN + l];
                m[l] = v > m[l] ? v : m[l]; nv[l] += v > -INFINITY;
                union { float f; int32_t i; } u = { v };
                int32_t key = u.i ^ ((u.i >> 31) & 0x7fffffff);
                K[j * LN + l] = key;
                lo[l] = key < lo[l] ? key : lo[l]; hi[l] = key > hi[l] ? key : hi[l];
            }
        }
        for (long l = 0; l < LN; l++) {
            dead[l] = nv[l] == 0;
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
        for (int it = 0; it < 33; it++) {              /* invariant: >= k keys >= lo, < k keys > hi */
            int open = 0;
            int32_t mid[LN];
            for (long l = 0; l < LN; l++) { mid[l] = (int32_t)(lo[l] + ((int64_t)hi[l] - lo[l] + 1) / 2); c[l] = 0; open += lo[l] < hi[l]; }
            if (!open) break;
            for (long j = 0; j < n; j++) {
                #pragma omp simd
                for (long l = 0; l < LN; l++) c[l] += K[j * LN + l] >= mid[l];
            }
            for (long l = 0; l < LN; l++) {
                if (lo[l] >= hi[l]) continue;
                if (c[l] >= k[l]) lo[l] = mid[l]; else hi[l] = mid[l] - 1;
            }
        }
        for (long l = 0; l < LN; l++) {
            if (n > 32) { union { int32_t i; float f; } u = { lo[l] ^ ((lo[l] >> 31) & 0x7fffffff) }; thr[l] = u.f; }
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
   rows; learned-alpha entmax stays in rows: the compiler does not vectorise its exp/log across lanes).
   W: scratch of 32 * (n + 16) floats. */
void sparsemax_fwd(const float* X, float* P, float* W, long rows, long n) {
    if (n <= 32) sparsemax_fwd_lanes(X, P, W, rows, n); else sparsemax_fwd_rows(X, P, rows, n);
}
void entmax15_fwd(const float* X, float* P, float* W, long rows, long n, long max_iter, float tol) {
    entmax15_fwd_lanes(X, P, W, rows, n, max_iter, tol);
}
void topk_softmax_fwd(const float* X, float* P, float* W, long rows, long n, double ratio) {
    topk_softmax_fwd_lanes(X, P, W, rows, n, ratio);
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
"""

# %% [markdown]
# ## Building and loading
#
# The library is compiled with `-O3 -march=native` into the cache folder (`$SPARSE_REPRO_CACHE`, else
# `~/.cache/sparse_attention_repro`) under a name that hashes the source, the flags and the machine's CPU flags, so an
# edited kernel or another CPU gets its own build. Processes started together (the grid's notebooks) take turns on a
# lock file, so one compiles and the others load its result; the build writes a temporary file and renames it, so no
# process ever loads a half-written library. A cache folder that cannot be written is reported in one warning naming
# `SPARSE_REPRO_CACHE`, and the torch path is used.

# %%
#| export
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC"]
_SIGNATURES = {  # name: argument types (P = pointer, L = long, F = float, D = double)
    "sparsemax_fwd": "PPPLL", "sparsemax_bwd": "PPPPLL", "entmax15_fwd": "PPPLLLF", "entmax_alpha_fwd": "PPPPLLLF",
    "entmax_bwd": "PPPPPPLL", "topk_softmax_fwd": "PPPLLD", "softmax_bwd": "PPPPLL"}
_CTYPES = {"P": ctypes.c_void_p, "L": ctypes.c_long, "F": ctypes.c_float, "D": ctypes.c_double}
_state = {"lib": None, "tried": False, "enabled": True, "calls": 0}

def _cpu_tag():
    try: flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags"))
    except (OSError, StopIteration): flags = platform.processor()
    return hashlib.sha256((platform.machine() + flags).encode()).hexdigest()[:8]

def kernel_dir(cache_dir=None) -> Path:
    "Where built kernels live: `cache_dir`, else `$SPARSE_REPRO_CACHE`, else `~/.cache/sparse_attention_repro`; then `kernels/`."
    d = cache_dir or os.environ.get("SPARSE_REPRO_CACHE") or Path.home() / ".cache" / "sparse_attention_repro"
    return Path(d).expanduser() / "kernels"

def build_kernels(cache_dir=None) -> Path:
    "Compile `C_SOURCE` (if not already built for this source, these flags and this CPU); returns the library's path."
    tag = hashlib.sha256((C_SOURCE + " ".join(CFLAGS)).encode()).hexdigest()[:12]
    out = kernel_dir(cache_dir) / f"normalizers-{tag}-{_cpu_tag()}.so"
    if out.exists(): return out
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which(cc): raise RuntimeError(f"no C compiler found ({cc or 'cc, gcc'}; install gcc or set CC)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        lock = open(out.with_suffix(".lock"), "w")
    except OSError as e:
        raise RuntimeError(f"the kernel cache {out.parent} is not writable ({e.strerror}); set SPARSE_REPRO_CACHE to a writable folder") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)                         # one builder at a time; the others wait, then load
        if out.exists(): return out
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src, lib = Path(tmp) / "normalizers.c", Path(tmp) / "normalizers.so"
            src.write_text(C_SOURCE)
            r = subprocess.run([cc, *CFLAGS, str(src), "-o", str(lib), "-lm"], capture_output=True, text=True)
            if r.returncode: raise RuntimeError(f"{cc} failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            os.replace(lib, out)
    return out

def kernels():
    "The loaded kernel library, or None (disabled, or the build failed — warned once)."
    if not _state["enabled"] or os.environ.get("SPARSE_REPRO_KERNELS", "1") == "0": return None
    if not _state["tried"]:
        _state["tried"] = True
        try:
            lib = ctypes.CDLL(str(build_kernels()))
            for name, sig in _SIGNATURES.items(): getattr(lib, name).argtypes = [_CTYPES[c] for c in sig]
            _state["lib"] = lib
        except Exception as e:
            warnings.warn(f"sparse_attention_repro: C kernels unavailable ({e}); using the slower torch path")
    return _state["lib"]

@contextmanager
def use_kernels(on: bool = True):
    "Switch the C kernels on or off inside a `with` block."
    old = _state["enabled"]; _state["enabled"] = on
    try: yield
    finally: _state["enabled"] = old

def usable(x) -> bool:
    "Can the kernels handle tensor `x`? (float32 on the CPU, kernels available and enabled)"
    return x.dtype == torch.float32 and x.device.type == "cpu" and kernels() is not None


# %% [markdown]
# ## Calling a kernel
#
# `_run` calls one kernel on the rows of contiguous `[..., T]` tensors. With more than one torch thread and enough
# work, the rows are split into one chunk per thread: `ctypes` releases the GIL, so the chunks run in parallel.

# %%
#| export
_pool = {}

def _run(name, row_tensors, rows, n, *scalars, per_row=(), scratch=False):
    "Call kernel `name` on `row_tensors` (`[rows, n]`) and `per_row` tensors (`[rows]`, None allowed), chunked over threads."
    fn = getattr(kernels(), name)
    _state["calls"] += 1
    threads = torch.get_num_threads() if rows * n >= 1 << 16 else 1
    bounds = [rows * i // threads for i in range(threads + 1)]
    def call(lo, hi):
        if hi <= lo: return
        ptrs = [t.data_ptr() + lo * n * 4 for t in row_tensors]
        ptrs += [None if t is None else t.data_ptr() + lo * 4 for t in per_row]
        buf = torch.empty(32 * (n + 16), dtype=torch.float32) if scratch else None   # scratch: a row, or a 16-row block
        fn(*ptrs, *([buf.data_ptr()] if scratch else []), hi - lo, n, *scalars)
    if threads == 1: call(0, rows); return
    if threads not in _pool: _pool[threads] = ThreadPoolExecutor(threads)
    list(_pool[threads].map(lambda i: call(bounds[i], bounds[i + 1]), range(threads)))


# %% [markdown]
# ## The kernels, one wrapper each
#
# Each takes contiguous float32 tensors whose last dimension is the key axis; `alpha_rows` holds one $\alpha$ per row
# (shape `[..., 1]`). The autograd functions in `normalizers` call these when `usable(scores)`.

# %%
#| export
_TOL = 4 * torch.finfo(torch.float32).eps       # Newton stops at a few ulps, as the torch path does

def _rows(x): return x.numel() // x.shape[-1], x.shape[-1]

def sparsemax_fwd(x):
    "Sparsemax of every row of `x` (Michelot's algorithm, exact)."
    x = x.contiguous(); p = torch.empty_like(x); _run("sparsemax_fwd", [x, p], *_rows(x), scratch=True); return p

def sparsemax_bwd(p, g):
    "Gradient of sparsemax: `g` minus its mean over the support, 0 off the support."
    p, g = p.contiguous(), g.contiguous(); dx = torch.empty_like(p); _run("sparsemax_bwd", [p, g, dx], *_rows(p), scratch=True); return dx

def entmax15_fwd(x, max_iter=50):
    "1.5-entmax of every row of `x` (Newton from the left)."
    x = x.contiguous(); p = torch.empty_like(x); _run("entmax15_fwd", [x, p], *_rows(x), max_iter, _TOL, scratch=True); return p

def entmax_alpha_fwd(x, alpha_rows, max_iter=30):
    "alpha-entmax of every row of `x`, with `alpha_rows[..., 0]` the alpha of each row."
    x = x.contiguous(); p = torch.empty_like(x)
    _run("entmax_alpha_fwd", [x, p], *_rows(x), max_iter, _TOL, per_row=[alpha_rows.contiguous()], scratch=True); return p

def entmax_bwd(p, g, alpha_rows=None, d_alpha=False):
    "Gradient of alpha-entmax (alpha 1.5 when `alpha_rows` is None) and, if `d_alpha`, d loss / d alpha per row `[..., 1]`."
    p, g = p.contiguous(), g.contiguous(); dx = torch.empty_like(p)
    da = torch.empty(p.shape[:-1] + (1,), dtype=torch.float32) if d_alpha else None
    _run("entmax_bwd", [p, g, dx], *_rows(p), per_row=[None if alpha_rows is None else alpha_rows.contiguous(), da],
         scratch=True)
    return dx, da

def topk_softmax_fwd(x, ratio):
    "Softmax over the keys scoring at least the k-th largest of each row, k = max(1, ceil(ratio * valid keys))."
    x = x.contiguous(); p = torch.empty_like(x); _run("topk_softmax_fwd", [x, p], *_rows(x), float(ratio), scratch=True); return p

def softmax_bwd(p, g):
    "Gradient of softmax: p * (g - <p, g>)."
    p, g = p.contiguous(), g.contiguous(); dx = torch.empty_like(p); _run("softmax_bwd", [p, g, dx], *_rows(p), scratch=True); return dx


# %% [markdown]
# ## Tests: every kernel against the torch path
#
# The torch implementations in `normalizers` are checked against the `entmax` package and finite differences there.
# Here each kernel must reproduce them in float32 — values and gradients, for rows with masked keys ($-\infty$), ties,
# huge logits, a single valid key, rows longer than 32 (top-k's other selection algorithm) and several threads.

# %%
from sparse_attention_repro import normalizers as N, kernels as KM   # the normalizers call the *module's* kernels
HAVE_KERNELS = KM.kernels() is not None
if not HAVE_KERNELS:                         # no compiler: the torch path serves; under CI the kernels must build
    if os.environ.get("CI"): raise RuntimeError("the C kernels did not build here (under CI they must)")
    print("SKIPPED kernel-vs-torch checks: the C kernels did not build here (no C compiler?); the torch path is in use")

if HAVE_KERNELS:
    def _both(fn, *args):
        "fn(*args) and its gradients, with the kernels and with the torch path."
        out = []
        for on in (True, False):
            with KM.use_kernels(on):
                leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
                y = fn(*leaves); y.backward(_g[:y.numel()].view_as(y))
                out.append((y.detach(), [l.grad for l in leaves if l.requires_grad]))
        return out

    torch.manual_seed(0)
    _g = torch.randn(10**6)
    def _scores(shape, scale=3.0):
        s = torch.randn(shape) * scale
        s[..., 0, 3] = float("-inf"); s[..., 1, :] = 2.0                                # a masked key, an all-tie row
        s[..., 2, 4:] = float("-inf")                                                   # a row with 4 valid keys
        s[..., 3, :] = s[..., 3, :] * 1e4                                               # huge logits
        return s

    for shape in [(4, 3, 9, 17), (2, 4, 6, 97), (1, 2, 4, 200)]:
        s = _scores(shape).requires_grad_()
        a = (1.05 + 0.9 * torch.rand(shape[1])).view(-1, 1, 1).requires_grad_()
        cases = {"sparsemax": lambda s: N.sparsemax(s), "entmax15": lambda s: N.entmax15(s),
                 "entmax_alpha": lambda s, a: N.entmax_alpha(s, a),
                 **{f"topk_{r}": (lambda r: lambda s: N.topk_softmax(s, r))(r) for r in (0.1, 0.125, 0.25, 0.5, 1.0)}}
        for name, fn in cases.items():
            args = (s, a) if name == "entmax_alpha" else (s,)
            (yk, gk), (yt, gt) = _both(fn, *args)
            test_close(yk, yt, eps=2e-6)
            assert ((yk > 0) == (yt > 0)).float().mean() > 0.999, name                  # same support
            for u, v in zip(gk, gt): test_close(u, v, eps=2e-4 * max(1.0, float(v.abs().max())))

# %% [markdown]
# Threads: the chunked call gives the same result as one call. And the normalizers really dispatch to the kernels for
# float32 — forward and backward — but not for float64 or inside `use_kernels(False)`.

# %%
if HAVE_KERNELS:
    x = torch.randn(96, 4, 97, 97)
    old = torch.get_num_threads()
    torch.set_num_threads(1); one = entmax15_fwd(x)
    torch.set_num_threads(2); two = entmax15_fwd(x)
    torch.set_num_threads(old)
    test_eq(one, two)
    def _calls(f):
        before = KM._state["calls"]; f(); return KM._state["calls"] - before
    xs = x[:2].clone().requires_grad_()
    test_eq(_calls(lambda: N.entmax15(xs).sum().backward()), 2)
    with KM.use_kernels(False): test_eq(_calls(lambda: N.entmax15(xs).sum().backward()), 0)
    test_eq(_calls(lambda: N.sparsemax(x[:2].double())), 0)
    assert not usable(x.double()) and usable(x)

# %% [markdown]
# The kernels allocate in float32 whatever torch's default dtype is, and gradients come back in the scores' dtype:

# %%
if HAVE_KERNELS:
    _dd = torch.get_default_dtype(); torch.set_default_dtype(torch.float64)
    try:
        xa = torch.randn(2, 4, 6, 17, dtype=torch.float32).requires_grad_()
        al = torch.tensor([1.2, 1.5, 1.7, 1.9], dtype=torch.float32).view(4, 1, 1).requires_grad_()
        y = N.entmax_alpha(xa, al); y.pow(2).sum().backward()
        test_eq((y.dtype, xa.grad.dtype, al.grad.dtype), (torch.float32,) * 3)
        with KM.use_kernels(False):
            xb, ab = xa.detach().clone().requires_grad_(), al.detach().clone().requires_grad_()
            N.entmax_alpha(xb, ab).pow(2).sum().backward()
        test_close(al.grad, ab.grad, eps=1e-4); test_close(xa.grad, xb.grad, eps=1e-4)
    finally: torch.set_default_dtype(_dd)

# %% [markdown]
# **Fallbacks.** Without a C compiler, or with a cache folder that cannot be written, the library warns once (naming the
# cause, and `SPARSE_REPRO_CACHE` for the folder) and every normalizer runs on the torch path with the same results.
# Each case runs in a fresh process, as a user would meet it.

# %%
import subprocess, sys, textwrap
probe = textwrap.dedent("""
    import warnings, torch, entmax
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        from sparse_attention_repro import normalizers as N, kernels as K
        x = torch.randn(8, 4, 17, 17)
        assert torch.allclose(N.sparsemax(x), entmax.sparsemax(x, dim=-1), atol=1e-5)
        assert not K.usable(x) and K._state["calls"] == 0
    print([str(m.message) for m in w if "C kernels unavailable" in str(m.message)])
""")
def _fresh(**env):
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env={**os.environ, **env})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout
with tempfile.TemporaryDirectory() as d:
    out = _fresh(CC="/nonexistent/cc", SPARSE_REPRO_CACHE=d)
    assert "no C compiler found" in out and out.count("C kernels unavailable") == 1, out
    if HAVE_KERNELS:                                  # (without a compiler the build stops before the cache is touched)
        ro = Path(d) / "readonly"; ro.mkdir(); ro.chmod(0o555)
        writable = os.access(ro, os.W_OK)             # root writes anywhere: then a file where the folder should be
        blocker = ro if not writable else Path(d) / "file"
        if writable: blocker.write_text("not a folder")
        out = _fresh(SPARSE_REPRO_CACHE=str(blocker))
        assert "not writable" in out and "SPARSE_REPRO_CACHE" in out, out
        ro.chmod(0o755)
