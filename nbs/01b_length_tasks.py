# %% [markdown]
# # Length tasks
#
# > Sequence-to-sequence tasks generated offline from a seed, in an open registry, for training short and testing long.

# %%
#| default_exp length_tasks

# %% [markdown]
# The length study asks where the literature says sparse attention wins: a model trained on short sequences is tested on
# sequences many times longer. Vasylenko, Pitorro, Martins & Treviso (*Long-Context Generalization with Sparse
# Attention*, ICLR 2026) pose every task as sequence to sequence: the model reads an input, a separator, and is trained
# to emit the target tokens (loss on the target only); a test sequence counts as right when every target token is right
# (exact match). This notebook declares the tasks; the model and the training loop are elsewhere.
#
# A task is a `LengthTask`: its vocabulary, the shortest input it can make, and `make(rng, n, length)`, which draws `n`
# examples whose input has exactly `length` tokens. The length of an example is its **input** length; the target is
# extra. Tasks live in one open registry, like the normalizers': `register_task`, reached by name, by
# `package.module:name`, or through the entry-point group `sparse_attention_repro.tasks`.
#
# Token ids are shared by every task: `0` pads, `1` separates the input from the target; a task's own symbols start at
# `2`.

# %%
#| export
import importlib, importlib.metadata, re
from dataclasses import dataclass
from typing import Callable

import numpy as np

# %%
from fastcore.test import test_eq, test_fail, test_ne

# %%
#| export
PAD, SEP, FIRST_SYMBOL = 0, 1, 2      # padding, input/target separator, a task's first own symbol
TASK_ENTRY_POINT_GROUP = "sparse_attention_repro.tasks"

@dataclass(frozen=True)
class LengthTask:
    "A sequence-to-sequence task generated from a seed: `make(rng, n, length) -> (inputs [n, length], targets [n, K])`."
    name: str
    symbols: int                      # the task's own symbols (ids 2 .. 2 + symbols - 1)
    min_length: int                   # the shortest input it can make
    make: Callable                    # make(rng: np.random.Generator, n: int, length: int) -> (int64 [n, L], int64 [n, K])
    description: str = ""
    source: str = ""                  # the module that registered it

    @property
    def vocab_size(self) -> int: return FIRST_SYMBOL + self.symbols

    def sample(self, rng: np.random.Generator, n: int, length: int):
        "`n` examples of input length `length`: checked inputs and targets (int64), ids within the vocabulary."
        if length < self.min_length:
            raise ValueError(f"task {self.name} needs inputs of at least {self.min_length} tokens, got {length}; choose a longer length")
        x, y = self.make(rng, n, length)
        x, y = np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64)
        if x.shape != (n, length) or y.ndim != 2 or len(y) != n:
            raise ValueError(f"task {self.name} made inputs {x.shape} and targets {y.shape} for n={n}, length={length}")
        if min(x.min(), y.min()) < FIRST_SYMBOL or max(x.max(), y.max()) >= self.vocab_size:
            raise ValueError(f"task {self.name} made ids outside its symbols {FIRST_SYMBOL}..{self.vocab_size - 1}")
        return x, y


# %% [markdown]
# ## The registry
#
# Registering checks the name (it becomes a file name and a column) and refuses to rebind a name to another definition.
# `get_task` resolves a name, `package.module:name` (the module is imported, which registers it) or an entry point, and
# answers an unknown name in one line that lists the choices.

# %%
#| export
_TASKS: dict = {}

def register_task(task: LengthTask) -> LengthTask:
    "Put `task` in the registry under its name (an identifier); another definition under a taken name is refused."
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", task.name):
        raise ValueError(f"task name {task.name!r} must be an identifier (letters, digits, _)")
    old = _TASKS.get(task.name)
    if old is not None and (old.make is not task.make or old.symbols != task.symbols or old.min_length != task.min_length):
        raise ValueError(f"task {task.name!r} is already registered (from {old.source}); choose another name")
    _TASKS[task.name] = task
    return task

def _task_entry_points():
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=TASK_ENTRY_POINT_GROUP)}

def registered_tasks() -> list:
    "Names that resolve without importing anything by hand: the registry, then the entry points."
    return list(dict.fromkeys(list(_TASKS) + sorted(_task_entry_points())))

