# %% [markdown]
# # Any normalizer in a transformers model
#
# > `use_normalizer(model, name)` puts a registered normalizer into every attention layer of a Hugging Face transformers model that has an eager attention path.

# %%
#| default_exp hf_attention

# %% [markdown]
# transformers routes every attention layer of its modern models through one registry of attention functions,
# `AttentionInterface`, chosen by the model's `attn_implementation`; a matching `AttentionMaskInterface` entry decides
# what mask the function receives. `use_normalizer` registers one function that computes the scores as the model's eager
# path does and hands them, with the mask as a boolean **key mask**, to the layer's normalizer. So the causal mask of a
# decoder reaches a length-aware normalizer as the keys each query may see, and padding is masked in an encoder.
#
# The scores, the mask and the dropout are computed as the eager implementations do (dropout on the probabilities, only
# in training; grouped key/value heads repeated to match the queries). Crisp Attention (study B) is one use of this
# function: its own normalizer per layer and a recorder of the links it keeps.
#
# Which modules are attention layers: the deepest modules whose class name ends in `Attention` (BERT's `BertAttention`
# wraps `BertSelfAttention`, which does the work), with their head count read from the module or its config. A
# normalizer that declares `query_context` (ASEntmax) gets the layer's input, caught by a forward pre-hook, and the
# queries' positions (the last Tq of the Tk keys).

# %%
#| export
import torch
import torch.nn as nn
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from sparse_attention_repro.normalizers import get_normalizer, resolve_normalizer

# %%
from fastcore.test import test_eq, test_close, test_fail

# %%
#| export
HF_ATTENTION = "sparse_repro"        # the name under which the function and its mask are registered

def key_mask_of(attention_mask):
    "Boolean key mask `[B, 1, Tq|1, Tk]` from transformers' 2D 0/1, 4D additive or 4D boolean mask (None stays None)."
    if attention_mask is None: return None
    m = attention_mask
    if m.dtype != torch.bool: m = (m != 0) if m.dim() == 2 else (m > torch.finfo(m.dtype).min / 2)
    if m.dim() == 2: m = m[:, None, None, :]
    if m.dim() != 4: raise ValueError(f"attention mask must be 2D or 4D, got shape {tuple(attention_mask.shape)}")
    return m

def normalizer_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, normalizer=None, record=None, **kwargs):
    """The eager attention of `module` with a normalizer — `normalizer`, else the module's `lab_normalizer`, else softmax —
    and, where given, `record(module, weights, key_mask)` called on each batch's weights: `((B, Tq, H, D) output, weights)`."""
    if key.shape[1] != query.shape[1]:                                          # grouped key/value heads
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    if scaling is None: scaling = query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling                # (B, H, Tq, Tk)
    mask = key_mask_of(attention_mask)                                          # (B, 1, 1|Tq, Tk) bool or None
    if mask is not None: mask = mask[..., : key.shape[-2]]
    norm = normalizer if normalizer is not None else getattr(module, "lab_normalizer", None)
    if norm is None: norm = get_normalizer("softmax")
    ctx = {}
    if getattr(norm, "lab_context", False):
        tq, tk = scores.shape[-2:]
        ctx = dict(hidden=module.lab_hidden, positions=torch.arange(tk - tq, tk, device=scores.device))
    p = norm(scores, mask, **ctx)                                               # (B, H, Tq, Tk)
    if record is not None: record(module, p, mask)
    p = nn.functional.dropout(p, p=dropout, training=module.training)
    return torch.matmul(p, value).transpose(1, 2).contiguous(), p

def materialised_mask(*args, **kwargs):
    "`sdpa_mask` that always builds the boolean mask (True = attend) instead of leaving it to a causal kernel."
    kwargs["allow_is_causal_skip"] = kwargs["allow_is_bidirectional_skip"] = False
    return sdpa_mask(*args, **kwargs)

# %%
pad = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
want = pad.bool()[:, None, None, :]
test_eq(key_mask_of(pad), want)
add = (1.0 - pad[:, None, None, :].float()) * torch.finfo(torch.float32).min  # BERT's extended mask
test_eq(key_mask_of(add), want)
test_eq(key_mask_of(want.expand(2, 1, 4, 4)).shape, (2, 1, 4, 4))
test_eq(key_mask_of(None), None)
test_eq(key_mask_of(torch.zeros(2, 1, 1, 4) - 3.0).all(), True)               # a finite bias is not a mask

# %% [markdown]
# Checked against a hand-written masked softmax attention, and with a recorder:

# %%
torch.manual_seed(0)
q, k, v = torch.randn(3, 2, 2, 5, 4).unbind(0)                               # (B=2, H=2, T=5, D=4)
am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
seen = []
out, w = normalizer_attention(nn.Module().eval(), q, k, v, am, scaling=0.5, record=lambda m, p, mask: seen.append(mask))
ref_p = torch.softmax((q @ k.transpose(-1, -2) * 0.5).masked_fill(~am.bool()[:, None, None, :], -1e9), -1)
test_close(w, ref_p, eps=1e-6); test_close(out, (ref_p @ v).transpose(1, 2), eps=1e-6)
test_eq(out.shape, (2, 5, 2, 4)); test_eq(seen[0], am.bool()[:, None, None, :])

