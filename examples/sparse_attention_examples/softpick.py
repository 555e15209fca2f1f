"""Softpick, the rectified softmax (Zuhri, Fuadi & Aji, 2025, "Softpick: No Attention Sink, No Massive Activations
with Rectified Softmax").

    softpick(x)_i = ReLU(e^{x_i} - 1) / (sum_j |e^{x_j} - 1| + eps)

A key whose score is below 0 gets exactly zero, and a row can give less than one in total (no forced "sink"). Computed
stably by multiplying through by e^{-m}, m = max(0, max_j x_j), which leaves the ratio unchanged (eps becomes eps e^{-m}).
Masked keys are left out of both sums and get zero.

Against the authors' reference code: it shifts by the row max and adds eps = 1e-8 after the shift, so its denominator
is sum_j |e^{x_j} - 1| + 1e-8 e^{max_j x_j}; ours is sum_j |e^{x_j} - 1| + EPS, the formula above with EPS = 1e-6. For
scores of unit scale the weights agree within 2e-8, with and without masked keys; where every score of a row is tiny
(|x| ~ 1e-3, so the sum is small) the eps terms weigh and the relative gap grows to about 1e-5.
`test_softpick_against_the_reference_epsilon` pins both.
"""
import torch
from sparse_attention_repro.normalizers import register_normalizer

EPS = 1e-6


@register_normalizer("softpick", sums_to_one=False, stackable=True)
def softpick(scores, key_mask=None):
    "ReLU(e^x - 1) / (sum |e^x - 1| + eps) over the valid keys; masked keys 0."
    valid = torch.ones_like(scores, dtype=torch.bool) if key_mask is None else key_mask.to(torch.bool).expand_as(scores)
    x = scores.masked_fill(~valid, 0.)
    m = x.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True).clamp_min(0)    # (..., 1); 0 for a row with no valid key
    d = (x - m).exp() - (-m).exp()                                                   # e^{-m} (e^x - 1)
    d = torch.where(valid, d, torch.zeros_like(d))
    return d.clamp_min(0) / (d.abs().sum(-1, keepdim=True) + EPS * (-m).exp())
