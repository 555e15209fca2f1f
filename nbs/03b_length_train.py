# %% [markdown]
# # Training short, testing long
#
# > One run of the length study: train the causal decoder on a task at 32–64 tokens, validate at those lengths only, and test the chosen checkpoint at many times the training length.

# %%
#| default_exp length_train

# %% [markdown]
# A run trains one normalizer on one task from one seed, and keeps what a fair comparison needs:
#
# * **a validation curve at the training lengths only.** Every `eval_every` steps the model's exact-match accuracy on a
#   fixed validation set (inputs of every length from 32 to 64, drawn from the run's seed) is recorded, and the weights
#   are kept. The recipe — the learning rate and the number of steps — is chosen on this curve, never on a test length.
# * **test sets shared by every run.** The test inputs of a length are drawn from that length alone (not from the run's
#   seed), so every normalizer and every seed answers the same sequences: the comparison is paired.
#
# The training stream is a fresh batch per step, drawn from the seed and the step number, so a run killed at any moment
# resumes from its last checkpoint and continues the same stream. Each batch has one input length, drawn uniformly from
# 32–64 (no padding; the anchor draws a length per sequence and pads).
#
# The optimiser is the anchor's: AdamW with β = (0.9, 0.99), no weight decay, gradients clipped at norm 1.0. Its
# schedule is a linear warm-up followed by an **inverse square-root decay**, $\eta_t = \eta \min(t / w, \sqrt{w / t})$
# (Vaswani et al., 2017), rather than the anchor's cosine decay to the end of the run: a cosine schedule depends on the
# run's length, so a checkpoint half-way through a run is not what a run of half the length would give, and the number
# of steps could not be chosen from one curve. Under a schedule that ignores the run's length, the weights kept at step
# $k$ are those of a run of $k$ steps. A deviation, declared.

# %%
#| export
import json, math, time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from sparse_attention_repro.decoder import CausalDecoder, DecoderConfig, exact_match, match_and_loss
from sparse_attention_repro.files import atomic_write_bytes
from sparse_attention_repro.length_tasks import get_task, pack
from sparse_attention_repro.options import option

# %%
from fastcore.test import test_eq, test_close, test_fail
import tempfile

# %%
#| export
TEST_ENTROPY = 20261207           # test inputs: default_rng((TEST_ENTROPY, length)), the same for every run

_positive = lambda v: None if v >= 0 else "must be positive (or 0: the profile's)"

@dataclass
class LengthRunConfig:
    "One length-study run: the task, the normalizer, the model's shape, the recipe and the seed."
    task: str
    normalizer: str = "softmax"
    positions: str = "nape"          # nape | rope | none
    seed: int = 0
    lr: float = 1e-3
    steps: int = option(4000, "training steps of every run (the chosen step is at most this; 0: the profile's)", _positive, unset=0)
    eval_every: int = option(250, "validate at the training lengths, and keep the weights, every this many steps (0: the profile's)", _positive, unset=0)
    warmup: int = option(200, "linear warm-up steps, then inverse square-root decay (0: the profile's)", _positive, unset=0)
    batch_size: int = option(64, "sequences per training batch (0: the profile's)", _positive, unset=0)
    train_lengths: tuple = (32, 64)  # inputs drawn uniformly from this closed range
    val_per_length: int = 8          # validation inputs of each training length
    width: int = option(64, "model width (0: the profile's)", _positive, unset=0)
    layers: int = option(2, "decoder blocks (0: the profile's)", _positive, unset=0)
    heads: int = option(4, "attention heads, even under NAPE (0: the profile's)", _positive, unset=0)
    ffn: int = option(256, "MLP hidden width (0: the profile's)", _positive, unset=0)

    def decoder_config(self, vocab_size: int) -> DecoderConfig:
        return DecoderConfig(vocab_size, self.width, self.layers, self.heads, self.ffn, self.positions, self.normalizer)


# %% [markdown]
# ## Data of a run

