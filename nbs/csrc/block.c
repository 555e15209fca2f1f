/* The elementwise parts of the post-norm encoder block, the llm.c way: one function per layer and direction.
   x = LN(x + drop(attention(x))); x = LN(x + drop(W2 drop(GELU(W1 x)))): the residual sum, its dropout and the
   LayerNorm in one pass over each row, and GELU with the dropout after it in another. The matrix products stay in
   torch (its BLAS is at the machine's arithmetic floor at these sizes); the attention core is attention.c. */

/* Phi(x), the standard normal CDF, through erfc(z) = t exp(-z^2 - 1.26551223 + t P(t)), t = 1 / (1 + z/2), z >= 0
   (Numerical Recipes' Chebyshev fit, relative error below 1.2e-7 everywhere), with the Gaussian factor exp(-x^2/2)
   kept apart so the backward reuses it. */
#pragma omp declare simd notinbranch
static inline float gauss_cdf(float x, float gauss) {
    float z = fabsf(x) * 0.70710678118654752f, t = 1.0f / (1.0f + 0.5f * z);
    float poly = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f
                 + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
    float half_erfc = 0.5f * t * gauss * exp_f(poly);                 /* exp(-z^2) = exp(-x^2 / 2) = gauss */
    return x >= 0 ? 1.0f - half_erfc : half_erfc;
}

/* Y = GELU(X) * M (exact GELU, x Phi(x)); M NULL: no dropout. */
void gelu_dropout_fwd(const float* X, const float* M, float* Y, long n) {
    #pragma omp simd
    for (long i = 0; i < n; i++) {
        float x = X[i], g = exp_f(-0.5f * x * x);
        Y[i] = x * gauss_cdf(x, g) * (M ? M[i] : 1.0f);
    }
}

/* DX = G * M * GELU'(X), GELU'(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi). */
void gelu_dropout_bwd(const float* X, const float* M, const float* G, float* DX, long n) {
    #pragma omp simd
    for (long i = 0; i < n; i++) {
        float x = X[i], g = exp_f(-0.5f * x * x);
        DX[i] = G[i] * (M ? M[i] : 1.0f) * (gauss_cdf(x, g) + x * g * 0.39894228040143268f);
    }
}

/* Rows of C values: S = X + H * M (M NULL: no dropout), Y = (S - mean) rstd * gamma + beta, with XHAT = (S - mean) rstd
   and RSTD = 1 / sqrt(var + eps) (biased variance, as LayerNorm) kept for the backward. */
void residual_layernorm_fwd(const float* X, const float* H, const float* M, const float* GAMMA, const float* BETA,
                            float* Y, float* XHAT, float* RSTD, long rows, long C, float eps) {
    for (long r = 0; r < rows; r++) {
        const float *x = X + r * C, *h = H + r * C, *m = M ? M + r * C : NULL;
        float *y = Y + r * C, *xh = XHAT + r * C, mean = 0, var = 0;
        #pragma omp simd reduction(+:mean)
        for (long j = 0; j < C; j++) { xh[j] = x[j] + h[j] * (m ? m[j] : 1.0f); mean += xh[j]; }
        mean /= C;
        #pragma omp simd reduction(+:var)
        for (long j = 0; j < C; j++) { float d = xh[j] - mean; var += d * d; }
        float rstd = 1.0f / sqrtf(var / C + eps);
        #pragma omp simd
        for (long j = 0; j < C; j++) { xh[j] = (xh[j] - mean) * rstd; y[j] = xh[j] * GAMMA[j] + BETA[j]; }
        RSTD[r] = rstd;
    }
}

/* Backward of the above from G = dL/dY: DX = dL/dS = rstd (G gamma - mean(G gamma) - XHAT mean(G gamma XHAT)),
   DH = DX * M, and DGAMMA, DBETA summed over the rows (written, not accumulated). */
void residual_layernorm_bwd(const float* XHAT, const float* RSTD, const float* M, const float* GAMMA, const float* G,
                            float* DX, float* DH, float* DGAMMA, float* DBETA, long rows, long C) {
    memset(DGAMMA, 0, C * sizeof(float)); memset(DBETA, 0, C * sizeof(float));
    for (long r = 0; r < rows; r++) {
        const float *xh = XHAT + r * C, *g = G + r * C, *m = M ? M + r * C : NULL;
        float *dx = DX + r * C, *dh = DH + r * C, s1 = 0, s2 = 0;
        #pragma omp simd reduction(+:s1, s2)
        for (long j = 0; j < C; j++) { float d = g[j] * GAMMA[j]; s1 += d; s2 += d * xh[j]; }
        s1 /= C; s2 /= C;
        float rstd = RSTD[r];
        #pragma omp simd
        for (long j = 0; j < C; j++) {
            float d = rstd * (g[j] * GAMMA[j] - s1 - xh[j] * s2);
            dx[j] = d; dh[j] = d * (m ? m[j] : 1.0f);
            DGAMMA[j] += g[j] * xh[j]; DBETA[j] += g[j];
        }
    }
}
