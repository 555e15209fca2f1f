# %% [markdown]
# # Attention normalizers
# > Softmax, sparsemax, entmax-1.5, head-wise adaptive entmax and top-k softmax behind one registry, with exact gradients.

# %%
#| default_exp normalizers

# %% [markdown]
# Self-attention turns a row of scores $s = q K^\top / \sqrt{d}$ into a probability vector over keys. Both studies this
# project reproduces change only that step:
#
# * **Study A** (Canay 2026) swaps softmax for *sparse* mappings — sparsemax, entmax-1.5, a head-wise *learned* entmax
#   ($\alpha$ per head) and top-k softmax at three ratios — inside a tiny classifier.
# * **Study B** (Crisp Attention) masks the lowest scores before the softmax; that is top-k softmax with ratio
#   $1 - \text{sparsity}$, so the same code serves it.
#
# Every mapping is written once, in the notebook of its family, registered here through `register_normalizer` and
# reached by name through `get_normalizer`. All of them take
# `scores` of shape `[..., H, T_query, T_key]` and an optional boolean `key_mask` (broadcastable, `True` = may attend),
# and return probabilities of the same shape. Two rules hold for every normalizer:
#
# 1. a masked key gets exactly 0;
# 2. a query row with *no* valid key returns all zeros (never NaN), and its gradient is zero.
#
# **One mapping, two implementations.** Each sparse mapping is written with torch operations — any dtype, any device;
# this is the reference that the tests of its notebook check against the `entmax` package in float64. For float32 on the
# CPU, the training case, the same algorithm runs row by row in a small C kernel (`sparse_attention_repro.kernels`) that
# keeps each row in cache across iterations: 5–15× faster at the paper's shapes. `kernels.use_kernels(False)` forces the
# torch path; the kernels notebook checks one against the other.
#
# **Where each part lives.** One family per notebook, as in the `entmax` package and our `examples/`: the masks and the
# treatment of empty and non-finite rows that every normalizer shares in `00a_masks`, sparsemax in `00b_sparsemax`,
# entmax-1.5, $\alpha$-entmax, the head-wise adaptive entmax and the original's bisection in `00c_entmax`, top-k softmax in
# `00d_topk`. This notebook keeps softmax, the names, the registry with its conformance suite, and the properties checked
# over every registered normalizer; `sparse_attention_repro.normalizers` re-exports every mapping, so
# `from sparse_attention_repro.normalizers import entmax15` works as before.

# %%
#| export
import copy, importlib, importlib.metadata, re
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable
import torch
import torch.nn as nn
from sparse_attention_repro import kernels as K
from sparse_attention_repro.masks import mask_scores, finish_rows, upcast, no_scores
from sparse_attention_repro.sparsemax_mapping import SparsemaxFunction, sparsemax
from sparse_attention_repro.entmax_mapping import (ENTMAX_ALPHA_ITERS, ENTMAX_ALPHA_NEAR_ONE, ORIGINAL_BISECT_STEPS, ALPHA_MIN,
    ALPHA_SPAN, ALPHA_MAX, Entmax15Function, entmax15, EntmaxAlphaFunction, entmax_alpha, EntmaxBisectFunction, entmax_bisect,
    adaptive_alpha, HeadwiseAdaptiveEntmax)
from sparse_attention_repro.topk_mapping import keep_count, TopkSoftmaxFunction, topk_softmax

# the families' names, re-exported: everything importable from this module before the split still is (and is in __all__)
_all_ = ["ENTMAX_ALPHA_ITERS", "ENTMAX_ALPHA_NEAR_ONE", "ORIGINAL_BISECT_STEPS", "ALPHA_MIN", "ALPHA_SPAN", "ALPHA_MAX",
         "SparsemaxFunction", "sparsemax", "Entmax15Function", "entmax15", "EntmaxAlphaFunction", "entmax_alpha",
         "EntmaxBisectFunction", "entmax_bisect", "adaptive_alpha", "HeadwiseAdaptiveEntmax", "keep_count",
         "TopkSoftmaxFunction", "topk_softmax"]

# %%
from fastcore.test import test_eq, test_close, test_fail
from torch.autograd import Function
import itertools
from sparse_attention_repro.study import PAPER_METHODS, ORIGINAL_GRADIENT_VARIANTS   # the study design (names only)


# %% [markdown]
# ## Softmax — the dense baseline
#
# $\mathrm{softmax}(s)_i = e^{s_i} / \sum_j e^{s_j}$. Every key gets positive weight, so attention is never sparse.

# %%
#| export
def softmax(scores, key_mask=None):
    "Dense softmax over the last (key) dimension."
    if scores.numel() == 0: return no_scores(scores)
    if key_mask is None: return torch.softmax(upcast(scores), -1).to(scores.dtype)   # bad rows are NaN already
    s, empty = mask_scores(upcast(scores), key_mask)
    return finish_rows(torch.softmax(s, -1), s, empty).to(scores.dtype)


# %% [markdown]
# Without a key mask there are no empty rows, and torch's softmax already turns every row whose scores hold a NaN or
# $+\infty$, or no finite value, into NaN, which is all `finish_rows` would do; so that path skips it (a pass over the
# `[B, H, T, T]` scores, 0.14 ms of 0.34 at 96×4×17×17 and 0.65 of 3.3 ms at 96×4×97×97 in the forward, one thread). The
# check: the same values and NaNs as with `finish_rows`, on rows of every kind.

# %%
x = torch.randn(2, 4, 5, 7)
test_close(softmax(x), torch.softmax(x, -1))
bad = torch.randn(6, 7)
bad[0, 3], bad[1, 5], bad[2], bad[3, :4], bad[4, 2] = float("nan"), float("inf"), float("-inf"), float("inf"), float("-inf")
bad[5] = torch.tensor([1e30, -1e30, 3e38, 0, -3e38, 5, 1])
ref = finish_rows(torch.softmax(bad, -1), bad, None)
test_eq(softmax(bad).isnan(), ref.isnan()); test_eq(softmax(bad).nan_to_num(), ref.nan_to_num())
test_eq(softmax(bad).isnan().all(-1), torch.tensor([True, True, True, True, False, False]))
mask = torch.rand(2, 1, 1, 7) > 0.4
mask[..., 0] = True
test_close(softmax(x, mask), torch.softmax(x.masked_fill(~mask, -1e9), -1), eps=1e-6)



