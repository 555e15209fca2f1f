"""Softmax with a learned temperature per head, the fixed-length control of Scalable-Softmax (Nakanishi, 2025,
"Scalable-Softmax Is Superior for Attention"):

    p = softmax(t_h z),    t_h learned, one per head

At one sequence length n, SSMax is softmax((s log n) z): this very function with t = s log n. The two differ only in
their parametrisation (an optimiser's step in s moves t by log n times as much) and, under a key mask, in n (SSMax
counts each row's valid keys; t is one number). Training both tells whether SSMax's gain is its length scaling or just
a learned temperature. Choices:
- start: t = S_START * log n_keys, with SSMax's S_START = 0.43, so that at initialisation this module equals SSMax
  at n_keys keys. n_keys is an option that the lab's classifier fills with its own key count (sequence + CLS): 17 on
  the image datasets (t = 1.22), 97 on 20 Newsgroups (t = 1.97). Built on its own it defaults to 17. With padding
  masked, SSMax's n varies by row and t's start is still the fixed 97. In the pretrained encoder (Crisp's regime) the
  batches are padded to their longest sentence, so no one key count exists: it starts at the default, t = 1.22.
- one t per head, `[H]`, or `[M, H]` for a stack of M models, like ScalableSoftmax's s; `t` is recorded per epoch.
- the library's softmax does the masking: masked keys 0, a row with no valid key all zeros.
"""
import math
import torch
import torch.nn as nn
from sparse_attention_repro.normalizers import register_normalizer, softmax
from .scalable_softmax import S_START

N_KEYS = 17     # the default n_keys: 16 image patches + CLS


@register_normalizer("learned_temperature_softmax", learned=("t",), stackable=True, options=("n_keys",))
class LearnedTemperatureSoftmax(nn.Module):
    "softmax(t * scores) with one learned t per head, started at SSMax's s log(n_keys)."
    def __init__(self, num_heads, num_models=None, n_keys=N_KEYS):
        super().__init__()
        start = S_START * math.log(n_keys)
        self.t = nn.Parameter(torch.full((num_heads,) if num_models is None else (num_models, num_heads), start))

    def forward(self, scores, key_mask=None):
        t = self.t.view(-1, 1, 1) if self.t.dim() == 1 else self.t.view(self.t.shape[0], 1, -1, 1, 1)
        return softmax(scores * t.to(scores.dtype), key_mask)