# %%
#| export
def train_batch(task, cfg: LengthRunConfig, step: int):
    "The training batch of `step` (tokens, labels as int64 tensors): one length, drawn from the seed and the step alone."
    rng = np.random.default_rng((cfg.seed, 0, step))
    length = int(rng.integers(cfg.train_lengths[0], cfg.train_lengths[1] + 1))
    return tuple(torch.from_numpy(a) for a in pack(*task.sample(rng, cfg.batch_size, length)))

def validation_set(task, cfg: LengthRunConfig) -> list:
    "Batches (tokens, labels), one per training length, `val_per_length` inputs each, drawn from the seed (apart from training's stream)."
    rng = np.random.default_rng((cfg.seed, 1))
    lo, hi = cfg.train_lengths
    return [tuple(torch.from_numpy(a) for a in pack(*task.sample(rng, cfg.val_per_length, L))) for L in range(lo, hi + 1)]

def shared_test_set(task, length: int, n: int):
    "`n` test inputs of `length` tokens (tokens, labels): the same for every run, seed and normalizer."
    return tuple(torch.from_numpy(a) for a in pack(*task.sample(np.random.default_rng((TEST_ENTROPY, length)), n, length)))

# %%
task = get_task("reverse")
cfg = LengthRunConfig("reverse", batch_size=4)
a, b = train_batch(task, cfg, 7), train_batch(task, cfg, 7)
test_eq(a[0], b[0])                                              # a step's batch is fixed ...
assert not torch.equal(train_batch(task, cfg, 8)[0][:, :5], a[0][:, :5])   # ... and differs between steps
assert 32 <= (a[1][0] != -100).sum() <= 64
val = validation_set(task, cfg)
test_eq([int((l[0] != -100).sum()) for _, l in val], list(range(32, 65)))
t1, t2 = shared_test_set(task, 100, 3), shared_test_set(task, 100, 3)
test_eq(t1[0], t2[0]); test_eq(t1[0].shape, (3, 200))


# %% [markdown]
# ## Evaluation
#
# Exact match by teacher forcing (one forward pass; the decoder notebook shows it equals greedy decoding's), in batches
# small enough that a long test stays within memory, and from the same pass the cross-entropy per target token, which
# still orders checkpoints when exact match saturates (a small validation set of an easy task is often 100 % right at
# many steps). `evaluate` returns both, `accuracy` the fraction right.

# %%
#| export
@torch.no_grad()
def evaluate(model, batches, labelled_only: bool = False) -> tuple:
    "(exact-match accuracy, mean cross-entropy per target token) over (tokens, labels) batches (`labelled_only`: see `match_and_loss`)."
    model.eval()
    right = total = tokens_seen = 0
    loss = 0.0
    for tokens, labels in batches:
        m, l, k = match_and_loss(model, tokens, labels, labelled_only)
        right += int(m.sum()); total += len(tokens); loss += l; tokens_seen += k
    return right / total, loss / max(1, tokens_seen)

def accuracy(model, batches) -> float:
    "Exact-match accuracy over (tokens, labels) batches."
    return evaluate(model, batches)[0]

def chunks(tokens, labels, size: int):
    "(tokens, labels) cut into batches of at most `size` sequences."
    return [(tokens[i:i + size], labels[i:i + size]) for i in range(0, len(tokens), size)]

