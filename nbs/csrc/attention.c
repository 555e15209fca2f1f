/* ---- Fused attention: scores -> normaliser -> weighted values, one (batch, head) at a time, inside the cache. --------
   The torch path sends the scores, the weights and their gradients through memory as [B, H, T, T] tensors and runs
   T x D x T products as tiny batched GEMMs. Here a head's T x T block lives in a scratch buffer (37 KB at T = 97)
   from the scores to the weighted values, and back in the backward. Only the weights P leave it (the backward needs
   them). The sums run in another order than torch's GEMMs, so results agree to float32 rounding, not bit for bit.
   QKV: [B, T, 3, H, D], the fused projection's output as it comes; O: [B, T, H, D]; P: [B, H, T, T].
   kind: an enum normalizer_kind (ALPHA[h] for KIND_ENTMAX_ALPHA, ratio for KIND_TOPK_SOFTMAX). KM: [B, T] key
   mask (nonzero = valid) or NULL. Blocks lo..hi of the B x H (batch, head) pairs. W: scratch of attention_scratch(T, D)
   floats. The head size D is at most ATTENTION_MAX_HEAD. */

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
#define ATTENTION_GROUP(T) ((T) <= SHORT_ROW ? ATTENTION_GROUP_MAX : 1)

long attention_scratch(long T, long D) {
    long G = ATTENTION_GROUP(T);
    return 2 * G * T * T + (T + 16) * D + 64 * (T + 16) + 3 * G * T + 16;
}

void attention_fwd(const float* QKV, float* O, float* P, const float* ALPHA, const unsigned char* KM, float* W, long lo, long hi,
                   long T, long H, long D, float scale, long kind, double ratio, long max_iter, float tol) {
    long C3 = 3 * H * D, HD = H * D, np = (T + 15) & ~15L, G = ATTENTION_GROUP(T);
    float *S = W, *KT = S + G * T * T, *NW = KT + np * D, *A = NW + 64 * (T + 16);
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
            if (kind == KIND_ENTMAX_ALPHA) for (long i = 0; i < T; i++) A[k * T + i] = ALPHA[h];
        }
        switch (kind) {
            case KIND_SOFTMAX: softmax_fwd(S, p, NW, rows, T); break;
            case KIND_SPARSEMAX: sparsemax_fwd(S, p, NW, rows, T); break;
            case KIND_ENTMAX15: entmax15_fwd(S, p, 0, NW, rows, T, max_iter, tol); break;
            case KIND_ENTMAX_ALPHA: entmax_alpha_fwd(S, p, A, 0, NW, rows, T, max_iter, tol); break;
            default: topk_softmax_fwd(S, p, BAD, NW, rows, T, ratio);               /* KIND_TOPK_SOFTMAX */
        }
        nan_bad_rows(S, p, kind == KIND_TOPK_SOFTMAX ? BAD : 0, rows, T);
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
   DALPHA (KIND_ENTMAX_ALPHA): d loss / d alpha of each (batch, head) block. */
void attention_bwd(const float* QKV, const float* P, const float* GO, float* DQKV, const float* ALPHA, float* DALPHA, float* W,
                   long lo, long hi, long T, long H, long D, float scale, long kind) {
    long C3 = 3 * H * D, HD = H * D, np = (T + 15) & ~15L, G = ATTENTION_GROUP(T);
    float *DS = W, *VT = DS + G * T * T, *DP = VT + np * D, *NW = DP + G * T * T, *A = NW + 64 * (T + 16), *DA = A + G * T;
    for (long g0 = lo; g0 < hi; g0 += G) {
        long n = hi - g0 < G ? hi - g0 : G, rows = n * T;
        const float* p = P + g0 * T * T;
        for (long k = 0; k < n; k++) {
            long b = (g0 + k) / H, h = (g0 + k) % H;
            row_products(GO + b * T * HD + h * D, HD, QKV + b * T * C3 + h * D + 2 * HD, C3, 1.0f, VT, DP + k * T * T, T, D);
            if (kind == KIND_ENTMAX_ALPHA) for (long i = 0; i < T; i++) A[k * T + i] = ALPHA[h];
        }
        switch (kind) {
            case KIND_SPARSEMAX: sparsemax_bwd(p, DP, DS, NW, rows, T); break;
            case KIND_ENTMAX15: entmax_bwd(p, DP, DS, 0, 0, NW, rows, T); break;
            case KIND_ENTMAX_ALPHA: entmax_bwd(p, DP, DS, A, DALPHA ? DA : 0, NW, rows, T); break;
            default: softmax_bwd(p, DP, DS, NW, rows, T);        /* softmax, and top-k: softmax's backward on its support */
        }
        for (long k = 0; k < n; k++) {
            long b = (g0 + k) / H, h = (g0 + k) % H;
            const float* base = QKV + b * T * C3 + h * D; const float* go = GO + b * T * HD + h * D;
            float* dbase = DQKV + b * T * C3 + h * D;
            const float *pk = p + k * T * T, *ds = DS + k * T * T;
            if (kind == KIND_ENTMAX_ALPHA && DALPHA) { float s = 0; for (long i = 0; i < T; i++) s += DA[k * T + i]; DALPHA[g0 + k] = s; }
            mix_rows(pk, 1, T, go, HD, 1.0f, dbase + 2 * HD, C3, T, D);          /* dV */
            mix_rows(ds, T, 1, base + HD, C3, scale, dbase, C3, T, D);          /* dQ */
            mix_rows(ds, 1, T, base, C3, scale, dbase + HD, C3, T, D);          /* dK */
        }
    }
}
