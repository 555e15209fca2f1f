# %% [markdown]
# # The compact classifier
# > Study A's 2-block post-norm transformer with a CLS token, taking any registry normalizer by name.

# %%
#| default_exp model

# %% [markdown]
# Study A deliberately uses a *tiny* model (embed 64, 4 heads, 2 blocks, about 105k parameters on Fashion-MNIST) so that the
# attention normalizer is the only thing that changes between runs. The protocol (`protocol.ipynb`) fixes every piece:
#
# * inputs: image patches through `Linear(patch_dim → 64)`, or token ids through an embedding table whose padding row
#   (id 0) is zero and never updated, as in the original study (`nn.Embedding(20000, 64, padding_idx=0)`): a pad position
#   then carries only its positional embedding. `learned_pad_row=True` is the variant that learns that row like any other
#   (it changes attention to padding measurably — see below);
# * a learned CLS token and learned positional embeddings, both initialised $\mathcal N(0, 0.02^2)$;
# * **post-norm** blocks: $x \leftarrow \mathrm{LN}(x + \mathrm{Dropout}(\mathrm{Attn}(x)))$, then
#   $x \leftarrow \mathrm{LN}(x + \mathrm{Dropout}(\mathrm{MLP}(x)))$ with MLP = Linear(64→256) · GELU · Dropout · Linear(256→64);
# * attention: one fused QKV linear, scores $QK^\top/\sqrt{d_{head}}$, **the normalizer**, output linear — no attention mask
#   in the paper (an optional key-padding mask is our variant for 20 Newsgroups);
# * a linear head on the CLS position, with no final norm.

# %%
#| export
import copy, math, time
from dataclasses import dataclass, replace
import torch
import numpy as np
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from sparse_attention_repro import kernels as K
from sparse_attention_repro.normalizers import resolve_normalizer, attention_density, NormalizerSpec, fused_kernel_args

# %%
from fastcore.test import test_eq, test_close, test_fail
from sparse_attention_repro.kernels import use_kernels


# %%
#| export
@dataclass
class ClassifierConfig:
    "Hyperparameters of the compact classifier (defaults are the paper's)."
    num_classes: int
    seq_len: int                    # input tokens per example, CLS excluded (16 patches, 96 words)
    input_dim: int | None = None    # patch vector size for images (49, 192); None for token ids
    vocab_size: int | None = None   # for token ids (20000); None for images
    normalizer: str | NormalizerSpec = "softmax"   # a registry entry, or anything `resolve_normalizer` takes
    embed_dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    mlp_ratio: int = 4
    dropout: float = 0.1
    learned_pad_row: bool = False   # token ids: learn the embedding of id 0 (padding) instead of the original's frozen zero row
    dropout_rng: str = "torch"      # "torch": nn.Dropout's masks exactly; "philox": a faster counter-based generator (below)
    attention: str = "torch"        # "torch": torch operations; "fused": the attention core in one C kernel per head;
                                    # "fused_block": that, and the block's residual, dropout, LayerNorm and GELU in C (below)


# %% [markdown]
# ## Attention
#
# The normalizer module comes from the registry; it is the only line that differs between methods. When `record` is on
# (evaluation), the layer keeps the density of its last attention map, the paper's `nonzero_ratio`.
# A normalizer whose start depends on how many keys it attends over (a learned temperature started where
# Scalable-Softmax starts, s·log n) declares the option `n_keys`, and the layer builds it with its own count: the
# sequence plus CLS, 17 on the image datasets and 97 on 20 Newsgroups.
#
# The scale $1/\sqrt{d_{head}}$ is applied to the queries `[T, D]` rather than to the scores `[T, T]`: at 97 tokens
# that is 6× fewer elements in the forward and the backward, about 5 % of a 20 Newsgroups epoch (measured side by side). With $d_{head} = 16$ the scale is $1/4$, a power of two, so both orders give the same scores bit for
# bit (tested below); `scale_queries=False` restores the textbook order (the original code's, used by `bench`).

# %% [markdown]
# **Fused attention, opt-in.** With `attention="fused"` the layer hands the fused projection's output to one C kernel
# (`kernels.attention_fwd`) that computes, head by head, the scores, the normalizer and the weighted values inside the
# cache, and the backward likewise; the $[B, H, T, T]$ scores and their gradients never travel through memory, and under
# bf16 autocast the attention core stays in float32. Its sums run in another order than torch's batched products, so a
# run on it is not bit-identical to the default path: it is a lever of `--fast`, checked like the other levers by a
# paired comparison over seeds (`sparse-repro bench compare`). Tested below against the torch path, forward and
# backward, for every normalizer it serves.

# %%
#| export
ATTENTION_PATHS = ("torch", "fused", "fused_block")
FUSED_PATHS = ATTENTION_PATHS[1:]                      # the paths on the fused attention kernel

class FusedAttentionFunction(torch.autograd.Function):
    "Scores, normalizer and weighted values of every head in one C kernel; the backward likewise (`kernels.attention_bwd`)."
    @staticmethod
    def forward(ctx, qkv, alpha, key_mask, num_heads, kind, scale, ratio, max_iter):
        o, p = K.attention_fwd(qkv, num_heads, kind, scale, ratio, alpha, max_iter, key_mask)
        ctx.save_for_backward(qkv, p, alpha)
        ctx.args = (num_heads, kind, scale)
        ctx.mark_non_differentiable(p)
        return o, p

    @staticmethod
    @once_differentiable
    def backward(ctx, g, _):
        qkv, p, alpha = ctx.saved_tensors
        dqkv, da = K.attention_bwd(qkv, p, g, *ctx.args, alpha, d_alpha=ctx.needs_input_grad[1])
        return dqkv, da, None, None, None, None, None, None


