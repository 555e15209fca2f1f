"""Each example normalizer against its paper's formula written out directly, and through the lab's registry."""
import itertools, math, subprocess, sys
import pytest
import torch
from sparse_attention_repro.normalizers import resolve_normalizer, check_normalizer, get_normalizer
from sparse_attention_examples.sigmoid_attention import sigmoid_attention
from sparse_attention_examples.scalable_softmax import ScalableSoftmax, S_START
from sparse_attention_examples.softpick import softpick, EPS
from sparse_attention_examples.softmax_sink import softmax_sink
from sparse_attention_examples.stick_breaking import stick_breaking
from sparse_attention_examples.relu_attention import relu_attention
from sparse_attention_examples.normmax import normmax
from sparse_attention_examples.learned_temperature_softmax import LearnedTemperatureSoftmax, N_KEYS
from sparse_attention_examples.asentmax import ASEntmax

NAMES = ("sigmoid_attention", "scalable_softmax", "softpick", "softmax_sink", "stick_breaking", "relu_attention", "normmax",
         "learned_temperature_softmax", "asentmax")
SUMS_TO_ONE = {"scalable_softmax", "normmax", "learned_temperature_softmax", "asentmax"}
LEARNED = {"scalable_softmax": "s", "learned_temperature_softmax": "t"}
MASK = torch.tensor([True, True, False, True, False, False]).view(1, 1, 1, 6)     # keys 0, 1 and 3 valid


def by_element(f, s, mask=None):
    "`f(row, valid, i) -> list` (i: the query's index) applied to every query row of `s [..., Tq, Tk]` in Python floats (float64)."
    valid = [True] * s.shape[-1] if mask is None else [bool(v) for v in mask.reshape(-1)]
    rows = s.reshape(-1, s.shape[-2], s.shape[-1])
    out = [[f([float(v) for v in row], valid, i) for i, row in enumerate(m)] for m in rows]
    return torch.tensor(out, dtype=torch.float64).view(s.shape)


def test_sigmoid_attention_is_the_papers_formula():
    s = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    ref = torch.tensor([[[[1 / (1 + math.exp(-(float(v) - math.log(6)))) for v in row] for row in h] for h in b] for b in s],
                       dtype=torch.float64)                                        # sigma(s - log n), element by element
    torch.testing.assert_close(sigmoid_attention(s), ref)
    mask = torch.tensor([True, True, False, True, False, False]).view(1, 1, 1, 6)
    p = sigmoid_attention(s, mask)
    torch.testing.assert_close(p[..., mask[0, 0, 0]], torch.sigmoid(s[..., mask[0, 0, 0]] - math.log(3)))   # n = 3 valid keys
    assert (p[..., ~mask[0, 0, 0]] == 0).all()


def test_sigmoid_attention_against_the_reference_bias():
    """The reference (the authors' FlashSigmoid) adds one constant bias b, from its configuration, to every row's scores.
    Without a mask and b = -log n the two agree; with masked keys ours takes b = -log(valid keys) per row, and a weight
    then differs from the constant-b one by at most tanh(log(n / valid) / 4)."""
    def reference(x, b, mask=None):                                     # sigmoid(x + b), masked keys 0
        p = torch.sigmoid(x + b)
        return p if mask is None else torch.where(mask.expand_as(p), p, torch.zeros_like(p))
    x = torch.randn(2, 3, 5, 97, dtype=torch.float64) * 3
    torch.testing.assert_close(sigmoid_attention(x), reference(x, -math.log(97)))
    mask = torch.zeros(1, 1, 1, 97, dtype=torch.bool); mask[..., :30] = True
    ours = sigmoid_attention(x, mask)
    torch.testing.assert_close(ours, reference(x, -math.log(30), mask))            # per row: b = -log(valid keys)
    gap = (ours - reference(x, -math.log(97), mask)).abs().max()                   # the constant b of the full length
    assert 0.1 < gap <= math.tanh(math.log(97 / 30) / 4) + 1e-12


