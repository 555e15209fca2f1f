"""Rectified linear attention, ReLA (Zhang, Titov & Sennrich, 2021, "Sparse Attention with Linear Units"), scaled by
1/n as in ReLU attention (Wortsman, Lee, Gilmer & Kornblith, 2023, "Replacing softmax with ReLU in Vision Transformers"):

    p_ij = ReLU(s_ij) / n,    n the number of keys query i may attend to

A key with a negative score gets exactly zero; rows are not normalised (they sum to anything >= 0, 0 included). Choices:
- ReLA normalises the attention *output* (an RMSNorm of the weighted values, optionally gated); that acts after the
  weighted sum, outside what a normalizer returns, so only the ReLU is kept here.
- without that output norm the row sums grow with the number of keys, so we divide by n (Wortsman et al.'s relu(x)/L);
  with a key mask n counts the valid keys of the row (as sigmoid_attention does), so padding does not dilute a row.
- masked keys get exactly 0; a row with no valid key gives zeros.
"""
import torch
from sparse_attention_repro.normalizers import register_normalizer


@register_normalizer("relu_attention", sums_to_one=False, stackable=True)
def relu_attention(scores, key_mask=None):
    "ReLU(scores) / n over keys, n the number of valid keys of each row; masked keys 0."
    if key_mask is None: return torch.relu(scores) / scores.shape[-1]
    valid = key_mask.to(torch.bool).expand_as(scores)
    n = valid.sum(-1, keepdim=True).clamp_min(1).to(scores.dtype)                 # (..., 1)
    return torch.where(valid, torch.relu(scores) / n, torch.zeros_like(scores))
