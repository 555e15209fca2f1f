# %% [markdown]
# # Causal decoder
#
# > A small pre-LN decoder for the length study: any registered normalizer in every layer, NAPE or RoPE positions, and attention in query blocks so that a 4,096-token test never holds a T × T tensor.

# %%
#| default_exp decoder

# %% [markdown]
# The length study trains on inputs of 32–64 tokens and tests on inputs up to 64 times longer. Its model is the
# smallest thing that can learn the tasks: a decoder of a few pre-LN blocks, $x \leftarrow x + \mathrm{Attn}(\mathrm{LN}(x))$,
# $x \leftarrow x + \mathrm{MLP}(\mathrm{LN}(x))$, a final LN and a linear read-out, no dropout (the anchor's Gemma-2
# configuration has none). Two things matter for length and are declared here:
#
# * **Causality is a key mask.** Query $i$ may attend to keys $j \le i$; the mask goes to the normalizer as its
#   `key_mask`, so a normalizer that counts its keys (Scalable-Softmax's $\log n$, ReLU attention's $1/n$) counts the
#   $i + 1$ keys that query sees, not the sequence length.
# * **Positions.** The anchor's default, *NAPE*: the first half of the heads add an ALiBi bias
#   $m_h (j - i)$ with slopes $m_h = 1, 1/2, \dots, 1/(H/2)$, the other half get no position information at all (only
#   causality). The alternative is RoPE on every head (base 10,000). `none` (NoPE) is there for ablations.
#
# **Query blocks.** At 4,096 tokens a `[B, H, T, T]` score tensor is gigabytes. Attention is computed for `query_block`
# queries at a time against the keys they can see, so the largest tensor is `[B, H, block, T]`; the result is the same
# (each query row is normalised on its own). Under autograd the weights of every block would be kept for the backward,
# which is $T^2$ again; so with more than one block each block is **recomputed** in the backward
# (`torch.utils.checkpoint`) instead of kept, and memory stays $O(\text{block} \times T)$ per head, forward and backward.
# Training at 32–64 tokens fits one block and pays nothing for this.

# %%
#| export
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from sparse_attention_repro.normalizers import resolve_normalizer

# %%
from fastcore.test import test_eq, test_close, test_fail

# %%
#| export
POSITION_SCHEMES = ("nape", "rope", "none")

@dataclass
class DecoderConfig:
    "The causal decoder's shape; one normalizer in every layer."
    vocab_size: int
    width: int = 64                  # model width
    layers: int = 2                  # pre-LN blocks
    heads: int = 4                   # attention heads (an even number under NAPE)
    ffn: int = 256                   # MLP hidden width
    positions: str = "nape"          # nape | rope | none
    normalizer: str = "softmax"      # any name `resolve_normalizer` takes
    query_block: int = 256           # queries per attention block

    def __post_init__(self):
        if self.positions not in POSITION_SCHEMES:
            raise ValueError(f"unknown position scheme {self.positions!r}; choose one of {', '.join(POSITION_SCHEMES)}")
        if self.width % self.heads: raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")
        if self.positions == "nape" and self.heads % 2: raise ValueError(f"NAPE splits the heads in halves: give an even number of heads, not {self.heads}")


# %% [markdown]
# ## Positions
#
# ALiBi's slopes under NAPE, as the anchor's code builds them: $1/1, 1/2, \dots$ for the first $H/2$ heads, zero after.
# RoPE rotates each pair of a head's dimensions by an angle proportional to the position.

# %%
#| export
def nape_slopes(heads: int) -> torch.Tensor:
    "ALiBi slopes `[H]` of NAPE: 1, 1/2, ..., 1/(H/2) on the first half of the heads, 0 (no position) on the rest."
    half = heads // 2
    return torch.cat([1 / torch.arange(1, half + 1, dtype=torch.float32), torch.zeros(heads - half)])

def rope(x, positions, base: float = 10000.0):
    "Rotary embedding of `x` `[..., T, D]` (D even) at integer `positions` `[T]`: pairs (2i, 2i+1) rotated by pos / base^(2i/D)."
    d = x.shape[-1]
    freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)          # (D/2,)
    angle = positions.to(torch.float32)[:, None] * freq                                          # (T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

