/* alpha-entmax (Peters et al., 2019): p = max((alpha - 1) z - tau, 0)^(1 / (alpha - 1)); entmax-1.5 (alpha = 1.5), and
   one learned alpha per row (the adaptive entmax of Correia et al., 2019). */

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

/* The learned-alpha backward of short rows in lanes, W holding the p, g, w and p log p blocks ([n][16] each). Its sums
   are the row kernel's bit for bit: that kernel's vector loop keeps 16 column sums (key j in column j mod 16, whole
   vectors only), adds the keys past the last whole vector to column 0, then adds the columns in order to 0; here each
   lane makes the same sums in the same order for its row. */
static inline void column_sums(const float* Z, long n, float* s) {
    long nb = n / 16;
    for (long l = 0; l < LN; l++) s[l] = 0;
    for (long col = 0; col < 16; col++) {
        float acc[LN];
        for (long l = 0; l < LN; l++) acc[l] = 0;
        for (long b = 0; b < nb; b++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) acc[l] += Z[(16 * b + col) * LN + l];
        }
        if (col == 0) for (long j = nb * 16; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) acc[l] += Z[j * LN + l];
        }
        #pragma omp simd
        for (long l = 0; l < LN; l++) s[l] += acc[l];
    }
}

/* acc += w * g rounded twice, as the row kernel's scalar tail adds its products (its vector loop fuses them) */
__attribute__((noinline, optimize("fp-contract=off"))) static void add_products_unfused(float* acc, const float* w, const float* g) {
    for (long l = 0; l < LN; l++) acc[l] += w[l] * g[l];
}

/* log p of the keys past a row's last whole vector, as the row kernel's scalar tail computes it: the same steps as
   log_f, but its last line rounds 0.693359375 e on its own before adding it (the vector code fuses that multiply-add).
   Built without contraction, with the fused steps written as fmaf. */
__attribute__((noinline, optimize("fp-contract=off"))) static void log_tail_lanes(const float* Z, float* lp) {
    for (long l = 0; l < LN; l++) {
        float x = Z[l] > 0 ? Z[l] : 1.0f;
        union { float f; int32_t i; } u = { x };
        float e = (float)(((u.i >> 23) & 0xff) - 126);
        u.i = (u.i & 0x007fffff) | 0x3f000000;
        float m = u.f;
        int small = m < 0.707106781186547524f;
        e -= (float)small;
        m = small ? fmaf(m, 2.0f, -1.0f) : m - 1.0f;
        float z = m * m;
        float y = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(7.0376836292E-2f, m, -1.1514610310E-1f), m, 1.1676998740E-1f), m,
                  -1.2420140846E-1f), m, 1.4249322787E-1f), m, -1.6668057665E-1f), m, 2.0000714765E-1f), m, -2.4999993993E-1f), m,
                  3.3333331174E-1f);
        y = fmaf(y * m, z, -2.12194440e-4f * e);
        y = fmaf(z, -0.5f, y);
        lp[l] = (m + y) + 0.693359375f * e;
    }
}