# %% [markdown]
# ## Names
#
# A top-k ratio is written in a name without its dot (`topk_softmax_0125` is $r = 0.125$), a start value of the
# adaptive entmax likewise (`headwise_adaptive_entmax_start12` starts every head at $\alpha = 1.2$).

# %%
#| export
def parse_topk_ratio(name):
    "Ratio encoded in a `topk_softmax_<digits>` name: '0125' -> 0.125, '1' -> 1.0; None if `name` is not top-k."
    if not name.startswith("topk_softmax_"): return None
    digits = name[len("topk_softmax_"):]
    if not digits.isdigit(): raise ValueError(f"bad top-k name {name!r}: write the ratio without its dot, e.g. topk_softmax_025 for 0.25")
    ratio = float(digits[0] + "." + digits[1:]) if len(digits) > 1 else float(digits)
    if not 0 < ratio <= 1: raise ValueError(f"top-k ratio of {name!r} is {ratio}, must be in (0, 1]")
    return ratio

def parse_alpha_start(name):
    "The start alpha in a `headwise_adaptive_entmax_start<digits>` name: 'start12' -> 1.2, 'start18' -> 1.8."
    d = name.removeprefix("headwise_adaptive_entmax_start")
    if not (d.isdigit() and len(d) >= 2 and d[0] == "1"):
        raise ValueError(f"unknown normalizer {name!r}: write the start alpha without its dot, e.g. headwise_adaptive_entmax_start12 for 1.2")
    return float(d[0] + "." + d[1:])

def topk_name(ratio):
    "Canonical name of top-k softmax at `ratio`: 0.125 -> 'topk_softmax_0125'."
    name = "topk_softmax_" + f"{float(ratio):.6f}".rstrip("0").replace(".", "")
    parse_topk_ratio(name)
    return name


# %%
test_eq([parse_topk_ratio(n) for n in ("topk_softmax_0125", "topk_softmax_025", "topk_softmax_05")], [0.125, 0.25, 0.5])
test_eq(parse_topk_ratio("topk_softmax_02"), 0.2)
test_eq(parse_topk_ratio("topk_softmax_1"), 1.0)
test_eq(parse_topk_ratio("softmax"), None)
test_eq([topk_name(r) for r in (0.125, 0.25, 0.5, 0.2, 1.0)],
        ["topk_softmax_0125", "topk_softmax_025", "topk_softmax_05", "topk_softmax_02", "topk_softmax_1"])
test_fail(lambda: parse_topk_ratio("topk_softmax_0.25"), contains="without its dot")
test_fail(lambda: parse_topk_ratio("topk_softmax_0"), contains="(0, 1]")
test_fail(lambda: parse_topk_ratio("topk_softmax_2"), contains="(0, 1]")
test_eq([parse_alpha_start(f"headwise_adaptive_entmax_start{d}") for d in ("12", "18", "175")], [1.2, 1.8, 1.75])
test_fail(lambda: parse_alpha_start("headwise_adaptive_entmax_start1.2"), contains="without its dot")

# %% [markdown]
# ## The registry
#
# One open registry serves every model of the project — study A's classifier, its stacked GPU path and Crisp's
# pretrained encoder. A normalizer enters it only through `register_normalizer`, the paper's seven included, and it
# *declares* what it is instead of the code guessing from its name:
#
# | capability | meaning |
# |---|---|
# | `sums_to_one` | each row is a distribution over the valid keys (sigmoid or ReLU attention: `False`) |
# | `learned` | attributes of the built module recorded after every epoch, any name and shape (e.g. `("alpha",)`) |
# | `stackable` | the factory takes `num_models`: one parameter set per model of a stack (`model.StackedClassifiers`) |
# | `kernel` | a C row kernel (`kernels`) serves it on the CPU |
# | `exact_gradient` | `False` declares an approximate backward (the original's bisection): no finite-difference check |
# | `options` | keyword options the factory accepts (`scope` for top-k, `n_iter` for the adaptive entmax) |
#
# A normalizer is a parameter-free function `fn(scores, key_mask=None, **options)`, an `nn.Module` class built as
# `cls(num_heads=H, **options)`, or any `factory(num_heads, num_models=None, **options)`. Every built normalizer is
# an `nn.Module` called as `norm(scores, key_mask=None)`; one that declares `query_context` (ASEntmax, whose scale depends
# on each query's input and position) also takes `hidden` `[B, Tq, C]` and `positions` `[Tq]` where a model has them,
# and must work without them. Names are canonical method names of the results tables, so
# they must be identifiers (they become file names and columns); two families are open-ended: `topk_softmax_<digits>`
# (the ratio without its dot, `topk_softmax_0125` is $r = 0.125$) and `headwise_adaptive_entmax_start<digits>`.

# %%
#| export
ENTRY_POINT_GROUP = "sparse_attention_repro.normalizers"     # outside packages register through this entry-point group

