/* Softmax: the dense baseline, forward (used by the fused attention) and backward. */

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
        center_lanes(Z, n, 1.0f, m, dead, 0);
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) Z[j * LN + l] = exp_f(Z[j * LN + l]);
        }
        normalise_lanes(Z, n, dead);
        store_lanes(P, r0, L, n, Z);
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

void softmax_fwd(const float* X, float* P, float* W, long rows, long n) {
    if (n <= SHORT_ROW) softmax_fwd_lanes(X, P, W, rows, n); else softmax_fwd_rows(X, P, rows, n);
}
void softmax_bwd(const float* P, const float* G, float* DX, float* W, long rows, long n) {
    if (n <= SHORT_ROW) weighted_bwd_lanes(KIND_SOFTMAX, P, G, DX, W, rows, n); else softmax_bwd_rows(P, G, DX, rows, n);
}