def get_task(ref) -> LengthTask:
    "The task `ref` names: a `LengthTask`, a registered name, `package.module:name`, or an entry point of the tasks group."
    if isinstance(ref, LengthTask): return register_task(ref)
    ref = str(ref)
    if ref in _TASKS: return _TASKS[ref]
    if ":" in ref:
        module, _, attr = ref.partition(":")
        try: obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"cannot load task {ref!r} ({type(e).__name__}: {e}); give package.module:name of a LengthTask") from None
        if not isinstance(obj, LengthTask): raise ValueError(f"{ref} is {type(obj).__name__}, not a LengthTask")
        return register_task(obj)
    if (ep := _task_entry_points().get(ref)) is not None:
        obj = ep.load()
        if not isinstance(obj, LengthTask): raise ValueError(f"entry point {ref} ({ep.value}) is not a LengthTask")
        return register_task(obj)
    raise ValueError(f"unknown task {ref!r}; choose one of {', '.join(registered_tasks())}, package.module:name, "
                     f"or an entry point of {TASK_ENTRY_POINT_GROUP}")


# %%
toy = LengthTask("toy_copy", 3, 1, lambda rng, n, L: (x := rng.integers(2, 5, (n, L)), x.copy()), "copy", __name__)
test_eq(register_task(toy), toy)
test_eq(get_task("toy_copy"), toy)
test_fail(lambda: register_task(LengthTask("toy_copy", 4, 1, toy.make)), contains="already registered")
test_fail(lambda: register_task(LengthTask("bad name", 4, 1, toy.make)), contains="identifier")
test_fail(lambda: get_task("nope"), contains="unknown task 'nope'; choose one of")
test_fail(lambda: get_task("no_such_module:x"), contains="cannot load task")
test_fail(lambda: toy.sample(np.random.default_rng(0), 2, 0), contains="at least 1 tokens")
x, y = toy.sample(np.random.default_rng(0), 3, 5)
test_eq(x.shape, (3, 5)); test_eq(x, y)
del _TASKS["toy_copy"]


# %% [markdown]
# ## Multi-query multi-token associative recall (MQMTAR)
#
# The anchor's hardest task, laid out as its generator lays it out. Key–value pairs, keys and values two symbols each,
# are written as `k₁ k₂ : v₁ v₂`, each pair at a random offset inside its own slot of spaces; then come four queries
# `? k₁ k₂`; the target is the four queried values, in order (8 tokens). The number of pairs grows with the length,
# $\lfloor 0.8\,L'/6 \rfloor$ for a prefix of $L'$ tokens, so a longer input holds more facts, not just more space.
# The keys of one example are distinct and so are its values; the queries are drawn with replacement. Differences from
# the anchor's generator, declared: an alphabet of 32 symbols instead of 256 (smaller models here; with two-symbol keys
# that is still 1,024 distinct keys, enough for the 544 pairs at 4,096 tokens); a length counts the whole input, the 12
# query tokens included (the anchor counts the prefix only); the target leaves out the `?` the anchor repeats before each
# answer (a constant token, predicted for free).

# %%
#| export
MQMTAR_ALPHABET, MQMTAR_QUERIES = 32, 4
_SPACE, _KV, _Q = FIRST_SYMBOL, FIRST_SYMBOL + 1, FIRST_SYMBOL + 2      # filler, key-value separator, query marker
_A0 = FIRST_SYMBOL + 3                                                   # the alphabet's first symbol