def eval_batch_size(length: int, budget_tokens: int = 16384) -> int:
    "Sequences per test batch: about `budget_tokens` tokens, at least 1."
    return max(1, budget_tokens // length)


# %% [markdown]
# ## One run
#
# `train_run` trains and validates, writing into `folder`: `curve.json` (one row per validation: step, validation
# accuracy, mean training loss since the last one, seconds), `weights/step_<n>.pt` at each validation, and `state.pt`
# (model, optimiser, step) to resume from. A non-finite loss ends the run with status `failed_nonfinite_loss`; the curve
# so far is kept. Everything is written atomically.

# %%
#| export
def lr_at(step: int, cfg: LengthRunConfig) -> float:
    "Linear warm-up over `warmup` steps, then inverse square-root decay: lr * min(t / w, sqrt(w / t)), t = step + 1."
    t, w = step + 1, max(1, cfg.warmup)
    return cfg.lr * min(t / w, math.sqrt(w / t))

def _save(obj, path: Path):
    "torch.save, atomically."
    atomic_write_bytes(path, lambda f: torch.save(obj, f))

def train_run(cfg: LengthRunConfig, folder, threads: int | None = 1, progress=None) -> dict:
    "Train (or resume) the run `cfg` in `folder`; returns its record: config, status, curve, seconds."
    folder = Path(folder); (folder / "weights").mkdir(parents=True, exist_ok=True)
    if threads: torch.set_num_threads(threads)
    task = get_task(cfg.task)
    torch.manual_seed(cfg.seed)
    model = CausalDecoder(cfg.decoder_config(task.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    record = dict(config=asdict(cfg), status="running", curve=[], train_seconds=0.0)
    step = 0
    if (folder / "state.pt").exists():
        state = torch.load(folder / "state.pt", weights_only=False)
        if (was := {k: v for k, v in state["record"]["config"].items() if k != "steps"}) != {k: v for k, v in asdict(cfg).items() if k != "steps"}:
            diff = ", ".join(f"{k}={was.get(k)!r} (now {v!r})" for k, v in asdict(cfg).items() if k != "steps" and was.get(k) != v)
            raise ValueError(f"{folder} holds a run made with {diff}; use another folder")
        model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); step, record = state["step"], state["record"]
    if record["status"] == "ok" and step < cfg.steps:                    # a finished run extended: it continues
        record = dict(record, status="running", config=asdict(cfg))
    if record["status"] != "running" or step >= cfg.steps: return record
    val = validation_set(task, cfg)
    losses, t0 = [], time.perf_counter()
    while step < cfg.steps:
        model.train()
        tokens, labels = train_batch(task, cfg, step)
        for g in opt.param_groups: g["lr"] = lr_at(step, cfg)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        if not torch.isfinite(loss):
            record["status"] = "failed_nonfinite_loss"; record["failed_at_step"] = step
            break
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); losses.append(loss.item()); step += 1
        if step % cfg.eval_every == 0 or step == cfg.steps:
            seconds = time.perf_counter() - t0
            acc, val_loss = evaluate(model, val)
            record["train_seconds"] += seconds
            record["curve"].append(dict(step=step, val_accuracy=acc, val_loss=val_loss, train_loss=float(np.mean(losses)),
                                        seconds=record["train_seconds"]))
            _save(model.state_dict(), folder / "weights" / f"step_{step}.pt")
            if step == cfg.steps: record["status"] = "ok"
            _save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step, record=record), folder / "state.pt")
            if progress: progress(record)
            losses, t0 = [], time.perf_counter()
    if record["status"] != "running":
        _save(dict(model=model.state_dict(), opt=opt.state_dict(), step=step, record=record), folder / "state.pt")
    atomic_write_bytes(folder / "curve.json", lambda f: f.write(json.dumps(record, indent=1).encode()))
    return record


# %%
c = LengthRunConfig("flip_flop", lr=1e-3, warmup=100)
test_close([lr_at(s, c) for s in (0, 49, 99, 399, 9999)], [1e-5, 5e-4, 1e-3, 5e-4, 1e-4], eps=1e-12)

# %% [markdown]
# A run killed half-way and resumed ends bit for bit where an uninterrupted one does, and so does a finished run
# **extended** to more steps (the schedule does not depend on the run's length, so a run of 40 steps continued to 60 is
# a run of 60 steps): the protocol lengthens every arm's runs this way when a chosen step lands near the end of its run.

