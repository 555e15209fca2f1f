# %% [markdown]
# # Attention normalizers
# > Softmax, sparsemax, entmax-1.5, head-wise adaptive entmax and top-k softmax behind one registry, with exact gradients.

# %%
#| default_exp normalizers

# %% [markdown]
# Self-attention turns a row of scores $s = q K^\top / \sqrt{d}$ into a probability vector over keys. Both studies this
# project reproduces change only that step:
#
# * **Study A** (Canay 2026) swaps softmax for *sparse* mappings — sparsemax, entmax-1.5, a head-wise *learned* entmax
#   ($\alpha$ per head) and top-k softmax at three ratios — inside a tiny classifier.
# * **Study B** (Crisp Attention) masks the lowest scores before the softmax; that is top-k softmax with ratio
#   $1 - \text{sparsity}$, so the same code serves it.
#
# Every mapping lives here once and is registered through `register_normalizer` and reached by name through `get_normalizer`. All of them take
# `scores` of shape `[..., H, T_query, T_key]` and an optional boolean `key_mask` (broadcastable, `True` = may attend),
# and return probabilities of the same shape. Two rules hold for every normalizer:
#
# 1. a masked key gets exactly 0;
# 2. a query row with *no* valid key returns all zeros (never NaN), and its gradient is zero.
#
# **One mapping, two implementations.** Each sparse mapping is written here with torch operations — any dtype, any
# device; this is the reference that the tests below check against the `entmax` package in float64. For float32 on the
# CPU, the training case, the same algorithm runs row by row in a small C kernel (`sparse_attention_repro.kernels`) that
# keeps each row in cache across iterations: 5–15× faster at the paper's shapes. `kernels.use_kernels(False)` forces the
# torch path; the kernels notebook checks one against the other.

# %%
#| export
import copy, importlib, importlib.metadata, math, re
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable
import torch
import torch.nn as nn
from torch.autograd import Function
from sparse_attention_repro import kernels as K

# %%
from fastcore.test import test_eq, test_close, test_fail
import itertools, math
from sparse_attention_repro.study import PAPER_METHODS, ORIGINAL_GRADIENT_VARIANTS   # the study design (names only)
import entmax


# %% [markdown]
# ## Masks and empty rows
#
# Masked keys are set to $-\infty$ before a mapping runs: every mapping below gives $-\infty$ exactly zero probability
# (softmax: $e^{-\infty}=0$; sparsemax/entmax: $[-\infty-\tau]_+=0$). A row whose keys are *all* masked has no valid
# distribution, so it is computed as if nothing were masked (finite numbers, finite gradients) and zeroed afterwards.
#
# **Nothing hides a divergence.** A row whose scores contain a NaN or $+\infty$, or no finite score at all, becomes NaN
# in every normalizer, as it does in softmax: a model whose scores blow up must produce a non-finite loss (which training
# records as `failed_nonfinite_loss`), never plausible probabilities. $-\infty$ is an ordinary score: a key nobody attends.
# Half-precision inputs are computed in float32 and cast back: threshold iterations in bf16 would lose the support.

# %%
#| export
def _mask_scores(scores, key_mask):
    "Scores with masked keys at -inf (rows with no valid key left untouched) and the `[..., 1]` mask of such empty rows."
    if key_mask is None: return scores, None
    valid = key_mask.to(torch.bool)                            # broadcastable to (..., H, Tq, Tk)
    empty = ~valid.any(-1, keepdim=True)                       # (..., Tq|1, 1): read on the mask, not on its copy per head
    return scores.masked_fill(~(valid | empty), float('-inf')), empty

def _zero_empty_rows(p, empty):
    "Zero the rows that had no valid key (no copy of `p` when there is none: `empty` is read on the mask, a small tensor)."
    return p if empty is None or not empty.any() else p.masked_fill(empty, 0.)

def _finish(p, s, empty, bad=None):
    """Zero the rows with no valid key; make NaN every row whose scores hold a NaN or +inf or no finite value (as softmax
    does). `bad`: those rows' `[..., 1]` flags where a kernel found them already (else a pass over `s` finds them)."""
    if bad is None: bad = ~torch.isfinite(s.detach().amax(-1, keepdim=True))   # (..., 1); masked keys are -inf, not bad
    if empty is not None: bad = bad & ~empty
    if bad.any(): p = p.masked_fill(bad, float('nan'))
    return _zero_empty_rows(p, empty)

def _upcast(x):
    "Half-precision scores are normalised in float32."
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# %%
s = torch.tensor([[1., 2., 3.], [4., 5., 6.]])
m = torch.tensor([[True, False, True], [False, False, False]])
ms, empty = _mask_scores(s, m)
test_eq(ms[0].tolist(), [1., float('-inf'), 3.])
test_eq(ms[1].tolist(), [4., 5., 6.])            # empty row left finite ...
test_eq(empty.squeeze(-1).tolist(), [False, True])  # ... and flagged


# %% [markdown]
# **Empty inputs.** A batch of no examples (or no queries, or no keys) has nothing to normalise, but the iterations
# below would still reduce over it, and a `max` over no rows raises. Every normalizer therefore returns empty scores as
# they are: an empty tensor of their shape and dtype, kept in the autograd graph of the scores and of any parameter the
# weights depend on (a learned $\alpha$), so that backward runs and gives that parameter a zero gradient.

# %%
#| export
def _no_scores(scores, *params):
    """The weights of empty `scores` (a zero-size batch, query or key dimension): an empty tensor of their shape and
    dtype, in the graph of `scores` and of `params` (each broadcastable to `scores`), whose gradients come out empty or zero."""
    out = scores.clone()                                                # no values to compute
    for t in params: out = out + t.to(out.dtype)                        # broadcast to the (empty) shape of `scores`
    return out


# %%
e = torch.zeros(0, 2, 3, 3, dtype=torch.bfloat16, requires_grad=True)
a = torch.tensor([1.2, 1.7]).view(2, 1, 1).requires_grad_()
out = _no_scores(e, a)
test_eq((out.shape, out.dtype), (e.shape, e.dtype))
out.sum().backward()
test_eq(e.grad.shape, e.shape); test_eq(a.grad, torch.zeros_like(a))


# %% [markdown]
# ## Softmax — the dense baseline
#
# $\mathrm{softmax}(s)_i = e^{s_i} / \sum_j e^{s_j}$. Every key gets positive weight, so attention is never sparse.

# %%
#| export
def softmax(scores, key_mask=None):
    "Dense softmax over the last (key) dimension."
    if scores.numel() == 0: return _no_scores(scores)
    if key_mask is None: return torch.softmax(_upcast(scores), -1).to(scores.dtype)   # bad rows are NaN already
    s, empty = _mask_scores(_upcast(scores), key_mask)
    return _finish(torch.softmax(s, -1), s, empty).to(scores.dtype)


# %% [markdown]
# Without a key mask there are no empty rows, and torch's softmax already turns every row whose scores hold a NaN or
# $+\infty$, or no finite value, into NaN, which is all `_finish` would do; so that path skips it (a pass over the
# `[B, H, T, T]` scores, 0.14 ms of 0.34 at 96×4×17×17 and 0.65 of 3.3 ms at 96×4×97×97 in the forward, one thread). The
# check: the same values and NaNs as with `_finish`, on rows of every kind.

# %%
x = torch.randn(2, 4, 5, 7)
test_close(softmax(x), torch.softmax(x, -1))
bad = torch.randn(6, 7)
bad[0, 3], bad[1, 5], bad[2], bad[3, :4], bad[4, 2] = float("nan"), float("inf"), float("-inf"), float("inf"), float("-inf")
bad[5] = torch.tensor([1e30, -1e30, 3e38, 0, -3e38, 5, 1])
ref = _finish(torch.softmax(bad, -1), bad, None)
test_eq(softmax(bad).isnan(), ref.isnan()); test_eq(softmax(bad).nan_to_num(), ref.nan_to_num())
test_eq(softmax(bad).isnan().all(-1), torch.tensor([True, True, True, True, False, False]))
mask = torch.rand(2, 1, 1, 7) > 0.4
mask[..., 0] = True
test_close(softmax(x, mask), torch.softmax(x.masked_fill(~mask, -1e9), -1), eps=1e-6)


# %% [markdown]
# ## Sparsemax
#
# Sparsemax (Martins & Astudillo, 2016) is the Euclidean projection of the scores onto the probability simplex,
# $\mathrm{sparsemax}(s) = \mathrm{arg\,min}_{p \in \Delta} \lVert p - s \rVert^2 = [s - \tau]_+$.
# It is sparse because the projection lands on a face of the simplex: every score below the threshold $\tau$ gets
# exactly zero. $\tau$ solves $f(\tau) = \sum_i [z_i - \tau]_+ - 1 = 0$, a piecewise-linear, convex, decreasing function.
# We find it without sorting by **Michelot's algorithm** (Newton's method on $f$ from the left):
# $\tau \leftarrow \tau + f(\tau)/|S(\tau)|$ with $S(\tau) = \{i : z_i > \tau\}$, i.e. $\tau \leftarrow (\sum_{S} z - 1)/|S|$.
# Starting from $\tau_0 = \max(\bar z - 1/T, \max z - 1) \le \tau^*$, the support only shrinks, and once it stops
# changing the threshold is *exact* — typically after 3–6 passes, each a handful of element-wise operations, which on a
# CPU is several times cheaper than sorting every row (see `sparse-repro bench normalizers`).
#
# **Gradient.** On the support $S$ the map is $p_S = s_S - \tau$ with $\tau = (\sum_S s - 1)/|S|$, so the Jacobian is
# $\mathrm{diag}(\mathbb 1_S) - \mathbb 1_S \mathbb 1_S^\top / |S|$ and the backward pass is
# $\partial s = \mathbb 1_S \odot (g - \overline{g}_S)$, where $\overline{g}_S$ is the mean of the incoming gradient over the support.

# %%
#| export
def _sparsemax_threshold(z):
    "Exact threshold tau `[..., 1]` of sparsemax for rows `z` (row max 0, -inf allowed), by Michelot's algorithm."
    tau = ((z.clamp_min(-1e4).sum(-1, keepdim=True) - 1) / z.shape[-1]).clamp_min(-1.0)     # (..., 1) <= tau*
    k = None
    for _ in range(z.shape[-1] + 1):                     # the support shrinks at least by one per pass
        d = (z - tau).clamp_min(0)                                               # (..., T)
        k_new = (d > 0).sum(-1, keepdim=True)                                    # support size at tau
        if k is not None and torch.equal(k_new, k): break                        # support stable: tau is exact
        k, tau = k_new, tau + (d.sum(-1, keepdim=True) - 1) / k_new
    return tau

class SparsemaxFunction(Function):
    "Sparsemax over the last dim with the closed-form backward."
    @staticmethod
    def forward(ctx, x):
        if K.usable(x): p = K.sparsemax_fwd(x)
        else:
            z = x - x.amax(-1, keepdim=True)
            p = (z - _sparsemax_threshold(z)).clamp_min(0)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        p, = ctx.saved_tensors
        if K.usable(g): return K.sparsemax_bwd(p, g)
        supp = (p > 0).to(g.dtype)
        g = g * supp
        return g - supp * (g.sum(-1, keepdim=True) / supp.sum(-1, keepdim=True))

