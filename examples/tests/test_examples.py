"""Each example normalizer against its paper's formula written out directly, and through the lab's registry."""
import math, subprocess, sys
import pytest
import torch
from sparse_attention_repro.normalizers import resolve_normalizer, check_normalizer, get_normalizer
from sparse_attention_examples.sigmoid_attention import sigmoid_attention
from sparse_attention_examples.scalable_softmax import ScalableSoftmax, S_START
from sparse_attention_examples.softpick import softpick, EPS

NAMES = ("sigmoid_attention", "scalable_softmax", "softpick")


def test_sigmoid_attention_is_the_papers_formula():
    s = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    ref = torch.tensor([[[[1 / (1 + math.exp(-(float(v) - math.log(6)))) for v in row] for row in h] for h in b] for b in s],
                       dtype=torch.float64)                                        # sigma(s - log n), element by element
    torch.testing.assert_close(sigmoid_attention(s), ref)
    mask = torch.tensor([True, True, False, True, False, False]).view(1, 1, 1, 6)
    p = sigmoid_attention(s, mask)
    torch.testing.assert_close(p[..., mask[0, 0, 0]], torch.sigmoid(s[..., mask[0, 0, 0]] - math.log(3)))   # n = 3 valid keys
    assert (p[..., ~mask[0, 0, 0]] == 0).all()


def test_scalable_softmax_is_the_papers_formula():
    norm = ScalableSoftmax(num_heads=3).double()
    with torch.no_grad(): norm.s.copy_(torch.tensor([0.2, 0.43, 1.1]))
    z = torch.randn(2, 3, 4, 7, dtype=torch.float64)
    n = 7
    powers = torch.pow(torch.tensor(float(n), dtype=torch.float64), norm.s.detach().view(3, 1, 1) * z)    # n^(s z_i)
    torch.testing.assert_close(norm(z), powers / powers.sum(-1, keepdim=True))
    assert torch.allclose(ScalableSoftmax(4).s, torch.full((4,), S_START))


def test_softpick_is_the_papers_formula():
    x = torch.randn(2, 3, 4, 9, dtype=torch.float64) * 2
    e = torch.exp(x) - 1
    ref = torch.relu(e) / (e.abs().sum(-1, keepdim=True) + EPS)                   # the unstable textbook form
    torch.testing.assert_close(softpick(x), ref)
    assert (softpick(x)[x < 0] == 0).all() and (softpick(x).sum(-1) <= 1 + 1e-12).all()
    big = torch.tensor([[800.0, 799.0, -3.0]], dtype=torch.float64)              # e^800 overflows; the stable form does not
    torch.testing.assert_close(softpick(big), torch.tensor([[1 / (1 + math.exp(-1)), math.exp(-1) / (1 + math.exp(-1)), 0.0]],
                                                          dtype=torch.float64))


@pytest.mark.parametrize("name", NAMES)
def test_registered_and_conforming(name):
    spec = resolve_normalizer(name)
    assert spec.name == name and check_normalizer(spec) == []
    assert spec.sums_to_one == (name == "scalable_softmax")


def test_entry_points_resolve_in_a_fresh_process():
    code = ("from sparse_attention_repro.normalizers import resolve_normalizer as r; "
            "print(' '.join(r(n).name + ':' + ','.join(r(n).learned) for n in ('sigmoid_attention', 'scalable_softmax', 'softpick')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["sigmoid_attention:", "scalable_softmax:s", "softpick:"]