# %%
#| export
AttentionInterface.register(HF_ATTENTION, normalizer_attention)
AttentionMaskInterface.register(HF_ATTENTION, materialised_mask)


# %% [markdown]
# ## Finding the layers

# %%
#| export
def attention_layers(model) -> list:
    "The deepest modules of `model` whose class name ends in 'Attention', input to output."
    found = [m for m in model.modules() if type(m).__name__.endswith("Attention")]
    deepest = [m for m in found if not any(o is not m and any(c is o for c in m.modules()) for o in found)]
    if not deepest: raise TypeError(f"{type(model).__name__}: no attention modules found (no class name ends in 'Attention')")
    return deepest

def num_heads(module) -> int:
    "Query heads of a transformers attention module."
    for k in ("num_heads", "n_heads", "num_attention_heads"):
        if isinstance(getattr(module, k, None), int): return getattr(module, k)
    if isinstance(n := getattr(getattr(module, "config", None), "num_attention_heads", None), int): return n
    raise TypeError(f"{type(module).__name__}: cannot tell its number of heads")

def _keep_input(module, args, kwargs):
    "Forward pre-hook: keep the layer's input hidden states for a normalizer that reads them."
    module.lab_hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

def use_normalizer(model, normalizer) -> nn.Module:
    """Put `normalizer` (anything `resolve_normalizer` takes) into every attention layer of `model`, one module per layer,
    and route the model's attention through it. Returns the model."""
    spec = resolve_normalizer(normalizer)
    width = getattr(model.config, "hidden_size", None) or getattr(model.config, "dim", None)
    for m in attention_layers(model):
        norm = spec.build(num_heads=num_heads(m), **({"width": width} if "width" in spec.options else {}))
        norm.lab_context = spec.query_context
        m.lab_normalizer = norm                                                 # a submodule: its parameters train
        if spec.query_context and not getattr(m, "lab_hooked", False):
            m.register_forward_pre_hook(_keep_input, with_kwargs=True); m.lab_hooked = True
    model.set_attn_implementation(HF_ATTENTION)
    return model


# %% [markdown]
# ## Three families from small configurations
#
# BERT (bidirectional, padding masked), GPT-2 (causal, learned positions) and Llama (causal, RoPE, grouped key/value
# heads), each built from a small configuration with random weights. With softmax the routed model must give what the
# model's own eager attention gives; with a sparse normalizer its weights must have exact zeros and no weight on a
# masked (future or padding) key.

# %%
from transformers import BertConfig, BertModel, GPT2Config, GPT2Model, LlamaConfig, LlamaModel

def small_models():
    torch.manual_seed(0)
    yield "bert", BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                       attn_implementation="eager")), False
    yield "gpt2", GPT2Model(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0, attn_implementation="eager")), True
    yield "llama", LlamaModel(LlamaConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=64, attn_implementation="eager")), True

ids = torch.randint(0, 50, (2, 9))
pad = torch.ones(2, 9, dtype=torch.long); pad[1, 6:] = 0                        # the second sequence padded
for family, model, causal in small_models():
    model.eval()
    test_eq(len(attention_layers(model)), 2)
    ref = model(input_ids=ids, attention_mask=pad).last_hidden_state
    use_normalizer(model, "softmax")
    test_close(model(input_ids=ids, attention_mask=pad).last_hidden_state[pad.bool()], ref[pad.bool()], eps=1e-5)
    use_normalizer(model, "sparsemax")
    w = model(input_ids=ids, attention_mask=pad, output_attentions=True).attentions[0]   # (B, H, T, T)
    future = torch.ones(9, 9, dtype=torch.bool).triu(1)
    assert (w[1, :, :6, 6:] == 0).all()                                          # padding keys get nothing
    if causal: assert (w[:, :, future] == 0).all()                               # nor do future keys
    else: assert (w[0, :, future] > 0).any()
    test_close(w[0].sum(-1), torch.ones(4, 9), eps=1e-5)                         # rows of sparsemax sum to one


# %% [markdown]
# A normalizer with learned parameters trains inside the model (they are submodules), and ASEntmax, which reads each
# layer's input, gets it: its scale then depends on the tokens, so changing an earlier token changes a later query's
# weights through the scale as well as through the keys.

# %%
import importlib.util
if importlib.util.find_spec("sparse_attention_examples"):                      # the example package is installed
    _, model, _ = list(small_models())[2]
    use_normalizer(model, "asentmax")
    names = [n for n, _ in model.named_parameters() if "lab_normalizer" in n]
    test_eq(len(names), 2 * 2 * 2)                                              # 2 layers x (beta, gamma) x (weight, bias)
    out = model(input_ids=ids).last_hidden_state
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lab_normalizer" in n)
    layer = attention_layers(model)[0]
    assert layer.lab_hidden.shape == (2, 9, 32)