# %%
test_eq(nape_slopes(4).tolist(), [1.0, 0.5, 0.0, 0.0])
test_close(nape_slopes(8), torch.tensor([1.0, 0.5, 1 / 3, 0.25, 0, 0, 0, 0]))
# RoPE makes q.k depend on the offset only: shift both positions, the scores stay
q, k = torch.randn(5, 8), torch.randn(5, 8)
pos = torch.arange(5)
s0 = rope(q, pos) @ rope(k, pos).T
s7 = rope(q, pos + 7) @ rope(k, pos + 7).T
test_close(s0, s7, eps=1e-4)
test_close(rope(q, torch.zeros(5, dtype=torch.long)), q)


# %% [markdown]
# ## Attention in query blocks
#
# One layer's attention. Scores $q k^\top / \sqrt{d}$ (plus the ALiBi bias on NAPE's first half) for a block of queries
# against the keys up to the block's last query; the causal mask to the normalizer; weights times values. A normalizer
# that declares `query_context` (ASEntmax: its scale depends on each query's input and position) also receives the
# block's layer input `hidden` `[B, q, C]` and the queries' positions `[q]`.

# %%
#| export
def causal_mask(q_start: int, q_stop: int, n_keys: int, device=None) -> torch.Tensor:
    "`[q, n_keys]` True where query q_start + r may attend key j (j <= q_start + r): the lower triangle from diagonal q_start."
    return torch.ones(q_stop - q_start, n_keys, dtype=torch.bool, device=device).tril_(q_start)   # ~10x faster than comparing aranges


# %%
# the definition, by brute force: query q_start + r sees key j exactly when j <= q_start + r
for _a, _b, _n in ((0, 5, 5), (3, 9, 12), (250, 256, 256), (7, 7, 7), (0, 4, 2)):
    test_eq(causal_mask(_a, _b, _n).tolist(), [[j <= _a + r for j in range(_n)] for r in range(_b - _a)])

