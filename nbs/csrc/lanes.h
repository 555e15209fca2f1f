/* ---- Short rows: 16 rows at a time, one per vector lane. ------------------------------------------------------
   A row of 17 keys is one full vector plus one scalar leftover, and each Newton step ends in a horizontal sum: most
   of the time goes to overhead. Transposed into a [n][16] block, every step is n plain vector operations across 16
   rows, with per-lane sums and thresholds and no horizontal work. Lanes past the last row repeat it (discarded). */

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

/* row max per lane; Z becomes (Z - max) * scale; `dead` marks lanes whose row has no finite key; `odd` (may be NULL)
   those whose row holds a NaN or +inf, found in the same pass (softmax's NaN rows are odd or dead) */
static void center_lanes(float* Z, long n, float scale, float* m, int* dead, int* odd) {
    for (long l = 0; l < LN; l++) m[l] = -INFINITY;
    if (odd) {
        for (long l = 0; l < LN; l++) odd[l] = 0;
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) { float z = Z[j * LN + l]; m[l] = z > m[l] ? z : m[l]; odd[l] |= !(z < INFINITY); }
        }
    } else for (long j = 0; j < n; j++) {
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


/* The backward shared by softmax, sparsemax and entmax-1.5 in lanes: dx = w (g - <w, g> / sum w), with w = p
   (softmax, where sum w = 1), 1 on the support (sparsemax) or sqrt p (entmax-1.5). W holds the p, g and output blocks. */
static void weighted_bwd_lanes(enum normalizer_kind kind, const float* P, const float* G, float* DX, float* W, long rows, long n) {
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
                float w = kind == KIND_SPARSEMAX ? (float)(p > 0) : (kind == KIND_ENTMAX15 ? (p > 0 ? sqrtf(p) : 0.0f) : p);
                Zp[j * LN + l] = w; a[l] += w * g; b[l] += w;
            }
        }
        for (long l = 0; l < LN; l++) a[l] = kind == KIND_SOFTMAX ? a[l] : (b[l] > 0 ? a[l] / b[l] : 0);
        for (long j = 0; j < n; j++) {
            #pragma omp simd
            for (long l = 0; l < LN; l++) Zp[j * LN + l] = Zp[j * LN + l] * (Zg[j * LN + l] - a[l]);
        }
        store_lanes(DX, r0, L, n, Zp);
    }
}