def sparsemax(scores, key_mask=None):
    "Sparsemax over keys: Euclidean projection onto the simplex."
    if scores.numel() == 0: return _no_scores(scores)
    s, empty = _mask_scores(_upcast(scores), key_mask)
    return _finish(SparsemaxFunction.apply(s), s, empty).to(scores.dtype)


# %% [markdown]
# The forward agrees with the `entmax` package and with a brute-force projection (solve for $\tau$ by trying every support size):

# %%
def brute_sparsemax(row):
    "Try every k; keep the threshold whose support is self-consistent."
    for k in range(len(row), 0, -1):
        top = sorted(row, reverse=True)[:k]
        tau = (sum(top) - 1) / k
        if top[-1] > tau: return [max(v - tau, 0.) for v in row]

x = torch.randn(3, 2, 4, 9, dtype=torch.float64) * 2
test_close(sparsemax(x), entmax.sparsemax(x, dim=-1), eps=1e-10)
test_close(sparsemax(x)[0, 0, 0], torch.tensor(brute_sparsemax(x[0, 0, 0].tolist()), dtype=torch.float64), eps=1e-10)
assert (sparsemax(x) == 0).any(), "sparsemax must produce exact zeros"


# %% [markdown]
# ## Entmax-1.5
#
# $\alpha$-entmax (Peters et al., 2019) replaces the Shannon entropy in softmax's variational form by Tsallis'
# $\alpha$-entropy: $\alpha\text{-entmax}(s) = [(\alpha-1)s - \tau]_+^{1/(\alpha-1)}$ with $\tau$ chosen so the result sums
# to one. $\alpha=1$ is softmax, $\alpha=2$ sparsemax; at $\alpha = 1.5$ the exponent is 2: with $z = (s - \max s)/2$,
# $\tau$ solves $f(\tau) = \sum_i [z_i - \tau]_+^2 - 1 = 0$. The original study computed this by 18 bisection steps
# with autograd through the loop. We solve it by **Newton's method from $\tau_0 = -1$**: $f$ is convex and decreasing,
# $f(-1) \ge 0$, so the iterates rise monotonically to the root without overshooting and converge quadratically; we
# stop when a step no longer moves $\tau$ by more than a few ulps (5–7 steps), and renormalise. No sort, no autograd
# through the loop: the agreement with the `entmax` package's exact sort-based algorithm is checked below.
#
# **Gradient.** Differentiating $p_i^{1/2} = z_i - \tau$ on the support gives, with $w = \sqrt{p}$ (zero off the support),
# $\partial s = w \odot g - w \,\frac{\langle w, g\rangle}{\sum w}$.

# %%
#| export
def _entmax15_threshold(z, max_iter=K.ENTMAX15_ITERS):
    "Threshold tau `[..., 1]` of 1.5-entmax for `z = (s - max)/2` (-inf allowed), by Newton's method from the left."
    tau = z.new_full(z.shape[:-1] + (1,), -1.0)                                  # f(-1) >= 0
    tol = 4 * torch.finfo(z.dtype).eps
    for _ in range(max_iter):
        d = (z - tau).clamp_min(0)                                               # (..., T)
        step = ((d * d).sum(-1, keepdim=True) - 1) / (2 * d.sum(-1, keepdim=True))
        tau = tau + step
        if step.abs().max() <= tol: break
    return tau

def _entmax_backward(p, g, exponent):
    "Backward of alpha-entmax: w = p**(2 - alpha) on the support, grad = w*g - w*<w,g>/sum(w)."
    w = torch.where(p > 0, p.pow(exponent), torch.zeros_like(p))
    wg = w * g
    return wg - w * (wg.sum(-1, keepdim=True) / w.sum(-1, keepdim=True))

class Entmax15Function(Function):
    "1.5-entmax over the last dim: Newton threshold, closed-form backward."
    @staticmethod
    def forward(ctx, x):
        if K.usable(x): p = K.entmax15_fwd(x)
        else:
            z = (x - x.amax(-1, keepdim=True)) / 2
            p = (z - _entmax15_threshold(z)).clamp_min(0) ** 2
            p = p / p.sum(-1, keepdim=True)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, g):
        p, = ctx.saved_tensors
        return K.entmax_bwd(p, g)[0] if K.usable(g) else _entmax_backward(p, g, 0.5)

def entmax15(scores, key_mask=None):
    "1.5-entmax over keys."
    if scores.numel() == 0: return _no_scores(scores)
    s, empty = _mask_scores(_upcast(scores), key_mask)
    return _finish(Entmax15Function.apply(s), s, empty).to(scores.dtype)


# %%
x = torch.randn(3, 2, 4, 9, dtype=torch.float64) * 3
test_close(entmax15(x), entmax.entmax15(x, dim=-1), eps=1e-10)
test_close(entmax15(x), entmax.entmax_bisect(x, 1.5, dim=-1, n_iter=100), eps=1e-10)
assert (entmax15(x) == 0).any() and (entmax15(x) > 0).sum() > (sparsemax(x) > 0).sum(), "1.5-entmax is sparse but denser than sparsemax"


# %% [markdown]
# ## Head-wise adaptive entmax (HAE)
#
# Study A's adaptive variant learns one $\alpha$ per head, $\alpha = 1.05 + 0.90\,\sigma(a)$ with $a$ initialised at 0
# (so every head starts at 1.5 and stays in $(1.05, 1.95)$); the study reports the mean learned $\alpha$.
# For general $\alpha$ the threshold has no closed form. We solve $f(\tau) = \sum_i [z_i - \tau]_+^{\beta} - 1 = 0$,
# $\beta = 1/(\alpha-1)$, $z = (\alpha-1)(s - \max s)$, by **Newton's method from $\tau_0 = -1$**: $f$ is convex and decreasing
# and $f(-1) \ge 0$, so the iterates rise monotonically to the root without overshooting; we stop when a step moves
# $\tau$ by no more than a few ulps (about 10 steps reach float64 round-off for every $\alpha \in (1.05, 1.95)$ at the
# study's sequence lengths; at most `n_iter`, `ENTMAX_ALPHA_ITERS` by default), and renormalise the output to sum exactly
# to one. The derivative $f'$ counts only the keys on the support: at $\alpha = 2$ an off-support key would add
# $0^0 = 1$ and slow the steps down, above 2 it would add $0^{\beta-1} = \infty$ (NaN).
#
# **$\alpha > 2$** ($\beta < 1$) needs another route: $f$ is then concave between the scores and each key enters it with
# infinite slope, so Newton on $\tau$ overshoots and can leave every key behind. Here we first find the support exactly:
# with the scores sorted, the $k$-th largest is kept iff $f(z_{(k)}) < 0$, which is monotone in $k$, so a binary search
# over $k$ ($\lceil\log_2 T\rceil$ passes) finds the smallest kept score $x_{(k)}$. On that support we solve for
# $v = \log p_{(k)}$, the log-probability of that key, instead of $\tau$: with $c_i = (\alpha-1)(x_i - x_{(k)}) \ge 0$,
# $p_i^{\alpha-1} = c_i + p_{(k)}^{\alpha-1}$, so $\log p_i = \beta \log(c_i + e^{(\alpha-1)v})$ (a `logaddexp`), and
# $\varphi(v) = \sum_i p_i - 1$ is increasing and convex. Newton starts right of the root, at
# $p_{(k)} = (1 - \sum_i c_i^{\beta})/m$ with $m$ the keys that tie with $x_{(k)}$, and falls monotonically to it (at most
# 9 steps to round-off in our checks, 1 at $\alpha = 50$).
#
# *Why these coordinates.* For large $\alpha$ the weights hang on tiny numbers: $p_i^{\alpha-1}$ is $10^{-15}$ for
# $p_i = \frac12$ at $\alpha = 50$, and a key with $p_i = 0.014$ sits $10^{-91}$ above $\tau$. A threshold $\tau$ stored
# to an ulp of a number near 1 loses them (the `entmax` package's bisection, given float64 scores, is off by up to 0.3
# at $\alpha = 50$, below); so did this route's earlier float32 differences $z_i - z_{(k)}$ of scores scaled from the
# maximum, and its power $p_{(k)}^{\alpha-1}$ underflowed: 17 equal float32 scores came out NaN at $\alpha = 50$, and
# random float32 rows were off by up to 0.1. Here $c_i$ comes from the scores with two roundings, every term is a sum of
# non-negative numbers, and only the logarithm of $p_{(k)}^{\alpha-1}$ is stored: float32 is within $2 \cdot 10^{-7}$ of
# the exact weights at every $\alpha$ checked below.
#
# **Near $\alpha = 1$**, Newton on $\tau$ loses digits the other way: $p_i = (z_i - \tau)^{\beta}$ with $\beta$ large, so
# one ulp of $z_i - \tau \approx 1$ becomes $\beta$ ulps of $p_i$ ($8\cdot10^{-6}$ at $\alpha = 1.001$ in float32). Below
# $\alpha = 1.04$ (`ENTMAX_ALPHA_NEAR_ONE`, just under the adaptive entmax's range $(1.05, 1.95)$, float32's 1.05
# included) we solve for $v = \log p_{\max}$ instead: $\log p_i = v + \beta\,\mathrm{log1p}\big(-(\alpha-1)(\max_j x_j - x_i)\,e^{-(\alpha-1)v}\big)$, and
# $\varphi(v) = \sum_i p_i - 1$ is again increasing and convex, with $\varphi(0) \ge 0$: Newton from $v = 0$ (at most 11
# steps in our checks). It takes 1.6–2.3× as long as Newton on $\tau$ on the CPU, so the adaptive entmax's range keeps
# the latter, bit for bit as before. The float32 C kernel runs Newton on $\tau$ only, so a call with some
# $\alpha \notin [1.04, 2]$ takes the torch path.
#
# **Gradients by implicit differentiation** (no autograd through the iterations). For the scores the formula is
# entmax-1.5's with $w = p^{2-\alpha}$. For $\alpha$, differentiating the optimality condition gives (Correia et al., 2019)
# $$\frac{\partial p_i}{\partial\alpha} = \frac{p_i - \tilde p_i}{(\alpha-1)^2} - \frac{p_i \log p_i - \tilde p_i \sum_j p_j\log p_j}{\alpha - 1},
# \qquad \tilde p = w / \textstyle\sum w,$$
# which is contracted with the incoming gradient and summed over everything that shares the head's $\alpha$.
# At large $\alpha$ this backward is ill-conditioned as written: $w = p^{2-\alpha}$ spans many orders of magnitude across
# a row, and where one key's $w$ dominates, $w \odot (g - \langle w, g\rangle/\sum w)$ cancels. Measured on random rows
# of 9 keys, the scores' gradient loses digits from $\alpha \approx 4$ in float32 ($10^{-4}$ relative at 4, all of them
# at 6) and from $\alpha \approx 8$ in float64 (all at 10); the weights themselves are exact at every $\alpha$.

# %%
#| export
def _sum_to_shape(t, shape):
    "Sum a broadcast gradient back down to `shape`."
    while t.dim() > len(shape): t = t.sum(0)
    for d, n in enumerate(shape):
        if n == 1 and t.shape[d] != 1: t = t.sum(d, keepdim=True)
    return t

ENTMAX_ALPHA_ITERS = 30   # alpha-entmax's Newton steps at most (it stops at a few ulps, in about 10)
ENTMAX_ALPHA_NEAR_ONE = 1.04   # below it alpha-entmax solves for log p_max (Newton on tau loses 1/(alpha - 1) ulps)

