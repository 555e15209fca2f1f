"""Stick-breaking attention (Tan, Yang, Courville, Panda & Shen, 2024, "Scaling Stick-Breaking Attention: An Efficient
Implementation and In-depth Study", ICLR 2025; arXiv 2410.17980, first titled "Stick-breaking Attention", Tan, Shen et al.).

Each key breaks off a sigmoid share of what is left of a unit stick, the keys taken in an order o_i(j) per query i:

    beta_ij = sigmoid(s_ij),    A_ij = beta_ij * prod_{k : o_i(k) < o_i(j)} (1 - beta_ik)

Rows sum to 1 - prod_k (1 - beta_ik) < 1 (the rest of the stick is attention to nothing). Choices:
- order: the paper is causal, query i breaks the stick over the keys j < i from the nearest (j = i - 1) backwards,
  which gives its recency bias. The lab's classifier is bidirectional (a CLS token at position 0, no causal order), so
  we keep "nearest first" on both sides: keys by distance |j - i| to the query's position, ties (i - d before i + d)
  broken by index, i.e. the order i, i-1, i+1, i-2, i+2, ... A query at the end of the sequence then sees the paper's
  order exactly. Query i sits at key position i (the same token when Tq = Tk, as in self-attention).
- the query attends to itself, first (the paper's kernel has this as an option): in a bidirectional encoder with
  key masks, its own token is one of the keys it may attend to.
- log space, as the paper computes it: log A_ij = logsigmoid(s_ij) + sum of logsigmoid(-s_ik) over the earlier keys
  (a cumulative sum in query i's order), then one exp; stable for any finite score. Both logsigmoids of a score come
  from one exp and one log1p (`LogSigmoidPair`), with their gradient written out.
- masked keys get exactly 0 and do not consume the stick (they are left out of the product); a row with no valid key
  gives zeros. Half-precision scores are computed in float32 (a cumulative sum of logs).
"""
import functools
import torch
import torch.nn.functional as F
from sparse_attention_repro.normalizers import register_normalizer


def key_order(tq, tk, device=None):
    "`[Tq, Tk]` rank of key j in query i's stick (smaller: earlier): by |j - i|, the key before the query first on ties."
    i, j = torch.arange(tq, device=device).view(-1, 1), torch.arange(tk, device=device)
    return 2 * (j - i).abs() + (j > i).long()                                      # distinct within each row


class LogSigmoidPair(torch.autograd.Function):
    """log sigmoid(s) and log sigmoid(-s) from one exp and one log1p: with l = log(1 + e^-|s|), they are min(s, 0) - l
    and -max(s, 0) - l, each as accurate as torch's logsigmoid (no cancellation); the gradient is written out, exact at
    s = 0 too: d/ds = sigmoid(-s) and -sigmoid(s), with sigmoid(s) = e^(log sigmoid(s))."""
    @staticmethod
    def forward(ctx, s):
        l = torch.log1p(torch.exp(-s.abs()))
        log_beta = s.clamp_max(0) - l
        ctx.save_for_backward(log_beta)
        return log_beta, -s.clamp_min(0) - l

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_beta, g_rest):
        log_beta, = ctx.saved_tensors
        return g_beta - (g_beta + g_rest) * log_beta.exp()


@functools.lru_cache(maxsize=None)
def _orders(tq, tk, device):
    """The keys of each query's stick in order, `[Tq, Tk]`, and each key's place in it (the inverse permutation): made once
    per shape, outside inference mode (so that a first call under `torch.inference_mode` leaves tensors autograd can save)."""
    with torch.inference_mode(False):
        order = key_order(tq, tk, device).argsort(-1)
        return order, order.argsort(-1)


@register_normalizer("stick_breaking", sums_to_one=False, stackable=True)
def stick_breaking(scores, key_mask=None):
    "Stick-breaking weights over the keys, nearest to the query first; masked keys 0 and skipped."
    x = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    if key_mask is not None: x = x.masked_fill(~key_mask.to(torch.bool), 0.)
    log_beta, log_rest = LogSigmoidPair.apply(x)                                   # log beta, log(1 - beta)
    if key_mask is not None: log_rest = log_rest.masked_fill(~key_mask.to(torch.bool), 0.)   # masked: no break
    order, place = (o.expand(x.shape) for o in _orders(*x.shape[-2:], x.device))   # (..., Tq, Tk)
    before = F.pad(log_rest.gather(-1, order).cumsum(-1)[..., :-1], (1, 0))         # stick used before each, in order
    p = (log_beta + before.gather(-1, place)).exp()                                # back to key positions
    if key_mask is not None: p = p.masked_fill(~key_mask.to(torch.bool), 0.)
    return p.to(scores.dtype)
