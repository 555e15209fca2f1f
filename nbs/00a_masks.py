# %% [markdown]
# # Masks and empty rows
# > What every attention normalizer does with masked keys, rows with no valid key, non-finite scores, half precision and empty inputs.

# %%
#| default_exp masks

# %% [markdown]
# Every normalizer of the library (`00_normalizers`, and the families in `00b_sparsemax`, `00c_entmax`, `00d_topk`)
# follows the same two rules for masks and the same treatment of bad scores; these helpers are that treatment, written
# once, in the lowest module, so that each family's module imports them instead of repeating them.

# %%
#| export
import torch
from torch.autograd import Function
from sparse_attention_repro import kernels as K

# %%
from fastcore.test import test_eq


# %% [markdown]
# Masked keys are set to $-\infty$ before a mapping runs: every mapping of the library gives $-\infty$ exactly zero
# probability (softmax: $e^{-\infty}=0$; sparsemax/entmax: $[-\infty-\tau]_+=0$). A row whose keys are *all* masked has
# no valid distribution, so it is computed as if nothing were masked (finite numbers, finite gradients) and zeroed
# afterwards.
#
# **Nothing hides a divergence.** A row whose scores contain a NaN or $+\infty$, or no finite score at all, becomes NaN
# in every normalizer, as it does in softmax: a model whose scores blow up must produce a non-finite loss (which training
# records as `failed_nonfinite_loss`), never plausible probabilities. $-\infty$ is an ordinary score: a key nobody attends.
# Half-precision inputs are computed in float32 and cast back: threshold iterations in bf16 would lose the support.
#
# **Speed, not semantics.** Float32 CPU scores under a mask that varies only over queries and keys (the decoder's causal
# mask) are masked by a small C kernel (`kernels.mask_rows`). Torch's `where`, broadcast over the heads, costs 2–5× a
# plain pass on long rows. The values and the gradient are `where`'s, bit for bit, and the tests below hold on both paths.

# %%
#| export
class _KernelMask(Function):
    "torch.where(keep, s, -inf) by the masking kernel, with where's gradient: the incoming one on kept keys, 0 on masked."
    @staticmethod
    def forward(ctx, s, keep):
        ctx.save_for_backward(keep)
        return K.mask_rows(s, keep)

    @staticmethod
    def backward(ctx, g):
        keep, = ctx.saved_tensors
        return torch.where(keep, g, 0.), None

def _by_kernel(scores, keep) -> bool:
    "Does the masking kernel take these? float32 scores on the CPU, and a mask `[..., Tq, Tk]` that varies over those two dims only (a causal mask)."
    return (scores.numel() > 0 and keep.dim() >= 2 and keep.shape[-2:] == scores.shape[-2:] and scores.dim() >= keep.dim()
            and keep.numel() == keep.shape[-2] * keep.shape[-1] and K.usable(scores))

def _any_key(valid):
    "`valid.any(-1, keepdim=True)` read as bytes: on the CPU torch's `any` over bool rows is ~25x slower than `amax` over their bytes."
    if valid.shape[-1] == 0: return valid.any(-1, keepdim=True)              # amax refuses an empty dim
    return valid.view(torch.uint8).amax(-1, keepdim=True).bool()

def mask_scores(scores, key_mask):
    "Scores with masked keys at -inf (rows with no valid key left untouched) and the `[..., 1]` mask of such empty rows."
    if key_mask is None: return scores, None
    valid = key_mask.to(torch.bool)                            # broadcastable to (..., H, Tq, Tk)
    empty = ~_any_key(valid)                                   # (..., Tq|1, 1): read on the mask, not on its copy per head
    keep = valid | empty if empty.any() else valid            # (no pass over the mask where no row is empty)
    if _by_kernel(scores, keep): return _KernelMask.apply(scores, keep), empty   # where's bits, 2-5x faster on long rows
    return torch.where(keep, scores, float('-inf')), empty     # one pass (masked_fill would copy, then fill)

def _zero_empty_rows(p, empty):
    "Zero the rows that had no valid key (no copy of `p` when there is none: `empty` is read on the mask, a small tensor)."
    return p if empty is None or not empty.any() else p.masked_fill(empty, 0.)