static void entmax_alpha_bwd_lanes(const float* P, const float* G, float* DX, const float* A, float* DA, float* W, long rows, long n) {
    float *Zp = W, *Zg = W + n * LN, *Zw = W + 2 * n * LN, *Zl = W + 3 * n * LN;
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float a[LN], e[LN], sw[LN], swg[LN], ent[LN], q[LN];
        load_lanes(P, r0, L, n, Zp); load_lanes(G, r0, L, n, Zg);
        for (long l = 0; l < LN; l++) { a[l] = A[r0 + (l < L ? l : L - 1)]; e[l] = 2 - a[l]; }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) {
                float p = Zp[j * LN + l]; int on = p > 0;
                float lp = log_f(on ? p : 1.0f);
                Zw[j * LN + l] = on ? exp_f(e[l] * lp) : 0.0f; Zl[j * LN + l] = on ? p * lp : 0.0f;
            }
        }
        for (long j = n / 16 * 16; j < n; j++) {       /* the keys past the last whole vector: the scalar tail's log */
            float lp[LN];
            log_tail_lanes(Zp + j * LN, lp);
            #pragma omp simd
            for (long l = 0; l < LN; l++) {
                float p = Zp[j * LN + l]; int on = p > 0;
                Zw[j * LN + l] = on ? exp_f(e[l] * lp[l]) : 0.0f; Zl[j * LN + l] = on ? p * lp[l] : 0.0f;
            }
        }
        column_sums(Zw, n, sw); column_sums(Zl, n, ent);
        {   /* swg: the products w g, summed as the row kernel sums them (acc += w * g) */
            long nb = n / 16;
            for (long l = 0; l < LN; l++) swg[l] = 0;
            for (long col = 0; col < 16; col++) {
                float acc[LN];
                for (long l = 0; l < LN; l++) acc[l] = 0;
                for (long b = 0; b < nb; b++) {
                    #pragma omp simd
                    for (long l = 0; l < LN; l++) acc[l] += Zw[(16 * b + col) * LN + l] * Zg[(16 * b + col) * LN + l];
                }
                if (col == 0) for (long j = nb * 16; j < n; j++) add_products_unfused(acc, Zw + j * LN, Zg + j * LN);
                #pragma omp simd
                for (long l = 0; l < LN; l++) swg[l] += acc[l];
            }
        }
        for (long l = 0; l < LN; l++) q[l] = sw[l] > 0 ? swg[l] / sw[l] : 0;
        if (DA) {
            float am1[LN], isw[LN], da[LN];
            long nb = n / 16;
            for (long l = 0; l < LN; l++) { am1[l] = a[l] - 1; isw[l] = sw[l] > 0 ? 1 / sw[l] : 0; da[l] = 0; }
            for (long col = 0; col < 16; col++) {
                float acc[LN];
                for (long l = 0; l < LN; l++) acc[l] = 0;
                for (long b = 0; b <= nb; b++) {
                    long j0 = b < nb ? 16 * b + col : (col == 0 ? 16 * nb : n), j1 = b < nb ? j0 + 1 : n;
                    for (long j = j0; j < j1; j++) {
                        #pragma omp simd
                        for (long l = 0; l < LN; l++) {
                            float skew = Zw[j * LN + l] * isw[l];
                            acc[l] += Zg[j * LN + l] * ((Zp[j * LN + l] - skew) / (am1[l] * am1[l]) - (Zl[j * LN + l] - skew * ent[l]) / am1[l]);
                        }
                    }
                }
                #pragma omp simd
                for (long l = 0; l < LN; l++) da[l] += acc[l];
            }
            for (long l = 0; l < L; l++) DA[r0 + l] = da[l];
        }
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) Zw[j * LN + l] = Zw[j * LN + l] * (Zg[j * LN + l] - q[l]);
        }
        store_lanes(DX, r0, L, n, Zw);
    }
}

static void entmax15_fwd_lanes(const float* X, float* P, int32_t* BAD, float* Z, long rows, long n, long max_iter, float tol) {
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], tau[LN], s1[LN], s2[LN]; int dead[LN], done[LN], odd[LN];
        load_lanes(X, r0, L, n, Z);
        center_lanes(Z, n, 0.5f, m, dead, BAD ? odd : 0);
        if (BAD) for (long l = 0; l < L; l++) BAD[r0 + l] = odd[l] || dead[l];
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
        center_lanes(Z, n, 1.0f, m, dead, 0);
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

/* Entry points: entmax-1.5 always in lanes; learned-alpha entmax in lanes only for short rows. */
/* BAD (may be NULL): per row, 1 where the scores hold a NaN or +inf or no finite value (softmax's NaN rows). */
void entmax15_fwd(const float* X, float* P, int32_t* BAD, float* W, long rows, long n, long max_iter, float tol) {
    entmax15_fwd_lanes(X, P, BAD, W, rows, n, max_iter, tol);
}
/* BAD (may be NULL): per row, 1 where the scores hold a NaN or +inf or no finite value (softmax's NaN rows, which the
   caller makes NaN), found 64 rows ahead of the kernel, while they are in the cache. */
void entmax_alpha_fwd(const float* X, float* P, const float* A, int32_t* BAD, float* W, long rows, long n, long max_iter, float tol) {
    for (long r0 = 0; r0 < rows; r0 += 64) {
        long R = rows - r0 < 64 ? rows - r0 : 64;
        if (BAD) for (long r = r0; r < r0 + R; r++) {
            const float* x = X + r * n; int nan_inf = 0, finite = 0;
            #pragma omp simd reduction(|:nan_inf, finite)
            for (long j = 0; j < n; j++) { nan_inf |= x[j] != x[j] || x[j] == INFINITY; finite |= x[j] > -INFINITY; }
            BAD[r] = nan_inf || !finite;
        }
        if (n <= SHORT_ROW) entmax_alpha_fwd_lanes(X + r0 * n, P + r0 * n, A + r0, W, R, n, max_iter, tol);
        else entmax_alpha_fwd_rows(X + r0 * n, P + r0 * n, A + r0, W, R, n, max_iter, tol);
    }
}
void entmax_bwd(const float* P, const float* G, float* DX, const float* A, float* DA, float* W, long rows, long n) {
    if (n <= SHORT_ROW && !A) weighted_bwd_lanes(KIND_ENTMAX15, P, G, DX, W, rows, n);
    else if (n <= SHORT_ROW) entmax_alpha_bwd_lanes(P, G, DX, A, DA, W, rows, n);
    else entmax_bwd_rows(P, G, DX, A, DA, W, rows, n);
}