# %%
#| export
class SelfAttention(nn.Module):
    "Multi-head self-attention with a pluggable normalizer over keys."
    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_heads, cfg.embed_dim // cfg.num_heads
        self.qkv = nn.Linear(cfg.embed_dim, 3 * cfg.embed_dim)
        self.out = nn.Linear(cfg.embed_dim, cfg.embed_dim)
        self.spec = resolve_normalizer(cfg.normalizer)
        self.normalizer = self.spec.build_for_keys(cfg.num_heads, cfg.seq_len + 1)   # the sequence + CLS
        self.record, self.last_density, self.scale_queries = False, None, True
        if cfg.attention not in ATTENTION_PATHS: raise ValueError(f"unknown attention path {cfg.attention!r}; choose one of {', '.join(ATTENTION_PATHS)}")
        self.fused = cfg.attention in FUSED_PATHS
        if self.fused and fused_kernel_args(self.spec, self.normalizer) is None:
            raise ValueError(f"normalizer {self.spec.name!r} has no fused attention kernel; use attention='torch' (drop --attention fused)")
        if self.fused and self.head_dim > K.ATTENTION_MAX_HEAD:
            raise ValueError(f"fused attention takes heads of at most {K.ATTENTION_MAX_HEAD} values, got {self.head_dim}; use attention='torch'")
        if self.fused and K.kernels() is None: raise RuntimeError("fused attention needs the C kernels, which are unavailable here (see the warning above); use attention='torch'")
        self.pad_keys, self.last_pad_mass = None, None          # recording only: which keys are padding, the mass they get

    def forward(self, x, key_mask=None):
        if self.fused: return self._fused(x, key_mask)
        *lead, T, C = x.shape                                                                    # lead: (B,), or (models, B) in a stack
        q, k, v = self.qkv(x).view(*lead, T, 3, self.num_heads, self.head_dim).movedim(-3, 0).transpose(-3, -2)  # 3 x (B, H, T, D)
        if self.scale_queries: scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)    # (B, H, T, T)
        else: scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        mask = None if key_mask is None else key_mask[..., None, None, :]                        # (B, 1, 1, T)
        p = self.normalizer(scores, mask)                                                        # (B, H, T, T)
        if self.record: self._record(p)
        return self.out((p @ v).transpose(-3, -2).reshape(*lead, T, C))                         # (B, T, C)

    def _record(self, p):
        "Keep the density of the weights `p` and, on token ids, the mass they put on padding keys."
        self.last_density = attention_density(p).detach()
        if self.pad_keys is not None:                                                             # (B, T) True on padding keys
            on_pad = (p.detach() * self.pad_keys[:, None, None, :]).sum(-1)                        # (B, H, T) mass on padding
            real_q = (~self.pad_keys).float()[:, None, :]                                          # CLS and real tokens ask
            self.last_pad_mass = (on_pad[:, :, 0].mean(), ((on_pad * real_q).sum((1, 2)) / (real_q.sum(2) * self.num_heads).squeeze(1)).mean())

    def _fused(self, x, key_mask):
        "The attention core in the C kernel: scores, normalizer and weighted values of each head in one pass, in float32."
        if x.device.type != "cpu" or x.dim() != 3:
            raise RuntimeError("fused attention runs one model on the CPU; use attention='torch' on a GPU or for a stack of models")
        a = fused_kernel_args(self.spec, self.normalizer)
        o, p = FusedAttentionFunction.apply(self.qkv(x).float(), a["alpha"], key_mask, self.num_heads, a["kind"],
                                            1 / math.sqrt(self.head_dim), a["ratio"], a["max_iter"])
        if self.record: self._record(p)
        return self.out(o)


# %% [markdown]
# ## Dropout that can share its masks
#
# Every method of one seed draws *the same* dropout masks: each run starts from `torch.manual_seed(seed)`, builds the
# same initial weights and then consumes the global generator in the same order. Drawing those masks is not cheap on a
# CPU — torch's generator produces one number every ~8 ns, and the model draws 768 per token (three dropouts of 64, 256
# and 64 values in each of 2 blocks), about a third of a softmax run's time. `MaskDropout` draws a mask exactly as
# `nn.Dropout` does (`bernoulli_(1 - p)`, divided by `1 - p`, multiplied in), and can also share it through a
# `MaskTape`: while the tape records, every mask drawn is appended to it; while it replays, masks are taken from it in
# the same order instead of being drawn again. Training several methods of one seed in lock-step (`train.train_lockstep`)
# then draws each mask once for all of them — and every method still sees exactly the masks of its own plain run.
# On the CPU the mask itself comes from `kernels.bernoulli_mask`: torch's own MT19937 draw, bit for bit, in C (about 4×
# faster here), or torch's `bernoulli_` on a CPU where the kernel does not reproduce it.

# %%
#| export
class MaskTape:
    "Dropout masks of one training step: drawn (recorded) by the first model, replayed in the same order to the others."
    def __init__(self): self.masks, self.pos, self.replaying, self.seconds = [], 0, False, 0.0
    def record(self):
        "Start a new step: the next forward pass draws fresh masks and keeps them."
        self.masks, self.pos, self.replaying = [], 0, False
    def replay(self):
        "Hand the recorded masks, from the first, to the next forward pass."
        self.pos, self.replaying = 0, True
    def next(self, shape):
        "The next recorded mask, which must have `shape`."
        if self.pos >= len(self.masks): raise RuntimeError("mask tape exhausted: the replaying model draws more masks than the recorder")
        m = self.masks[self.pos]; self.pos += 1
        if m.shape != shape: raise RuntimeError(f"mask tape holds shape {tuple(m.shape)} where {tuple(shape)} was asked: models differ")
        return m

class MaskDropout(nn.Module):
    "`nn.Dropout` (same masks, same random stream) whose masks can be recorded on and replayed from a `MaskTape`."
    def __init__(self, p: float, rng: str = "torch"):
        super().__init__()
        if rng not in DROPOUT_RNGS: raise ValueError(f"unknown dropout rng {rng!r}; choose one of {', '.join(DROPOUT_RNGS)}")
        self.p, self.rng, self.tape = p, rng, None

    def mask(self, shape, device):
        "The mask the next forward pass of a `shape` input would apply (drawn, or replayed from the tape); None when off."
        if not self.training or self.p == 0: return None
        if self.tape is not None and self.tape.replaying: return self.tape.next(shape)
        t0 = time.perf_counter()
        noise = draw_mask(shape, self.p, self.rng, device)
        if self.tape is not None:
            self.tape.masks.append(noise); self.tape.seconds += time.perf_counter() - t0
        return noise

    def forward(self, x):
        noise = self.mask(x.shape, x.device)
        return x if noise is None else x * noise

    def extra_repr(self): return f"p={self.p}" + ("" if self.rng == "torch" else f", rng={self.rng}")


# %% [markdown]
# **Another generator, opt-in.** With `rng="philox"` a mask is drawn instead from the counter-based Philox4x64-10
# generator of the C kernels (numpy's `Philox` where the kernels are unavailable, with bit-identical masks): the key, two
# 64-bit words, is drawn from torch's global generator, so a seed still fixes every mask, and an element is kept where its
# 32-bit draw is below $(1-p)\,2^{32}$. It was introduced when torch's `bernoulli_` (~6–15 ns per element here) was a
# quarter of a softmax step; since the default draw moved to C (~1.4 ns per element, against ~3.5 for Philox, one
# thread), its advantage on a CPU is that its elements are independent, so a mask can be split over threads, and that
# the masks are the same on every device. The masks have the same distribution as `nn.Dropout`'s but are *different
# masks*, so results change run by run: `sparse-repro bench compare` checks, paired over seeds, that the study's
# conclusions do not.

