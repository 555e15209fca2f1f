"""Property tests (hypothesis) over every registry normalizer: random shapes, masks (fully masked rows included),
huge / tiny / equal logits, float32 / float64 / bf16 -> finite, rows sum to 1 over valid keys (0 for empty rows),
masked keys exactly 0, gradients finite; a NaN, a +inf or a row of -inf makes exactly its row NaN."""
import torch
from hypothesis import given, settings, strategies as st, HealthCheck
from sparse_attention_repro.normalizers import get_normalizer
from sparse_attention_repro.study import PAPER_METHODS, ORIGINAL_GRADIENT_VARIANTS

NAMES = PAPER_METHODS + ORIGINAL_GRADIENT_VARIANTS + ("topk_softmax_02", "topk_softmax_1")
DTYPES = {"float32": (torch.float32, 1e-5), "float64": (torch.float64, 1e-10), "bfloat16": (torch.bfloat16, 2e-2)}

@st.composite
def cases(draw):
    b, h = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    tq, tk = draw(st.integers(1, 9)), draw(st.integers(1, 12))
    scale = draw(st.sampled_from([0.0, 1e-6, 1.0, 30.0, 1e4]))      # equal, tiny, ordinary, large, huge logits
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, h, tq, tk, generator=g, dtype=torch.float64) * scale
    if draw(st.booleans()):                                          # ties: round to a coarse grid
        scores = scores.round()
    mask_kind = draw(st.sampled_from(["none", "random", "with_empty_rows", "all_masked"]))
    mask = None
    if mask_kind != "none":
        mask = torch.rand(b, 1, tq, tk, generator=g) > 0.4
        if mask_kind == "with_empty_rows": mask[:, :, 0] = False
        if mask_kind == "all_masked": mask[:] = False
    return draw(st.sampled_from(NAMES)), draw(st.sampled_from(sorted(DTYPES))), scores, mask, h

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_normalizer_properties(case):
    name, dtype_name, scores, mask, h = case
    dtype, tol = DTYPES[dtype_name]
    norm = get_normalizer(name, num_heads=h)
    s = scores.to(dtype).requires_grad_()
    p = norm(s, mask)
    assert p.shape == s.shape and p.dtype == dtype
    pf = p.detach().double()
    assert torch.isfinite(pf).all(), name
    assert (pf >= 0).all()
    valid = torch.ones_like(pf, dtype=torch.bool) if mask is None else mask.expand_as(pf)
    assert (pf[~valid] == 0).all(), "masked keys must get exactly 0"
    has_valid = valid.any(-1)
    sums = pf.sum(-1)
    assert torch.allclose(sums[has_valid], torch.ones_like(sums[has_valid]), atol=tol * 10), (name, sums)
    assert (sums[~has_valid] == 0).all(), "a row with no valid key must be all zeros"
    (p.float() * torch.randn(p.shape)).sum().backward()
    assert torch.isfinite(s.grad.double()).all(), name
    if (~has_valid).any():
        assert (s.grad.double()[~has_valid] == 0).all(), "empty rows get no gradient"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["nan", "+inf", "all -inf"]), st.integers(0, 2**31 - 1))
def test_nonfinite_scores_make_their_row_nan(case, kind, pick):
    name, dtype_name, scores, mask, h = case
    dtype = DTYPES[dtype_name][0]
    norm = get_normalizer(name, num_heads=h)
    valid = torch.ones(scores.shape, dtype=torch.bool) if mask is None else mask.expand(scores.shape)
    rows = valid.any(-1).nonzero()
    if not len(rows): return                                          # every row is masked out: nothing to poison
    r = tuple(rows[pick % len(rows)].tolist())
    keys = valid[r].nonzero().flatten()
    s = scores.clone()
    if kind == "all -inf": s[r] = float("-inf")
    else: s[r + (int(keys[pick % len(keys)]),)] = float("nan") if kind == "nan" else float("inf")
    p = norm(s.to(dtype), mask).double()
    assert p[r].isnan().all(), (name, kind, p[r])
    others = torch.ones(p.shape[:-1], dtype=torch.bool); others[r] = False
    assert torch.isfinite(p[others]).all(), name
