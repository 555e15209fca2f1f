"""Softmax with a sink, the "off-by-one" softmax (Miller, 2023, "Attention Is Off By One", evanmiller.org; the zero
sink of Xiao, Tian, Chen, Han & Lewis, 2024, "Efficient Streaming Language Models with Attention Sinks", is the same).

Every row gets one more, virtual, key with score 0 and a zero value:

    p_i = e^{x_i} / (1 + sum_j e^{x_j})

so a query can put its attention on nothing: a row sums to 1 - (the sink's share) < 1. Choices:
- the sink's score is fixed at 0, as in Miller's softmax_1, not learned per head (as some later models do): the method
  stays parameter-free and is exactly the formula of the paper.
- computed stably by multiplying numerator and denominator by e^{-m}, m = max(0, max_j x_j): no exponent is positive and
  the sink's 1 becomes e^{-m}. m is taken out of the graph: the ratio does not depend on it, so the gradient is exact.
- masked keys are left out of the sum and get exactly 0; a row with no valid key gives zeros (all of it on the sink)
  with no special case, and a zero gradient.
"""
import torch
from sparse_attention_repro.normalizers import register_normalizer


@register_normalizer("softmax_sink", sums_to_one=False, stackable=True)
def softmax_sink(scores, key_mask=None):
    "e^x / (1 + sum e^x) over the valid keys; masked keys 0."
    x = scores if key_mask is None else scores.masked_fill(~key_mask.to(torch.bool), float("-inf"))
    m = x.detach().amax(-1, keepdim=True).clamp_min(0)                             # (..., 1); 0 for a row with no valid key
    e = (x - m).exp()                                                              # e^{-m} e^x, masked keys 0
    return e / ((-m).exp() + e.sum(-1, keepdim=True))