def test_scalable_softmax_against_the_reference_n():
    """The most used re-implementation (the `scalable-softmax` package) has one scalar s and n = the row's full length,
    masked positions included. With every head at that s and no mask the two agree, gradient included; with masked keys
    ours takes n = the row's valid keys."""
    def reference(x, s, mask=None):                                     # softmax(s log(n) x), n = x.size(-1)
        x = x if mask is None else x.masked_fill(~mask, float("-inf"))
        return torch.softmax(x * s * math.log(x.shape[-1]), -1)
    norm = ScalableSoftmax(num_heads=3).double()
    x = torch.randn(2, 3, 5, 97, dtype=torch.float64, requires_grad=True)
    ours, ref = norm(x), reference(x, S_START)
    torch.testing.assert_close(ours, ref)
    g = torch.randn_like(ours)
    torch.testing.assert_close(torch.autograd.grad((ours * g).sum(), x)[0], torch.autograd.grad((ref * g).sum(), x)[0])
    mask = torch.zeros(1, 1, 1, 97, dtype=torch.bool); mask[..., :30] = True
    torch.testing.assert_close(norm(x, mask), torch.softmax((x * S_START * math.log(30)).masked_fill(~mask, float("-inf")), -1))
    assert (norm(x, mask) - reference(x, S_START, mask)).abs().max() > 0.01      # the full-length n differs on masked rows


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



def test_softpick_against_the_reference_epsilon():
    """The authors' code shifts by the row max and adds eps = 1e-8 after the shift (denominator sum|e^x - 1| + 1e-8 e^max);
    ours adds EPS = 1e-6 after a shift by max(0, row max). For scores of unit scale the two agree within 2e-8, masked keys
    included; for tiny scores (|x| ~ 1e-3, sum|e^x - 1| small) the eps terms weigh and the relative gap grows to ~1e-5."""
    def reference(x):                                                   # masked keys as -inf, as the reference masks them
        m = x.amax(-1, keepdim=True); e = torch.exp(x - m) - torch.exp(-m)
        return torch.relu(e) / (torch.where(x.isfinite(), e.abs(), 0).sum(-1, keepdim=True) + 1e-8)
    torch.manual_seed(0)
    mask = torch.zeros(1, 1, 1, 97, dtype=torch.bool); mask[..., :30] = True
    for scale, tol in ((1.0, 2e-8), (2.0, 2e-8)):
        x = torch.randn(8, 4, 17, 97, dtype=torch.float64) * scale
        assert (softpick(x) - reference(x)).abs().max() < tol
        assert (softpick(x, mask) - reference(x.masked_fill(~mask, float("-inf")))).abs().max() < tol
    tiny = torch.randn(8, 4, 17, 97, dtype=torch.float64) * 1e-3
    e = torch.exp(tiny) - 1
    torch.testing.assert_close(softpick(tiny), torch.relu(e) / (e.abs().sum(-1, keepdim=True) + EPS))   # ours: the formula's + eps
    rel = ((softpick(tiny) - reference(tiny)).abs() / reference(tiny))[reference(tiny) > 0].max()
    assert 1e-7 < rel < 1e-4

def test_softpick_gradient_is_autograd_through_the_formula():
    """The written-out gradient against autograd through the stable formula in plain torch ops, with masked keys and a
    row with no valid key."""
    def by_autograd(x, valid):
        x = torch.where(valid, x, torch.zeros_like(x))
        m = torch.where(valid, x, torch.full_like(x, float("-inf"))).amax(-1, keepdim=True).clamp_min(0)
        d = torch.where(valid, (x - m).exp() - (-m).exp(), torch.zeros_like(x))
        return torch.relu(d) / (d.abs().sum(-1, keepdim=True) + EPS * (-m).exp())
    mask = MASK.expand(3, 1, 1, 6).clone(); mask[2] = False
    for valid in (torch.ones(1, 1, 1, 6, dtype=torch.bool), mask):
        s = (torch.randn(3, 2, 4, 6, dtype=torch.float64) * 2).requires_grad_()
        g = torch.randn(3, 2, 4, 6, dtype=torch.float64)
        ours, ref = softpick(s, valid), by_autograd(s, valid.expand_as(s))
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(torch.autograd.grad((ours * g).sum(), s)[0], torch.autograd.grad((ref * g).sum(), s)[0])