@dataclass(frozen=True)
class NormalizerSpec:
    "A registered attention normalizer: how to build it and what it declares about itself."
    name: str
    factory: Callable                 # factory(num_heads=H, [num_models=M], **options) -> nn.Module
    sums_to_one: bool = True          # rows are distributions over the valid keys
    learned: tuple = ()               # module attributes recorded per epoch (any name, any shape)
    stackable: bool = False           # accepts num_models (one parameter set per model of a stack)
    kernel: bool = False              # a C row kernel serves it on the CPU
    fused: Callable | None = None     # fused(module) -> the C attention kernel's arguments that compute a built module, or None
    exact_gradient: bool = True       # False: a declared approximate backward
    options: tuple = ()               # keyword options the factory accepts
    query_context: bool = False       # forward also takes hidden=[B, Tq, C] (the layer input at the queries) and positions=[Tq]
    source: str = ""                  # the module that registered it (the library's, or an outside package's)

    def build(self, num_heads: int = 1, num_models: int | None = None, **options) -> nn.Module:
        "The normalizer module for `num_heads` heads (and a stack of `num_models` models)."
        if bad := sorted(set(options) - set(self.options)):
            raise ValueError(f"{self.name} takes " + (f"only {', '.join(self.options)}" if self.options else "no options") + f", got {bad}")
        if num_models is not None and not self.stackable:
            raise ValueError(f"{self.name} does not declare stackable=True, so it cannot train as a stack of models; drop --stack-seeds")
        return self.factory(num_heads=num_heads, **({} if num_models is None else dict(num_models=num_models)), **options)

    def build_for_keys(self, num_heads: int, n_keys: int, num_models: int | None = None) -> nn.Module:
        "The module for attention over `n_keys` keys: one that declares the option `n_keys` (its start depends on it) gets it."
        return self.build(num_heads, num_models, **({"n_keys": n_keys} if "n_keys" in self.options else {}))

class Normalizer(nn.Module):
    "A parameter-free attention normalizer `fn(scores, key_mask, **kwargs)` as a module."
    def __init__(self, name, fn, **kwargs):
        super().__init__()
        self.name, self.fn, self.kwargs = name, fn, kwargs
    def forward(self, scores, key_mask=None): return self.fn(scores, key_mask=key_mask, **self.kwargs)
    def extra_repr(self): return self.name

def _function_factory(name, fn, **bound):
    "The factory of the parameter-free normalizer `fn` (with `bound` keyword arguments fixed)."
    def factory(num_heads=1, num_models=None, **options): return Normalizer(name, fn, **bound, **options)
    return factory

_REGISTRY: dict = {}     # name -> NormalizerSpec
_FAMILIES: dict = {}     # name prefix -> make(name) -> NormalizerSpec
_CONFORMING: set = set() # names that passed the conformance suite in this process

def _check_name(name):
    if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)):
        raise ValueError(f"normalizer name {name!r} must be an identifier (letters, digits, _): it becomes a file name and a column")

def _add(spec: NormalizerSpec, origin=None) -> NormalizerSpec:
    "Put `spec` in the registry; a name taken by another definition is refused."
    old = _REGISTRY.get(spec.name)
    if old is not None and old != spec and getattr(old, "_origin", None) != origin:
        raise ValueError(f"normalizer {spec.name!r} is already registered (from {old.source}); choose another name")
    object.__setattr__(spec, "_origin", origin)
    _REGISTRY[spec.name] = spec; _CONFORMING.discard(spec.name)
    return spec

def register_normalizer(name: str, normalizer=None, *, factory=None, **capabilities):
    """Register `normalizer` — a parameter-free function `fn(scores, key_mask=None, **options)` or an `nn.Module` class
    built as `cls(num_heads=H, **options)` — or a `factory(num_heads, num_models=None, **options)` under `name`, with
    the `NormalizerSpec` capabilities. As a decorator, `@register_normalizer(name, ...)`, it returns the function or class
    unchanged, with its spec as `__normalizer__`."""
    _check_name(name)
    if bad := sorted(set(capabilities) - (set(NormalizerSpec.__dataclass_fields__) - {"name", "factory"})):
        raise ValueError(f"unknown capabilities {bad} for {name}; choose from sums_to_one, learned, stackable, kernel, exact_gradient, options, query_context, source")
    def add(obj):
        if factory is not None: make = factory
        elif isinstance(obj, type) and issubclass(obj, nn.Module): make = obj
        elif callable(obj): make = _function_factory(name, obj)
        else: raise TypeError(f"register_normalizer({name!r}): give a function, an nn.Module class or factory=, not {type(obj).__name__}")
        where = obj if obj is not None else factory
        origin = f"{getattr(where, '__module__', '')}.{getattr(where, '__qualname__', repr(where))}"
        caps = {"source": getattr(where, "__module__", None) or "unknown", **capabilities}
        spec = _add(NormalizerSpec(name, make, **{k: tuple(v) if k in ("learned", "options") else v for k, v in caps.items()}), origin)
        if obj is not None:
            try: obj.__normalizer__ = spec
            except (AttributeError, TypeError): pass
        return obj if obj is not None else spec
    return add if normalizer is None and factory is None else add(normalizer)      # without either: a decorator

def register_normalizer_family(prefix: str, make):
    "Names `prefix<suffix>` resolve through `make(name) -> NormalizerSpec` (e.g. every `topk_softmax_<digits>`)."
    _FAMILIES[prefix] = make


# %% [markdown]
# **Resolving a name.** `resolve_normalizer` turns what a user writes — a registered name, a member of a family,
# `package.module:name`, or the name of an entry point in the group `sparse_attention_repro.normalizers` — into its
# `NormalizerSpec`. Outside code therefore registers without touching the library: a module that calls
# `register_normalizer` is imported by `module:name`, or by its package's entry point. The command line and the
# experiment notebooks resolve each method once, at the edge; the training code passes the spec along.
#
# Before a normalizer is first used in a process it must pass the **conformance suite** (`check_normalizer`, below);
# one that fails is refused in one line naming every failed property, separated by `;`. The library's own normalizers (and the members of its
# families) pass it in this notebook's tests, so resolving them skips the run-time check, which would cost every
# training process about two seconds.

# %%
#| export
class NormalizerConformanceError(ValueError):
    "A normalizer that fails the conformance suite: one line naming every failed property."

def _spec_of(obj, ref):
    "The spec behind an imported object: a `NormalizerSpec`, or a function or class decorated by `register_normalizer`."
    spec = obj if isinstance(obj, NormalizerSpec) else getattr(obj, "__normalizer__", None)
    if not isinstance(spec, NormalizerSpec):
        raise ValueError(f"{ref} is not a registered normalizer: decorate it with @register_normalizer(name, ...) or point at its NormalizerSpec")
    return spec if _REGISTRY.get(spec.name) is spec else _add(spec, getattr(spec, "_origin", None))

