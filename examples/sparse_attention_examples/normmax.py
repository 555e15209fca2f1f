"""2-normmax (Santos, Niculae, McNamee & Martins, 2024, "Sparse and Structured Hopfield Networks", ICML 2024; the
`entmax` package's `normmax_bisect`), a sparse normalizer whose regulariser is the 2-norm instead of an entropy:

    normmax(z) = argmax_{p in simplex} <p, z> - ||p||_2

Its solution is p = (z - tau)_+ / sum_j (z_j - tau)_+ with tau the threshold where sum_j (z_j - tau)_+^2 = 1, so
keys more than 1 below the top score get exactly zero and rows sum to one. Choices:
- alpha = 2 only (the package's default and the paper's normmax); other alpha-norms would need a root search.
- tau exactly, not by bisection: sort the scores, and for the top k keys tau_k = mean_k - sqrt((1 - ss_k) / k) (ss_k
  their sum of squared deviations from mean_k) solves the quadratic; the support is the largest k with tau_k <= z_(k),
  the argument of Peters, Niculae & Martins (2019) for 1.5-entmax, whose threshold equation this is. With the support
  fixed (no gradient through the sort), tau is recomputed from it in closed form, so autograd gives the exact gradient.
- shift invariant: the row max is subtracted first (out of the graph). Masked keys are -inf, get exactly 0 and are left
  out; a row with no valid key gives zeros. Half-precision scores are computed in float32.
"""
import torch
from sparse_attention_repro.normalizers import register_normalizer


def _support(z):
    "Keys `z > tau` of normmax's support, for rows `z` with max 0 (-inf: masked), by sorting."
    zs = z.sort(-1, descending=True).values
    kept = torch.isfinite(zs)
    zs0 = torch.where(kept, zs, torch.zeros_like(zs))
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    mean = zs0.cumsum(-1) / k
    ss = (zs0 * zs0).cumsum(-1) - k * mean * mean                                 # sum of (z - mean)^2 over the top k
    tau = mean - ((1 - ss).clamp_min(0) / k).sqrt()                                # (..., T): tau if the support is the top k
    size = ((tau <= zs) & kept).sum(-1, keepdim=True).clamp_min(1)
    return z > tau.gather(-1, size - 1)


@register_normalizer("normmax", stackable=True)
def normmax(scores, key_mask=None):
    "2-normmax over keys: (z - tau)_+ normalised, with sum (z - tau)_+^2 = 1; masked keys 0."
    x, empty = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores, None
    if key_mask is not None:
        valid = key_mask.to(torch.bool).expand_as(x)
        empty = ~valid.any(-1, keepdim=True)                                        # (..., 1): rows with no valid key
        x = x.masked_fill(~(valid | empty), float("-inf"))
    z = x - x.detach().amax(-1, keepdim=True)
    with torch.no_grad(): on = _support(z)
    zero = torch.zeros_like(z)
    k = on.sum(-1, keepdim=True)
    mean = torch.where(on, z, zero).sum(-1, keepdim=True) / k
    ss = torch.where(on, z - mean, zero).pow(2).sum(-1, keepdim=True)
    tau = mean - ((1 - ss) / k).clamp_min(0).sqrt()                                # exact on the support, differentiable
    q = torch.where(on, z - tau, zero)
    p = q / q.sum(-1, keepdim=True)
    if empty is not None: p = p.masked_fill(empty, 0.)
    return p.to(scores.dtype)