def _entmax_alpha_convex(z, alpha, n_iter=ENTMAX_ALPHA_ITERS):
    "Unnormalised alpha-entmax, 1 < alpha <= 2, of `z = (s - max)(alpha - 1)` (-inf allowed): Newton on tau from -1."
    beta = 1 / (alpha - 1)
    tau = torch.full_like(z[..., :1], -1.0)                             # f(-1) >= 0: start left of the root
    tol = 4 * torch.finfo(z.dtype).eps
    for _ in range(n_iter):
        d = (z - tau).clamp_min(0)
        d_pow = torch.where(d > 0, d.pow(beta - 1), torch.zeros_like(d))  # d^(beta-1) on the support only (0^0 = 1 at alpha 2)
        step = ((d_pow * d).sum(-1, keepdim=True) - 1) / (beta * d_pow.sum(-1, keepdim=True))
        tau = tau + step
        if step.abs().max() <= tol: break                                # converged to round-off
    return (z - tau).clamp_min(0).pow(beta)

def _newton_done(phi, step, v, tol):
    "Every row's Newton on a log-probability `v` has converged: the weights sum to 1, or `v` moved by a few ulps."
    return bool(((phi.abs() <= tol) | (step.abs() <= tol * v.abs().clamp_min(1)) | ~torch.isfinite(step)).all())

def _entmax_alpha_near_one(x, alpha, n_iter=ENTMAX_ALPHA_ITERS):
    """Unnormalised alpha-entmax, 1 < alpha <= 2, of scores `x` (-inf allowed): Newton on v = log p_max from 0, with
    log p_i = v + beta log1p(-(alpha - 1)(max x - x_i) e^(-(alpha - 1) v)); accurate however close alpha is to 1."""
    a, beta = alpha - 1, 1 / (alpha - 1)
    gap = a * (x.amax(-1, keepdim=True) - x)                            # (..., T) >= 0; inf for a -inf key
    def weights(v):
        q = (gap * torch.exp(-a * v)).clamp_max(1)                      # (..., T); a key is on the support iff q < 1
        return q, torch.exp(v + beta * torch.log1p(-q))                 # p_i; 0 off the support
    v = torch.zeros_like(x[..., :1])                                    # p_max = 1: phi(0) >= 0, right of the root
    tol = 4 * torch.finfo(x.dtype).eps
    for _ in range(n_iter):
        q, p = weights(v)
        phi = p.sum(-1, keepdim=True) - 1
        step = phi / torch.where(q < 1, p / (1 - q), torch.zeros_like(p)).sum(-1, keepdim=True)   # dp_i/dv = p_i / (1 - q_i)
        v = v - step
        if _newton_done(phi, step, v, tol): break
    return weights(v)[1]

def _entmax_alpha_concave(x, alpha, n_iter=ENTMAX_ALPHA_ITERS):
    """Unnormalised alpha-entmax, alpha >= 2, of scores `x` (-inf allowed): the support by a binary search over the
    sorted keys, then Newton on v = log p_k, the log-probability of the smallest kept key x_k, where
    p_i^(alpha - 1) = (alpha - 1)(x_i - x_k) + p_k^(alpha - 1)."""
    a, beta, n = alpha - 1, 1 / (alpha - 1), x.shape[-1]
    xs = x.sort(-1, descending=True).values
    def above(xm): return torch.where(x > xm, a * (x - xm), torch.zeros_like(x))   # (alpha - 1)(x_i - x_m)_+, from the scores
    on_k = torch.zeros(x.shape[:-1] + (1,), dtype=torch.long, device=x.device)   # a key known to be kept (the max) ...
    off_k = torch.full_like(on_k, n)                                              # ... and one known dropped (or n)
    for _ in range(max(1, math.ceil(math.log2(n)))):
        mid = (on_k + off_k) // 2
        xm = xs.gather(-1, mid.clamp_max(n - 1))
        kept = (above(xm).pow(beta).sum(-1, keepdim=True) < 1) & (mid < off_k)   # f(z_mid) < 0
        on_k, off_k = torch.where(kept, mid, on_k), torch.where(kept, off_k, torch.maximum(mid, on_k + 1))
    xk = xs.gather(-1, on_k)                                            # the smallest kept score
    on, c = x >= xk, above(xk)                                          # p_i^a = c_i + p_k^a on the support
    log_c = c.log()                                                     # -inf at x_k, its ties and off the support
    def weights(v):
        lu = torch.logaddexp(log_c, a * v)                              # log p_i^a
        return lu, torch.where(on, (beta * lu).exp(), torch.zeros_like(lu))
    v = ((1 - c.pow(beta).sum(-1, keepdim=True)) / (x == xk).sum(-1, keepdim=True)).log()   # p_k <= that: right of the root
    tol = 4 * torch.finfo(x.dtype).eps
    for _ in range(n_iter):
        lu, p = weights(v)
        phi = p.sum(-1, keepdim=True) - 1
        step = phi / (p * (a * v - lu).exp()).sum(-1, keepdim=True)    # dp_i/dv = p_i p_k^a / p_i^a
        v = v - step
        if _newton_done(phi, step, v, tol): break
    return weights(v)[1]

def _entmax_alpha_rows(x, alpha, n_iter=ENTMAX_ALPHA_ITERS):
    """Unnormalised alpha-entmax of scores `x`, each row by the method for its alpha (broadcastable to `x[..., :1]`).
    A method runs only if some row needs it, on all rows with alpha clamped to its range; the other rows are discarded."""
    lo, hi = ENTMAX_ALPHA_NEAR_ONE, 2.0
    methods = [(alpha < lo, alpha.clamp_max(lo), lambda a: _entmax_alpha_near_one(x, a, n_iter)),
               ((alpha >= lo) & (alpha <= hi), alpha.clamp(lo, hi),
                lambda a: _entmax_alpha_convex((x - x.amax(-1, keepdim=True)) * (a - 1), a, n_iter)),   # z: max 0
               (alpha > hi, alpha.clamp_min(hi), lambda a: _entmax_alpha_concave(x, a, n_iter))]
    p = None
    for rows, a, method in methods:
        if rows.any(): p = method(a) if p is None else torch.where(rows, method(a), p)
    return p

class EntmaxAlphaFunction(Function):
    """alpha-entmax over the last dim for a tensor `alpha` (broadcastable, size 1 on that dim): Newton forward, implicit backward.
    Returns the weights and the `[..., 1]` flags of the rows softmax makes NaN (for `_finish`; the kernel finds them)."""
    @staticmethod
    def forward(ctx, x, alpha, n_iter=ENTMAX_ALPHA_ITERS):
        alpha_shape = alpha.shape
        alpha = alpha.to(x.dtype)
        ctx.alpha_shape = alpha_shape
        if K.usable(x) and ((alpha >= ENTMAX_ALPHA_NEAR_ONE) & (alpha <= 2)).all():   # the kernel runs Newton on tau
            p, bad = K.entmax_alpha_fwd(x, alpha.expand(x.shape[:-1] + (1,)), n_iter, flags=True)   # flags: softmax's NaN rows
            ctx.save_for_backward(p, alpha)
            ctx.mark_non_differentiable(bad)
            return p, bad
        p = _entmax_alpha_rows(x, alpha, n_iter)
        p = p / p.sum(-1, keepdim=True)
        ctx.save_for_backward(p, alpha)
        bad = ~torch.isfinite(x.detach().amax(-1, keepdim=True))
        ctx.mark_non_differentiable(bad)
        return p, bad

    @staticmethod
    def backward(ctx, g, _):
        p, alpha = ctx.saved_tensors
        if K.usable(g):
            dx, da = K.entmax_bwd(p, g, alpha.expand(p.shape[:-1] + (1,)), d_alpha=ctx.needs_input_grad[1])
            return dx, None if da is None else _sum_to_shape(da, ctx.alpha_shape), None
        dx = _entmax_backward(p, g, 2 - alpha)
        d_alpha = None
        if ctx.needs_input_grad[1]:
            w = torch.where(p > 0, p.pow(2 - alpha), torch.zeros_like(p))
            p_skew = w / w.sum(-1, keepdim=True)
            plogp = torch.where(p > 0, p * torch.log(p), torch.zeros_like(p))
            ent = plogp.sum(-1, keepdim=True)
            dp_dalpha = (p - p_skew) / (alpha - 1) ** 2 - (plogp - p_skew * ent) / (alpha - 1)
            d_alpha = _sum_to_shape((g * dp_dalpha).sum(-1, keepdim=True), ctx.alpha_shape)
        return dx, d_alpha, None

def entmax_alpha(scores, alpha, key_mask=None, n_iter=ENTMAX_ALPHA_ITERS):
    "alpha-entmax over keys; `alpha` is a float or a tensor broadcastable to `scores[..., :1]` (e.g. `[H, 1, 1]`), all > 1 and finite."
    s, empty = _mask_scores(_upcast(scores), key_mask)
    if not torch.is_tensor(alpha): alpha = torch.tensor(float(alpha), dtype=s.dtype, device=s.device)
    if not ((alpha > 1) & (alpha < math.inf)).all():
        raise ValueError(f"entmax_alpha needs every alpha > 1 and finite (got {alpha.min().item()} to {alpha.max().item()}); use softmax for alpha = 1")
    if s.numel() == 0: return _no_scores(scores, alpha)
    p, bad = EntmaxAlphaFunction.apply(s, alpha, n_iter)              # and the rows softmax makes NaN, found on the way
    return _finish(p, s, empty, bad).to(scores.dtype)


# %% [markdown]
# Agreement with `entmax.entmax_bisect` (values and both gradients) for a different $\alpha$ per head,
# across the whole admissible range:

# %%
torch.manual_seed(0)
x = torch.randn(2, 4, 5, 17, dtype=torch.float64, requires_grad=True)
alpha = torch.tensor([1.06, 1.3, 1.5, 1.94], dtype=torch.float64).view(4, 1, 1).requires_grad_()
ours = entmax_alpha(x, alpha)
ref = entmax.entmax_bisect(x, alpha, dim=-1, n_iter=100)
test_close(ours, ref, eps=1e-10)
g = torch.randn_like(ours)
gx, ga = torch.autograd.grad((ours * g).sum(), (x, alpha))
rx, ra = torch.autograd.grad((ref * g).sum(), (x, alpha))
test_close(gx, rx, eps=1e-8)
test_close(ga, ra, eps=1e-8)
test_eq(ga.shape, alpha.shape)

# %% [markdown]
# The $\alpha$-gradient is also checked against finite differences, independent of the `entmax` package:

# %%
xs = x.detach()
f = lambda a: (entmax_alpha(xs, a) * g).sum()
eps = 1e-6
e1 = torch.zeros_like(alpha); e1[1] = eps
fd = (f(alpha.detach() + e1) - f(alpha.detach() - e1)) / (2 * eps)
test_close(ga[1], fd, eps=1e-6)

# %% [markdown]
# Every $\alpha > 1$, not only the learned range: above 2 the threshold is found on the exact support (a key far below it
# once made the whole row NaN), at 2 the off-support keys no longer slow Newton down; both the torch path (float64) and the
# float32 path (the C kernel up to $\alpha = 2$) are checked against `entmax.entmax_bisect`, with a masked key:

# %%
torch.manual_seed(1)
x = torch.randn(4, 7, dtype=torch.float64) * 2
x[1, 3] = -50.                                                          # a key far outside the support
m = torch.ones(4, 7, dtype=torch.bool); m[:, 2] = False                # a masked key in every row
xf = x.float()
for a in (1.25, 1.5, 2.0, 2.25, 3.0):
    test_close(entmax_alpha(x, a, m), entmax.entmax_bisect(x.masked_fill(~m, -math.inf), a, dim=-1, n_iter=100), eps=1e-10)
    ref32 = entmax.entmax_bisect(xf.double().masked_fill(~m, -math.inf), a, dim=-1, n_iter=100)
    test_close(entmax_alpha(xf, a, m).double(), ref32, eps=1e-6)      # float32: the C kernel for alpha <= 2
    assert (entmax_alpha(xf, a, m)[:, 2] == 0).all() and (entmax_alpha(x, a, m)[1, 3] == 0)
test_eq(entmax_alpha(torch.tensor([[0., -1.]], dtype=torch.float64), 2.25).tolist(), [[1., 0.]])
test_fail(lambda: entmax_alpha(x, 1.0), contains="alpha > 1")

# %% [markdown]
# The backward's formula holds above 2 as well (finite differences, both inputs):

# %%
a25 = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(lambda u, b: entmax_alpha(u, b, m), (x.clone().requires_grad_(), a25))


# %% [markdown]
# **Large $\alpha$, and $\alpha$ near 1, in both precisions.** The reference is the `entmax` package's bisection in
# float64 with 1100 halvings (down to float64's smallest numbers), given each row shifted so that its smallest kept score
# is 0. Entmax does not change under a shift, and the bisection finds $\tau$ only to an ulp of its magnitude, which at
# $\alpha = 50$ is more than the weights carry: unshifted, it gives the two keys below 0.66 and 0.34 instead of 0.986
# and 0.014. The smallest kept key is found by brute force (key $m$ is kept iff
# $\sum_{x_i > x_m} ((\alpha-1)(x_i - x_m))^{\beta} < 1$). Rows of float32 values scaled from $0.1/(\alpha-1)$ (nearly
# uniform) to $10/(\alpha-1)$ (a key or two), widths 1, 2, 17 and 97, with and without masked keys: float32 within
# $5 \cdot 10^{-7}$ of the exact weights (1.2e-7 measured), float64 within $10^{-12}$.

# %%
def kept_floor(x, alpha):
    "The smallest kept score of each row `x` (float64, -inf masked), by brute force over the keys."
    d = ((alpha - 1) * (x.unsqueeze(-2) - x.unsqueeze(-1))).clamp_min(0)        # [..., m, i]: (alpha - 1)(x_i - x_m)_+
    f = torch.nan_to_num(d.pow(1 / (alpha - 1)), nan=0.).sum(-1)               # f(z_m) + 1; a masked key m: inf
    return torch.where(f < 1, x, math.inf).amin(-1, keepdim=True)

def exact_entmax(x, alpha):
    "alpha-entmax of float64 rows by the package's bisection, each row shifted so its smallest kept score is 0."
    return entmax.entmax_bisect(x - kept_floor(x, alpha), alpha, dim=-1, n_iter=1100)

two = torch.tensor([[1 + 0.5 / 49, 1.]], dtype=torch.float64)                   # (alpha - 1)(x_0 - x_1) = 0.5
p2 = (49 * (two[0, 0] - 1)) ** (1 / 49)                                          # p_0^49 - p_1^49 = 0.5, p_1^49 ~ 1e-91
test_close(entmax_alpha(two, 50.), torch.tensor([[p2, 1 - p2]]), eps=1e-14)
test_close(exact_entmax(two, 50.), torch.tensor([[p2, 1 - p2]]), eps=1e-14)
unshifted = entmax.entmax_bisect(two, 50., dim=-1, n_iter=1100)                 # tau to an ulp of 0.5: 0.66, 0.34
assert (unshifted[0, 0] - p2).abs() > 0.3, unshifted
test_close(entmax_alpha(torch.zeros(1, 17), 50.), torch.full((1, 17), 1 / 17), eps=1e-7)   # was NaN in float32
torch.manual_seed(2)
for alpha in (1.0001, 1.01, 1.5, 2.0, 3.0, 10.0, 50.0):
    for T in (1, 2, 17, 97):
        x = (torch.randn(64, T) * torch.logspace(-1, 1, 64).view(-1, 1) / (alpha - 1)).double()   # float32 values
        for m in (None, torch.rand(64, T) > 0.3):
            if m is not None: m[:, 0] = True                                      # every row keeps a valid key
            ref = exact_entmax(x if m is None else x.masked_fill(~m, -math.inf), alpha)
            test_close(entmax_alpha(x, alpha, m), ref, eps=1e-12)
            test_close(entmax_alpha(x.float(), alpha, m).double(), ref, eps=5e-7)
test_close(entmax_alpha(x, 1 + 1e-9), torch.softmax(x, -1), eps=1e-7)         # alpha -> 1 is softmax
test_fail(lambda: entmax_alpha(x, math.inf), contains="finite")

# %% [markdown]
# ## The original study's entmax: 18 bisection steps, gradient through the loop
#
# The original study computed entmax-1.5 and the head-wise adaptive entmax by **bisection** — 18 halvings of the bracket
# $[\tau_{lo}, \tau_{hi}] = [\max x - 1,\ \max x - T^{-(\alpha-1)}]$ on $x = (\alpha-1)s$, the output taken at the last
# midpoint and renormalised (the `entmax` package's `entmax_bisect` forward) — and let autograd differentiate *through
# the loop*. Its forward agrees with the exact mapping to about $10^{-4}$, but its gradient is not the gradient of entmax:
# each step's decision (which half holds the root) is piecewise constant, so autograd sees
# $\tau = \max x - 1 + D(\alpha)\,c$ with $D(\alpha) = 1 - T^{-(\alpha-1)}$ and a constant $c \in [0, 1)$ fixed by the
# decisions. The threshold's gradient flows only into the *largest* score (through $\max x$), instead of being shared over
# the support as the implicit-function gradient is. We keep the exact gradient as the default and offer the original's as
# the named variants `entmax15_bisect` and `headwise_adaptive_entmax_bisect`, so the effect of this approximation on the
# paper's conclusions can be measured.
#
# The variant's backward is that derivation written out. With $u = [x - \tau]_+$, $q = u^{\beta}$ ($\beta = 1/(\alpha-1)$),
# $S = \sum q$, $p = q/S$ and incoming gradient $g$: $\bar q = (g - \langle g, p\rangle)/S$,
# $r = \bar q\,\beta u^{\beta-1}$ on the support, $\partial x = r$, $\partial\tau = -\sum r$, added to the arg-max entry of
# $x$; then $\partial s = (\alpha-1)\,\partial x$ and
# $\partial\alpha = \sum_i \partial x_i s_i + \partial\tau\, c\, D'(\alpha) - (\alpha-1)^{-2}\sum_i \bar q_i q_i \log u_i$.
# It is checked below against autograd through the 18 steps in float64, so it *is* the original's gradient, only without
# storing 18 copies of the attention map.

# %%
#| export
ORIGINAL_BISECT_STEPS = 18   # bisection steps of the original study's entmax

class EntmaxBisectFunction(Function):
    "alpha-entmax by bisection (the original study's forward) with the gradient autograd takes through the loop."
    @staticmethod
    def forward(ctx, s, alpha, n_iter=ORIGINAL_BISECT_STEPS):
        alpha_shape, a = alpha.shape, (alpha.to(s.dtype) - 1)                  # a = alpha - 1, broadcastable to (..., 1)
        x = s * a                                                               # (..., T)
        max_val, arg = x.max(-1, keepdim=True)                                  # (..., 1)
        d = s.shape[-1]
        D = 1 - d ** (-a)                                                       # bracket width tau_hi - tau_lo
        beta = 1 / a
        tau_lo = max_val - 1
        f_lo = (x - tau_lo).clamp_min(0).pow(beta).sum(-1, keepdim=True) - 1
        c_lo, dm, dc = torch.zeros_like(max_val), D.expand_as(max_val), torch.ones_like(max_val)
        for _ in range(n_iter):
            dm, dc = dm / 2, dc / 2
            tau_m, c_m = tau_lo + dm, c_lo + dc
            p = (x - tau_m).clamp_min(0).pow(beta)
            keep = ((p.sum(-1, keepdim=True) - 1) * f_lo) >= 0
            tau_lo, c_lo = torch.where(keep, tau_m, tau_lo), torch.where(keep, c_m, c_lo)
        S = p.sum(-1, keepdim=True)
        out = p / S
        ctx.alpha_shape = alpha_shape
        ctx.save_for_backward(s, a.expand_as(max_val), tau_m, c_m, arg, S)
        return out

    @staticmethod
    def backward(ctx, g):
        s, a, tau, c, arg, S = ctx.saved_tensors
        beta = 1 / a
        u = (s * a - tau).clamp_min(0)                                          # (..., T)
        supp = u > 0
        q = u.pow(beta)
        p = q / S
        gq = (g - (g * p).sum(-1, keepdim=True)) / S
        r = torch.where(supp, gq * beta * u.pow(beta - 1), torch.zeros_like(u))
        dtau = -r.sum(-1, keepdim=True)
        dx = r.scatter_add(-1, arg, dtau)                                       # tau = max x - 1 + D c: only the max entry
        ds = dx * a
        da = None
        if ctx.needs_input_grad[1]:
            d = s.shape[-1]
            dD = math.log(d) * d ** (-a)
            logu = torch.where(supp, u, torch.ones_like(u)).log()
            da = ((dx * torch.where(dx != 0, s, torch.zeros_like(s))).sum(-1, keepdim=True) + dtau * c * dD
                  - (gq * q * logu).sum(-1, keepdim=True) / (a * a))
            da = _sum_to_shape(da, ctx.alpha_shape)
        return ds, da, None

def entmax_bisect(scores, alpha, key_mask=None, n_iter=ORIGINAL_BISECT_STEPS):
    "alpha-entmax over keys as the original study computed it: bisection, gradient through the loop (see above)."
    alpha = torch.as_tensor(alpha, dtype=torch.float32 if scores.dtype in (torch.float16, torch.bfloat16) else scores.dtype)
    if scores.numel() == 0: return _no_scores(scores, alpha)
    s, empty = _mask_scores(_upcast(scores), key_mask)
    return _finish(EntmaxBisectFunction.apply(s, alpha.to(s.device), n_iter), s, empty).to(scores.dtype)


# %% [markdown]
# The check: the same 18 steps written with plain torch operations and differentiated by autograd (as the original
# did) give the same output and the same gradients for the scores and for a per-head $\alpha$; the forward is the
# `entmax` package's `entmax_bisect` at 18 iterations; and the gradient differs from the exact one by tens of percent.

# %%
def autograd_bisect(x, alpha, n_iter=18):
    "Reference: bisection with autograd through every step (as `entmax.entmax_bisect`'s forward, without its custom backward)."
    X = x * (alpha - 1)
    max_val, _ = X.max(-1, keepdim=True)
    tau_lo, tau_hi = max_val - 1, max_val - (1 / x.shape[-1]) ** (alpha - 1)
    f_lo = (X - tau_lo).clamp_min(0).pow(1 / (alpha - 1)).sum(-1, keepdim=True) - 1
    dm = tau_hi - tau_lo
    for _ in range(n_iter):
        dm = dm / 2
        tau_m = tau_lo + dm
        p_m = (X - tau_m).clamp_min(0).pow(1 / (alpha - 1))
        mask = ((p_m.sum(-1, keepdim=True) - 1) * f_lo) >= 0
        tau_lo = torch.where(mask, tau_m, tau_lo)
    return p_m / p_m.sum(-1, keepdim=True)