# %%
#| export
DROPOUT_RNGS = ("torch", "philox")

def draw_mask(shape, p: float, rng: str, device, generator=None, device_generator=None) -> torch.Tensor:
    """A dropout mask (values 0 and 1/(1-p)) as `MaskDropout` draws it: from `generator` (CPU: Philox keys) and
    `device_generator` (`bernoulli_` on `device`), torch's global generators where None."""
    if rng == "torch": return K.bernoulli_mask(shape, 1 - p, device_generator, device)     # torch's draw (in C on the CPU)
    return philox_mask(shape, p, torch.randint(-2**63, 2**63 - 1, (2,), generator=generator).tolist()).to(device)

def philox_mask(shape, p: float, key) -> torch.Tensor:
    "Dropout mask of `shape` (values 0 and 1/(1-p)) from the Philox stream of `key` (two 64-bit ints), on the CPU."
    keep_below, scale = round((1 - p) * 2**32), np.float32(1) / np.float32(1 - p)
    if K.kernels() is not None: return K.philox_dropout(shape, key, keep_below, scale)
    n = math.prod(shape)
    bits = np.random.Philox(key=np.array([k % 2**64 for k in key], dtype=np.uint64)).random_raw(-(-n // 2)).view(np.uint32)[:n]
    return torch.from_numpy(np.where(bits < keep_below, scale, np.float32(0))).view(shape)


# %%
m = philox_mask((200, 17, 256), 0.1, (11, 12))
test_eq(set(m.unique().tolist()), {0.0, float(np.float32(1) / np.float32(0.9))})
keep = float((m > 0).float().mean())
assert abs(keep - 0.9) < 5 * math.sqrt(0.9 * 0.1 / m.numel()), keep       # within 5 sd of the binomial
test_eq(philox_mask((200, 17, 256), 0.1, (11, 12)), m)                      # a key fixes the mask
assert not torch.equal(philox_mask((200, 17, 256), 0.1, (11, 13)), m)
with K.use_kernels(False): test_eq(philox_mask((200, 17, 256), 0.1, (11, 12)), m)   # numpy fallback: the same mask
r = torch.corrcoef(torch.stack([(m > 0).float().flatten()[:-1], (m > 0).float().flatten()[1:]]))[0, 1]
assert abs(r) < 0.01, r                                                      # neighbours are independent

# %% [markdown]
# Without a tape it *is* `nn.Dropout`: same seed, same output, bit for bit, and the global generator ends where
# `nn.Dropout` leaves it. A replayed mask equals the recorded one, and a
# model that asks for a mask the tape does not hold fails loudly instead of silently drawing a fresh one.

# %%
x = torch.randn(8, 17, 64)
torch.manual_seed(3); ref = nn.Dropout(0.1).train()(x); ref_next = torch.rand(3)
torch.manual_seed(3); ours = MaskDropout(0.1).train()(x)
assert torch.equal(ref, ours) and (ours == 0).any()
test_eq(torch.rand(3), ref_next)
test_eq(MaskDropout(0.1).eval()(x), x)
tape, d = MaskTape(), MaskDropout(0.5)
d.tape = tape
tape.record(); y1 = d(x); y2 = d(x * 2)
tape.replay(); test_eq(d(x), y1); test_eq(d(x * 2), y2)
test_eq(len(tape.masks), 2)
test_fail(lambda: d(x), contains="tape exhausted")
tape.replay(); test_fail(lambda: d(torch.randn(8, 16, 64)), contains="models differ")
torch.manual_seed(3); ph = MaskDropout(0.1, rng="philox").train()(x)       # philox: its own masks, fixed by the seed
torch.manual_seed(3); test_eq(MaskDropout(0.1, rng="philox").train()(x), ph)
assert not torch.equal(ph, ref) and (ph == 0).any()
test_fail(lambda: MaskDropout(0.1, rng="mt"), contains="unknown dropout rng")


# %%
#| export
class ResidualLayerNormFunction(torch.autograd.Function):
    "LN(x + h * mask) in one C pass per row, and its backward (`kernels.residual_layernorm_*`); mask None: no dropout."
    @staticmethod
    def forward(ctx, x, h, mask, weight, bias, eps):
        y, xhat, rstd = K.residual_layernorm_fwd(x, h, mask, weight, bias, eps)
        ctx.save_for_backward(xhat, rstd, mask, weight)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        xhat, rstd, mask, weight = ctx.saved_tensors
        dx, dh, dw, db = K.residual_layernorm_bwd(xhat, rstd, mask, weight, g)
        return dx, dh, None, dw, db, None

class GeluDropoutFunction(torch.autograd.Function):
    "GELU(u) * mask in one C pass, and its backward (`kernels.gelu_dropout_*`); mask None: no dropout."
    @staticmethod
    def forward(ctx, u, mask):
        ctx.save_for_backward(u, mask)
        return K.gelu_dropout_fwd(u, mask)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        u, mask = ctx.saved_tensors
        return K.gelu_dropout_bwd(u, mask, g), None

class Block(nn.Module):
    "Post-norm encoder block: x = LN(x + Drop(Attn(x))); x = LN(x + Drop(MLP(x)))."
    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        hidden = cfg.mlp_ratio * cfg.embed_dim
        self.attn = SelfAttention(cfg)
        self.ln1, self.ln2 = nn.LayerNorm(cfg.embed_dim), nn.LayerNorm(cfg.embed_dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.embed_dim, hidden), nn.GELU(), MaskDropout(cfg.dropout, cfg.dropout_rng),
                                 nn.Linear(hidden, cfg.embed_dim))
        self.drop = MaskDropout(cfg.dropout, cfg.dropout_rng)
        self.fused = cfg.attention == "fused_block"

    def forward(self, x, key_mask=None):
        if self.fused: return self._fused(x, key_mask)
        x = self.ln1(x + self.drop(self.attn(x, key_mask)))
        return self.ln2(x + self.drop(self.mlp(x)))

    def _fused(self, x, key_mask):
        "The same block with its elementwise layers in C: the masks are drawn in the torch path's order, so a tape serves both."
        a = self.attn(x, key_mask)
        x = ResidualLayerNormFunction.apply(x.float(), a.float(), self.drop.mask(a.shape, a.device), self.ln1.weight, self.ln1.bias, self.ln1.eps)
        up, mid_drop, down = self.mlp[0], self.mlp[2], self.mlp[3]
        u = up(x)
        h = down(GeluDropoutFunction.apply(u.float(), mid_drop.mask(u.shape, u.device)))
        return ResidualLayerNormFunction.apply(x, h.float(), self.drop.mask(h.shape, h.device), self.ln2.weight, self.ln2.bias, self.ln2.eps)


# %%
#| export
class CompactClassifier(nn.Module):
    "Study A's classifier: embed, prepend CLS, add positions, 2 post-norm blocks, linear head on CLS."
    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        if (cfg.input_dim is None) == (cfg.vocab_size is None):
            raise ValueError("give exactly one of input_dim (image patches) or vocab_size (token ids)")
        self.cfg = cfg = replace(cfg, normalizer=resolve_normalizer(cfg.normalizer))      # resolved once, here
        self.embed = (nn.Linear(cfg.input_dim, cfg.embed_dim) if cfg.input_dim else
                      nn.Embedding(cfg.vocab_size, cfg.embed_dim, padding_idx=None if cfg.learned_pad_row else 0))
        self.cls = nn.Parameter(torch.randn(1, 1, cfg.embed_dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, cfg.seq_len + 1, cfg.embed_dim) * 0.02)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes)

    def forward(self, x, key_mask=None):
        if self.blocks[0].attn.record and not x.is_floating_point():          # recording on token ids: note the padding keys
            pad = torch.cat([torch.zeros_like(x[:, :1], dtype=torch.bool), x == 0], 1)
            for b in self.blocks: b.attn.pad_keys = pad
        h = self.embed(x)                                                     # (B, T, C)
        h = torch.cat([self.cls.expand(*h.shape[:-2], 1, -1), h], -2) + self.pos  # (B, T+1, C)
        if key_mask is not None:                                              # CLS is always a valid key
            key_mask = torch.cat([key_mask.new_ones(*key_mask.shape[:-1], 1), key_mask.bool()], -1)
        for block in self.blocks: h = block(h, key_mask)
        return self.head(h[..., 0, :])                                        # (B, classes)

    def set_recording(self, on: bool):
        "Turn recording of attention density (and, on token ids, of the attention mass on padding) on or off in every layer."
        for b in self.blocks: b.attn.record, b.attn.last_density, b.attn.pad_keys, b.attn.last_pad_mass = on, None, None, None

    def pad_masses(self):
        "Per layer, the (CLS query, mean real-token query) attention mass on padding keys of the last recorded pass; None for images."
        return [b.attn.last_pad_mass for b in self.blocks]

    def densities(self):
        "Attention density of the last forward pass, one per layer."
        return [b.attn.last_density for b in self.blocks]

    def set_mask_tape(self, tape):
        "Record dropout masks on / replay them from `tape` (None: draw fresh masks, like `nn.Dropout`)."
        for mod in self.modules():
            if isinstance(mod, MaskDropout): mod.tape = tape

    @property
    def method(self) -> str:
        "The registry name of the model's normalizer."
        return self.cfg.normalizer.name

    def learned(self) -> dict:
        "The normalizer's recorded parameters (its spec's `learned`), each a list of per-layer tensors; {} when it has none."
        return {k: [getattr(b.attn.normalizer, k).detach() for b in self.blocks] for k in self.cfg.normalizer.learned}

