"""Scalable-Softmax, SSMax (Nakanishi, 2025, "Scalable-Softmax Is Superior for Attention").

Softmax of the scores multiplied by s·log n, with n the number of keys and s a learned scalar, here one per head:

    SSMax(z)_i = n^(s z_i) / sum_j n^(s z_j) = softmax((s log n) z)_i

so attention does not flatten as n grows. The paper leaves s's start open; we start every head at s = 0.43, the default
of the most used re-implementation (the `scalable-softmax` package; at the lab's 17 and 97 keys, s log n is then 1.22
and 1.97). `s` is recorded per epoch.

Against that re-implementation (no code from the paper's author was found): equal without a key mask, weights and
gradient, when every head starts at its s. It has one scalar s and takes n as the row's full length, masked positions
included; ours has one s per head (a head-wise scale, like the adaptive entmax's alpha) and, with a key mask, n = the
row's valid keys, so padding does not sharpen a short document's row. The lab's main runs leave padding unmasked, where
the two n agree. `test_scalable_softmax_against_the_reference_n` pins both readings.
"""
import math
import torch
import torch.nn as nn
from sparse_attention_repro.normalizers import register_normalizer, softmax

S_START = 0.43


@register_normalizer("scalable_softmax", learned=("s",), stackable=True)
class ScalableSoftmax(nn.Module):
    "softmax(s log(n) * scores) with one learned s per head (`[H]`, or `[M, H]` for a stack of M models)."
    def __init__(self, num_heads, num_models=None):
        super().__init__()
        self.s = nn.Parameter(torch.full((num_heads,) if num_models is None else (num_models, num_heads), S_START))

    def forward(self, scores, key_mask=None):
        s = self.s.view(-1, 1, 1) if self.s.dim() == 1 else self.s.view(self.s.shape[0], 1, -1, 1, 1)
        if key_mask is None: log_n = math.log(scores.shape[-1])
        else: log_n = key_mask.to(torch.bool).expand_as(scores).sum(-1, keepdim=True).clamp_min(1).to(scores.dtype).log()
        return softmax(scores * (s * log_n).to(scores.dtype), key_mask)