torch.manual_seed(0)
x = (torch.randn(3, 4, 6, 17, dtype=torch.float64) * 2).requires_grad_()
alpha = torch.tensor([1.2, 1.5, 1.7, 1.9], dtype=torch.float64).view(4, 1, 1).requires_grad_()
g = torch.randn(3, 4, 6, 17, dtype=torch.float64)
ours, ref = entmax_bisect(x, alpha), autograd_bisect(x, alpha)
test_close(ours, ref, eps=1e-12)
test_close(ours, entmax.entmax_bisect(x.detach(), alpha.detach(), dim=-1, n_iter=18), eps=1e-12)
gx, ga = torch.autograd.grad((ours * g).sum(), (x, alpha))
rx, ra = torch.autograd.grad((ref * g).sum(), (x, alpha))
test_close(gx, rx, eps=1e-10); test_close(ga, ra, eps=1e-10); test_eq(ga.shape, alpha.shape)
ex = torch.autograd.grad((entmax_alpha(x, alpha) * g).sum(), x)[0]                       # the exact gradient
test_close(ours, entmax_alpha(x, alpha), eps=1e-4)                                        # forward: close to exact ...
rel = (gx - ex).flatten(-2).norm(dim=-1) / ex.flatten(-2).norm(dim=-1)
print(f"relative error of the bisection gradient per head matrix: median {rel.median():.2f}, max {rel.max():.2f}")
assert rel.median() > 0.05                                                                 # ... the gradient is not

# %%
p15 = entmax_bisect(x, 1.5)
test_close(p15, autograd_bisect(x, torch.tensor(1.5, dtype=torch.float64)), eps=1e-12)
test_close(p15, entmax15(x), eps=1e-4)


# %% [markdown]
# ## Top-k softmax
#
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
    if scores.numel() == 0: return _no_scores(scores)
    s, empty = _mask_scores(_upcast(scores), key_mask)
    if scope == "row" and K.usable(s):
        p, bad = TopkSoftmaxFunction.apply(s, ratio)                        # the kernel flags softmax's NaN rows
        return _finish(p, s, empty, bad).to(scores.dtype)
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
    return _finish(p, s, empty).to(scores.dtype)


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


# %% [markdown]
# ## Names
#
# A top-k ratio is written in a name without its dot (`topk_softmax_0125` is $r = 0.125$), a start value of the
# adaptive entmax likewise (`headwise_adaptive_entmax_start12` starts every head at $\alpha = 1.2$).

# %%
#| export
def parse_topk_ratio(name):
    "Ratio encoded in a `topk_softmax_<digits>` name: '0125' -> 0.125, '1' -> 1.0; None if `name` is not top-k."
    if not name.startswith("topk_softmax_"): return None
    digits = name[len("topk_softmax_"):]
    if not digits.isdigit(): raise ValueError(f"bad top-k name {name!r}: write the ratio without its dot, e.g. topk_softmax_025 for 0.25")
    ratio = float(digits[0] + "." + digits[1:]) if len(digits) > 1 else float(digits)
    if not 0 < ratio <= 1: raise ValueError(f"top-k ratio of {name!r} is {ratio}, must be in (0, 1]")
    return ratio

def parse_alpha_start(name):
    "The start alpha in a `headwise_adaptive_entmax_start<digits>` name: 'start12' -> 1.2, 'start18' -> 1.8."
    d = name.removeprefix("headwise_adaptive_entmax_start")
    if not (d.isdigit() and len(d) >= 2 and d[0] == "1"):
        raise ValueError(f"unknown normalizer {name!r}: write the start alpha without its dot, e.g. headwise_adaptive_entmax_start12 for 1.2")
    return float(d[0] + "." + d[1:])

def topk_name(ratio):
    "Canonical name of top-k softmax at `ratio`: 0.125 -> 'topk_softmax_0125'."
    name = "topk_softmax_" + f"{float(ratio):.6f}".rstrip("0").replace(".", "")
    parse_topk_ratio(name)
    return name


# %%
test_eq([parse_topk_ratio(n) for n in ("topk_softmax_0125", "topk_softmax_025", "topk_softmax_05")], [0.125, 0.25, 0.5])
test_eq(parse_topk_ratio("topk_softmax_02"), 0.2)
test_eq(parse_topk_ratio("topk_softmax_1"), 1.0)
test_eq(parse_topk_ratio("softmax"), None)
test_eq([topk_name(r) for r in (0.125, 0.25, 0.5, 0.2, 1.0)],
        ["topk_softmax_0125", "topk_softmax_025", "topk_softmax_05", "topk_softmax_02", "topk_softmax_1"])
test_fail(lambda: parse_topk_ratio("topk_softmax_0.25"), contains="without its dot")
test_fail(lambda: parse_topk_ratio("topk_softmax_0"), contains="(0, 1]")
test_fail(lambda: parse_topk_ratio("topk_softmax_2"), contains="(0, 1]")
test_eq([parse_alpha_start(f"headwise_adaptive_entmax_start{d}") for d in ("12", "18", "175")], [1.2, 1.8, 1.75])
test_fail(lambda: parse_alpha_start("headwise_adaptive_entmax_start1.2"), contains="without its dot")

# %% [markdown]
# ## The registry
#
# One open registry serves every model of the project — study A's classifier, its stacked GPU path and Crisp's
# pretrained encoder. A normalizer enters it only through `register_normalizer`, the paper's seven included, and it
# *declares* what it is instead of the code guessing from its name:
#
# | capability | meaning |
# |---|---|
# | `sums_to_one` | each row is a distribution over the valid keys (sigmoid or ReLU attention: `False`) |
# | `learned` | attributes of the built module recorded after every epoch, any name and shape (e.g. `("alpha",)`) |
# | `stackable` | the factory takes `num_models`: one parameter set per model of a stack (`model.StackedClassifiers`) |
# | `kernel` | a C row kernel (`kernels`) serves it on the CPU |
# | `exact_gradient` | `False` declares an approximate backward (the original's bisection): no finite-difference check |
# | `options` | keyword options the factory accepts (`scope` for top-k, `n_iter` for the adaptive entmax) |
#
# A normalizer is a parameter-free function `fn(scores, key_mask=None, **options)`, an `nn.Module` class built as
# `cls(num_heads=H, **options)`, or any `factory(num_heads, num_models=None, **options)`. Every built normalizer is
# an `nn.Module` called as `norm(scores, key_mask=None)`; one that declares `query_context` (ASEntmax, whose scale depends
# on each query's input and position) also takes `hidden` `[B, Tq, C]` and `positions` `[Tq]` where a model has them,
# and must work without them. Names are canonical method names of the results tables, so
# they must be identifiers (they become file names and columns); two families are open-ended: `topk_softmax_<digits>`
# (the ratio without its dot, `topk_softmax_0125` is $r = 0.125$) and `headwise_adaptive_entmax_start<digits>`.

# %%
#| export
ENTRY_POINT_GROUP = "sparse_attention_repro.normalizers"     # outside packages register through this entry-point group

@dataclass(frozen=True)
class NormalizerSpec:
    "A registered attention normalizer: how to build it and what it declares about itself."
    name: str
    factory: Callable                 # factory(num_heads=H, [num_models=M], **options) -> nn.Module
    sums_to_one: bool = True          # rows are distributions over the valid keys
    learned: tuple = ()               # module attributes recorded per epoch (any name, any shape)
    stackable: bool = False           # accepts num_models (one parameter set per model of a stack)
    kernel: bool = False              # a C row kernel serves it on the CPU
    fused: Callable | None = None     # fused(module) -> the C attention kernel's arguments that compute a built module, or None
    exact_gradient: bool = True       # False: a declared approximate backward
    options: tuple = ()               # keyword options the factory accepts
    query_context: bool = False       # forward also takes hidden=[B, Tq, C] (the layer input at the queries) and positions=[Tq]
    source: str = ""                  # the module that registered it (the library's, or an outside package's)

    def build(self, num_heads: int = 1, num_models: int | None = None, **options) -> nn.Module:
        "The normalizer module for `num_heads` heads (and a stack of `num_models` models)."
        if bad := sorted(set(options) - set(self.options)):
            raise ValueError(f"{self.name} takes " + (f"only {', '.join(self.options)}" if self.options else "no options") + f", got {bad}")
        if num_models is not None and not self.stackable:
            raise ValueError(f"{self.name} does not declare stackable=True, so it cannot train as a stack of models; drop --stack-seeds")
        return self.factory(num_heads=num_heads, **({} if num_models is None else dict(num_models=num_models)), **options)

    def build_for_keys(self, num_heads: int, n_keys: int, num_models: int | None = None) -> nn.Module:
        "The module for attention over `n_keys` keys: one that declares the option `n_keys` (its start depends on it) gets it."
        return self.build(num_heads, num_models, **({"n_keys": n_keys} if "n_keys" in self.options else {}))

class Normalizer(nn.Module):
    "A parameter-free attention normalizer `fn(scores, key_mask, **kwargs)` as a module."
    def __init__(self, name, fn, **kwargs):
        super().__init__()
        self.name, self.fn, self.kwargs = name, fn, kwargs
    def forward(self, scores, key_mask=None): return self.fn(scores, key_mask=key_mask, **self.kwargs)
    def extra_repr(self): return self.name

def _function_factory(name, fn, **bound):
    "The factory of the parameter-free normalizer `fn` (with `bound` keyword arguments fixed)."
    def factory(num_heads=1, num_models=None, **options): return Normalizer(name, fn, **bound, **options)
    return factory

_REGISTRY: dict = {}     # name -> NormalizerSpec
_FAMILIES: dict = {}     # name prefix -> make(name) -> NormalizerSpec
_CONFORMING: set = set() # names that passed the conformance suite in this process

def _check_name(name):
    if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)):
        raise ValueError(f"normalizer name {name!r} must be an identifier (letters, digits, _): it becomes a file name and a column")

def _add(spec: NormalizerSpec, origin=None) -> NormalizerSpec:
    "Put `spec` in the registry; a name taken by another definition is refused."
    old = _REGISTRY.get(spec.name)
    if old is not None and old != spec and getattr(old, "_origin", None) != origin:
        raise ValueError(f"normalizer {spec.name!r} is already registered (from {old.source}); choose another name")
    object.__setattr__(spec, "_origin", origin)
    _REGISTRY[spec.name] = spec; _CONFORMING.discard(spec.name)
    return spec

