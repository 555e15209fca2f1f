"""Softpick, the rectified softmax (Zuhri, Fuadi & Aji, 2025, "Softpick: No Attention Sink, No Massive Activations
with Rectified Softmax").

    softpick(x)_i = ReLU(e^{x_i} - 1) / (sum_j |e^{x_j} - 1| + eps)

A key whose score is below 0 gets exactly zero, and a row can give less than one in total (no forced "sink"). Computed
stably by multiplying through by e^{-m}, m = max(0, max_j x_j), which leaves the ratio unchanged (eps becomes eps e^{-m}).
Masked keys are left out of both sums and get zero. One `autograd.Function` computes it, with the gradient written out
(`SoftpickFunction`; autograd through the dozen elementwise steps kept each step's tensor and took several times as long).
The same weights and gradients up to rounding; its CIFAR-10 fair search ran on that earlier autograd form, its other
fair searches on this one.

Against the formula without eps, ReLU(e^{x_i} - 1) / sum_j |e^{x_j} - 1|: ours is exactly that times S / (S + EPS),
S = sum_j |e^{x_j} - 1| over the valid keys, so a weight is off by at most EPS / S, and the agreement degrades as a row
has fewer keys, fewer valid keys or scores nearer 0. Measured in float64 on N(0, 1) scores, 8192 rows a case, the
largest difference of a weight (99th percentile of the rows' largest; worst row, over two seeds):

    97 keys   2e-9 (4e-9)           17 keys, 3 valid   1e-6 (4e-6 to 5e-6)
    17 keys   4e-8 (5e-8 to 6e-8)   17 keys, 2 valid   3e-6 (2e-5 to 5e-5)
     8 keys   1e-7 (2e-7)           17 keys, 1 valid   4e-5 (3e-3 to 5e-3)
     4 keys   5e-7 (2e-6 to 3e-6)
     2 keys   3e-6 (3e-5 to 1e-4)

A single valid key gets (e^x - 1) / (e^x - 1 + EPS) instead of 1: 1/2 for a score of 1e-6. In float32 ours adds only
rounding: within 2e-7 of the formula with EPS (in float64) at 4 to 97 keys, 1.5e-6 at two keys or two valid keys.

Against the authors' reference code: it shifts by the row max and adds eps = 1e-8 after the shift, so its denominator
is sum_j |e^{x_j} - 1| + 1e-8 e^{max_j x_j}; ours is sum_j |e^{x_j} - 1| + EPS, the formula above with EPS = 1e-6. Its
eps being the smaller, the differences are close to those of the table: for scores of unit scale the weights agree
within 2e-8 at 97 keys (30 of them valid, as the test pins), but only within 6e-8 at 17 keys and 5e-3 with one valid
key; where every score of a row is tiny (|x| ~ 1e-3, so the sum is small) the eps terms weigh and the relative gap
grows to about 1e-5. `test_softpick_against_the_reference_epsilon` pins the 97-key cases.
"""
import torch
from sparse_attention_repro.normalizers import register_normalizer

EPS = 1e-6


class SoftpickFunction(torch.autograd.Function):
    """softpick of rows `x` over the keys `valid` (bool, broadcastable; None: all). With d = e^{-m} (e^x - 1) and
    S = sum_j |d_j| + eps e^{-m}, p = ReLU(d) / S, and for an upstream g the gradient is
    (e^{x - m} / S) (g 1[d > 0] - sign(d) <g, p>) (checked against autograd through the formula in the tests)."""
    @staticmethod
    def forward(ctx, x, valid):
        if valid is not None: x = x.masked_fill(~valid, float("-inf"))
        m = x.amax(-1, keepdim=True).clamp_min(0)                                   # (..., 1); 0 for a row with no valid key
        c = (-m).exp()
        d = (x - m).exp_().sub_(c)                                                   # e^{-m} (e^x - 1)
        if valid is not None: d.masked_fill_(~valid, 0.)
        S = d.abs().sum(-1, keepdim=True).add_(c, alpha=EPS)
        p = d.clamp_min(0).div_(S)
        ctx.save_for_backward(d, S, c, p)
        return p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        d, S, c, p = ctx.saved_tensors
        gp = (g * p).sum(-1, keepdim=True)
        sign = d.sign()                                                              # masked keys: d = 0, no gradient
        return sign.clamp_min(0).mul_(g).addcmul_(sign, gp, value=-1).mul_(d.add(c).div_(S)), None


@register_normalizer("softpick", sums_to_one=False, stackable=True)
def softpick(scores, key_mask=None):
    "ReLU(e^x - 1) / (sum |e^x - 1| + eps) over the valid keys; masked keys 0."
    return SoftpickFunction.apply(scores, None if key_mask is None else key_mask.to(torch.bool))