# %%
cfg = LengthRunConfig("flip_flop", steps=60, eval_every=20, warmup=10, batch_size=16, width=32, layers=1, heads=2, ffn=64, lr=3e-3)
cfg40 = LengthRunConfig(**{**asdict(cfg), "steps": 40})
with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    full = train_run(cfg, d / "full")
    test_eq([r["step"] for r in full["curve"]], [20, 40, 60]); test_eq(full["status"], "ok")
    train_run(cfg40, d / "killed")                                     # a 60-step run killed after keeping step 40 ...
    state = torch.load(d / "killed" / "state.pt", weights_only=False)
    state["record"]["status"] = "running"; state["record"]["config"]["steps"] = 60
    _save(state, d / "killed" / "state.pt")
    resumed = train_run(cfg, d / "killed")                              # ... and resumed
    train_run(cfg40, d / "extended")                                    # a finished 40-step run ...
    extended = train_run(cfg, d / "extended")                           # ... extended to 60
    for name, run in (("killed", resumed), ("extended", extended)):
        test_eq([r["val_accuracy"] for r in run["curve"]], [r["val_accuracy"] for r in full["curve"]])
        test_eq((run["status"], run["config"]["steps"]), ("ok", 60))
        w1, w2 = torch.load(d / "full" / "weights" / "step_60.pt"), torch.load(d / name / "weights" / "step_60.pt")
        assert all(torch.equal(w1[k], w2[k]) for k in w1)
    test_eq(train_run(cfg, d / "extended"), extended)                   # a finished run is not trained again


# %% [markdown]
# ## Testing at length
#
# The weights kept at a step are tested at each test length on the shared test inputs, in batches of about 16,384
# tokens: with query blocks of 256 the largest attention tensor of a batch then holds `batch × heads × 256 × T` scores,
# whatever the length (at T = 4,096, 4 × 4 × 256 × 4,108 floats, 67 MB), where one unblocked `[B, H, T, T]` tensor
# would take 1 GB. A test computes the last block only for the queries that are answered (`labelled_only`): at 4,096
# tokens and one answer token that halves a 2-block model's attention. Validation, which chooses the recipes, runs the
# plain forward pass, the same for every run.

# %%
#| export
def load_model(cfg: LengthRunConfig, folder, step: int):
    "The decoder of run `cfg` with the weights it kept at `step`."
    model = CausalDecoder(cfg.decoder_config(get_task(cfg.task).vocab_size))
    model.load_state_dict(torch.load(Path(folder) / "weights" / f"step_{step}.pt"))
    return model.eval()

def evaluate_lengths(cfg: LengthRunConfig, folder, step: int, lengths, n: int, threads: int | None = 1) -> list:
    "Rows (length, step, accuracy, n, seconds) of the weights kept at `step`, tested on `n` shared inputs per length."
    if threads: torch.set_num_threads(threads)
    task, model, rows = get_task(cfg.task), load_model(cfg, folder, step), []
    for length in lengths:
        t0 = time.perf_counter()
        tokens, labels = shared_test_set(task, length, n)
        acc, loss = evaluate(model, chunks(tokens, labels, eval_batch_size(tokens.shape[1])), labelled_only=True)
        rows.append(dict(length=length, step=step, accuracy=acc, loss=loss, n=n, seconds=time.perf_counter() - t0))
    return rows

def test_or_fail(cfg: LengthRunConfig, folder, record: dict, step: int, lengths, n: int, threads: int | None = 1) -> list:
    "`evaluate_lengths` at `step`, or, where the run diverged before it, rows that count every test input wrong."
    if record["status"].startswith("failed") and record.get("failed_at_step", 0) < step:
        return [dict(length=L, step=step, accuracy=0.0, loss=float("nan"), n=n, seconds=0.0) for L in lengths]
    return evaluate_lengths(cfg, folder, step, lengths, n, threads)

# %%
with tempfile.TemporaryDirectory() as d:
    cfg = LengthRunConfig("flip_flop", steps=40, eval_every=20, warmup=10, batch_size=16, width=32, layers=1, heads=2, ffn=64, lr=3e-3)
    train_run(cfg, d)
    rows = evaluate_lengths(cfg, d, 40, [33, 128], 24)
    test_eq([(r["length"], r["n"]) for r in rows], [(33, 24), (128, 24)])
    assert all(0 <= r["accuracy"] <= 1 for r in rows)
    tokens, labels = shared_test_set(get_task("flip_flop"), 128, 24)           # the same reading by hand, one batch
    test_eq(rows[1]["accuracy"] * 24, int(exact_match(load_model(cfg, d, 40), tokens, labels).sum()))