def count_parameters(model):
    "Number of trainable parameters."
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# %% [markdown]
# The parameter count matches the paper's for the same inputs: 104,970 on Fashion-MNIST (16 patches of 49 values) and
# 114,122 on CIFAR-10 (16 patches of 192 values). The adaptive entmax adds one $\alpha$ logit per head and layer (8).

# %%
fm = CompactClassifier(ClassifierConfig(num_classes=10, seq_len=16, input_dim=49))
test_eq(count_parameters(fm), 104_970)
test_eq(count_parameters(CompactClassifier(ClassifierConfig(10, 16, input_dim=192))), 114_122)
test_eq(count_parameters(CompactClassifier(ClassifierConfig(10, 16, input_dim=49, normalizer="headwise_adaptive_entmax"))), 104_978)
test_eq(fm(torch.rand(5, 16, 49)).shape, (5, 10))
test_fail(lambda: CompactClassifier(ClassifierConfig(10, 16)), contains="exactly one")
# a normalizer declaring `n_keys` is built with the model's key count (sequence + CLS)
from sparse_attention_repro.normalizers import register_normalizer, softmax as _softmax
@register_normalizer("_keys_probe", options=("n_keys",))
class _KeysProbe(nn.Module):
    def __init__(self, num_heads, num_models=None, n_keys=0): super().__init__(); self.n_keys = n_keys
    def forward(self, scores, key_mask=None): return _softmax(scores, key_mask)
test_eq([CompactClassifier(ClassifierConfig(20, n, vocab_size=50, normalizer="_keys_probe")).blocks[0].attn.normalizer.n_keys for n in (16, 96)], [17, 97])

# %% [markdown]
# Behaviour checks: the model is a real post-norm encoder — the output of each block is layer-normalised; with the same
# seed every normalizer starts from the same weights (the paired design), and swapping the normalizer changes only the
# attention map; the CLS position reads all tokens; and a padding mask really hides padded tokens.

# %%
torch.manual_seed(0)
a = CompactClassifier(ClassifierConfig(20, 96, vocab_size=200, normalizer="softmax")).eval()
torch.manual_seed(0)
b = CompactClassifier(ClassifierConfig(20, 96, vocab_size=200, normalizer="topk_softmax_025")).eval()
test_eq([torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())], [True] * len(list(a.parameters())))
ids = torch.randint(1, 200, (3, 96))
assert not torch.allclose(a(ids), b(ids))

h = a.blocks[0](torch.randn(3, 97, 64))
test_close(h.mean(-1), torch.zeros(3, 97), eps=1e-5)          # post-norm: block output is normalised
test_close(h.std(-1, unbiased=False), torch.ones(3, 97), eps=1e-3)

# a token is visible to CLS: changing it changes the logits; masked padding is invisible
ids2 = ids.clone(); ids2[:, 50:] = 0
mask = ids2 != 0
ids3 = ids2.clone(); ids3[:, 60] = 7                            # change a token that is masked
test_close(a(ids2, mask), a(ids3, mask), eps=1e-6)
assert not torch.allclose(a(ids2), a(ids3))                     # unmasked (the paper's setting): padding is attended

# %% [markdown]
# Reference check of one attention layer against a brute-force loop over heads with plain softmax:

# %%
att = a.blocks[0].attn
x = torch.randn(2, 5, 64)
q, k, v = att.qkv(x).split(64, -1)
heads = []
for h_ in range(4):
    sl = slice(16 * h_, 16 * h_ + 16)
    w = torch.softmax(q[..., sl] @ k[..., sl].transpose(1, 2) / 4.0, -1)
    heads.append(w @ v[..., sl])
