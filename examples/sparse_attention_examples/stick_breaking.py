"""Stick-breaking attention (Tan, Yang, Courville, Panda & Shen, 2024, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study", ICLR 2025; arXiv 2410.17980, first titled "Stick-breaking Attention", Tan, Shen et al.).

Each key breaks off a sigmoid share of what is left of a unit stick, the keys taken in an order o_i(j) per query i:

    beta_ij = sigmoid(s_ij),    A_ij = beta_ij * prod_{k : o_i(k) < o_i(j)} (1 - beta_ik)

Rows sum to 1 - prod_k (1 - beta_ik) < 1 (the rest of the stick is attention to nothing). Choices:
- order: the paper is causal, query i breaks the stick over the keys j < i from the nearest (j = i - 1) backwards,
  which gives its recency bias. The lab's classifier is bidirectional (a CLS token at position 0, no causal order), so
  we keep "nearest first" on both sides: keys by distance |j - i| to the query's position, ties (i - d before i + d)
  broken by index, i.e. the order i, i-1, i+1, i-2, i+2, ... A query at the end of the sequence then sees the paper's
  order exactly. Query i sits at key position i (the same token when Tq = Tk, as in self-attention); with fewer queries
  than keys they are the last Tq positions (query r at key Tk - Tq + r), as in a causal model's block of queries, so the
  length study's decoder, which attends in blocks of queries under a causal mask, gets the paper's causal order.
- the query attends to itself, first (the paper's kernel has this as an option): in a bidirectional encoder with
  key masks, its own token is one of the keys it may attend to.
- log space, as the paper computes it: log A_ij = logsigmoid(s_ij) + sum of logsigmoid(-s_ik) over the earlier keys
  (a cumulative sum in query i's order), then one exp; stable for any finite score. Both logsigmoids of a score come
  from one exp and one log: with l = log(1 + e^-|s|), they are min(s, 0) - l and -max(s, 0) - l (no cancellation; log
  rather than log1p, which is several times slower here, costs at most one rounding of 1 + e^-|s|, an absolute error
  below 1.2e-7 in float32). One `autograd.Function` computes the weights, with the gradient written out
  (`StickBreakingFunction`; autograd through the gathers and the cumulative sum took several times as long). The
  same weights and gradients up to rounding; its CIFAR-10 fair search ran on that earlier autograd form, its other
  fair searches on this one.
- masked keys get exactly 0 and do not consume the stick (they are left out of the product); a row with no valid key
  gives zeros. Half-precision scores are computed in float32 (a cumulative sum of logs).
"""
import functools
import torch
from sparse_attention_repro.normalizers import register_normalizer


def key_order(tq, tk, device=None):
    "`[Tq, Tk]` rank of key j in query r's stick (smaller: earlier): by |j - i|, i = Tk - Tq + r, the key before the query first on ties."
    i, j = torch.arange(tk - tq, tk, device=device).view(-1, 1), torch.arange(tk, device=device)
    return 2 * (j - i).abs() + (j > i).long()                                      # distinct within each row


@functools.lru_cache(maxsize=None)
def _orders(tq, tk, device):
    """The keys of each query's stick in order, `[Tq, Tk]`, and each key's place in it (the inverse permutation): made once
    per shape, outside inference mode (so that a first call under `torch.inference_mode` leaves tensors autograd can save)."""
    with torch.inference_mode(False):
        order = key_order(tq, tk, device).argsort(-1)
        return order, order.argsort(-1)


class StickBreakingFunction(torch.autograd.Function):
    """Stick-breaking weights of scores `x` (masked keys already 0) over the keys `valid` (bool, broadcastable; None:
    all). For an upstream g, with h = g A (the gradient of log A) and H_ik = the sum of h_ij over the keys j after k in
    query i's order, the gradient of s_ik is h_ik - beta_ik (h_ik + H_ik), since d log beta / ds = 1 - beta and
    d log(1 - beta) / ds = -beta (checked against autograd through the formula in the tests)."""
    @staticmethod
    def forward(ctx, x, valid):
        l = torch.exp(-x.abs()).add_(1).log_()                                      # log(1 + e^-|s|)
        log_beta, log_rest = x.clamp_max(0).sub_(l), x.clamp_min(0).neg_().sub_(l)  # log beta, log(1 - beta)
        if valid is not None: log_rest.masked_fill_(~valid, 0.)                     # masked: no break
        order, place = (o.expand(x.shape) for o in _orders(*x.shape[-2:], x.device))   # (..., Tq, Tk)
        in_order = log_rest.gather(-1, order)
        before = in_order.cumsum(-1).sub_(in_order)                                 # stick used before each, in order
        p = before.gather(-1, place).add_(log_beta).exp_()                          # back to key positions
        if valid is not None: p.masked_fill_(~valid, 0.)
        ctx.save_for_backward(p, log_beta, *(() if valid is None else (valid,)))
        return p

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        p, log_beta, *valid = ctx.saved_tensors
        h = g * p
        order, place = (o.expand(h.shape) for o in _orders(*h.shape[-2:], h.device))
        in_order = h.gather(-1, order)
        after = in_order.cumsum(-1).neg_().add_(in_order.sum(-1, keepdim=True))    # h summed over the keys after each
        grad = h - log_beta.exp().mul_(after.gather(-1, place).add_(h))
        if valid: grad.masked_fill_(~valid[0], 0.)
        return grad, None


@register_normalizer("stick_breaking", sums_to_one=False, stackable=True)
def stick_breaking(scores, key_mask=None):
    "Stick-breaking weights over the keys, nearest to the query first; masked keys 0 and skipped."
    x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    valid = None if key_mask is None else key_mask.to(torch.bool)
    if valid is not None: x = x.masked_fill(~valid, 0.)
    return StickBreakingFunction.apply(x, valid).to(scores.dtype)