@pytest.mark.parametrize("name", NAMES)
def test_registered_and_conforming(name):
    spec = resolve_normalizer(name)
    assert spec.name == name and check_normalizer(spec) == []
    assert spec.sums_to_one == (name in SUMS_TO_ONE) and spec.learned == tuple(LEARNED.get(name, ""))


def test_entry_points_resolve_in_a_fresh_process():
    code = ("from sparse_attention_repro.normalizers import resolve_normalizer as r; "
            f"print(' '.join(r(n).name + ':' + ','.join(r(n).learned) for n in {NAMES!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"{n}:{LEARNED.get(n, '')}" for n in NAMES]


@pytest.mark.parametrize("name", NAMES)
def test_gradient_matches_finite_differences_with_masks_and_empty_rows(name):
    norm = get_normalizer(name, num_heads=2).double()
    s = (torch.randn(3, 2, 4, 6, dtype=torch.float64) * 2).requires_grad_()
    mask = MASK.expand(3, 1, 1, 6).clone(); mask[2] = False                       # example 2: no valid key at all
    assert torch.autograd.gradcheck(lambda t: norm(t, mask), (s,), eps=1e-6, atol=1e-6)
    p = norm(s, mask)
    assert torch.equal(p[2], torch.zeros_like(p[2])) and (p[:2][~mask[:2].expand(2, 2, 4, 6)] == 0).all()
    (p * torch.randn_like(p)).sum().backward()
    assert torch.equal(s.grad[2], torch.zeros_like(s.grad[2])) and torch.isfinite(s.grad).all()


def test_softmax_sink_is_the_papers_formula():
    s = torch.randn(2, 3, 4, 6, dtype=torch.float64) * 2
    def sink(x, valid, i):
        e = [math.exp(v) if ok else 0.0 for v, ok in zip(x, valid)]
        return [v / (1 + sum(e)) for v in e]                                      # e^x_i / (1 + sum_j e^x_j)
    torch.testing.assert_close(softmax_sink(s), by_element(sink, s))
    torch.testing.assert_close(softmax_sink(s, MASK), by_element(sink, s, MASK))
    assert (softmax_sink(s).sum(-1) < 1).all()
    big = torch.tensor([[800.0, 799.0, -3.0]], dtype=torch.float64)               # e^800 overflows; the stable form does not
    torch.testing.assert_close(softmax_sink(big), torch.softmax(big, -1))        # the sink's share e^-800 is 0 in float64
    torch.testing.assert_close(softmax_sink(torch.zeros(1, 3)), torch.full((1, 3), 0.25))


def test_stick_breaking_is_the_papers_formula():
    def sticks(x, valid, r, tq=6):
        i = len(x) - tq + r                                                       # query r sits at key position Tk - Tq + r
        order = sorted(range(len(x)), key=lambda j: (abs(j - i), j))              # nearest first, i - d before i + d
        out, rest = [0.0] * len(x), 1.0
        for j in order:
            if not valid[j]: continue                                             # a masked key takes nothing
            beta = 1 / (1 + math.exp(-x[j]))
            out[j], rest = beta * rest, rest / (1 + math.exp(x[j]))               # break off beta; 1 - beta = sigmoid(-x) exactly
        return out
    for tq in (6, 4):                                                             # self-attention, and a block of the last queries
        s = torch.randn(2, 3, tq, 6, dtype=torch.float64) * 2
        ref = lambda x, valid, r: sticks(x, valid, r, tq)
        torch.testing.assert_close(stick_breaking(s), by_element(ref, s))
        torch.testing.assert_close(stick_breaking(s, MASK), by_element(ref, s, MASK))
    causal = torch.randn(1, 1, 5, 5, dtype=torch.float64)                         # the paper's case: the last query, keys before it
    j = torch.arange(5)
    p = stick_breaking(causal, (j < 4).view(1, 1, 1, 5))[0, 0, 4]
    b = torch.sigmoid(causal[0, 0, 4])
    torch.testing.assert_close(p[:4], torch.stack([b[k] * torch.prod(1 - b[k + 1:4]) for k in range(4)]))
    big = torch.tensor([[[60.0, -60.0, 30.0]]])                                   # float32: log space stays finite and exact
    torch.testing.assert_close(stick_breaking(big).double(), by_element(lambda x, v, r: sticks(x, v, r, 1), big.double()), rtol=1e-5, atol=1e-30)
    assert (stick_breaking(s).sum(-1) < 1).all()


def test_stick_breaking_gradient_is_autograd_through_the_formula_and_inference_mode():
    """The written-out gradient against autograd through the log-space formula in plain torch ops (logsigmoid, the
    keys gathered into each query's order, an exclusive cumulative sum), masks, an empty row and Tq != Tk included."""
    from sparse_attention_examples.stick_breaking import key_order
    def by_autograd(x, valid=None):
        tq, tk = x.shape[-2:]
        order = key_order(tq, tk).argsort(-1).expand(x.shape); place = order.argsort(-1)
        rest = torch.nn.functional.logsigmoid(-x)
        if valid is not None: rest = torch.where(valid, rest, torch.zeros_like(rest))
        in_order = rest.gather(-1, order)
        p = (torch.nn.functional.logsigmoid(x) + (in_order.cumsum(-1) - in_order).gather(-1, place)).exp()
        return p if valid is None else torch.where(valid, p, torch.zeros_like(p))
    mask = MASK.expand(3, 1, 1, 6).clone(); mask[2] = False
    for tq, valid in ((6, None), (6, mask), (4, mask)):
        s = (torch.randn(3, 2, tq, 6, dtype=torch.float64) * 3).requires_grad_()
        s.data[0, 0, 0, 1] = 0.0                                                  # sigmoid(0) = 1/2 exactly
        g = torch.randn(3, 2, tq, 6, dtype=torch.float64)
        ours, ref = stick_breaking(s, valid), by_autograd(s, valid)
        torch.testing.assert_close(ours, ref)
        torch.testing.assert_close(torch.autograd.grad((ours * g).sum(), s)[0], torch.autograd.grad((ref * g).sum(), s)[0])
    x = torch.randn(2, 3, 7, 7)                                                   # a first call in inference mode, then training
    with torch.inference_mode(): stick_breaking(x)
    y = x.clone().requires_grad_(); stick_breaking(y).sum().backward()
    assert torch.isfinite(y.grad).all()


def test_relu_attention_is_the_papers_formula():
    s = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    def rela(x, valid, i):
        n = sum(valid)
        return [max(v, 0.0) / n if ok else 0.0 for v, ok in zip(x, valid)]       # ReLU(s) / n over the n valid keys
    torch.testing.assert_close(relu_attention(s), by_element(rela, s))
    torch.testing.assert_close(relu_attention(s, MASK), by_element(rela, s, MASK))
    assert (relu_attention(s)[s < 0] == 0).all()


def _normmax_brute_force(x, valid, i):
    "The simplex point of <p, x> - ||p||_2's optimality conditions, trying every support: (x - tau)_+ normalised, sum (x - tau)_+^2 = 1."
    keys = [j for j in range(len(x)) if valid[j]]
    for k in range(1, len(keys) + 1):
        for sup in itertools.combinations(keys, k):
            S, Q = sum(x[j] for j in sup), sum(x[j] ** 2 for j in sup)
            disc = S * S - k * (Q - 1)                                            # k tau^2 - 2 S tau + Q - 1 = 0
            if disc < 0: continue
            tau = (S - math.sqrt(disc)) / k                                       # the root below the support's scores
            if all(x[j] > tau for j in sup) and all(x[j] <= tau for j in keys if j not in sup):
                q = [x[j] - tau if j in sup else 0.0 for j in range(len(x))]
                return [v / sum(q) for v in q]
    raise AssertionError("no support satisfies the optimality conditions")


def test_normmax_is_the_papers_formula():
    s = torch.randn(2, 3, 4, 6, dtype=torch.float64) * 1.5
    ref = by_element(_normmax_brute_force, s)
    torch.testing.assert_close(normmax(s), ref)
    torch.testing.assert_close(normmax(s, MASK), by_element(_normmax_brute_force, s, MASK))
    p, z = ref.view(-1, 6), s.view(-1, 6)                                           # p is the argmax of <p, z> - ||p||_2 ...
    q = torch.distributions.Dirichlet(torch.full((6,), 0.3, dtype=torch.float64)).sample((2000,))   # ... over random simplex points
    best = (z * p).sum(-1) - p.norm(dim=-1)
    assert (best[:, None] >= z @ q.T - q.norm(dim=-1) - 1e-12).all()
    assert (normmax(s)[s < s.amax(-1, keepdim=True) - 1] == 0).all()             # keys more than 1 below the top are dropped
    x = torch.tensor([[0.0, -3.0, -0.5, -0.25]])                                   # shift invariant, in float32 too
    torch.testing.assert_close(normmax(x + 1e4), normmax(x))


def test_normmax_in_float32_on_the_kernel_path():
    "float32 rows take the support from the lab's entmax-1.5 kernel (2z): the same weights, keys at tau get 0."
    s = torch.randn(3, 4, 5, 6, dtype=torch.float64) * 2
    for mask in (None, MASK):
        torch.testing.assert_close(normmax(s.float(), mask).double(), by_element(_normmax_brute_force, s, mask), rtol=1e-5, atol=1e-6)
    tau = (-1 - math.sqrt(7)) / 4                                                    # support {0, -0.5}: t^2 + (t + 0.5)^2 = 1
    torch.testing.assert_close(normmax(torch.tensor([[0.0, -1.0, -0.5, -3.0]])),
                               torch.tensor([[-tau, 0.0, -0.5 - tau, 0.0]]) / (-2 * tau - 0.5))
    p = normmax(torch.tensor([[0.0, -1.0]]))                                          # the second key sits exactly at tau = -1
    assert p[0, 1] == 0 and p[0, 0] == 1
    assert (normmax(torch.randn(64, 97) * 0.3) >= 0).all()


def test_normmax_keys_at_the_threshold():
    "A key placed at tau (float32's nearest value, and one step above) is within rounding of it: never a negative weight."
    import sparse_attention_repro.kernels as K
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(20000, 12, generator=gen, dtype=torch.float64)
    z = z - z.amax(-1, keepdim=True)
    x = z.float()
    x[:, 11] = torch.tensor([_normmax_tau(row) for row in z.tolist()]).float()     # key 11 at tau ...
    x[1::2, 11] = torch.nextafter(x[1::2, 11], torch.tensor(float("inf")))          # ... or one float32 step above it
    assert K.usable(x), "the float32 CPU path should use the kernel"
    p = normmax(x)
    tau = torch.tensor([_normmax_tau(row) for row in x.double().tolist()], dtype=torch.float64)[:, None]
    q = (x.double() - tau).clamp_min(0)
    assert (p >= 0).all() and torch.isfinite(p).all()
    torch.testing.assert_close(p.double(), q / q.sum(-1, keepdim=True), rtol=1e-5, atol=1e-6)
    off = x.double()[:, 11] <= tau[:, 0]
    assert off.any() and (p[off, 11] == 0).all()                                   # at or below the exact tau: exactly 0


def _normmax_tau(x):
    "The exact threshold of a row, by sorting (float64)."
    zs = sorted(x, reverse=True)
    for k in range(len(zs), 0, -1):
        top = zs[:k]; S, Q = sum(top), sum(v * v for v in top)
        disc = S * S - k * (Q - 1)
        if disc < 0: continue
        t = (S - math.sqrt(disc)) / k
        if t < top[-1] and (k == len(zs) or zs[k] <= t): return t
    raise AssertionError("no threshold")


def test_normmax_gradient_is_autograd_through_the_closed_form():
    from sparse_attention_examples.normmax import NormmaxFunction, _support_and_threshold, _threshold
    def by_autograd(z):                                                              # the support fixed, tau differentiated
        with torch.no_grad(): on = _support_and_threshold(z)[0]
        q = torch.where(on, z - _threshold(z, on), torch.zeros_like(z))
        return q / q.sum(-1, keepdim=True)
    s = torch.randn(3, 4, 5, 9, dtype=torch.float64) * 1.5
    s[0, 0, 0, 3:] = float("-inf")                                                   # masked keys
    z = (s - s.amax(-1, keepdim=True)).requires_grad_()
    g = torch.randn_like(s)
    a, = torch.autograd.grad((NormmaxFunction.apply(z) * g).sum(), z)
    b, = torch.autograd.grad((by_autograd(z) * g).sum(), z)
    torch.testing.assert_close(a, b)
    torch.autograd.gradcheck(NormmaxFunction.apply, (torch.randn(2, 7, dtype=torch.float64, requires_grad=True),))


def test_normmax_matches_the_entmax_package():
    entmax = pytest.importorskip("entmax")
    s = torch.randn(5, 3, 4, 11, dtype=torch.float64) * 3
    torch.testing.assert_close(normmax(s), entmax.normmax_bisect(s, alpha=2, n_iter=100))
    x = s.clone().requires_grad_(); y = s.clone().requires_grad_()
    g = torch.randn_like(s)
    (normmax(x) * g).sum().backward(); (entmax.normmax_bisect(y, alpha=2, n_iter=100) * g).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_learned_temperature_softmax_is_the_formula_and_starts_at_ssmax():
    norm = LearnedTemperatureSoftmax(num_heads=3).double()
    assert N_KEYS == 17 and torch.allclose(norm.t, torch.full((3,), S_START * math.log(17), dtype=torch.float64))
    z = torch.randn(2, 3, 4, 17, dtype=torch.float64)
    torch.testing.assert_close(norm(z), ScalableSoftmax(3).double()(z))           # = SSMax at 17 keys at initialisation
    torch.testing.assert_close(get_normalizer("learned_temperature_softmax", 3, n_keys=97).t.detach(),
                               ScalableSoftmax(3).s.detach() * math.log(97))
    temps = (0.5, 1.0, 3.0)
    with torch.no_grad(): norm.t.copy_(torch.tensor(temps))
    mask = torch.zeros(1, 1, 1, 17, dtype=torch.bool); mask[..., ::3] = True
    for m in (None, mask):
        for h, t in enumerate(temps):
            def tempered(x, valid, i):
                e = [math.exp(t * v) if ok else 0.0 for v, ok in zip(x, valid)]
                return [v / sum(e) for v in e]                                     # softmax(t_h z)
            torch.testing.assert_close(norm(z, m)[:, h], by_element(tempered, z[:, h], m))


def test_the_model_starts_learned_temperature_where_ssmax_starts():
    "In the lab's classifier the control starts at SSMax's s·log n for the model's own key count: 17 on images, 97 on text."
    from sparse_attention_repro.model import CompactClassifier, ClassifierConfig
    for seq_len, cfg in ((16, dict(input_dim=49)), (96, dict(vocab_size=50))):
        model = CompactClassifier(ClassifierConfig(4, seq_len, normalizer="learned_temperature_softmax", **cfg))
        ssmax = CompactClassifier(ClassifierConfig(4, seq_len, normalizer="scalable_softmax", **cfg))
        t = model.blocks[0].attn.normalizer.t.detach()
        torch.testing.assert_close(t, ssmax.blocks[0].attn.normalizer.s.detach() * math.log(seq_len + 1))
        assert abs(float(t[0]) - S_START * math.log(seq_len + 1)) < 1e-6


def test_learned_temperature_gets_a_gradient_and_stacks():
    norm = LearnedTemperatureSoftmax(num_heads=3).double()
    z = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    t = norm.t.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: torch.func.functional_call(norm, {"t": t}, (z, MASK)), (t,), eps=1e-6, atol=1e-6)
    (norm(z, MASK) * torch.randn(2, 3, 4, 6, dtype=torch.float64)).sum().backward()
    assert norm.t.grad.shape == (3,) and (norm.t.grad != 0).all()
    stack = get_normalizer("learned_temperature_softmax", num_heads=3, num_models=2).double()
    assert stack.t.shape == (2, 3)
    with torch.no_grad(): stack.t[1] = 2.0
    z5 = torch.stack([z, z.flip(0)])                                                # (M, B, H, Tq, Tk)
    p5 = stack(z5, MASK)
    torch.testing.assert_close(p5[0], LearnedTemperatureSoftmax(3).double()(z, MASK))
    torch.testing.assert_close(p5[1], torch.softmax(2.0 * z.flip(0).masked_fill(~MASK, float("-inf")), -1))
    (p5 * torch.randn_like(p5)).sum().backward()
    assert (stack.t.grad != 0).all()