test_close(att(x), att.out(torch.cat(heads, -1)), eps=1e-5)
xs = torch.randn(4, 97, 64, requires_grad=True)
y_q = att(xs); g_q = torch.autograd.grad(y_q.pow(2).sum(), xs)[0]
att.scale_queries = False                        # scores divided after the product: the same bits when sqrt(D) = 4
y_s = att(xs); g_s = torch.autograd.grad(y_s.pow(2).sum(), xs)[0]
att.scale_queries = True
assert torch.equal(y_q, y_s) and torch.equal(g_q, g_s)

# %%
m = CompactClassifier(ClassifierConfig(10, 16, input_dim=49, normalizer="topk_softmax_025")).eval()
m.set_recording(True); m(torch.rand(4, 16, 49))
test_close(torch.stack(m.densities()), torch.full((2,), 5 / 17), eps=1e-6)   # k = ceil(0.25 * 17) = 5 of 17 keys
test_eq(m.learned(), {})
hae = CompactClassifier(ClassifierConfig(10, 16, input_dim=49, normalizer="headwise_adaptive_entmax"))
test_close(torch.stack(hae.learned()["alpha"]), torch.full((2, 4), 1.5)); test_eq(hae.method, "headwise_adaptive_entmax")

# %% [markdown]
# **The fused path against the torch path.** The same weights on both paths, every paper method, images (17 tokens, the
# lane kernels) and token ids (97 tokens, with and without a key mask): the logits, the recorded densities and the
# gradient of every parameter — the learned $\alpha$ included — agree to float32 rounding.

# %%
from sparse_attention_repro.study import PAPER_METHODS
if K.kernels() is not None:
    for method in PAPER_METHODS:
        for cfg, x, mask in [(ClassifierConfig(10, 16, input_dim=49, normalizer=method), torch.rand(6, 16, 49), None),
                             (ClassifierConfig(20, 96, vocab_size=200, normalizer=method), ids2, None),
                             (ClassifierConfig(20, 96, vocab_size=200, normalizer=method), ids2, mask)]:
            torch.manual_seed(1); ref = CompactClassifier(cfg)
            torch.manual_seed(1); fus = CompactClassifier(replace(cfg, attention="fused"))
            for m_ in (ref, fus):
                with torch.no_grad():
                    for prm in m_.parameters(): prm.add_(0.05 * torch.randn(prm.shape, generator=torch.Generator().manual_seed(prm.numel())))
            outs = []
            for m_ in (ref, fus):
                m_.train(); m_.set_mask_tape(None)
                for mod in m_.modules():
                    if isinstance(mod, MaskDropout): mod.p = 0.0              # dropout off: the two paths see the same activations
                y = m_(x, mask); y.pow(2).sum().backward()
                m_.eval(); m_.set_recording(True); m_(x, mask)
                outs.append((y.detach(), [prm.grad for prm in m_.parameters()], torch.stack(m_.densities())))
            (y0, g0, d0), (y1, g1, d1) = outs
            test_close(y1, y0, eps=1e-4)
            test_close(d1, d0, eps=1e-3)
            for a_, b_ in zip(g1, g0): test_close(a_, b_, eps=2e-3 * max(1.0, float(b_.abs().max())))
    test_fail(lambda: CompactClassifier(ClassifierConfig(10, 16, input_dim=49, normalizer="entmax15_bisect", attention="fused")),
              contains="no fused attention kernel")
    test_fail(lambda: CompactClassifier(ClassifierConfig(10, 16, input_dim=49, attention="flash")), contains="unknown attention path")

# %% [markdown]
# **The fused block, opt-in.** `attention="fused_block"` keeps the fused attention and also runs each block's residual
# sum, dropout and LayerNorm, and its GELU with the dropout after it, as C kernels (`kernels.residual_layernorm_*`,
# `kernels.gelu_dropout_*`); the matrix products stay torch's. It draws its dropout masks in the torch path's order, so a
# mask tape recorded by a torch-path model replays into it: below, with dropout on, both paths see the same masks and
# agree to float32 rounding — logits and every parameter's gradient, for every paper method, on images and on token ids
# with a key mask. Whether it pays is measured, not assumed: `--fast` calibrates it against the other levers.

# %%
if K.kernels() is not None:
    for method in PAPER_METHODS:
        for cfg, x, mask in [(ClassifierConfig(10, 16, input_dim=49, normalizer=method), torch.rand(6, 16, 49), None),
                             (ClassifierConfig(20, 96, vocab_size=200, normalizer=method), ids2, mask)]:
            torch.manual_seed(1); ref = CompactClassifier(replace(cfg, attention="fused"))
            torch.manual_seed(1); blk = CompactClassifier(replace(cfg, attention="fused_block"))
            tape, outs = MaskTape(), []
            for pos, m_ in enumerate((ref, blk)):
                m_.train(); m_.set_mask_tape(tape)
                tape.replay() if pos else tape.record()                            # the second model replays the first's masks
                y = m_(x, mask); y.pow(2).sum().backward()
                outs.append((y.detach(), [prm.grad for prm in m_.parameters()]))
            test_eq(tape.pos, len(tape.masks))                                      # it asked for every mask, in order
            (y0, g0), (y1, g1) = outs
            test_close(y1, y0, eps=1e-4)
            for a_, b_ in zip(g1, g0): test_close(a_, b_, eps=2e-3 * max(1.0, float(b_.abs().max())))
    blk.eval(); ref.eval()
    test_close(blk(x, mask), ref(x, mask), eps=1e-4)                                # evaluation: no masks

# %% [markdown]
# **The padding row.** By default the embedding of id 0 is zero and gets no gradient, exactly as
# `nn.Embedding(..., padding_idx=0)` in the original; both variants draw the same initial weights for every other row
# (the paired design holds across them). With a learned pad row, padding stops being "only a position": at
# initialisation sparsemax already spreads over a different share of keys.