def _import_spec(ref):
    "`package.module:name` -> the spec it names (the module is imported, which registers it)."
    module, _, attr = ref.partition(":")
    try: obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load normalizer {ref!r} ({type(e).__name__}: {e}); give package.module:name of a registered normalizer") from None
    return _spec_of(obj, ref)

def _entry_points():
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}

def registered_normalizers() -> list:
    "Names that resolve without importing anything by hand: the registry and the entry points (families not expanded)."
    return list(dict.fromkeys(list(_REGISTRY) + sorted(_entry_points())))

def _lookup(ref):
    if ref in _REGISTRY: return _REGISTRY[ref]
    for prefix, make in _FAMILIES.items():
        if ref.startswith(prefix) and ref != prefix: return _add(replace(make(ref), source=f"family {prefix}<digits>"), f"family {prefix}")
    if ":" in ref: return _import_spec(ref)
    if (ep := _entry_points().get(ref)) is not None:
        try: obj = ep.load()
        except Exception as e: raise ValueError(f"entry point {ref!r} ({ep.value}) failed to load: {type(e).__name__}: {e}") from None
        return _spec_of(obj, f"entry point {ref} ({ep.value})")
    raise ValueError(f"unknown normalizer {ref!r}; choose one of {', '.join(registered_normalizers())}, "
                     f"{', '.join(p + '<digits>' for p in _FAMILIES)}, package.module:name, or an entry point of {ENTRY_POINT_GROUP}")

def resolve_normalizer(ref) -> NormalizerSpec:
    "The `NormalizerSpec` of `ref` (a spec, a name, a family member, `package.module:name` or an entry point), conformance-checked."
    spec = ref if isinstance(ref, NormalizerSpec) else _lookup(str(ref))
    if spec.name not in _CONFORMING and not _library_tested(spec):
        if failures := check_normalizer(spec):
            raise NormalizerConformanceError(f"normalizer {spec.name!r} fails the conformance suite: " + "; ".join(failures))
        _CONFORMING.add(spec.name)
    return spec

def _library_tested(spec) -> bool:
    "`spec` is the registry's own entry for one of the library's normalizers or a member of one of its families."
    if _REGISTRY.get(spec.name) is not spec: return False
    return spec.name in _LIBRARY_NAMES or any(spec.source == f"family {p}<digits>" and _FAMILIES.get(p) is make
                                               for p, make in _LIBRARY_FAMILIES.items())

def get_normalizer(name, num_heads: int = 1, num_models: int | None = None, **options) -> nn.Module:
    "The normalizer module of `name` (anything `resolve_normalizer` takes) for `num_heads` heads; `options` as its spec declares."
    return resolve_normalizer(name).build(num_heads=num_heads, num_models=num_models, **options)


# %% [markdown]
# **The conformance suite.** Each property is a rule of the lab's attention contract, checked on small random scores
# (3 heads, 5 queries, 7 keys): the shape and dtype come back unchanged; finite scores give finite weights; a masked key
# gets exactly zero and changing its score changes nothing; a row with no valid key gives zeros, not NaN; a NaN in one
# row shows in that row and leaves every other row as it was; examples of a batch do not see each other; the gradient is
# finite, and matches finite differences in float64 unless the spec declares an approximate one; where declared, rows
# are non-negative and sum to one, and a stack of models equals its models one by one.

# %%
#| export
def check_normalizer(spec: NormalizerSpec, num_heads: int = 3, seed: int = 0) -> list:
    "The failed properties of `spec`'s normalizer, one line each (an empty list: it conforms); torch's global generator is left as it was."
    with torch.random.fork_rng(devices=[]): return _conformance(spec, num_heads, seed)

