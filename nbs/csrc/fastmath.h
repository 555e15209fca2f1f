/* Branch-free float32 exp and log, and a row maximum: the arithmetic every normalizer shares. */
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
