# %% [markdown]
# # Sparsemax
# > The Euclidean projection of attention scores onto the simplex: an exact threshold by Michelot's algorithm, a closed-form backward.

# %%
#| default_exp sparsemax_mapping

# %% [markdown]
# One family per notebook, as in the `entmax` package and our `examples/`: sparsemax needs nothing but the masks
# (`00a_masks`) and its C row kernel, and the registry (`00_normalizers`) imports it from here.

# %%
#| export
import torch
from torch.autograd import Function
from sparse_attention_repro import kernels as K
from sparse_attention_repro.masks import mask_scores, finish_rows, upcast, no_scores

# %%
from fastcore.test import test_close
import entmax


# %% [markdown]
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
    if scores.numel() == 0: return no_scores(scores)
    s, empty = mask_scores(upcast(scores), key_mask)
    return finish_rows(SparsemaxFunction.apply(s), s, empty).to(scores.dtype)


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
# The same agreement with the `entmax` package holds in float32 (tolerance 1e-5) at the study's shapes:

# %%
x32 = torch.randn(96, 4, 17, 17) * 2
test_close(sparsemax(x32), entmax.sparsemax(x32, dim=-1), eps=1e-5)
