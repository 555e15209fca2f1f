# %% [markdown]
# # Top-k softmax
# > Softmax over the k largest scores of each query row (or of each head's score matrix), with k counted over the valid keys.

# %%
#| default_exp topk_mapping

# %% [markdown]
# One family per notebook, as in the `entmax` package and our `examples/`: top-k softmax serves Study A's three ratios
# and Crisp's sparsity levels; it needs only the masks (`00a_masks`) and its C row kernel, and the registry
# (`00_normalizers`) imports it from here.

# %%
#| export
import torch
from torch.autograd import Function
from sparse_attention_repro import kernels as K
from sparse_attention_repro.masks import mask_scores, finish_rows, upcast, no_scores

# %%
from fastcore.test import test_eq, test_close, test_fail
import math


# %% [markdown]
# Top-k softmax keeps the $k$ largest scores of each query row, gives the others $-\infty$, and applies softmax.
# Study A sets $k = \lceil r\,T \rceil$ with $T$ keys (CLS included) and $r \in \{0.125, 0.25, 0.5\}$; with padding
# masks we count only the valid keys: $k = \max(1, \lceil r \cdot n_{\text{valid}} \rceil)$. The ceiling is taken
# after rounding $r\,n$ to 9 decimals, so $0.2 \cdot 10$ gives $k = 2$, not 3 from float round-off.
# **Ties** at the $k$-th score are all kept (the threshold is the $k$-th largest value); with distinct scores exactly
# $k$ keys survive. The gradient is softmax's on the kept keys and zero elsewhere (the selection is piecewise constant).
#
# **Head scope** (`scope="head"`). The Crisp paper speaks of a percentile per *head*: one threshold over the whole
# $T_q \times T_k$ score matrix of a head, keeping the top $\max(1, \lceil r \cdot n_{\text{valid entries}} \rceil)$
# entries. Such a threshold can leave a query row with no surviving key (its softmax would be undefined). Our rule:
# **every query row also keeps its own largest valid score**, so no row is empty; the measured density is therefore
# slightly above $r$ when some rows would otherwise have been emptied.

# %%
#| export
def keep_count(ratio, n_valid):
    "k = max(1, ceil(ratio * n_valid)) with the product rounded to 9 decimals first; `n_valid` a tensor."
    return torch.clamp(torch.ceil(torch.round(n_valid.double() * ratio * 1e9) / 1e9), min=1).long()

def _kth_largest(s, k):
    "k-th largest value along the last dim, with a per-row `k` tensor `[..., 1]`."
    kmax = int(k.max())
    top = s.topk(min(kmax, s.shape[-1]), dim=-1).values                     # (..., kmax)
    return top.gather(-1, (k - 1).clamp(max=top.shape[-1] - 1))

class TopkSoftmaxFunction(Function):
    "Row-scope top-k softmax through the C kernel; the selection is piecewise constant, so only softmax's gradient flows."
    @staticmethod
    def forward(ctx, x, ratio):
        p, bad = K.topk_softmax_fwd(x, ratio)
        ctx.save_for_backward(p)
        ctx.mark_non_differentiable(bad)
        return p, bad

    @staticmethod
    def backward(ctx, g, _):
        p, = ctx.saved_tensors
        return K.softmax_bwd(p, g), None

def topk_softmax(scores, ratio, key_mask=None, scope="row"):
    "Softmax over the top `ratio` fraction of valid keys per query row (`scope='row'`) or per head matrix (`scope='head'`)."
    if not 0 < ratio <= 1: raise ValueError(f"top-k ratio must be in (0, 1], got {ratio}")
    if scope not in ("row", "head"): raise ValueError(f"scope must be 'row' or 'head', got {scope!r}")
    if scores.numel() == 0: return no_scores(scores)
    s, empty = mask_scores(upcast(scores), key_mask)
    if scope == "row" and K.usable(s):
        p, bad = TopkSoftmaxFunction.apply(s, ratio)                        # the kernel flags softmax's NaN rows
        return finish_rows(p, s, empty, bad).to(scores.dtype)
    valid = torch.isfinite(s)                                               # (..., H, Tq, Tk)
    if scope == "row":
        k = keep_count(ratio, valid.sum(-1, keepdim=True))                  # (..., H, Tq, 1)
        keep = s >= _kth_largest(s, k)
    else:
        flat = s.flatten(-2)                                                # (..., H, Tq*Tk)
        k = keep_count(ratio, valid.flatten(-2).sum(-1, keepdim=True))      # (..., H, 1)
        thr = _kth_largest(flat, k).unsqueeze(-1)                           # (..., H, 1, 1)
        keep = (s >= thr) | (s == s.amax(-1, keepdim=True))                 # each row keeps its max
    p = torch.softmax(s.masked_fill(~keep, float('-inf')), -1)
    return finish_rows(p, s, empty).to(scores.dtype)


# %%
torch.manual_seed(0)
x = torch.randn(3, 4, 17, 17)
for r, k in [(0.125, 3), (0.25, 5), (0.5, 9), (1.0, 17)]:
    p = topk_softmax(x, r)
    test_eq(((p > 0).sum(-1) == k).all(), True)                               # exactly k with distinct scores
    kept = x.topk(k, -1).indices
    test_close(p.gather(-1, kept), torch.softmax(x.gather(-1, kept), -1), eps=1e-6)  # brute force: softmax of the top k
test_eq(keep_count(0.2, torch.tensor([10, 1, 0])).tolist(), [2, 1, 1])
test_fail(lambda: topk_softmax(x, 1.5), contains="(0, 1]")

# %% [markdown]
# With padding, $k$ counts valid keys only, and in head scope every row keeps at least its best key:

# %%
mask = torch.ones(3, 1, 1, 17, dtype=torch.bool); mask[..., 9:] = False      # 9 valid keys
p = topk_softmax(x, 0.25, mask)
test_eq(((p > 0).sum(-1) == 3).all(), True)                                    # ceil(0.25 * 9) = 3
test_eq(p[..., 9:].abs().sum(), 0)
ph = topk_softmax(x, 0.2, mask, scope="head")
assert ((ph > 0).sum(-1) >= 1).all()
test_close(ph.sum(-1), torch.ones(3, 4, 17), eps=1e-6)
n_kept = (ph > 0).sum((-2, -1))
assert (n_kept >= math.ceil(0.2 * 17 * 9)).all() and (n_kept < math.ceil(0.2 * 17 * 9) + 17).all()
skew = x.clone(); skew[:, :, :8] += 100                                       # first 8 rows dominate the head matrix
test_eq(((topk_softmax(skew, 0.1, scope="head") > 0).sum(-1) >= 1).all(), True)  # yet no row is emptied