def mqmtar_pairs(length: int) -> int:
    "Key-value pairs in an MQMTAR input of `length` tokens (the last 12 are the four queries)."
    return int(0.8 * (length - 3 * MQMTAR_QUERIES) // 6)

def make_mqmtar(rng, n, length):
    "MQMTAR inputs `[n, length]` (pairs `k1 k2 : v1 v2` in slots of spaces, then 4 queries `? k1 k2`) and targets `[n, 8]`."
    P, Q = mqmtar_pairs(length), MQMTAR_QUERIES
    prefix = length - 3 * Q
    slot = prefix // P                                                          # >= 7 tokens per pair
    draw = lambda: np.stack([rng.choice(MQMTAR_ALPHABET ** 2, P, replace=False) for _ in range(n)])   # (n, P) distinct
    as_symbols = lambda c: _A0 + np.stack([c // MQMTAR_ALPHABET, c % MQMTAR_ALPHABET], -1)          # (n, P, 2)
    keys, values = as_symbols(draw()), as_symbols(draw())
    x = np.full((n, length), _SPACE)
    starts = slot * np.arange(P) + rng.integers(0, slot - 5 + 1, (n, P))        # (n, P) where each pair begins
    rows = np.arange(n)[:, None]
    for j, part in enumerate((keys[..., 0], keys[..., 1], np.full((n, P), _KV), values[..., 0], values[..., 1])):
        x[rows, starts + j] = part
    asked = rng.integers(0, P, (n, Q))                                          # (n, Q) queried pairs, with replacement
    queried = np.take_along_axis(keys, asked[..., None], 1)                    # (n, Q, 2)
    x[:, prefix:] = np.concatenate([np.full((n, Q, 1), _Q), queried], -1).reshape(n, 3 * Q)
    return x, np.take_along_axis(values, asked[..., None], 1).reshape(n, 2 * Q)

mqmtar = register_task(LengthTask("mqmtar", 3 + MQMTAR_ALPHABET, 3 * MQMTAR_QUERIES + 8, make_mqmtar,
                                  "multi-query multi-token associative recall: 2-token keys and values, 4 queries", __name__))


# %% [markdown]
# A brute-force reader checks the generator: it scans each input for `k₁ k₂ : v₁ v₂` and answers the queries from what
# it found.

# %%
def read_mqmtar(x):
    "Answer an MQMTAR input by scanning it: the values of its four queried keys (8 ids)."
    x = list(x)
    found = {(x[i - 2], x[i - 1]): (x[i + 1], x[i + 2]) for i in range(len(x) - 12) if x[i] == _KV}
    assert len(found) == mqmtar_pairs(len(x)) and all(x[-12 + 3 * q] == _Q for q in range(4))
    return [v for q in range(4) for v in found[(x[-11 + 3 * q], x[-10 + 3 * q])]]

rng = np.random.default_rng(0)
for L in (20, 32, 64, 200, 1024):
    x, y = mqmtar.sample(rng, 20, L)
    test_eq(x.shape, (20, L)); test_eq(y.shape, (20, 8))
    for xi, yi in zip(x, y): test_eq(read_mqmtar(xi), yi.tolist())
test_eq([mqmtar_pairs(L) for L in (32, 64, 1024, 4096)], [2, 6, 134, 544])
test_fail(lambda: mqmtar.sample(rng, 1, 19), contains="at least 20")


# %% [markdown]
# ## Flip-flop
#
# Liu et al. (2023, *Exposing Attention Glitches with Flip-Flop Language Modeling*): a tape of instructions, each an
# opcode and a bit — *write b*, *ignore b* — and a final *read*; the answer is the bit of the **last write**. Ignores are
# the distractors that must be skipped however many there are. As in that paper's sparse setting, an instruction after
# the first (always a write) is a write with probability 0.1 and an ignore otherwise, so the last write lies on average
# about ten instructions back at any length. The input is `w b i b … r` (an odd length: pairs and the read), the target
# one bit.

# %%
#| export
FLIP_FLOP_P_WRITE = 0.1
_W, _I, _R, _B0 = FIRST_SYMBOL, FIRST_SYMBOL + 1, FIRST_SYMBOL + 2, FIRST_SYMBOL + 3    # write, ignore, read, bit 0 (bit 1 = +1)

def make_flip_flop(rng, n, length):
    "Flip-flop inputs `[n, length]` (`length` odd: instruction-bit pairs, then read) and targets `[n, 1]` (the last written bit)."
    if length % 2 == 0: length_pairs = (length - 1) // 2; pad_front = 1                 # even: one leading ignore-free pad
    else: length_pairs, pad_front = (length - 1) // 2, 0
    ops = np.where(rng.random((n, length_pairs)) < FLIP_FLOP_P_WRITE, _W, _I)
    ops[:, 0] = _W
    bits = rng.integers(0, 2, (n, length_pairs))
    tape = np.stack([ops, _B0 + bits], -1).reshape(n, 2 * length_pairs)
    last_write = (length_pairs - 1) - np.argmax((ops == _W)[:, ::-1], 1)       # index of each tape's last write
    x = np.concatenate([np.full((n, pad_front), _I), tape, np.full((n, 1), _R)], 1) if pad_front else \
        np.concatenate([tape, np.full((n, 1), _R)], 1)
    return x, (_B0 + bits[np.arange(n), last_write])[:, None]

# %% [markdown]
# An even length cannot hold whole pairs and a read; rather than refuse it, the input then starts with one bare *ignore*
# opcode (no bit), which changes no answer. The brute-force check replays the tape.

# %%
#| export
flip_flop = register_task(LengthTask("flip_flop", 5, 3, make_flip_flop,
                                     "flip-flop: write/ignore instructions with a bit, a final read; the target is the last written bit", __name__))

# %%
def replay_flip_flop(x):
    "The bit a machine reading the tape `x` returns at its final read."
    state, i = None, (1 if len(x) % 2 == 0 else 0)
    while i < len(x) - 1:
        if x[i] == _W: state = x[i + 1]
        i += 2
    assert x[-1] == _R
    return state

for L in (3, 4, 33, 64, 1025):
    x, y = flip_flop.sample(rng, 40, L)
    test_eq(x.shape, (40, L))
    test_eq([replay_flip_flop(xi) for xi in x], y[:, 0].tolist())
x, _ = flip_flop.sample(np.random.default_rng(1), 2000, 65)
p_write = ((x[:, 2:-1:2] == _W).mean())
assert abs(p_write - FLIP_FLOP_P_WRITE) < 0.01, p_write


# %% [markdown]
# ## Reverse and sort
#
# Two tasks where the anchor reports its widest gaps between softmax and entmax: the target is the input reversed, or
# sorted ascending. Symbols come from an alphabet of 32, the anchor's vocabulary. The target is as long as the input,
# so a test at 16× asks for 1,024 tokens, all of them right.

# %%
#| export
SEQUENCE_ALPHABET = 32

def make_reverse(rng, n, length):
    "Random inputs `[n, length]` and their reversals."
    x = FIRST_SYMBOL + rng.integers(0, SEQUENCE_ALPHABET, (n, length))
    return x, x[:, ::-1].copy()

def make_sort(rng, n, length):
    "Random inputs `[n, length]` and the same symbols sorted ascending."
    x = FIRST_SYMBOL + rng.integers(0, SEQUENCE_ALPHABET, (n, length))
    return x, np.sort(x, 1)

reverse = register_task(LengthTask("reverse", SEQUENCE_ALPHABET, 1, make_reverse, "reverse the input", __name__))
sort = register_task(LengthTask("sort", SEQUENCE_ALPHABET, 1, make_sort, "sort the input ascending", __name__))

# %%
x, y = reverse.sample(rng, 5, 9)
test_eq(y, [list(reversed(r)) for r in x.tolist()])
x, y = sort.sample(rng, 5, 9)
test_eq(y, [sorted(r) for r in x.tolist()])
test_eq(registered_tasks()[:4], ["mqmtar", "flip_flop", "reverse", "sort"])


# %% [markdown]
# ## From examples to model sequences
#
# The model reads `input SEP target` and predicts every next token; the loss and the exact match look only at the
# positions whose next token is a target token. `pack` lays a batch out that way: tokens `[n, L + 1 + K - 1]` (the last
# target token is never an input), labels of the same shape with `-100` where no loss is taken (PyTorch's
# `ignore_index`).

# %%
#| export
IGNORE = -100

def pack(x, y):
    "Model inputs `[n, L + K]` (`x`, SEP, `y` without its last token) and labels `[n, L + K]` (-100 but on the targets)."
    n, L = x.shape
    seq = np.concatenate([x, np.full((n, 1), SEP), y], 1)                 # (n, L + 1 + K)
    labels = np.full_like(seq, IGNORE)
    labels[:, L + 1:] = seq[:, L + 1:]
    return seq[:, :-1], labels[:, 1:]

# %%
inputs, labels = pack(np.array([[2, 3, 4]]), np.array([[4, 3, 2]]))
test_eq(inputs.tolist(), [[2, 3, 4, SEP, 4, 3]])
test_eq(labels.tolist(), [[IGNORE, IGNORE, 4, 3, 2][:0] + [IGNORE, IGNORE, IGNORE, 4, 3, 2]])
