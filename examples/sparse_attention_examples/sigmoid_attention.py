"""Sigmoid attention (Ramapuram et al., 2024, "Theory, Analysis, and Best Practices for Sigmoid Self-Attention").

Each weight is an independent sigmoid of its score with a bias of -log n, n the number of keys a query may attend to:

    p_ij = sigmoid(s_ij - log n)

Rows do not sum to one (at initialisation they sum to about one, which is what the bias is for). With a key mask, n
counts the valid keys and masked keys get exactly zero.

Against the reference code (the authors' FlashSigmoid release): equal without a key mask, weights and gradient. With
masked keys the reference takes one constant bias b from its configuration for every row; ours takes b = -log(valid
keys) per row, so that a short document's row starts near one in total like a long one's. On a row with v valid keys
of n, a weight then differs from the constant-b one (b = -log n) by at most tanh(log(n / v) / 4): 0.29 for 30 of 97.
The lab's main runs leave padding unmasked: there n is the full length (17 or 97) and the two agree.
`test_sigmoid_attention_against_the_reference_bias` pins both readings.
"""
import math
import torch
from sparse_attention_repro.normalizers import register_normalizer


@register_normalizer("sigmoid_attention", sums_to_one=False, stackable=True)
def sigmoid_attention(scores, key_mask=None):
    "sigmoid(scores - log n) over keys, n the number of valid keys of each row; masked keys 0."
    if key_mask is None:
        return torch.sigmoid(scores - math.log(scores.shape[-1]))
    valid = key_mask.to(torch.bool).expand_as(scores)
    n = valid.sum(-1, keepdim=True).clamp_min(1).to(scores.dtype)                 # (..., 1)
    return torch.where(valid, torch.sigmoid(scores - n.log()), torch.zeros_like(scores))
