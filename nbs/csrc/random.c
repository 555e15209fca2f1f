/* Dropout masks from a counter-based generator: Philox4x64-10 (Salmon et al., SC 2011), bit for bit the stream of
   numpy.random.Philox(key=(k0, k1)) started at counter 0. Block b (counter b + 1, as numpy increments before it draws)
   gives four 64-bit words; each word is two 32-bit draws, low half first, so element i of the stream is half (i % 2) of
   word (i / 2) % 4 of block i / 8. Any element can be computed without the ones before it: chunks split freely. */
static inline uint64_t mulhilo64(uint64_t a, uint64_t b, uint64_t* hi) {
    __uint128_t p = (__uint128_t)a * b; *hi = (uint64_t)(p >> 64); return (uint64_t)p;
}

static inline void philox4x64_10(uint64_t b, uint64_t k0, uint64_t k1, uint32_t out[8]) {   /* block b */
    uint64_t c0 = b + 1, c1 = b + 1 == 0, c2 = 0, c3 = 0;   /* numpy's 256-bit counter, carry into the next word */
    for (int r = 0; r < 10; r++) {
        if (r) { k0 += 0x9E3779B97F4A7C15ULL; k1 += 0xBB67AE8584CAA73BULL; }
        uint64_t hi0, hi1;
        uint64_t lo0 = mulhilo64(0xD2E7470EE14C6C93ULL, c0, &hi0);
        uint64_t lo1 = mulhilo64(0xCA5A826395121157ULL, c2, &hi1);
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    uint64_t w[4] = {c0, c1, c2, c3};
    for (int j = 0; j < 4; j++) { out[2 * j] = (uint32_t)w[j]; out[2 * j + 1] = (uint32_t)(w[j] >> 32); }
}

/* Elements [first, first + count) of the stream, block by block; `emit` writes element i from its 32-bit draw. */
#define PHILOX_FOR_EACH(emit) do {                                                                    \
    uint32_t u[8]; long end = first + count;                                                          \
    for (long b = first / 8; b * 8 < end; b++) {                                                      \
        philox4x64_10((uint64_t)b, (uint64_t)k0, (uint64_t)k1, u);                                   \
        long lo = b * 8 < first ? first : b * 8, hi = b * 8 + 8 > end ? end : b * 8 + 8;              \
        for (long i = lo; i < hi; i++) { uint32_t d = u[i - b * 8]; emit; }                           \
    } } while (0)

/* The 32-bit draws themselves (what the tests compare with numpy). */
void philox_bits(uint32_t* out, long first, long count, long k0, long k1) {
    PHILOX_FOR_EACH(out[i - first] = d);
}

/* Dropout mask over elements [first, first + count): `scale` where the draw is below `keep_below`, else 0. */
void philox_dropout(float* out, long first, long count, long k0, long k1, long keep_below, float scale) {
    PHILOX_FOR_EACH(out[i - first] = (long)d < keep_below ? scale : 0.0f);
}

/* Dropout masks bit for bit as torch draws them with `torch.empty(n).bernoulli_(p)` on a CPU where its element loop
   serves (its non-MKL path, as on this AMD machine; `bernoulli_mask` checks that it applies): element i takes the next two 32-bit words a, b of the
   generator's MT19937 stream (Matsumoto & Nishimura, 1998), u = ((a << 32 | b) & (2^53 - 1)) * 2^-53, and is `scale`
   where u < p, else 0. `state` is the generator's `get_state()` bytes (int64 seed, int32 left, int32 seeded,
   uint64 next, then the 624 state words as uint64), advanced in place: `set_state` afterwards leaves the generator
   where bernoulli_ would have. Torch draws word `next` after a twist when `left` counts down to 0; here `avail` =
   left - 1 words remain from `pos` = next. The stream is sequential, so one thread fills the whole mask. */
#define MT_N 624
#define MT_M 397

static inline uint32_t mt_mix(uint32_t a, uint32_t b, uint32_t m) {
    uint32_t y = (a & 0x80000000u) | (b & 0x7fffffffu);
    return m ^ (y >> 1) ^ (-(y & 1u) & 0x9908b0dfu);
}

static void mt_twist(uint32_t* s) {                                  /* the standard loop, split where it wraps */
    for (int i = 0; i < MT_N - MT_M; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M]);
    for (int i = MT_N - MT_M; i < MT_N - 1; i++) s[i] = mt_mix(s[i], s[i + 1], s[i + MT_M - MT_N]);
    s[MT_N - 1] = mt_mix(s[MT_N - 1], s[0], s[MT_M - 1]);
}

static void mt_temper(const uint32_t* s, uint32_t* t) {
    for (int i = 0; i < MT_N; i++) {
        uint32_t y = s[i];
        y ^= y >> 11; y ^= (y << 7) & 0x9d2c5680u; y ^= (y << 15) & 0xefc60000u; y ^= y >> 18;
        t[i] = y;
    }
}

void mt_bernoulli(float* out, long count, unsigned char* state, double p, float scale) {
    int32_t left; uint64_t next, words[MT_N];
    memcpy(&left, state + 8, 4); memcpy(&next, state + 16, 8); memcpy(words, state + 24, sizeof words);
    uint32_t s[MT_N], t[MT_N];
    for (int i = 0; i < MT_N; i++) s[i] = (uint32_t)words[i];
    long pos = (long)next, avail = left - 1;
    mt_temper(s, t);
    const uint64_t mask53 = (1ULL << 53) - 1;
    for (long i = 0; i < count;) {
        if (avail == 0) { mt_twist(s); mt_temper(s, t); pos = 0; avail = MT_N; }
        if (avail >= 2) {                                            /* whole pairs inside this block */
            long pairs = avail / 2 < count - i ? avail / 2 : count - i;
            const uint32_t* w = t + pos;
            for (long j = 0; j < pairs; j++) {
                uint64_t v = (((uint64_t)w[2 * j] << 32) | w[2 * j + 1]) & mask53;
                out[i + j] = (double)v * 0x1p-53 < p ? scale : 0.0f;
            }
            pos += 2 * pairs; avail -= 2 * pairs; i += pairs;
        } else {                                                     /* a pair across a twist */
            uint32_t a = t[pos];
            mt_twist(s); mt_temper(s, t); pos = 1; avail = MT_N - 1;
            uint64_t v = (((uint64_t)a << 32) | t[0]) & mask53;
            out[i++] = (double)v * 0x1p-53 < p ? scale : 0.0f;
        }
    }
    left = (int32_t)(avail + 1); next = (uint64_t)pos;
    for (int i = 0; i < MT_N; i++) words[i] = s[i];
    memcpy(state + 8, &left, 4); memcpy(state + 16, &next, 8); memcpy(state + 24, words, sizeof words);
}