def finish_rows(p, s, empty, bad=None):
    """Zero the rows with no valid key; make NaN every row whose scores hold a NaN or +inf or no finite value (as softmax
    does). `bad`: those rows' `[..., 1]` flags where a kernel found them already (else a pass over `s` finds them)."""
    if bad is None: bad = ~torch.isfinite(s.detach().amax(-1, keepdim=True))   # (..., 1); masked keys are -inf, not bad
    if empty is not None: bad = bad & ~empty
    if bad.any(): p = p.masked_fill(bad, float('nan'))
    return _zero_empty_rows(p, empty)

def upcast(x):
    "Half-precision scores are normalised in float32."
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# %%
# `_any_key` is `any` over the keys: on causal, random, expanded and transposed masks, and with no keys at all
_g = torch.Generator().manual_seed(1)
for _m in ((torch.arange(9)[None, :] <= torch.arange(-2, 5)[:, None])[None, None], torch.rand(2, 3, 7, 9, generator=_g) > 0.8,
           (torch.rand(1, 9, generator=_g) > 0.5).expand(7, 9), (torch.rand(9, 7, generator=_g) > 0.7).t(), torch.ones(3, 0, dtype=torch.bool)):
    test_eq(torch.equal(_any_key(_m), _m.any(-1, keepdim=True)), True)

# %%
s = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
m = torch.tensor([[True, False, True], [False, False, False]])
ms, empty = mask_scores(s, m)
test_eq(ms[0].tolist(), [1., float('-inf'), 3.])
test_eq(ms[1].tolist(), [4., 5., 6.])            # empty row left finite ...
test_eq(empty.squeeze(-1).tolist(), [False, True])  # ... and flagged

# the same values, dtypes and gradients as `masked_fill`, the obvious way to write it, on a causal mask with an empty row
_g = torch.Generator().manual_seed(0)
for _dt in (torch.float32, torch.float64, torch.bfloat16):
    _s = torch.randn(2, 3, 5, 7, generator=_g).to(_dt).requires_grad_()
    _m = (torch.arange(7)[None, :] <= torch.arange(-1, 4)[:, None])[None, None]       # query 0 sees no key
    _ours, _e = mask_scores(_s, _m)
    _ref = _s.masked_fill(~(_m | ~_m.any(-1, keepdim=True)), float('-inf'))
    test_eq((_ours.dtype, torch.equal(_ours, _ref)), (_dt, True))
    _w = torch.randn(_ours.shape, generator=_g).to(_dt)
    _ga, = torch.autograd.grad(_ours.masked_fill(_ours.isinf(), 0).mul(_w).sum(), _s)
    _gb, = torch.autograd.grad(_ref.masked_fill(_ref.isinf(), 0).mul(_w).sum(), _s)
    assert torch.equal(_ga, _gb), _dt


# %% [markdown]
# **Empty inputs.** A batch of no examples (or no queries, or no keys) has nothing to normalise, but the mappings'
# iterations would still reduce over it, and a `max` over no rows raises. Every normalizer therefore returns empty scores as
# they are: an empty tensor of their shape and dtype, kept in the autograd graph of the scores and of any parameter the
# weights depend on (a learned $\alpha$), so that backward runs and gives that parameter a zero gradient.

# %%
#| export
def no_scores(scores, *params):
    """The weights of empty `scores` (a zero-size batch, query or key dimension): an empty tensor of their shape and
    dtype, in the graph of `scores` and of `params` (each broadcastable to `scores`), whose gradients come out empty or zero."""
    out = scores.clone()                                                # no values to compute
    for t in params: out = out + t.to(out.dtype)                        # broadcast to the (empty) shape of `scores`
    return out


# %%
e = torch.zeros(0, 2, 3, 3, dtype=torch.bfloat16, requires_grad=True)
a = torch.tensor([1.2, 1.7]).view(2, 1, 1).requires_grad_()
out = no_scores(e, a)
test_eq((out.shape, out.dtype), (e.shape, e.dtype))
out.sum().backward()
test_eq(e.grad.shape, e.shape); test_eq(a.grad, torch.zeros_like(a))