def register_normalizer(name: str, normalizer=None, *, factory=None, **capabilities):
    """Register `normalizer` — a parameter-free function `fn(scores, key_mask=None, **options)` or an `nn.Module` class
    built as `cls(num_heads=H, **options)` — or a `factory(num_heads, num_models=None, **options)` under `name`, with
    the `NormalizerSpec` capabilities. As a decorator, `@register_normalizer(name, ...)`, it returns the function or class
    unchanged, with its spec as `__normalizer__`."""
    _check_name(name)
    if bad := sorted(set(capabilities) - (set(NormalizerSpec.__dataclass_fields__) - {"name", "factory"})):
        raise ValueError(f"unknown capabilities {bad} for {name}; choose from sums_to_one, learned, stackable, kernel, exact_gradient, options, query_context, source")
    def add(obj):
        if factory is not None: make = factory
        elif isinstance(obj, type) and issubclass(obj, nn.Module): make = obj
        elif callable(obj): make = _function_factory(name, obj)
        else: raise TypeError(f"register_normalizer({name!r}): give a function, an nn.Module class or factory=, not {type(obj).__name__}")
        where = obj if obj is not None else factory
        origin = f"{getattr(where, '__module__', '')}.{getattr(where, '__qualname__', repr(where))}"
        caps = {"source": getattr(where, "__module__", None) or "unknown", **capabilities}
        spec = _add(NormalizerSpec(name, make, **{k: tuple(v) if k in ("learned", "options") else v for k, v in caps.items()}), origin)
        if obj is not None:
            try: obj.__normalizer__ = spec
            except (AttributeError, TypeError): pass
        return obj if obj is not None else spec
    return add if normalizer is None and factory is None else add(normalizer)      # without either: a decorator

def register_normalizer_family(prefix: str, make):
    "Names `prefix<suffix>` resolve through `make(name) -> NormalizerSpec` (e.g. every `topk_softmax_<digits>`)."
    _FAMILIES[prefix] = make


# %% [markdown]
# **Resolving a name.** `resolve_normalizer` turns what a user writes — a registered name, a member of a family,
# `package.module:name`, or the name of an entry point in the group `sparse_attention_repro.normalizers` — into its
# `NormalizerSpec`. Outside code therefore registers without touching the library: a module that calls
# `register_normalizer` is imported by `module:name`, or by its package's entry point. The command line and the
# experiment notebooks resolve each method once, at the edge; the training code passes the spec along.
#
# Before a normalizer is first used in a process it must pass the **conformance suite** (`check_normalizer`, below);
# one that fails is refused in one line naming every failed property, separated by `;`. The library's own normalizers (and the members of its
# families) pass it in this notebook's tests, so resolving them skips the run-time check, which would cost every
# training process about two seconds.

# %%
#| export
class NormalizerConformanceError(ValueError):
    "A normalizer that fails the conformance suite: one line naming every failed property."

def _spec_of(obj, ref):
    "The spec behind an imported object: a `NormalizerSpec`, or a function or class decorated by `register_normalizer`."
    spec = obj if isinstance(obj, NormalizerSpec) else getattr(obj, "__normalizer__", None)
    if not isinstance(spec, NormalizerSpec):
        raise ValueError(f"{ref} is not a registered normalizer: decorate it with @register_normalizer(name, ...) or point at its NormalizerSpec")
    return spec if _REGISTRY.get(spec.name) is spec else _add(spec, getattr(spec, "_origin", None))

def _import_spec(ref):
    "`package.module:name` -> the spec it names (the module is imported, which registers it)."
    module, _, attr = ref.partition(":")
    try: obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load normalizer {ref!r} ({type(e).__name__}: {e}); give package.module:name of a registered normalizer") from None
    return _spec_of(obj, ref)

def _entry_points():
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}

def registered_normalizers() -> list:
    "Names that resolve without importing anything by hand: the registry and the entry points (families not expanded)."
    return list(dict.fromkeys(list(_REGISTRY) + sorted(_entry_points())))

def _lookup(ref):
    if ref in _REGISTRY: return _REGISTRY[ref]
    for prefix, make in _FAMILIES.items():
        if ref.startswith(prefix) and ref != prefix: return _add(replace(make(ref), source=f"family {prefix}<digits>"), f"family {prefix}")
    if ":" in ref: return _import_spec(ref)
    if (ep := _entry_points().get(ref)) is not None:
        try: obj = ep.load()
        except Exception as e: raise ValueError(f"entry point {ref!r} ({ep.value}) failed to load: {type(e).__name__}: {e}") from None
        return _spec_of(obj, f"entry point {ref} ({ep.value})")
    raise ValueError(f"unknown normalizer {ref!r}; choose one of {', '.join(registered_normalizers())}, "
                     f"{', '.join(p + '<digits>' for p in _FAMILIES)}, package.module:name, or an entry point of {ENTRY_POINT_GROUP}")

def resolve_normalizer(ref) -> NormalizerSpec:
    "The `NormalizerSpec` of `ref` (a spec, a name, a family member, `package.module:name` or an entry point), conformance-checked."
    spec = ref if isinstance(ref, NormalizerSpec) else _lookup(str(ref))
    if spec.name not in _CONFORMING and not _library_tested(spec):
        if failures := check_normalizer(spec):
            raise NormalizerConformanceError(f"normalizer {spec.name!r} fails the conformance suite: " + "; ".join(failures))
        _CONFORMING.add(spec.name)
    return spec

def _library_tested(spec) -> bool:
    "`spec` is the registry's own entry for one of the library's normalizers or a member of one of its families."
    if _REGISTRY.get(spec.name) is not spec: return False
    return spec.name in _LIBRARY_NAMES or any(spec.source == f"family {p}<digits>" and _FAMILIES.get(p) is make
                                               for p, make in _LIBRARY_FAMILIES.items())

def get_normalizer(name, num_heads: int = 1, num_models: int | None = None, **options) -> nn.Module:
    "The normalizer module of `name` (anything `resolve_normalizer` takes) for `num_heads` heads; `options` as its spec declares."
    return resolve_normalizer(name).build(num_heads=num_heads, num_models=num_models, **options)


# %% [markdown]
# **The conformance suite.** Each property is a rule of the lab's attention contract, checked on small random scores
# (3 heads, 5 queries, 7 keys): the shape and dtype come back unchanged; finite scores give finite weights; a masked key
# gets exactly zero and changing its score changes nothing; a row with no valid key gives zeros, not NaN; a NaN in one
# row shows in that row and leaves every other row as it was; examples of a batch do not see each other; the gradient is
# finite, and matches finite differences in float64 unless the spec declares an approximate one; where declared, rows
# are non-negative and sum to one, and a stack of models equals its models one by one.

# %%
#| export
def check_normalizer(spec: NormalizerSpec, num_heads: int = 3, seed: int = 0) -> list:
    "The failed properties of `spec`'s normalizer, one line each (an empty list: it conforms); torch's global generator is left as it was."
    with torch.random.fork_rng(devices=[]): return _conformance(spec, num_heads, seed)

