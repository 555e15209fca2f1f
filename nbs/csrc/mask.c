/* Masked keys at -inf, the step every normalizer takes first: OUT[r][j] = KEEP[(r0 + r) % period][j] ? S[r][j] : -inf,
   the mask's rows repeating every `period` score rows (a [Tq, Tk] mask, such as a causal one, over [..., Tq, Tk] scores).
   One pass, as torch.where's, without the cost of its broadcast. */
void mask_rows(const float* S, const unsigned char* KEEP, float* OUT, long rows, long n, long period, long r0) {
    for (long r = 0; r < rows; r++) {
        const float* s = S + r * n; const unsigned char* k = KEEP + ((r0 + r) % period) * n; float* o = OUT + r * n;
        #pragma omp simd
        for (long j = 0; j < n; j++) o[j] = k[j] ? s[j] : -INFINITY;
    }
}
