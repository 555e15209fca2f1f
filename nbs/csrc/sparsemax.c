/* Sparsemax (Martins & Astudillo, 2016): the Euclidean projection onto the simplex, p = max(z - tau, 0). */

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

static void sparsemax_fwd_lanes(const float* X, float* P, float* Z, long rows, long n) {
    for (long r0 = 0; r0 < rows; r0 += LN) {
        long L = rows - r0 < LN ? rows - r0 : LN;
        float m[LN], tau[LN], s[LN]; int dead[LN], k[LN], c[LN], done[LN];
        load_lanes(X, r0, L, n, Z);
        center_lanes(Z, n, 1.0f, m, dead, 0);
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

/* Entry points: lanes for short rows (sparsemax in lanes loses at long rows). */
void sparsemax_fwd(const float* X, float* P, float* W, long rows, long n) {
    if (n <= SHORT_ROW) sparsemax_fwd_lanes(X, P, W, rows, n); else sparsemax_fwd_rows(X, P, rows, n);
}
void sparsemax_bwd(const float* P, const float* G, float* DX, float* W, long rows, long n) {
    if (n <= SHORT_ROW) weighted_bwd_lanes(KIND_SPARSEMAX, P, G, DX, W, rows, n); else sparsemax_bwd_rows(P, G, DX, rows, n);
}