# %%
torch.manual_seed(0); frozen = CompactClassifier(ClassifierConfig(20, 96, vocab_size=200, normalizer="sparsemax"))
torch.manual_seed(0); learned = CompactClassifier(ClassifierConfig(20, 96, vocab_size=200, normalizer="sparsemax", learned_pad_row=True))
test_eq(frozen.embed.weight[0].detach(), torch.zeros(64)); assert learned.embed.weight[0].abs().sum() > 0
test_eq(frozen.embed.weight[1:].detach(), learned.embed.weight[1:].detach())                   # same draw for every real token
test_eq(count_parameters(frozen), count_parameters(learned))                 # the frozen row is still a parameter entry
ids_pad = torch.randint(2, 200, (8, 96)); ids_pad[:, 40:] = 0
frozen(ids_pad).sum().backward()
test_eq(frozen.embed.weight.grad[0], torch.zeros(64))                        # ... that never receives a gradient
frozen.eval(); learned.eval(); frozen.set_recording(True); learned.set_recording(True)
with torch.no_grad(): frozen(ids_pad); learned(ids_pad)
d_frozen, d_learned = float(torch.stack(frozen.densities()).mean()), float(torch.stack(learned.densities()).mean())
print(f"sparsemax density at initialisation, 56 of 96 tokens padding: frozen pad row {d_frozen:.3f}, learned {d_learned:.3f}")
assert abs(d_frozen - d_learned) > 0.02

# %% [markdown]
# **Attention on padding.** While recording on token ids, each layer also keeps the attention mass that falls on padding
# keys: from the CLS query (what the classifier reads) and averaged over the real (non-padding) queries. Checked by brute
# force: the attention weights recomputed by hand from the layer's own projections and normalizer, summed over padding.

# %%
bf = CompactClassifier(ClassifierConfig(20, 96, vocab_size=200, normalizer="softmax")).eval()
bf.set_recording(True)
with torch.no_grad(): bf(ids_pad)
layer0 = bf.blocks[0].attn
with torch.no_grad():
    h0 = torch.cat([bf.cls.expand(8, -1, -1), bf.embed(ids_pad)], 1) + bf.pos
    q0, k0, _ = layer0.qkv(h0).view(8, 97, 3, 4, 16).permute(2, 0, 3, 1, 4)
    w0 = torch.softmax(q0 @ k0.transpose(-2, -1) / 4, -1)                               # (B, H, T, T)
pad_cols = torch.zeros(97, dtype=torch.bool); pad_cols[41:] = True                    # tokens 40..95 are keys 41..96
cls_ref = w0[:, :, 0, pad_cols].sum(-1).mean()
tok_ref = w0[:, :, :41, :][..., pad_cols].sum(-1).mean()                              # CLS and the 40 real tokens ask
test_close(bf.pad_masses()[0][0], cls_ref, eps=1e-5); test_close(bf.pad_masses()[0][1], tok_ref, eps=1e-5)
bf.set_recording(False); test_eq(bf.pad_masses(), [None, None])


# %% [markdown]
# ## Many models as one: the stack
#
# On a GPU these models are far too small to keep the device busy: one training step of one model launches a few hundred
# tiny kernels, so a grid of sequential runs is bound by launch latency, not arithmetic. `StackedClassifiers` trains a
# whole *methods × seeds* grid of one dataset as one module. It is not a second model: it is a copy of the plain
# `CompactClassifier` — the same module tree, the same `forward` — whose leaves are swapped for stacked ones. Every
# parameter gains a leading model axis (ordered method by method, seeds within), a linear layer becomes one batched
# matmul over all models, and the normalizer of each method runs once on its seeds' slice of the scores; the attention
# and the classifier are written once, for any leading axes. The seeds' batches come in stacked (`[S, B, ...]`); each method reads them
# through a broadcast, and each seed draws its dropout masks from its own generator, exactly the draws its plain run makes
# — so the methods of a seed share their masks as in lock-step.
#
# With `bitwise=True` (the default on the CPU) the stack is **the plain path bit for bit** (tested below and in
# `train`): where a batched kernel would round differently from `nn.Linear` or `nn.LayerNorm` — a weight gradient of
# the head, the layer norms' affine gradients — it computes model by model. `bitwise=False` (the default on a GPU, where
# runs are not bit-reproducible anyway) batches those too: fewer kernel launches per step, last-bit differences. On this
# 2-core CPU the stack is no faster than lock-step (the larger working sets spill out of cache): it is the path for GPUs.

# %%
#| export
class StackedLinear(torch.autograd.Function):
    "y[i] = x[i] @ w[i].T + b[i] for every model i, with gradients computed as `nn.Linear` computes them."
    @staticmethod
    def forward(ctx, x, w, b, bitwise=True):
        ctx.dtypes, ctx.bitwise = (x.dtype, w.dtype, b.dtype), bitwise
        if torch.is_autocast_enabled(x.device.type):                  # bf16 autocast: cast as autocast casts a Linear
            dt = torch.get_autocast_dtype(x.device.type)
            x, w, b = x.to(dt), w.to(dt), b.to(dt)
        ctx.save_for_backward(x, w)
        with torch.autocast(x.device.type, enabled=False): return torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        g = g.to(x.dtype)
        if ctx.bitwise: dw = torch.stack([gi.t() @ xi for gi, xi in zip(g, x)])   # batched, this GEMM rounds unlike nn.Linear's
        else: dw = torch.bmm(g.transpose(1, 2), x)
        return *(t.to(dt) for t, dt in zip((torch.bmm(g, w), dw, g.sum(1)), ctx.dtypes)), None

def stacked_parameter(modules, name):
    "Parameter `name` of every module in `modules`, stacked on a leading model axis, as one new parameter."
    return nn.Parameter(torch.stack([m.get_parameter(name).detach() for m in modules]))

class _StackedAffine(nn.Module):
    "A stacked leaf with each model's `weight` and `bias` (linear layers and layer norms)."
    def __init__(self, layers, bitwise: bool):
        super().__init__()
        self.weight, self.bias, self.bitwise = stacked_parameter(layers, "weight"), stacked_parameter(layers, "bias"), bitwise

class StackedLinearLayer(_StackedAffine):
    "The `nn.Linear` of every model of a stack as one module: weight `[N, out, in]`; `[N, ..., in]` -> `[N, ..., out]`."
    def forward(self, x):
        return StackedLinear.apply(x.reshape(x.shape[0], -1, x.shape[-1]), self.weight, self.bias, self.bitwise).view(*x.shape[:-1], self.weight.shape[1])

class StackedLayerNorm(_StackedAffine):
    "Each model's own `nn.LayerNorm` (bitwise: one call per model; a shared call sums the affine gradients differently)."
    def forward(self, x):
        w, b = self.weight, self.bias
        if self.bitwise: return torch.stack([F.layer_norm(x[i], x.shape[-1:], w[i], b[i]) for i in range(x.shape[0])])
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
        return torch.addcmul(b.view(shape), F.layer_norm(x, x.shape[-1:]), w.view(shape))