# %% [markdown]
# ## A run's rows
#
# One schema for everything a run reports: a row per validation (`split` = validation, at the training lengths, so no
# single `length`) and a row per tested length (`split` = test), each with its exact match and its cross-entropy per
# target token (`loss`). The run's identity — task, normalizer, positions, rate, seed and run length — is on every row;
# `status` says whether the run finished (`ok`) or diverged (`failed_nonfinite_loss`): a diverged run's curve is kept up
# to the step it failed at and scores 0 at every later kept step, and a test at a step it never reached counts every
# input wrong (`test_or_fail`), so that a seed that diverges is counted, not dropped.

# %%
#| export
RUN_KEYS = ("task", "normalizer", "positions", "lr", "seed", "steps")
ROW_COLUMNS = RUN_KEYS + ("split", "step", "length", "accuracy", "loss", "n", "train_loss", "seconds", "status")
ROW_KEYS = RUN_KEYS + ("split", "step", "length")

def run_rows(cfg: LengthRunConfig, record: dict, tested=()) -> list:
    "The rows (`ROW_COLUMNS`) of run `cfg`: its validation curve from `record`, then its `tested` rows."
    ident = {k: getattr(cfg, k) for k in RUN_KEYS}
    n_val = cfg.val_per_length * (cfg.train_lengths[1] - cfg.train_lengths[0] + 1)
    rows = [dict(ident, split="validation", step=r["step"], length=float("nan"), accuracy=r["val_accuracy"], loss=r["val_loss"], n=n_val,
                 train_loss=r["train_loss"], seconds=r["seconds"], status=record["status"]) for r in record["curve"]]
    if record["status"].startswith("failed"):                         # a diverged run scores 0 at every step it did not reach
        last = record["curve"][-1]["step"] if record["curve"] else 0
        rows += [dict(ident, split="validation", step=k, length=float("nan"), accuracy=0.0, loss=float("nan"), n=n_val,
                      train_loss=float("nan"), seconds=float("nan"), status=record["status"])
                 for k in range(last + cfg.eval_every, cfg.steps + 1, cfg.eval_every)]
    rows += [dict(ident, split="test", step=t["step"], length=t["length"], accuracy=t["accuracy"], loss=t["loss"], n=t["n"],
                  train_loss=float("nan"), seconds=t["seconds"], status=record["status"]) for t in tested]
    return [{c: r[c] for c in ROW_COLUMNS} for r in rows]

# %%
with tempfile.TemporaryDirectory() as d:
    cfg = LengthRunConfig("flip_flop", steps=20, eval_every=10, warmup=5, batch_size=8, width=16, layers=1, heads=2, ffn=32)
    rec = train_run(cfg, d)
    rows = run_rows(cfg, rec, evaluate_lengths(cfg, d, 20, [64], 8))
    test_eq([(r["split"], r["step"]) for r in rows], [("validation", 10), ("validation", 20), ("test", 20)])
    test_eq(list(rows[0]), list(ROW_COLUMNS)); test_eq(rows[0]["n"], 8 * 33); test_eq(rows[2]["length"], 64)
    assert rows[0]["loss"] > 0 and rows[2]["loss"] > 0
    failed = dict(rec, status="failed_nonfinite_loss", failed_at_step=13, curve=rec["curve"][:1])   # as if it diverged at step 13
    rows = run_rows(cfg, failed, test_or_fail(cfg, d, failed, 20, [64, 128], 8))
    test_eq([(r["split"], r["step"], r["accuracy"]) for r in rows][1:], [("validation", 20, 0.0), ("test", 20, 0.0), ("test", 20, 0.0)])
    test_fail(lambda: train_run(LengthRunConfig(**{**asdict(cfg), "width": 32}), d), contains="holds a run made with width=16 (now 32)")