def _conformance(spec, num_heads, seed):
    failures = []
    def prop(label, test):
        try:
            if (msg := test()): failures.append(f"{label}: {msg}")
        except Exception as e: failures.append(f"{label}: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, num_heads, 5, 7, generator=g) * 2                        # (B, H, Tq, Tk)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool); mask[0, ..., 4:] = False; mask[1, ..., :2] = False
    try:
        torch.manual_seed(seed); norm = spec.build(num_heads=num_heads)
        p = norm(s)
    except Exception as e:
        return [f"build and call: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    prop("shape", lambda: None if p.shape == s.shape and p.dtype == s.dtype else f"returns {tuple(p.shape)} {p.dtype} for {tuple(s.shape)} {s.dtype}")
    prop("finite", lambda: None if torch.isfinite(p).all() else "non-finite weights for finite scores")
    if spec.sums_to_one:
        prop("sums to one", lambda: None if (p >= 0).all() and (p.sum(-1) - 1).abs().max() < 1e-5 else
             f"rows sum to {p.sum(-1).min():.4g}..{p.sum(-1).max():.4g} (min weight {p.min():.3g}); declare sums_to_one=False if intended")
    def key_mask():
        pm = norm(s, mask)
        if pm.masked_select(~mask.expand_as(pm)).abs().max() != 0: return "a masked key gets a non-zero weight"
        moved = s.masked_fill(~mask, 0.) + torch.randn(s.shape, generator=g).masked_fill(mask, 0.) * 5
        if not torch.allclose(norm(moved, mask), pm, atol=1e-6): return "changing a masked key's score changes the weights"
        if spec.sums_to_one and (pm.sum(-1) - 1).abs().max() > 1e-5: return "rows do not sum to one over the valid keys"
    prop("key mask", key_mask)
    def empty_rows():
        none = torch.zeros(1, 1, 1, 7, dtype=torch.bool)
        pe = norm(s, none)
        return None if torch.equal(pe, torch.zeros_like(pe)) else "a row with no valid key must give zeros (not NaN)"
    prop("empty rows", empty_rows)
    def nan_rows():
        bad = s.clone(); bad[0, 0, 1, 3] = float("nan")
        pn = norm(bad)
        if not pn[0, 0, 1].isnan().any(): return "a NaN score disappears from its row's weights"
        keep = torch.ones(2, num_heads, 5, dtype=torch.bool); keep[0, 0, 1] = False
        if not torch.allclose(pn[keep], p[keep], atol=1e-6): return "a NaN in one row changes other rows"
    prop("NaN propagation", nan_rows)
    prop("batch independence", lambda: None if torch.allclose(norm(s[1:]), p[1:], atol=1e-6) else "an example's weights depend on the other examples of the batch")
    def gradient():
        x = s.clone().requires_grad_()
        out = norm(x, mask)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        if not torch.isfinite(x.grad).all(): return "non-finite gradient for the scores"
        if any(q.grad is not None and not torch.isfinite(q.grad).all() for q in norm.parameters()): return "non-finite gradient for a parameter"
        if spec.exact_gradient:
            n64 = copy.deepcopy(norm).double()
            x64 = (torch.randn(1, num_heads, 3, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
            ok = torch.autograd.gradcheck(lambda t: n64(t, mask[:1, ..., :5]), (x64,), eps=1e-6, atol=1e-5, raise_exception=False)
            if not ok: return "the gradient does not match finite differences (float64); declare exact_gradient=False for an approximate backward"
    prop("gradient", gradient)
    for name in spec.learned:
        prop(f"learned {name}", lambda name=name: None if torch.is_tensor(getattr(norm, name, None)) else f"the module has no tensor attribute {name!r} to record")
    if spec.stackable:
        def stack():
            torch.manual_seed(seed); st = spec.build(num_heads=num_heads, num_models=2)
            s5 = torch.stack([s, s.flip(0)])                                     # (M, B, H, Tq, Tk)
            ps = st(s5)
            return None if ps.shape == s5.shape and torch.allclose(ps[0], p, atol=1e-6) else "model 0 of a stack differs from the module alone"
        prop("stack", stack)
    return failures


# %% [markdown]
# **Study A's normalizers** enter the registry the same way any outside one would. Only the adaptive entmax has
# parameters: one logit $a$ per head, recorded as `alpha` after every epoch.

# %%
#| export
ALPHA_MIN, ALPHA_SPAN, ALPHA_MAX = 1.05, 0.90, 1.95      # the adaptive entmax's alpha lives in (1.05, 1.95)

def adaptive_alpha(logit):
    "The head-wise adaptive entmax's alpha from its logit: alpha = 1.05 + 0.90 * sigmoid(a), in (1.05, 1.95); a = 0 gives 1.5."
    return ALPHA_MIN + ALPHA_SPAN * torch.sigmoid(logit)

class HeadwiseAdaptiveEntmax(nn.Module):
    """alpha-entmax with one learned alpha per head: alpha = 1.05 + 0.90 * sigmoid(a), a initialised at 0 (alpha 1.5);
    `alpha_start` starts every head elsewhere in (1.05, 1.95) (the start-value control of the learned alpha)."""
    def __init__(self, num_heads, n_iter=ENTMAX_ALPHA_ITERS, bisect=False, num_models=None, alpha_start=1.5):
        super().__init__()
        if not ALPHA_MIN < alpha_start < ALPHA_MAX: raise ValueError(f"alpha_start must lie in (1.05, 1.95), got {alpha_start}")
        u = (alpha_start - ALPHA_MIN) / ALPHA_SPAN                                       # the logit that gives alpha_start
        self.alpha_logit = nn.Parameter(torch.full((num_heads,) if num_models is None else (num_models, num_heads),
                                                   0.0 if alpha_start == 1.5 else math.log(u / (1 - u))))
        self.n_iter, self.bisect = n_iter, bisect
    @property
    def alpha(self):
        "Current alpha of each head, shape `[H]` (`[M, H]` for a stack of M models)."
        return adaptive_alpha(self.alpha_logit)
    def forward(self, scores, key_mask=None):
        "scores `[B, H, T, T]`, or `[M, B, H, T, T]` for a stack of M models."
        a = self.alpha
        a = a.view(-1, 1, 1) if a.dim() == 1 else a.view(a.shape[0], 1, -1, 1, 1)          # (H, 1, 1) / (M, 1, H, 1, 1)
        if self.bisect: return entmax_bisect(scores, a, key_mask)                         # the original's gradient
        return entmax_alpha(scores, a, key_mask, self.n_iter)

def fused_row(kind: str):
    """A `fused` declaration: the C attention kernel computes a module of this normalizer as its row normalizer `kind`
    (softmax, sparsemax, entmax15 or topk_softmax, with the module's top-k `ratio`), per query row only."""
    def args(norm):
        kw = getattr(norm, "kwargs", {})
        if not set(kw) <= {"ratio", "scope"} or kw.get("scope", "row") != "row": return None
        return dict(kind=kind, ratio=kw.get("ratio", 1.0), alpha=None, max_iter=K.ENTMAX15_ITERS)
    return args

def _fused_adaptive(norm):
    "The head-wise adaptive entmax in the kernel: one model (not a stack), the Newton solver (not the original's bisection)."
    if norm.bisect or norm.alpha_logit.dim() != 1: return None
    return dict(kind="entmax_alpha", ratio=1.0, alpha=norm.alpha, max_iter=norm.n_iter)

register_normalizer("softmax", softmax, stackable=True, fused=fused_row("softmax"))
register_normalizer("sparsemax", sparsemax, stackable=True, kernel=True, fused=fused_row("sparsemax"))
register_normalizer("entmax15", entmax15, stackable=True, kernel=True, fused=fused_row("entmax15"))
register_normalizer("headwise_adaptive_entmax", HeadwiseAdaptiveEntmax, learned=("alpha",), stackable=True, kernel=True, options=("n_iter",),
                    fused=_fused_adaptive)
register_normalizer("entmax15_bisect", factory=_function_factory("entmax15_bisect", entmax_bisect, alpha=1.5), stackable=True,
                    exact_gradient=False)
register_normalizer("headwise_adaptive_entmax_bisect", factory=partial(HeadwiseAdaptiveEntmax, bisect=True), learned=("alpha",),
                    stackable=True, exact_gradient=False)
register_normalizer_family("topk_softmax_", lambda name: NormalizerSpec(
    name, _function_factory(name, topk_softmax, ratio=parse_topk_ratio(name)), stackable=True, kernel=True, options=("scope",),
    fused=fused_row("topk_softmax")))
register_normalizer_family("headwise_adaptive_entmax_start", lambda name: NormalizerSpec(
    name, partial(HeadwiseAdaptiveEntmax, alpha_start=parse_alpha_start(name)), learned=("alpha",), stackable=True, kernel=True,
    options=("n_iter",), fused=_fused_adaptive))
_LIBRARY_NAMES, _LIBRARY_FAMILIES = frozenset(_REGISTRY), dict(_FAMILIES)     # the conformance tests below cover these

# %%
hae = get_normalizer("headwise_adaptive_entmax", num_heads=4)
test_close(hae.alpha, torch.full((4,), 1.5))
test_eq(sum(p.numel() for p in hae.parameters()), 4)
test_eq(sum(p.numel() for n in PAPER_METHODS if n != "headwise_adaptive_entmax" for p in get_normalizer(n).parameters()), 0)
test_close(get_normalizer("topk_softmax_02")(x), topk_softmax(x, 0.2))
test_fail(lambda: get_normalizer("softmaxx"), contains="unknown normalizer")
for start in (1.2, 1.8):                            # the start-value control: every head starts at alpha_start
    name = f"headwise_adaptive_entmax_start{start:g}".replace(".", "")
    h0 = get_normalizer(name, num_heads=4)
    test_close(h0.alpha, torch.full((4,), start), eps=1e-6)
    test_close(h0(x.detach()), entmax_alpha(x.detach(), start))
    test_eq((resolve_normalizer(name).name, resolve_normalizer(name).learned), (name, ("alpha",)))
test_fail(lambda: get_normalizer("headwise_adaptive_entmax_start195"), contains="(1.05, 1.95)")
assert torch.equal(HeadwiseAdaptiveEntmax(4, alpha_start=1.5).alpha_logit, hae.alpha_logit)   # the default start is exactly a = 0
hb = get_normalizer("headwise_adaptive_entmax_bisect", num_heads=4)
test_eq(sum(p.numel() for p in hb.parameters()), 4)
test_close(hb(x.detach()), entmax_bisect(x.detach(), hb.alpha.detach().double().view(-1, 1, 1)))
test_close(get_normalizer("entmax15_bisect")(x.detach()), entmax_bisect(x.detach(), 1.5))
test_fail(lambda: get_normalizer("sparsemax", scope="head"), contains="takes no options")
stacked = get_normalizer("headwise_adaptive_entmax", num_heads=4, num_models=3)           # one alpha per head and model
test_eq(stacked.alpha_logit.shape, (3, 4))
with torch.no_grad(): stacked.alpha_logit.copy_(torch.randn(3, 4))
s5 = torch.randn(3, 2, 4, 6, 6)
for i in range(3):                                # model i of the stack is the one-model module with model i's alpha
    single = get_normalizer("headwise_adaptive_entmax", num_heads=4)
    with torch.no_grad(): single.alpha_logit.copy_(stacked.alpha_logit[i])
    test_close(stacked(s5)[i], single(s5[i]), eps=1e-6)
test_fail(lambda: get_normalizer("topk_softmax_025", scope="matrix")(x), contains="scope must be")

# %% [markdown]
# **The fused attention kernel.** The paper's normalizers also have a C kernel that runs a whole attention core — scores,
# normalizer, weighted values, forward and backward — for one head at a time (`kernels.attention_fwd`, used by the
# model's opt-in fused path). Which normalizers it serves is a capability each spec declares (`fused`, above): a
# function saying how the kernel computes a built module of it, or `None` where it cannot (the original's bisection, a
# stack of models, top-k over the whole head). An outside normalizer whose rows are one of the kernel's normalizers
# declares it the same way (`fused=fused_row("softmax")`). Without a declaration the model refuses the fused path
# rather than run the arms of one experiment on different paths.

# %%
#| export
def fused_kernel_args(spec: NormalizerSpec, norm) -> dict | None:
    "Arguments of `kernels.attention_fwd` (kind, ratio, alpha, max_iter) that compute `norm`, a module built from `spec`, or None."
    return spec.fused(norm) if spec.fused is not None else None

def fused_refusal(methods, device="cpu", stacked=False) -> str | None:
    """Why the fused attention kernel cannot serve every one of `methods` (specs or names; all arms of a grid run on one
    path) on `device`, or None when it can: the one place that decides it."""
    if getattr(device, "type", str(device)) != "cpu": return "it runs on the CPU only"
    if stacked: return "a stack of models (--stack-seeds) runs the torch path"
    if K.kernels() is None: return "the C kernels are unavailable here"
    specs = [m if isinstance(m, NormalizerSpec) else resolve_normalizer(m) for m in methods]
    if none := [s.name for s in specs if fused_kernel_args(s, s.build()) is None]: return f"{', '.join(none)} has no fused kernel"
    return None


# %%
test_eq(fused_refusal(["softmax", "entmax15_bisect"]), "entmax15_bisect has no fused kernel")
test_eq(fused_refusal(["softmax"], device="cuda"), "it runs on the CPU only")
test_eq(fused_refusal(["softmax"], stacked=True), "a stack of models (--stack-seeds) runs the torch path")
test_eq(fused_refusal(["softmax", "sparsemax", "entmax15", "headwise_adaptive_entmax", "topk_softmax_025"]),
        None if K.kernels() is not None else "the C kernels are unavailable here")

# %%
_fka = lambda n, **kw: fused_kernel_args(resolve_normalizer(n), get_normalizer(n, num_heads=4, **kw))
test_eq([_fka(n)["kind"] for n in PAPER_METHODS],
        ["softmax", "sparsemax", "entmax15", "entmax_alpha", "topk_softmax", "topk_softmax", "topk_softmax"])
test_eq(_fka("topk_softmax_025")["ratio"], 0.25)
for n, kw in [("entmax15_bisect", {}), ("headwise_adaptive_entmax_bisect", {}), ("topk_softmax_025", dict(scope="head"))]:
    test_eq(_fka(n, **kw), None)
test_eq(_fka("headwise_adaptive_entmax", num_models=2), None)
test_eq(_fka("headwise_adaptive_entmax_start12")["kind"], "entmax_alpha")
_outside = NormalizerSpec("outside", _function_factory("outside", lambda s, key_mask=None: softmax(s, key_mask)))
test_eq(fused_kernel_args(_outside, _outside.build()), None)                # undeclared: no fused path
_declared = NormalizerSpec("outside_declared", _outside.factory, fused=fused_row("softmax"))
test_eq(fused_kernel_args(_declared, _declared.build())["kind"], "softmax")   # an outside normalizer can declare it
test_eq(fused_refusal([_declared]), None if K.kernels() is not None else "the C kernels are unavailable here")

# %% [markdown]
# Capabilities are what the specs declare; a name that is taken, a bad name or an unknown capability is refused, and a
# decorated function keeps working as a function.

# %%
test_eq([n for n in PAPER_METHODS if resolve_normalizer(n).learned], ["headwise_adaptive_entmax"])
test_eq([resolve_normalizer(n).exact_gradient for n in ORIGINAL_GRADIENT_VARIANTS], [False, False])
assert all(resolve_normalizer(n).sums_to_one and resolve_normalizer(n).stackable for n in PAPER_METHODS)
test_fail(lambda: register_normalizer("softmax", sparsemax), contains="already registered")
test_fail(lambda: register_normalizer("my-norm", softmax), contains="must be an identifier")
test_fail(lambda: register_normalizer("mine", softmax, rows_sum=True), contains="unknown capabilities")
test_fail(lambda: get_normalizer("mine_softmax", num_models=2), contains="unknown normalizer")

@register_normalizer("half_softmax_example", sums_to_one=False, stackable=True)
def half_softmax(scores, key_mask=None):
    "Softmax scaled by one half: rows sum to 1/2 (a test of `sums_to_one=False`)."
    return softmax(scores, key_mask) / 2
test_close(half_softmax(x), softmax(x) / 2)                                   # still the plain function
test_close(get_normalizer("half_softmax_example")(x), softmax(x) / 2)
test_eq(half_softmax.__normalizer__.sums_to_one, False)
test_eq(half_softmax.__normalizer__.source, half_softmax.__module__)                 # who registered it
register_normalizer("half_softmax_example", half_softmax, sums_to_one=False, stackable=True)   # the same definition again (a notebook re-run): allowed

@register_normalizer("nonstackable_example")
class ScaledSoftmax(nn.Module):
    "Softmax of learned-temperature scores (one temperature per head): a module class without a stack."
    def __init__(self, num_heads):
        super().__init__(); self.log_t = nn.Parameter(torch.zeros(num_heads, 1, 1))
    def forward(self, scores, key_mask=None): return softmax(scores * self.log_t.exp(), key_mask)
test_close(get_normalizer("nonstackable_example", num_heads=x.shape[-3])(x), softmax(x))
test_fail(lambda: get_normalizer("nonstackable_example", num_heads=4, num_models=2), contains="stackable=True")

# %% [markdown]
# **The conformance suite catches what it should.** Every registered normalizer passes it. Each broken normalizer
# below violates one rule and is refused with that rule named; a correct one that declares `sums_to_one=False` passes.

# %%
for n in PAPER_METHODS + ORIGINAL_GRADIENT_VARIANTS + ("topk_softmax_02", "headwise_adaptive_entmax_start12", "half_softmax_example"):
    test_eq((n, check_normalizer(resolve_normalizer(n))), (n, []))
assert "topk_softmax_02" not in _CONFORMING and _library_tested(resolve_normalizer("topk_softmax_02"))    # tested here, not at run time
test_eq(_library_tested(NormalizerSpec("softmax", _function_factory("softmax", softmax))), False)          # a look-alike spec is checked
state = torch.get_rng_state(); check_normalizer(resolve_normalizer("softmax"))
assert torch.equal(state, torch.get_rng_state())          # checking never moves the generator that draws the initial weights
broken = {
    "sums to one": lambda s, key_mask=None: softmax(s, key_mask) * 1.5,
    "key mask": lambda s, key_mask=None: torch.softmax(s, -1),                            # ignores the mask
    "empty rows": lambda s, key_mask=None: torch.softmax(s.masked_fill(~key_mask, float("-inf")), -1) if key_mask is not None else torch.softmax(s, -1),
    "NaN propagation": lambda s, key_mask=None: softmax(torch.nan_to_num(s), key_mask),    # hides a NaN
    "batch independence": lambda s, key_mask=None: softmax(s - s.mean(0), key_mask),      # mixes the batch
    "gradient": lambda s, key_mask=None: ScaledGrad.apply(softmax(s, key_mask)),          # a wrong backward
    "shape": lambda s, key_mask=None: softmax(s, key_mask)[..., :-1],
}
class ScaledGrad(Function):
    @staticmethod
    def forward(ctx, p): return p.clone()
    @staticmethod
    def backward(ctx, g): return 2 * g
for rule, fn in broken.items():
    fails = check_normalizer(NormalizerSpec(f"broken_{rule.replace(' ', '_')}", _function_factory("b", fn)))
    assert any(f.startswith(rule) for f in fails), (rule, fails)
test_eq(check_normalizer(NormalizerSpec("no_alpha", _function_factory("b", softmax), learned=("alpha",))),
        ["learned alpha: the module has no tensor attribute 'alpha' to record"])
err = NormalizerSpec("broken_mask", _function_factory("b", broken["key mask"]))
test_fail(lambda: resolve_normalizer(err), exc=NormalizerConformanceError, contains="key mask:")
try: resolve_normalizer(NormalizerSpec("broken_twice", _function_factory("b", lambda s, key_mask=None: softmax(s, key_mask)[..., :-1])))
except NormalizerConformanceError as e: _refusal = str(e)
test_eq(len(_refusal.splitlines()), 1); assert _refusal.count("; ") >= 1, _refusal   # several failed properties, one line

# %% [markdown]
# The adaptive module learns: a gradient step on a loss that rewards sparser rows moves every head's $\alpha$.

# %%
torch.manual_seed(1)
hae = get_normalizer("headwise_adaptive_entmax", num_heads=4)
s4 = torch.randn(2, 4, 6, 6)
(hae(s4) ** 2).sum().backward()                 # sum of squares grows as rows get sparser (higher alpha)
assert (hae.alpha_logit.grad > 0).all(), hae.alpha_logit.grad


# %% [markdown]
# ## Attention density
#
# Study A reports `nonzero_ratio`, the fraction of attention weights above $10^{-7}$. With a `key_mask` the denominator
# counts only valid (query, key) pairs — the measure Crisp's "sparsity" needs (sparsity = 1 − density).

# %%
#| export
def attention_density(p, key_mask=None, threshold=1e-7):
    "Fraction of attention weights > `threshold` (the paper's `nonzero_ratio`), over valid entries if `key_mask` is given."
    nz = p > threshold
    if key_mask is None: return nz.float().mean()
    valid = key_mask.to(torch.bool).expand_as(p)
    return (nz & valid).sum().float() / valid.sum().clamp_min(1)


# %%
test_eq(attention_density(torch.tensor([[0.5, 0.5, 0., 0.]])), 0.5)
test_close(attention_density(topk_softmax(x, 0.25)), 5 / 17)
test_close(attention_density(topk_softmax(x, 0.25, mask), mask), 3 / 9)
test_eq(attention_density(softmax(x)), 1.)

# %% [markdown]
# ## Properties every normalizer shares
#
# The checks below run over the whole registry: rows sum to one over valid keys, masked keys get exactly zero,
# fully masked rows give zeros (no NaN) with finite gradients, huge logits ($\pm 10^4$) and ties are handled, bf16 works,
# and `gradcheck` validates every analytic backward in float64 (top-k away from ties, where it is differentiable).

# %%
torch.manual_seed(0)
names = PAPER_METHODS + ORIGINAL_GRADIENT_VARIANTS + ("topk_softmax_02",)
mask = torch.rand(2, 1, 5, 7) > 0.3
mask[0, 0, 1] = False                                       # one query row with no valid key
for name in names:
    norm = get_normalizer(name, num_heads=3).double()
    s = (torch.randn(2, 3, 5, 7, dtype=torch.float64) * 3).requires_grad_()
    p = norm(s, mask)
    assert torch.isfinite(p).all(), name
    test_eq(p.masked_select(~mask.expand_as(p)).abs().sum().item(), 0)
    rows = mask.any(-1).expand(2, 3, 5)
    test_close(p.sum(-1)[rows], torch.ones(int(rows.sum()), dtype=torch.float64), eps=1e-9)
    test_eq(p[0, :, 1].abs().sum().item(), 0)
    p.pow(2).sum().backward()
    assert torch.isfinite(s.grad).all(), name
    if name not in ORIGINAL_GRADIENT_VARIANTS:   # bisection jumps by its last step (~1e-6): checked against autograd above
        assert torch.autograd.gradcheck(lambda t: norm(t, mask), (s.detach().requires_grad_(),)), name
    big = torch.tensor([1e4, -1e4, 0., 1e4 - 1, -5.]).expand(3, 1, 5)   # huge logits (one row per head)
    pb = norm(big.double())
    assert torch.isfinite(pb).all() and (pb[..., 1] == 0).all() and (pb.sum(-1) - 1).abs().max() < 1e-9, name
    ties = norm(torch.zeros(3, 1, 8, dtype=torch.float64))   # all equal: uniform over the kept keys
    test_close(ties, torch.full_like(ties, 1 / 8), eps=1e-9)   # ties at the k-th score are all kept
    pbf = norm.float()(torch.randn(2, 3, 5, 7).bfloat16(), mask)
    test_eq(pbf.dtype, torch.bfloat16)
    assert torch.isfinite(pbf.float()).all() and (pbf.float().sum(-1)[rows] - 1).abs().max() < 1e-2, name

# %% [markdown]
# **Empty inputs** (see `_no_scores`): a batch of no examples, a head with no queries or a row with no keys gives an
# empty result of the same shape and dtype, with and without a key mask, forward and backward, for every normalizer of
# the library and its families' members, in float64 (the torch path's dtype), float32 (the C kernels' on the CPU) and bf16; the
# learned $\alpha$ gets a zero gradient.

# %%
cases = [(n, {}) for n in sorted(_LIBRARY_NAMES)] + [("topk_softmax_025", {}), ("topk_softmax_025", dict(scope="head")),
                                                    ("headwise_adaptive_entmax_start12", {})]
for (name, options), dtype in itertools.product(cases, (torch.float64, torch.float32, torch.bfloat16)):
    norm = get_normalizer(name, num_heads=3, **options).to(torch.float32 if dtype == torch.bfloat16 else dtype)
    for shape, masked in itertools.product([(0, 3, 5, 7), (2, 3, 0, 7), (2, 3, 5, 0), (0, 3, 0, 0)], (False, True)):
        s = torch.randn(shape, dtype=dtype, requires_grad=True)
        p = norm(s, torch.ones(shape[0], 1, 1, shape[-1], dtype=torch.bool) if masked else None)
        test_eq((name, p.shape, p.dtype), (name, s.shape, dtype))
        p.sum().backward()
        test_eq((name, s.grad.shape), (name, s.shape))
        for q in norm.parameters(): test_eq((name, q.grad), (name, torch.zeros_like(q))); q.grad = None

# %% [markdown]
# Non-finite scores stay visible: with a NaN in one row, a $+\infty$ in another and a row of only $-\infty$, exactly
# those rows come out NaN — in float32 (the C kernels) and float64 (the torch path) — and every other row is what it
# would be without them. A $-\infty$ among finite scores is just a key with zero weight.

# %%
for name in names:
    for dtype in (torch.float32, torch.float64):
        norm = get_normalizer(name, num_heads=3).to(dtype)
        s = torch.randn(2, 3, 5, 7, dtype=dtype)
        bad = s.clone(); bad[0, 0, 1, 3] = float("nan"); bad[1, 2, 4, 0] = float("inf"); bad[0, 1, 2] = float("-inf")
        bad[1, 1, 3, 5] = float("-inf")                                          # an ordinary zero-weight key
        p, ref = norm(bad), norm(s)
        hit = torch.zeros(2, 3, 5, dtype=torch.bool); hit[0, 0, 1] = hit[1, 2, 4] = hit[0, 1, 2] = True
        assert p[hit].isnan().all(), (name, dtype)
        assert torch.isfinite(p[~hit]).all() and p[1, 1, 3, 5] == 0, (name, dtype)
        keep = ~hit; keep[1, 1, 3] = False
        test_close(p[keep], ref[keep], eps=1e-6)

# %% [markdown]
# The same agreement with the `entmax` package holds in float32 (tolerance 1e-5) at the study's shapes:

# %%
x32 = torch.randn(96, 4, 17, 17) * 2
test_close(sparsemax(x32), entmax.sparsemax(x32, dim=-1), eps=1e-5)
test_close(entmax15(x32), entmax.entmax15(x32, dim=-1), eps=1e-5)
test_close(entmax_alpha(x32, 1.5), entmax.entmax_bisect(x32, 1.5, dim=-1), eps=1e-5)
a32 = torch.tensor([1.1, 1.4, 1.6, 1.9]).view(4, 1, 1)
test_close(entmax_alpha(x32, a32), entmax.entmax_bisect(x32, a32, dim=-1), eps=1e-5)