class StackedEmbedding(nn.Module):
    "Each model's own token table `[N, vocab, C]`; a zero padding row keeps no gradient unless the models learn it."
    def __init__(self, layers, learned_pad_row: bool):
        super().__init__()
        self.weight, self.learned_pad_row = stacked_parameter(layers, "weight"), learned_pad_row
    def forward(self, x):                                                       # x: [N, B, T] token ids
        N, V = self.weight.shape[:2]
        h = F.embedding(x + (torch.arange(N, device=x.device) * V).view(N, 1, 1), self.weight.view(N * V, -1))  # model i's table
        return h if self.learned_pad_row else h * (x != 0).unsqueeze(-1)        # padding_idx=0: no gradient to row 0

class StackedDropout(nn.Module):
    "Each seed's next mask, the draw its plain run makes, shared by the seed's methods (`streams`: the stack's generators)."
    def __init__(self, p: float, rng: str, streams):
        super().__init__()
        self.p, self.rng, self.streams = p, rng, streams
    def forward(self, x):
        if not self.training or self.p == 0: return x
        gens, S = self.streams.generators, self.streams.num_seeds
        if gens is None: raise RuntimeError("set `generators` (one pair per seed) before training the stack")
        mask = torch.stack([draw_mask(x.shape[1:], self.p, self.rng, x.device, *g) for g in gens])
        return (x.view(-1, S, *x.shape[1:]) * mask).view(x.shape)

class StackedNormalizer(nn.Module):
    "One layer's normalizer for every model: each method's module (built for `num_seeds` models) on its seeds' slice of the scores."
    def __init__(self, specs, num_seeds: int, num_heads: int, n_keys: int):
        super().__init__()
        self.num_seeds = num_seeds
        self.groups = nn.ModuleList(spec.build_for_keys(num_heads, n_keys, num_models=num_seeds) for spec in specs)
    def forward(self, scores, mask=None):                                       # scores [N, B, H, T, T], mask [S, B, 1, 1, T]
        S = self.num_seeds
        outs = [norm(scores[g * S:(g + 1) * S], mask) for g, norm in enumerate(self.groups)]
        return torch.cat(outs) if len(outs) > 1 else outs[0]

class _Streams:
    "The dropout generators of a stack's seeds, shared by its dropout modules."
    def __init__(self, num_seeds): self.num_seeds, self.generators = num_seeds, None