def _conformance(spec, num_heads, seed):
    failures = []
    def prop(label, test):
        try:
            if (msg := test()): failures.append(f"{label}: {msg}")
        except Exception as e: failures.append(f"{label}: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(2, num_heads, 5, 7, generator=g) * 2                        # (B, H, Tq, Tk)
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool); mask[0, ..., 4:] = False; mask[1, ..., :2] = False
    try:
        torch.manual_seed(seed); norm = spec.build(num_heads=num_heads)
        p = norm(s)
    except Exception as e:
        return [f"build and call: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    prop("shape", lambda: None if p.shape == s.shape and p.dtype == s.dtype else f"returns {tuple(p.shape)} {p.dtype} for {tuple(s.shape)} {s.dtype}")
    prop("finite", lambda: None if torch.isfinite(p).all() else "non-finite weights for finite scores")
    if spec.sums_to_one:
        prop("sums to one", lambda: None if (p >= 0).all() and (p.sum(-1) - 1).abs().max() < 1e-5 else
             f"rows sum to {p.sum(-1).min():.4g}..{p.sum(-1).max():.4g} (min weight {p.min():.3g}); declare sums_to_one=False if intended")
    def key_mask():
        pm = norm(s, mask)
        if pm.masked_select(~mask.expand_as(pm)).abs().max() != 0: return "a masked key gets a non-zero weight"
        moved = s.masked_fill(~mask, 0.) + torch.randn(s.shape, generator=g).masked_fill(mask, 0.) * 5
        if not torch.allclose(norm(moved, mask), pm, atol=1e-6): return "changing a masked key's score changes the weights"
        if spec.sums_to_one and (pm.sum(-1) - 1).abs().max() > 1e-5: return "rows do not sum to one over the valid keys"
    prop("key mask", key_mask)
    def empty_rows():
        none = torch.zeros(1, 1, 1, 7, dtype=torch.bool)
        pe = norm(s, none)
        return None if torch.equal(pe, torch.zeros_like(pe)) else "a row with no valid key must give zeros (not NaN)"
    prop("empty rows", empty_rows)
    def nan_rows():
        bad = s.clone(); bad[0, 0, 1, 3] = float("nan")
        pn = norm(bad)
        if not pn[0, 0, 1].isnan().any(): return "a NaN score disappears from its row's weights"
        keep = torch.ones(2, num_heads, 5, dtype=torch.bool); keep[0, 0, 1] = False
        if not torch.allclose(pn[keep], p[keep], atol=1e-6): return "a NaN in one row changes other rows"
    prop("NaN propagation", nan_rows)
    prop("batch independence", lambda: None if torch.allclose(norm(s[1:]), p[1:], atol=1e-6) else "an example's weights depend on the other examples of the batch")
    def gradient():
        x = s.clone().requires_grad_()
        out = norm(x, mask)
        (out * torch.randn(out.shape, generator=g)).sum().backward()
        if not torch.isfinite(x.grad).all(): return "non-finite gradient for the scores"
        if any(q.grad is not None and not torch.isfinite(q.grad).all() for q in norm.parameters()): return "non-finite gradient for a parameter"
        if spec.exact_gradient:
            n64 = copy.deepcopy(norm).double()
            x64 = (torch.randn(1, num_heads, 3, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
            ok = torch.autograd.gradcheck(lambda t: n64(t, mask[:1, ..., :5]), (x64,), eps=1e-6, atol=1e-5, raise_exception=False)
            if not ok: return "the gradient does not match finite differences (float64); declare exact_gradient=False for an approximate backward"
    prop("gradient", gradient)
    for name in spec.learned:
        prop(f"learned {name}", lambda name=name: None if torch.is_tensor(getattr(norm, name, None)) else f"the module has no tensor attribute {name!r} to record")
    if spec.stackable:
        def stack():
            torch.manual_seed(seed); st = spec.build(num_heads=num_heads, num_models=2)
            s5 = torch.stack([s, s.flip(0)])                                     # (M, B, H, Tq, Tk)
            ps = st(s5)
            return None if ps.shape == s5.shape and torch.allclose(ps[0], p, atol=1e-6) else "model 0 of a stack differs from the module alone"
        prop("stack", stack)
    return failures


# %% [markdown]
# **Study A's normalizers** enter the registry the same way any outside one would. Only the adaptive entmax has
# parameters: one logit $a$ per head, recorded as `alpha` after every epoch (its module, `HeadwiseAdaptiveEntmax`, is in
# `00c_entmax`).

# %%
#| export
def fused_row(kind: str):
    """A `fused` declaration: the C attention kernel computes a module of this normalizer as its row normalizer `kind`
    (softmax, sparsemax, entmax15 or topk_softmax, with the module's top-k `ratio`), per query row only."""
    def args(norm):
        kw = getattr(norm, "kwargs", {})
        if not set(kw) <= {"ratio", "scope"} or kw.get("scope", "row") != "row": return None
        return dict(kind=kind, ratio=kw.get("ratio", 1.0), alpha=None, max_iter=K.ENTMAX15_ITERS)
    return args

def _fused_adaptive(norm):
    "The head-wise adaptive entmax in the kernel: one model (not a stack), the Newton solver (not the original's bisection)."
    if norm.bisect or norm.alpha_logit.dim() != 1: return None
    return dict(kind="entmax_alpha", ratio=1.0, alpha=norm.alpha, max_iter=norm.n_iter)

register_normalizer("softmax", softmax, stackable=True, fused=fused_row("softmax"))
register_normalizer("sparsemax", sparsemax, stackable=True, kernel=True, fused=fused_row("sparsemax"))
register_normalizer("entmax15", entmax15, stackable=True, kernel=True, fused=fused_row("entmax15"))
register_normalizer("headwise_adaptive_entmax", HeadwiseAdaptiveEntmax, learned=("alpha",), stackable=True, kernel=True, options=("n_iter",),
                    fused=_fused_adaptive)
register_normalizer("entmax15_bisect", factory=_function_factory("entmax15_bisect", entmax_bisect, alpha=1.5), stackable=True,
                    exact_gradient=False)
register_normalizer("headwise_adaptive_entmax_bisect", factory=partial(HeadwiseAdaptiveEntmax, bisect=True), learned=("alpha",),
                    stackable=True, exact_gradient=False)
register_normalizer_family("topk_softmax_", lambda name: NormalizerSpec(
    name, _function_factory(name, topk_softmax, ratio=parse_topk_ratio(name)), stackable=True, kernel=True, options=("scope",),
    fused=fused_row("topk_softmax")))
register_normalizer_family("headwise_adaptive_entmax_start", lambda name: NormalizerSpec(
    name, partial(HeadwiseAdaptiveEntmax, alpha_start=parse_alpha_start(name)), learned=("alpha",), stackable=True, kernel=True,
    options=("n_iter",), fused=_fused_adaptive))
_LIBRARY_NAMES, _LIBRARY_FAMILIES = frozenset(_REGISTRY), dict(_FAMILIES)     # the conformance tests below cover these

# %%
torch.manual_seed(0)
x = torch.randn(3, 4, 17, 17)                                                 # the scores of the top-k tests (`00d_topk`) ...
mask = torch.ones(3, 1, 1, 17, dtype=torch.bool); mask[..., 9:] = False      # ... and their mask: 9 valid keys
hae = get_normalizer("headwise_adaptive_entmax", num_heads=4)
test_close(hae.alpha, torch.full((4,), 1.5))
test_eq(sum(p.numel() for p in hae.parameters()), 4)
test_eq(sum(p.numel() for n in PAPER_METHODS if n != "headwise_adaptive_entmax" for p in get_normalizer(n).parameters()), 0)
test_close(get_normalizer("topk_softmax_02")(x), topk_softmax(x, 0.2))
test_fail(lambda: get_normalizer("softmaxx"), contains="unknown normalizer")
for start in (1.2, 1.8):                            # the start-value control: every head starts at alpha_start
    name = f"headwise_adaptive_entmax_start{start:g}".replace(".", "")
    h0 = get_normalizer(name, num_heads=4)
    test_close(h0.alpha, torch.full((4,), start), eps=1e-6)
    test_close(h0(x.detach()), entmax_alpha(x.detach(), start))
    test_eq((resolve_normalizer(name).name, resolve_normalizer(name).learned), (name, ("alpha",)))
test_fail(lambda: get_normalizer("headwise_adaptive_entmax_start195"), contains="(1.05, 1.95)")
assert torch.equal(HeadwiseAdaptiveEntmax(4, alpha_start=1.5).alpha_logit, hae.alpha_logit)   # the default start is exactly a = 0
hb = get_normalizer("headwise_adaptive_entmax_bisect", num_heads=4)
test_eq(sum(p.numel() for p in hb.parameters()), 4)
test_close(hb(x.detach()), entmax_bisect(x.detach(), hb.alpha.detach().double().view(-1, 1, 1)))
test_close(get_normalizer("entmax15_bisect")(x.detach()), entmax_bisect(x.detach(), 1.5))
test_fail(lambda: get_normalizer("sparsemax", scope="head"), contains="takes no options")
stacked = get_normalizer("headwise_adaptive_entmax", num_heads=4, num_models=3)           # one alpha per head and model
test_eq(stacked.alpha_logit.shape, (3, 4))
with torch.no_grad(): stacked.alpha_logit.copy_(torch.randn(3, 4))
s5 = torch.randn(3, 2, 4, 6, 6)
for i in range(3):                                # model i of the stack is the one-model module with model i's alpha
    single = get_normalizer("headwise_adaptive_entmax", num_heads=4)
    with torch.no_grad(): single.alpha_logit.copy_(stacked.alpha_logit[i])
    test_close(stacked(s5)[i], single(s5[i]), eps=1e-6)
test_fail(lambda: get_normalizer("topk_softmax_025", scope="matrix")(x), contains="scope must be")


# %% [markdown]
# **The fused attention kernel.** The paper's normalizers also have a C kernel that runs a whole attention core — scores,
# normalizer, weighted values, forward and backward — for one head at a time (`kernels.attention_fwd`, used by the
# model's opt-in fused path). Which normalizers it serves is a capability each spec declares (`fused`, above): a
# function saying how the kernel computes a built module of it, or `None` where it cannot (the original's bisection, a
# stack of models, top-k over the whole head). An outside normalizer whose rows are one of the kernel's normalizers
# declares it the same way (`fused=fused_row("softmax")`). Without a declaration the model refuses the fused path
# rather than run the arms of one experiment on different paths.

# %%
#| export
def fused_kernel_args(spec: NormalizerSpec, norm) -> dict | None:
    "Arguments of `kernels.attention_fwd` (kind, ratio, alpha, max_iter) that compute `norm`, a module built from `spec`, or None."
    return spec.fused(norm) if spec.fused is not None else None

def fused_refusal(methods, device="cpu", stacked=False) -> str | None:
    """Why the fused attention kernel cannot serve every one of `methods` (specs or names; all arms of a grid run on one
    path) on `device`, or None when it can: the one place that decides it."""
    if getattr(device, "type", str(device)) != "cpu": return "it runs on the CPU only"
    if stacked: return "a stack of models (--stack-seeds) runs the torch path"
    if K.kernels() is None: return "the C kernels are unavailable here"
    specs = [m if isinstance(m, NormalizerSpec) else resolve_normalizer(m) for m in methods]
    if none := [s.name for s in specs if fused_kernel_args(s, s.build()) is None]: return f"{', '.join(none)} has no fused kernel"
    return None


# %%
test_eq(fused_refusal(["softmax", "entmax15_bisect"]), "entmax15_bisect has no fused kernel")
test_eq(fused_refusal(["softmax"], device="cuda"), "it runs on the CPU only")
test_eq(fused_refusal(["softmax"], stacked=True), "a stack of models (--stack-seeds) runs the torch path")
test_eq(fused_refusal(["softmax", "sparsemax", "entmax15", "headwise_adaptive_entmax", "topk_softmax_025"]),
        None if K.kernels() is not None else "the C kernels are unavailable here")

# %%
_fka = lambda n, **kw: fused_kernel_args(resolve_normalizer(n), get_normalizer(n, num_heads=4, **kw))
test_eq([_fka(n)["kind"] for n in PAPER_METHODS],
        ["softmax", "sparsemax", "entmax15", "entmax_alpha", "topk_softmax", "topk_softmax", "topk_softmax"])
test_eq(_fka("topk_softmax_025")["ratio"], 0.25)
for n, kw in [("entmax15_bisect", {}), ("headwise_adaptive_entmax_bisect", {}), ("topk_softmax_025", dict(scope="head"))]:
    test_eq(_fka(n, **kw), None)
test_eq(_fka("headwise_adaptive_entmax", num_models=2), None)
test_eq(_fka("headwise_adaptive_entmax_start12")["kind"], "entmax_alpha")
_outside = NormalizerSpec("outside", _function_factory("outside", lambda s, key_mask=None: softmax(s, key_mask)))
test_eq(fused_kernel_args(_outside, _outside.build()), None)                # undeclared: no fused path
_declared = NormalizerSpec("outside_declared", _outside.factory, fused=fused_row("softmax"))
test_eq(fused_kernel_args(_declared, _declared.build())["kind"], "softmax")   # an outside normalizer can declare it
test_eq(fused_refusal([_declared]), None if K.kernels() is not None else "the C kernels are unavailable here")

# %% [markdown]
# Capabilities are what the specs declare; a name that is taken, a bad name or an unknown capability is refused, and a
# decorated function keeps working as a function.

# %%
test_eq([n for n in PAPER_METHODS if resolve_normalizer(n).learned], ["headwise_adaptive_entmax"])
test_eq([resolve_normalizer(n).exact_gradient for n in ORIGINAL_GRADIENT_VARIANTS], [False, False])
assert all(resolve_normalizer(n).sums_to_one and resolve_normalizer(n).stackable for n in PAPER_METHODS)
test_fail(lambda: register_normalizer("softmax", sparsemax), contains="already registered")
test_fail(lambda: register_normalizer("my-norm", softmax), contains="must be an identifier")
test_fail(lambda: register_normalizer("mine", softmax, rows_sum=True), contains="unknown capabilities")
test_fail(lambda: get_normalizer("mine_softmax", num_models=2), contains="unknown normalizer")

@register_normalizer("half_softmax_example", sums_to_one=False, stackable=True)
def half_softmax(scores, key_mask=None):
    "Softmax scaled by one half: rows sum to 1/2 (a test of `sums_to_one=False`)."
    return softmax(scores, key_mask) / 2
test_close(half_softmax(x), softmax(x) / 2)                                   # still the plain function
test_close(get_normalizer("half_softmax_example")(x), softmax(x) / 2)
test_eq(half_softmax.__normalizer__.sums_to_one, False)
test_eq(half_softmax.__normalizer__.source, half_softmax.__module__)                 # who registered it
register_normalizer("half_softmax_example", half_softmax, sums_to_one=False, stackable=True)   # the same definition again (a notebook re-run): allowed

@register_normalizer("nonstackable_example")
class ScaledSoftmax(nn.Module):
    "Softmax of learned-temperature scores (one temperature per head): a module class without a stack."
    def __init__(self, num_heads):
        super().__init__(); self.log_t = nn.Parameter(torch.zeros(num_heads, 1, 1))
    def forward(self, scores, key_mask=None): return softmax(scores * self.log_t.exp(), key_mask)
test_close(get_normalizer("nonstackable_example", num_heads=x.shape[-3])(x), softmax(x))
test_fail(lambda: get_normalizer("nonstackable_example", num_heads=4, num_models=2), contains="stackable=True")

# %% [markdown]
# **The conformance suite catches what it should.** Every registered normalizer passes it. Each broken normalizer
# below violates one rule and is refused with that rule named; a correct one that declares `sums_to_one=False` passes.

# %%
for n in PAPER_METHODS + ORIGINAL_GRADIENT_VARIANTS + ("topk_softmax_02", "headwise_adaptive_entmax_start12", "half_softmax_example"):
    test_eq((n, check_normalizer(resolve_normalizer(n))), (n, []))
assert "topk_softmax_02" not in _CONFORMING and _library_tested(resolve_normalizer("topk_softmax_02"))    # tested here, not at run time
test_eq(_library_tested(NormalizerSpec("softmax", _function_factory("softmax", softmax))), False)          # a look-alike spec is checked
state = torch.get_rng_state(); check_normalizer(resolve_normalizer("softmax"))
assert torch.equal(state, torch.get_rng_state())          # checking never moves the generator that draws the initial weights
broken = {
    "sums to one": lambda s, key_mask=None: softmax(s, key_mask) * 1.5,
    "key mask": lambda s, key_mask=None: torch.softmax(s, -1),                            # ignores the mask
    "empty rows": lambda s, key_mask=None: torch.softmax(s.masked_fill(~key_mask, float("-inf")), -1) if key_mask is not None else torch.softmax(s, -1),
    "NaN propagation": lambda s, key_mask=None: softmax(torch.nan_to_num(s), key_mask),    # hides a NaN
    "batch independence": lambda s, key_mask=None: softmax(s - s.mean(0), key_mask),      # mixes the batch
    "gradient": lambda s, key_mask=None: ScaledGrad.apply(softmax(s, key_mask)),          # a wrong backward
    "shape": lambda s, key_mask=None: softmax(s, key_mask)[..., :-1],
}
class ScaledGrad(Function):
    @staticmethod
    def forward(ctx, p): return p.clone()
    @staticmethod
    def backward(ctx, g): return 2 * g
for rule, fn in broken.items():
    fails = check_normalizer(NormalizerSpec(f"broken_{rule.replace(' ', '_')}", _function_factory("b", fn)))
    assert any(f.startswith(rule) for f in fails), (rule, fails)
test_eq(check_normalizer(NormalizerSpec("no_alpha", _function_factory("b", softmax), learned=("alpha",))),
        ["learned alpha: the module has no tensor attribute 'alpha' to record"])
err = NormalizerSpec("broken_mask", _function_factory("b", broken["key mask"]))
test_fail(lambda: resolve_normalizer(err), exc=NormalizerConformanceError, contains="key mask:")
try: resolve_normalizer(NormalizerSpec("broken_twice", _function_factory("b", lambda s, key_mask=None: softmax(s, key_mask)[..., :-1])))
except NormalizerConformanceError as e: _refusal = str(e)
test_eq(len(_refusal.splitlines()), 1); assert _refusal.count("; ") >= 1, _refusal   # several failed properties, one line

# %% [markdown]
# The adaptive module learns: a gradient step on a loss that rewards sparser rows moves every head's $\alpha$.

# %%
torch.manual_seed(1)
hae = get_normalizer("headwise_adaptive_entmax", num_heads=4)
s4 = torch.randn(2, 4, 6, 6)
(hae(s4) ** 2).sum().backward()                 # sum of squares grows as rows get sparser (higher alpha)
assert (hae.alpha_logit.grad > 0).all(), hae.alpha_logit.grad


# %% [markdown]
# ## Attention density
#
# Study A reports `nonzero_ratio`, the fraction of attention weights above $10^{-7}$. With a `key_mask` the denominator
# counts only valid (query, key) pairs — the measure Crisp's "sparsity" needs (sparsity = 1 − density).

# %%
#| export
def attention_density(p, key_mask=None, threshold=1e-7):
    "Fraction of attention weights > `threshold` (the paper's `nonzero_ratio`), over valid entries if `key_mask` is given."
    nz = p > threshold
    if key_mask is None: return nz.float().mean()
    valid = key_mask.to(torch.bool).expand_as(p)
    return (nz & valid).sum().float() / valid.sum().clamp_min(1)


# %%
test_eq(attention_density(torch.tensor([[0.5, 0.5, 0., 0.]])), 0.5)
test_close(attention_density(topk_softmax(x, 0.25)), 5 / 17)
test_close(attention_density(topk_softmax(x, 0.25, mask), mask), 3 / 9)
test_eq(attention_density(softmax(x)), 1.)

# %% [markdown]
# ## Properties every normalizer shares
#
# The checks below run over the whole registry: rows sum to one over valid keys, masked keys get exactly zero,
# fully masked rows give zeros (no NaN) with finite gradients, huge logits ($\pm 10^4$) and ties are handled, bf16 works,
# and `gradcheck` validates every analytic backward in float64 (top-k away from ties, where it is differentiable).

# %%
torch.manual_seed(0)
names = PAPER_METHODS + ORIGINAL_GRADIENT_VARIANTS + ("topk_softmax_02",)
mask = torch.rand(2, 1, 5, 7) > 0.3
mask[0, 0, 1] = False                                       # one query row with no valid key
for name in names:
    norm = get_normalizer(name, num_heads=3).double()
    s = (torch.randn(2, 3, 5, 7, dtype=torch.float64) * 3).requires_grad_()
    p = norm(s, mask)
    assert torch.isfinite(p).all(), name
    test_eq(p.masked_select(~mask.expand_as(p)).abs().sum().item(), 0)
    rows = mask.any(-1).expand(2, 3, 5)
    test_close(p.sum(-1)[rows], torch.ones(int(rows.sum()), dtype=torch.float64), eps=1e-9)
    test_eq(p[0, :, 1].abs().sum().item(), 0)
    p.pow(2).sum().backward()
    assert torch.isfinite(s.grad).all(), name
    if name not in ORIGINAL_GRADIENT_VARIANTS:   # bisection jumps by its last step (~1e-6): checked against autograd in 00c_entmax
        assert torch.autograd.gradcheck(lambda t: norm(t, mask), (s.detach().requires_grad_(),)), name
    big = torch.tensor([1e4, -1e4, 0., 1e4 - 1, -5.]).expand(3, 1, 5)   # huge logits (one row per head)
    pb = norm(big.double())
    assert torch.isfinite(pb).all() and (pb[..., 1] == 0).all() and (pb.sum(-1) - 1).abs().max() < 1e-9, name
    ties = norm(torch.zeros(3, 1, 8, dtype=torch.float64))   # all equal: uniform over the kept keys
    test_close(ties, torch.full_like(ties, 1 / 8), eps=1e-9)   # ties at the k-th score are all kept
    pbf = norm.float()(torch.randn(2, 3, 5, 7).bfloat16(), mask)
    test_eq(pbf.dtype, torch.bfloat16)
    assert torch.isfinite(pbf.float()).all() and (pbf.float().sum(-1)[rows] - 1).abs().max() < 1e-2, name

# %% [markdown]
# **Empty inputs** (see `no_scores`): a batch of no examples, a head with no queries or a row with no keys gives an
# empty result of the same shape and dtype, with and without a key mask, forward and backward, for every normalizer of
# the library and its families' members, in float64 (the torch path's dtype), float32 (the C kernels' on the CPU) and bf16; the
# learned $\alpha$ gets a zero gradient.

# %%
cases = [(n, {}) for n in sorted(_LIBRARY_NAMES)] + [("topk_softmax_025", {}), ("topk_softmax_025", dict(scope="head")),
                                                    ("headwise_adaptive_entmax_start12", {})]
for (name, options), dtype in itertools.product(cases, (torch.float64, torch.float32, torch.bfloat16)):
    norm = get_normalizer(name, num_heads=3, **options).to(torch.float32 if dtype == torch.bfloat16 else dtype)
    for shape, masked in itertools.product([(0, 3, 5, 7), (2, 3, 0, 7), (2, 3, 5, 0), (0, 3, 0, 0)], (False, True)):
        s = torch.randn(shape, dtype=dtype, requires_grad=True)
        p = norm(s, torch.ones(shape[0], 1, 1, shape[-1], dtype=torch.bool) if masked else None)
        test_eq((name, p.shape, p.dtype), (name, s.shape, dtype))
        p.sum().backward()
        test_eq((name, s.grad.shape), (name, s.shape))
        for q in norm.parameters(): test_eq((name, q.grad), (name, torch.zeros_like(q))); q.grad = None

# %% [markdown]
# Non-finite scores stay visible: with a NaN in one row, a $+\infty$ in another and a row of only $-\infty$, exactly
# those rows come out NaN — in float32 (the C kernels) and float64 (the torch path) — and every other row is what it
# would be without them. A $-\infty$ among finite scores is just a key with zero weight.

# %%
for name in names:
    for dtype in (torch.float32, torch.float64):
        norm = get_normalizer(name, num_heads=3).to(dtype)
        s = torch.randn(2, 3, 5, 7, dtype=dtype)
        bad = s.clone(); bad[0, 0, 1, 3] = float("nan"); bad[1, 2, 4, 0] = float("inf"); bad[0, 1, 2] = float("-inf")
        bad[1, 1, 3, 5] = float("-inf")                                          # an ordinary zero-weight key
        p, ref = norm(bad), norm(s)
        hit = torch.zeros(2, 3, 5, dtype=torch.bool); hit[0, 0, 1] = hit[1, 2, 4] = hit[0, 1, 2] = True
        assert p[hit].isnan().all(), (name, dtype)
        assert torch.isfinite(p[~hit]).all() and p[1, 1, 3, 5] == 0, (name, dtype)
        keep = ~hit; keep[1, 1, 3] = False
        test_close(p[keep], ref[keep], eps=1e-6)

# %% [markdown]
# **The registry as the library declares it.** This notebook's cells built a second registry and registered in it the
# families' `sparsemax`, `entmax15` and `HeadwiseAdaptiveEntmax`, objects it shares with the package (they are imported
# from their modules), so their `__normalizer__` now names this notebook's specs. The package's are put back, so that a
# `module:name` ref resolves through the package in whatever runs next in this process (`nbdev_test` runs the notebooks
# in one):

# %%
from sparse_attention_repro import normalizers as _lib
for _obj in (sparsemax, entmax15, HeadwiseAdaptiveEntmax): _obj.__normalizer__ = _lib._REGISTRY[_obj.__normalizer__.name]
assert _lib.resolve_normalizer("sparse_attention_repro.normalizers:sparsemax") is _lib._REGISTRY["sparsemax"]
