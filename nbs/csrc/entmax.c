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

/* Entry points: entmax-1.5 always in lanes; learned-alpha entmax in lanes only for short rows. */
void entmax15_fwd(const float* X, float* P, float* W, long rows, long n, long max_iter, float tol) {
    entmax15_fwd_lanes(X, P, W, rows, n, max_iter, tol);
}
void entmax_alpha_fwd(const float* X, float* P, const float* A, float* W, long rows, long n, long max_iter, float tol) {
    if (n <= SHORT_ROW) entmax_alpha_fwd_lanes(X, P, A, W, rows, n, max_iter, tol); else entmax_alpha_fwd_rows(X, P, A, W, rows, n, max_iter, tol);
}
void entmax_bwd(const float* P, const float* G, float* DX, const float* A, float* DA, float* W, long rows, long n) {
    if (n <= SHORT_ROW && !A) weighted_bwd_lanes(KIND_ENTMAX15, P, G, DX, W, rows, n); else entmax_bwd_rows(P, G, DX, A, DA, W, rows, n);
}
