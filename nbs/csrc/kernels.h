/* The kernels' shared declarations: the normalizer kinds, the limits, and the entry points Python calls (ctypes).
   Every .c file of this folder is compiled as one unit through kernels.c, so the helpers stay `static` and inline. */
#ifndef SPARSE_REPRO_KERNELS_H
#define SPARSE_REPRO_KERNELS_H
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The normalizer of a fused attention call or of a shared backward, one code everywhere (Python reads this enum). */
enum normalizer_kind { KIND_SOFTMAX = 0, KIND_SPARSEMAX = 1, KIND_ENTMAX15 = 2, KIND_ENTMAX_ALPHA = 3, KIND_TOPK_SOFTMAX = 4 };

#define LN 16                       /* rows per lane block: one row per vector lane */
#define SHORT_ROW 32                /* rows of at most this many keys run in lanes */
#define ATTENTION_MAX_HEAD 64       /* values per head the fused attention takes */
#define ATTENTION_GROUP_MAX 16      /* heads per fused-attention group on short rows */

/* Normalizer rows: X, P, G, DX are [rows, n] float32; W a scratch of 64 * (n + 16) floats; A one alpha per row; BAD
   (int32, may be NULL) flags of the rows softmax makes NaN. */
void mask_rows(const float* S, const unsigned char* KEEP, float* OUT, long rows, long n, long period, long r0);
void sparsemax_fwd(const float* X, float* P, float* W, long rows, long n);
void sparsemax_bwd(const float* P, const float* G, float* DX, float* W, long rows, long n);
void entmax15_fwd(const float* X, float* P, int32_t* BAD, float* W, long rows, long n, long max_iter, float tol);
void entmax_alpha_fwd(const float* X, float* P, const float* A, int32_t* BAD, float* W, long rows, long n, long max_iter, float tol);
void entmax_bwd(const float* P, const float* G, float* DX, const float* A, float* DA, float* W, long rows, long n);
void topk_softmax_fwd(const float* X, float* P, int32_t* BAD, float* W, long rows, long n, double ratio);
void softmax_bwd(const float* P, const float* G, float* DX, float* W, long rows, long n);

/* Fused attention (attention.c). */
long attention_scratch(long T, long D);
void attention_fwd(const float* QKV, float* O, float* P, const float* ALPHA, const unsigned char* KM, float* W, long lo, long hi,
                   long T, long H, long D, float scale, long kind, double ratio, long max_iter, float tol);
void attention_bwd(const float* QKV, const float* P, const float* GO, float* DQKV, const float* ALPHA, float* DALPHA, float* W,
                   long lo, long hi, long T, long H, long D, float scale, long kind);

/* The block's residual + dropout + LayerNorm and GELU + dropout (block.c): rows of C floats; M may be NULL. */
void gelu_dropout_fwd(const float* X, const float* M, float* Y, long n);
void gelu_dropout_bwd(const float* X, const float* M, const float* G, float* DX, long n);
void residual_layernorm_fwd(const float* X, const float* H, const float* M, const float* GAMMA, const float* BETA,
                            float* Y, float* XHAT, float* RSTD, long rows, long C, float eps);
void residual_layernorm_bwd(const float* XHAT, const float* RSTD, const float* M, const float* GAMMA, const float* G,
                            float* DX, float* DH, float* DGAMMA, float* DBETA, long rows, long C);

/* Random numbers for dropout masks (random.c). */
void philox_bits(uint32_t* out, long first, long count, long k0, long k1);
void philox_dropout(float* out, long first, long count, long k0, long k1, long keep_below, float scale);
void mt_bernoulli(float* out, long count, unsigned char* state, double p, float scale);
#endif