class StackedClassifiers(nn.Module):
    "Models of a methods x seeds grid (built as `CompactClassifier`s, ordered method by method) as one module."
    def __init__(self, models, num_seeds: int, bitwise: bool | None = None):
        super().__init__()
        cfg, n = models[0].cfg, len(models)
        self.bitwise = next(models[0].parameters()).device.type == "cpu" if bitwise is None else bitwise
        if n % num_seeds: raise ValueError(f"{n} models do not form a grid with {num_seeds} seeds")
        self.cfg, self.num_seeds, self.num_methods = cfg, num_seeds, n // num_seeds
        self.methods = [models[i].cfg.normalizer for i in range(0, n, num_seeds)]
        if any(m.cfg.normalizer != self.methods[i // num_seeds] for i, m in enumerate(models)):
            raise ValueError("order the models method by method, the seeds within each method")
        self.order = [[k for k, _ in models[g * num_seeds].named_parameters()] for g in range(self.num_methods)]
        self._streams = _Streams(num_seeds)
        self.model = copy.deepcopy(models[0])            # the plain module tree and forward, its leaves swapped for stacked ones
        self._stack_leaves(models)

    def _stack_leaves(self, models):
        "Replace each leaf of `self.model` by the stacked leaf holding every model's copy of it."
        device, swapped = next(models[0].parameters()).device, []
        for name, mod in list(models[0].named_modules()):
            if any(name.startswith(s + ".") for s in swapped): continue
            parts = [m.get_submodule(name) for m in models]
            if isinstance(mod, nn.Linear): new = StackedLinearLayer(parts, self.bitwise)
            elif isinstance(mod, nn.LayerNorm): new = StackedLayerNorm(parts, self.bitwise)
            elif isinstance(mod, nn.Embedding): new = StackedEmbedding(parts, self.cfg.learned_pad_row)
            elif isinstance(mod, MaskDropout): new = StackedDropout(mod.p, mod.rng, self._streams)
            elif name.endswith(".normalizer"):
                new = StackedNormalizer(self.methods, self.num_seeds, self.cfg.num_heads, self.cfg.seq_len + 1).to(device)
                with torch.no_grad():                       # learned ones: one entry per seed, from each model
                    for g, norm in enumerate(new.groups):
                        for k, q in norm.named_parameters():
                            q.copy_(torch.stack([p.get_parameter(k) for p in parts[g * self.num_seeds:(g + 1) * self.num_seeds]]))
            else:                                           # a container: stack its own parameters (cls, pos)
                for k, _ in mod.named_parameters(recurse=False):
                    setattr(self.model.get_submodule(name), k, stacked_parameter(parts, k))
                continue
            parent, _, leaf = name.rpartition(".")
            setattr(self.model.get_submodule(parent), leaf, new); swapped.append(name)

    @property
    def generators(self): return self._streams.generators
    @generators.setter
    def generators(self, gens):
        "Per seed: (CPU generator, device generator) for the dropout masks."
        self._streams.generators = gens

    def parameter_of(self, i, name):
        "Model i's parameter `name` (its plain name) in the stack: (stacked tensor, index of model i in it)."
        g, s = divmod(i, self.num_seeds)
        if ".normalizer." not in name: return self.model.get_parameter(name), i
        layer, attr = name.split(".normalizer.")
        return self.model.get_parameter(f"{layer}.normalizer.groups.{g}.{attr}"), s

    def forward(self, x, key_mask=None):
        "Each seed's batch `x` `[S, B, ...]` (and `key_mask` `[S, B, T]`) -> every model's logits `[N, B, classes]`."
        return self.model(x.expand(self.num_methods, *x.shape).reshape(-1, *x.shape[1:]), key_mask)

    def losses(self, logits, y):
        "Each model's mean cross-entropy `[N]` on its seed's labels `y` `[S, B]` (bitwise: one call per model)."
        N, B = logits.shape[:2]
        if self.bitwise: return torch.stack([F.cross_entropy(logits[i], y[i % self.num_seeds]) for i in range(N)])
        y = y.expand(self.num_methods, *y.shape).reshape(N * B)
        return F.cross_entropy(logits.reshape(N * B, -1), y, reduction="none").view(N, B).mean(1)

    @torch.no_grad()
    def clip_grad_norms_(self, max_norm: float):
        "`clip_grad_norm_` of every model: the norm over its own gradients, taken in its plain order; its own coefficient."
        S, norms, totals = self.num_seeds, {}, []
        for g in range(self.num_methods):
            per = []
            for k in self.order[g]:
                t, j = self.parameter_of(g * S, k)
                if ".normalizer." in k: per.append(torch.linalg.vector_norm(t.grad.flatten(1), 2, dim=1))            # [S]
                else:
                    if k not in norms: norms[k] = torch.linalg.vector_norm(t.grad.flatten(1), 2, dim=1)          # [N]
                    per.append(norms[k][j:j + S])
            totals.append(torch.linalg.vector_norm(torch.stack(per, 1), 2, dim=1))                              # [S]
        total = torch.cat(totals)
        coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for k, q in self.model.named_parameters():
            c = coef if ".groups." not in k else coef[int(k.split(".groups.")[1].split(".")[0]) * S:][:S]
            q.grad.mul_(c.view(-1, *(1,) * (q.dim() - 1)))
        return total

    def model_learned(self, i) -> dict:
        "Recorded parameters of model i's normalizer (its spec's `learned`), each a list of per-layer tensors; {} when none."
        g, s = divmod(i, self.num_seeds)
        return {k: [getattr(b.attn.normalizer.groups[g], k)[s].detach() for b in self.model.blocks] for k in self.methods[g].learned}

    @torch.no_grad()
    def write_back(self, models):
        "Copy each model's slice of the stack into its `CompactClassifier` (to evaluate, save or inspect it)."
        for i, m in enumerate(models):
            for k, q in m.named_parameters():
                t, j = self.parameter_of(i, k)
                q.copy_(t[j])


# %% [markdown]
# The stack computes what its models compute: logits bit for bit, the gradient of every parameter bit for bit (dropout
# on, one mask stream per seed), and the adaptive entmax keeps one $\alpha$ per head *and model*. Training equivalence
# over many steps is tested in `train`.

# %%
def _grid_models(num_seeds, methods, **kw):
    out = []
    for m in methods:
        for s in range(num_seeds):
            torch.manual_seed(s); out.append(CompactClassifier(ClassifierConfig(num_classes=5, normalizer=m, **kw)))
    return out

def _streams(num_seeds, models):
    "Each seed's generator as its plain run finds it: seeded, then advanced by building the model."
    gens = []
    for s in range(num_seeds):
        torch.manual_seed(s); CompactClassifier(models[0].cfg); g = torch.Generator(); g.set_state(torch.get_rng_state())
        gens.append((g, g))
    return gens

for kw, x, km in [(dict(seq_len=16, input_dim=49), torch.rand(2, 12, 16, 49), None),
                  (dict(seq_len=20, vocab_size=50), torch.randint(0, 50, (2, 12, 20)), torch.rand(2, 12, 20) > 0.3)]:
    methods = ["softmax", "headwise_adaptive_entmax", "topk_softmax_025"]
    models = _grid_models(2, methods, **kw)
    with torch.no_grad():
        for mod in models[2:4]:
            for b in mod.blocks: b.attn.normalizer.alpha_logit.normal_()       # distinct alphas per seed
    stack = StackedClassifiers(models, 2).train()
    stack.generators = _streams(2, models)
    y = torch.randint(0, 5, (2, 12))
    logits = stack(x, km)
    sum(F.cross_entropy(logits[i], y[i % 2]) for i in range(6)).backward()
    for i, mod in enumerate(models):
        torch.manual_seed(i % 2); CompactClassifier(mod.cfg)                     # the plain run's generator state
        mod.train(); F.cross_entropy(out := mod(x[i % 2], None if km is None else km[i % 2]), y[i % 2]).backward()
        assert torch.equal(out, logits[i])
    grad_of = lambda i, k: (lambda t, j: t.grad[j])(*stack.parameter_of(i, k))
    for i, mod in enumerate(models): assert all(torch.equal(grad_of(i, k), q.grad) for k, q in mod.named_parameters()), i
    totals = stack.clip_grad_norms_(0.05)                                         # small enough to clip every model
    for i, mod in enumerate(models):
        test_eq(totals[i], torch.nn.utils.clip_grad_norm_(mod.parameters(), 0.05))
        assert all(torch.equal(grad_of(i, k), q.grad) for k, q in mod.named_parameters()), i
    with use_kernels(False), torch.no_grad():    # the torch normalizers (the GPU's): the same model, to the Newton
        for i, mod in enumerate(models):          # tolerance (their iterations stop when every row of the call has converged)
            test_close(stack.eval()(x, km)[i], mod.eval()(x[i % 2], None if km is None else km[i % 2]), eps=1e-5)
    test_eq(stack.model.blocks[0].attn.normalizer.groups[1].alpha_logit.shape, (2, 4))
    test_eq(list(stack.model_learned(3)), ["alpha"]); test_eq(stack.model_learned(3)["alpha"], models[3].learned()["alpha"])
    test_eq(stack.model_learned(0), {})
test_fail(lambda: StackedClassifiers(models[:5], 2), contains="do not form a grid")
test_fail(lambda: StackedClassifiers([models[0], models[2], models[1], models[3]], 2), contains="method by method")

# %% [markdown]
# `bitwise=False` batches the per-model reductions: the same model to the last bits, and far fewer operator calls per
# training step (each a kernel launch on a GPU) — counted here, forward and backward, for 7 methods × 2 seeds:

# %%
from torch.utils._python_dispatch import TorchDispatchMode
from sparse_attention_repro.study import PAPER_METHODS

class CountOps(TorchDispatchMode):
    "Counts the operator calls that reach the kernels."
    def __init__(self): super().__init__(); self.n = 0
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))

calls, out = {}, {}
for seeds in (2, 6):
    models = _grid_models(seeds, PAPER_METHODS, seq_len=16, input_dim=49)
    x, y = torch.rand(seeds, 32, 16, 49), torch.randint(0, 5, (seeds, 32))
    for bitwise in (True, False):
        stack = StackedClassifiers(models, seeds, bitwise=bitwise).train()
        stack.generators = _streams(seeds, models)
        with CountOps() as ops:
            loss = stack.losses(stack(x), y); loss.sum().backward(); stack.clip_grad_norms_(5.0)
        calls[seeds, bitwise] = ops.n
        out[seeds, bitwise] = (loss.detach(), stack.model.get_parameter("blocks.0.ln1.weight").grad.clone(), stack.model.get_parameter("head.weight").grad.clone())
    print(f"operator calls per training step, {7 * seeds} models: bitwise {calls[seeds, True]}, batched {calls[seeds, False]}")
assert calls[6, False] - calls[2, False] < (calls[6, True] - calls[2, True]) / 4       # batched: barely grows with seeds
for a, b in zip(out[6, True], out[6, False]): test_close(a, b, eps=1e-5)
