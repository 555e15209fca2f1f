"""ASEntmax, adaptive-scalable entmax (Vasylenko, Pitorro, Martins & Treviso, "Long-Context Generalization with Sparse
Attention", ICLR 2026; arXiv 2506.16640; code: github deep-spin/asentmax).

Each query is scaled by a learned, length-dependent factor before 1.5-entmax:

    q_i <- q_i * (1 + softplus(w_beta . h_i + b_beta) * log(i + 2) ** (2 tanh(w_gamma . h_i + b_gamma)))

with i the query's 0-based position, h_i the attention layer's (normalised) input at that query, and one (w, b) pair
per head for beta and one for gamma. Scaling q_i scales row i of the scores q_i k_j / sqrt(d), so here the factor
multiplies each score row, then `entmax15` (exact threshold and gradient) normalises it.

Against the reference code (`synthetic/src/models/architectures/sparse_gemma.py`, read in deep-spin/asentmax), which
`test_asentmax_against_the_reference_formula` re-implements line by line:
- the same factor: delta 1, gamma range 2, log(i + 2) of the query's position, biases on both projections;
- under NAPE only the heads without ALiBi are scaled, as there (`nope_heads`: the last heads, which the model names);
  without NAPE every head is;
- the reference normalises with entmax by bisection (or its Triton kernel, 10 iterations); ours is the exact 1.5-entmax;
- the reference's projections start as its model's other linear maps (normal, std 0.02, biases 0), as ours do, so the
  factor starts near 1 + log 2 at every position;
- the reference scales the queries before ALiBi's bias is added; the scaled heads carry no bias, so the two agree.

It needs each query's layer input: it declares `query_context`, and a model that has it passes `hidden` `[B, Tq, C]`
and `positions` `[Tq]`. Called without them (the conformance suite, or a model that passes no context), the features
are zero and the positions are the last Tq of the Tk keys (a query at key position Tk - Tq + r), so the factor depends
on the position alone.
"""
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from sparse_attention_repro.normalizers import entmax15, register_normalizer

DELTA, GAMMA_RANGE, INIT_STD = 1.0, 2.0, 0.02


@register_normalizer("asentmax", options=("width", "nope_heads"), query_context=True)
class ASEntmax(nn.Module):
    "1.5-entmax of scores whose rows are scaled by 1 + softplus(beta(h)) * log(i + 2) ** (2 tanh(gamma(h)))."
    def __init__(self, num_heads, width: int = 64, nope_heads: int | None = None):
        super().__init__()
        self.num_heads, self.scaled = num_heads, num_heads if nope_heads is None else nope_heads
        self.beta, self.gamma = nn.Linear(width, self.scaled), nn.Linear(width, self.scaled)
        for lin in (self.beta, self.gamma):
            nn.init.normal_(lin.weight, 0.0, INIT_STD); nn.init.zeros_(lin.bias)

    def factor(self, hidden, positions):
        "The scale `[B, S, Tq, 1]` of each scaled head's query rows, from `hidden` `[B, Tq, C]` and `positions` `[Tq]`."
        log_pos = torch.log(positions.to(hidden.dtype) + 2).view(1, 1, -1)                     # (1, 1, Tq)
        beta = F.softplus(self.beta(hidden)).transpose(1, 2)                                    # (B, S, Tq)
        gamma = GAMMA_RANGE * torch.tanh(self.gamma(hidden)).transpose(1, 2)                    # (B, S, Tq)
        return (DELTA + beta * log_pos.pow(gamma)).unsqueeze(-1)                                # (B, S, Tq, 1)

    def forward(self, scores, key_mask=None, hidden=None, positions=None):
        *lead, H, tq, tk = scores.shape
        if positions is None: positions = torch.arange(tk - tq, tk, device=scores.device)
        if hidden is None: hidden = scores.new_zeros((math.prod(lead) or 1, tq, self.beta.in_features))
        c = self.factor(hidden.to(scores.dtype), positions).reshape(*(lead or [1]), self.scaled, tq, 1)
        if not lead: c = c[0]
        if self.scaled < H: c = torch.cat([torch.ones_like(c[..., :1, :, :]).expand(*c.shape[:-3], H - self.scaled, tq, 1), c], -3)
        return entmax15(scores * c, key_mask)