# %%
#| export
class CausalSelfAttention(nn.Module):
    "Multi-head causal self-attention with a registered normalizer, computed in blocks of queries."
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.heads, self.head_dim, self.block, self.positions = cfg.heads, cfg.width // cfg.heads, cfg.query_block, cfg.positions
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=False)
        self.out = nn.Linear(cfg.width, cfg.width, bias=False)
        self.spec = resolve_normalizer(cfg.normalizer)
        with torch.random.fork_rng(devices=[]):          # a normalizer's own draws leave the model's initial weights as every arm's
            self.normalizer = self.spec.build(num_heads=cfg.heads, **self._options(cfg))
        self.register_buffer("slopes", nape_slopes(cfg.heads) if cfg.positions == "nape" else torch.zeros(cfg.heads), persistent=False)

    def _options(self, cfg):
        "What the normalizer is told of the model, where it asks: the model `width`, and under NAPE the heads without position (`nope_heads`, the last ones)."
        told = {"width": cfg.width} | ({"nope_heads": cfg.heads - cfg.heads // 2} if cfg.positions == "nape" else {})
        return {k: v for k, v in told.items() if k in self.spec.options}

    def _block(self, q, k, v, h, pos, a, b):
        "The output `[B, H, b - a, d]` of queries a..b-1 against keys 0..b-1."
        s = q[:, :, a:b] @ k[:, :, :b].transpose(-1, -2)                                          # (B, H, q, b)
        if self.positions == "nape":
            s = s + self.slopes.view(-1, 1, 1) * (pos[:b][None, :] - pos[a:b][:, None]).to(s.dtype)   # m_h (j - i)
        mask = causal_mask(a, b, b, h.device)[None, None]                                        # (1, 1, q, b)
        ctx = {"hidden": h[:, a:b], "positions": pos[a:b]} if self.spec.query_context else {}
        return self.normalizer(s, mask, **ctx) @ v[:, :, :b]                                     # (B, H, q, d)

    def forward(self, h, first_query: int = 0):
        "h `[B, T, C]` (the block's normalised input) -> `[B, T - first_query, C]`: the outputs of queries first_query..T-1."
        B, T, C = h.shape
        q, k, v = self.qkv(h).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)   # 3 x (B, H, T, d)
        pos = torch.arange(T, device=h.device)
        if self.positions == "rope": q, k = rope(q, pos), rope(k, pos)
        q = q / math.sqrt(self.head_dim)
        blocks = [(a, min(a + self.block, T)) for a in range(first_query, T, self.block)]
        if torch.is_grad_enabled() and len(blocks) > 1:          # backward through long rows: each block recomputed, not kept
            parts = [checkpoint(self._block, q, k, v, h, pos, a, b, use_reentrant=False) for a, b in blocks]
        else: parts = [self._block(q, k, v, h, pos, a, b) for a, b in blocks]
        out = torch.cat(parts, 2)                                                                # (B, H, T', d)
        return self.out(out.transpose(1, 2).reshape(B, T - first_query, C))


# %% [markdown]
# The blocks change nothing: any block size gives the output of one block, for a dense and a sparse normalizer, and a
# query's output does not depend on later tokens (causality, checked by changing the future).

# %%
torch.manual_seed(0)
for name in ("softmax", "entmax15", "sparsemax"):
    for positions in POSITION_SCHEMES:
        att = CausalSelfAttention(DecoderConfig(10, width=16, heads=4, positions=positions, normalizer=name, query_block=64))
        h = torch.randn(2, 23, 16, dtype=torch.float64); att = att.double()
        full = att(h)
        att.block = 5; test_close(att(h), full, eps=1e-10)
        h2 = h.clone(); h2[:, 15:] = torch.randn(2, 8, 16, dtype=torch.float64)
        test_close(att(h2)[:, :15], full[:, :15], eps=1e-10)
test_fail(lambda: DecoderConfig(10, heads=3, width=12), contains="even number of heads")
test_fail(lambda: DecoderConfig(10, positions="alibi"), contains="unknown position scheme 'alibi'")


# %% [markdown]
# And the layer computes what the formula says: a direct, unblocked computation with an explicit $T \times T$ bias and
# `torch.softmax` on masked scores gives the same output under NAPE.

# %%
att = CausalSelfAttention(DecoderConfig(10, width=16, heads=4, positions="nape", query_block=4)).double()
h = torch.randn(3, 11, 16, dtype=torch.float64)
q, k, v = att.qkv(h).view(3, 11, 3, 4, 4).permute(2, 0, 3, 1, 4)
i, j = torch.arange(11)[:, None], torch.arange(11)[None, :]
bias = torch.tensor([1, .5, 0, 0], dtype=torch.float64).view(4, 1, 1) * (j - i)
s = (q @ k.transpose(-1, -2) / 2 + bias).masked_fill(j > i, float("-inf"))
ref = att.out((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(3, 11, 16))
test_close(att(h), ref, eps=1e-10)


# %% [markdown]
# ## The decoder

# %%
#| export
class DecoderBlock(nn.Module):
    "Pre-LN block: x + Attn(LN(x)), then x + MLP(LN(x))."
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(cfg.width), CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, cfg.ffn), nn.GELU(), nn.Linear(cfg.ffn, cfg.width))
    def forward(self, x, first_query: int = 0):
        "x `[B, T, C]` -> `[B, T - first_query, C]` (keys from every position, outputs from first_query on)."
        x = x[:, first_query:] + self.attn(self.ln1(x), first_query)
        return x + self.mlp(self.ln2(x))

class CausalDecoder(nn.Module):
    "Token embedding, pre-LN blocks, final LN, linear read-out: logits `[B, T, V]` for every next token."
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.width)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab_size, bias=False)
        self.apply(self._init)
    @staticmethod
    def _init(m):
        "GPT-2's initialisation: weights N(0, 0.02), biases 0."
        if isinstance(m, (nn.Linear, nn.Embedding)): nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None: nn.init.zeros_(m.bias)
    def forward(self, tokens, first_query: int = 0):
        """Logits `[B, T - first_query, V]` of the positions first_query..T-1: every block but the last runs on every
        position (the last one's keys need them), the last only on those queries."""
        x = self.embed(tokens)                                                                    # (B, T, C)
        for block in self.blocks[:-1]: x = block(x)
        return self.head(self.ln(self.blocks[-1](x, first_query)))                               # (B, T', V)

# %%
torch.manual_seed(0)
model = CausalDecoder(DecoderConfig(12, width=16, heads=4, normalizer="entmax15"))
tokens = torch.randint(0, 12, (2, 9))
test_eq(model(tokens).shape, (2, 9, 12))
test_close(model(tokens, first_query=6), model(tokens)[:, 6:], eps=1e-6)   # only the last queries: the same logits
t2 = tokens.clone(); t2[:, 6:] = (t2[:, 6:] + 1) % 12
test_close(model(t2)[:, :6], model(tokens)[:, :6], eps=1e-6)        # the future does not leak