def test_asentmax_against_the_reference_formula():
    """The reference's lines (deep-spin/asentmax, `sparse_gemma.py`), re-implemented on queries: a factor
    delta + softplus(W_b h) * log_pos ** (gamma_range * tanh(W_g h)) on the last `nope_heads` heads' queries, log_pos =
    log(arange(2, T + 2)) sliced at the queries, then scores q k / sqrt(d) with the causal mask added, then 1.5-entmax
    (the `entmax` package's, by bisection to round-off). Ours scales the score rows and takes `hidden` and `positions`."""
    import entmax
    torch.manual_seed(0)
    B, H, S, T, d, C = 2, 4, 2, 9, 8, 16
    norm = ASEntmax(num_heads=H, width=C, nope_heads=S).double()
    with torch.no_grad():                                                   # away from the start, so every term matters
        for lin in (norm.beta, norm.gamma): lin.weight.normal_(0, 0.5); lin.bias.normal_(0, 0.5)
    h, q, k = (torch.randn(B, T, C, dtype=torch.float64), torch.randn(B, H, T, d, dtype=torch.float64),
               torch.randn(B, H, T, d, dtype=torch.float64))
    log_pos = torch.log(torch.arange(2, T + 2, dtype=torch.float64))[0:T]                 # [k_len - q_len : k_len]
    beta = torch.nn.functional.softplus(norm.beta(h)).transpose(1, 2)[..., None]           # (B, S, T, 1)
    gamma = 2 * torch.tanh(norm.gamma(h)).transpose(1, 2)[..., None]
    scaler = 1 + beta * log_pos.view(1, 1, T, 1) ** gamma
    q_ref = q.clone(); q_ref[:, -S:] = q[:, -S:] * scaler
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores_ref = (q_ref @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
    ref = entmax.entmax_bisect(scores_ref, alpha=1.5, dim=-1, n_iter=200)
    ours = norm(q @ k.transpose(-1, -2) / math.sqrt(d), causal.view(1, 1, T, T), hidden=h, positions=torch.arange(T))
    torch.testing.assert_close(ours, ref, atol=1e-9, rtol=0)
    # a block of queries (positions 5..8 against keys 0..8) gives those rows
    blk = norm(q[:, :, 5:] @ k.transpose(-1, -2) / math.sqrt(d), causal[5:].view(1, 1, 4, T), hidden=h[:, 5:], positions=torch.arange(5, T))
    torch.testing.assert_close(blk, ref[:, :, 5:], atol=1e-9, rtol=0)


def test_asentmax_starts_near_one_plus_log_two_and_without_context_uses_positions():
    norm = ASEntmax(num_heads=2, width=8).double()
    c = norm.factor(torch.zeros(1, 6, 8, dtype=torch.float64), torch.arange(6))
    torch.testing.assert_close(c, torch.full_like(c, 1 + math.log(2)))      # biases 0: softplus(0) = log 2, log_pos ** 0 = 1
    with torch.no_grad(): norm.gamma.bias.fill_(5.0)                         # gamma -> 2: the factor grows as log(i+2)^2
    s = torch.randn(1, 2, 3, 6, dtype=torch.float64)
    alone = norm(s)                                                          # no context: zero features, queries at keys 3, 4, 5
    c0 = norm.factor(torch.zeros(1, 3, 8, dtype=torch.float64), torch.arange(3, 6))
    from sparse_attention_repro.normalizers import entmax15
    torch.testing.assert_close(alone, entmax15(s * c0))