# %% [markdown]
# ## Exact match without a decoding loop
#
# The anchor decodes greedily and compares the whole answer. With teacher forcing, one forward pass gives the model's
# argmax at every target position given the *true* prefix. The two readings agree: if every teacher-forced argmax is
# right, greedy decoding reproduces the target token by token (its prefix is always the true one); if one is wrong, greedy
# decoding goes wrong at the first such position at the latest, since up to there its prefix was the true one. So a
# sequence is an exact match exactly when all its target positions are argmax-correct, and a test costs one forward pass
# instead of one per target token.

# %%
#| export
IGNORE_INDEX = -100

@torch.no_grad()
def exact_match(model, tokens, labels) -> torch.Tensor:
    "`[B]` bool: every labelled position's argmax equals its label (labels -100 elsewhere) — greedy decoding's exact match."
    return match_and_loss(model, tokens, labels)[0]

@torch.no_grad()
def match_and_loss(model, tokens, labels, labelled_only: bool = False) -> tuple:
    """(`[B]` exact match, the summed cross-entropy of the labelled tokens, their number) from one forward pass; with
    `labelled_only` its last block computes only the queries from the first labelled position on (at 4,096 tokens and
    one target token, half the attention of a 2-block model; the same values up to float rounding)."""
    on = labels != IGNORE_INDEX
    if not on.any(): return torch.ones(len(tokens), dtype=torch.bool), 0.0, 0                    # nothing to answer
    first = int(on.any(0).nonzero()[0]) if labelled_only else 0
    logits = model(tokens, first_query=first)                                                     # (B, T - first, V)
    labels, on = labels[:, first:], on[:, first:]
    match = ((logits.argmax(-1) == labels) | ~on).all(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum")
    return match, float(loss), int(on.sum())

# %% [markdown]
# The check against real greedy decoding, token by token, on an untrained model (whose answers are mostly wrong) and on
# a model rigged to answer right: the two readings agree sequence by sequence.

# %%
def greedy_exact_match(model, tokens, labels):
    "Decode the target greedily, one token at a time from the prompt, and compare."
    first = (labels != IGNORE_INDEX).float().argmax(-1)                                           # first target position
    out = []
    for b in range(len(tokens)):
        seq = tokens[b, : first[b] + 1].clone()
        want = labels[b][labels[b] != IGNORE_INDEX]
        for _ in range(len(want)):
            nxt = model(seq[None])[0, -1].argmax()
            seq = torch.cat([seq, nxt[None]])
        out.append(bool((seq[first[b] + 1:] == want).all()))
    return torch.tensor(out)

torch.manual_seed(1)
model = CausalDecoder(DecoderConfig(5, width=8, heads=2, layers=1)).eval()
seq = torch.randint(0, 5, (60, 4))                               # prompts: the target starts after position 3
with torch.no_grad():
    for _ in range(3): seq = torch.cat([seq, model(seq).argmax(-1)[:, -1:]], 1)   # the model's own greedy answers
tokens, labels = seq[:, :-1], torch.full((60, 6), IGNORE_INDEX)
labels[:, 3:] = seq[:, 4:]                                       # right, by construction ...
labels[::3, 5] = (labels[::3, 5] + 1) % 5                        # ... but every third wrong at its last token
labels[1::3, 3] = (labels[1::3, 3] + 1) % 5                      # and another third at its first
test_eq(exact_match(model, tokens, labels), greedy_exact_match(model, tokens, labels))
m1, l1, n1 = match_and_loss(model, tokens, labels); m2, l2, n2 = match_and_loss(model, tokens, labels, labelled_only=True)
test_eq(m1, m2); test_close(l1, l2, eps=1e-4); test_eq(n1, n2)
test_eq(exact_match(model, tokens, labels).sum(), 20)


# %% [markdown]
# The recomputed backward is the kept one: gradients of the input and of every parameter agree with one unblocked
# block, for a dense and a sparse normalizer with a learned parameter.

# %%
for name in ("softmax", "headwise_adaptive_entmax"):
    torch.manual_seed(0)
    att = CausalSelfAttention(DecoderConfig(10, width=16, heads=4, normalizer=name, query_block=64)).double()
    h = torch.randn(2, 19, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 19, 16, dtype=torch.float64)
    grads = []
    for block in (64, 5):
        att.block, h.grad = block, None
        att.zero_grad()
        (att(h) * g).sum().backward()
        grads.append([h.grad.clone()] + [p.grad.clone() for p in att.parameters()])
    for x, y in zip(*grads): test_close(x, y, eps=1e-10)
