# %% [markdown]
# # Training study A
# > One run = one dataset, one normalizer, one seed, trained with the paper's protocol and evaluated once at the end.

# %%
#| default_exp train

# %% [markdown]
# The protocol (`protocol.ipynb`) fixes the recipe: AdamW (lr $10^{-3}$, weight decay $10^{-4}$), batch 96, gradient-norm clipping at 5,
# cross-entropy, no schedule (a modern warm-up + cosine schedule is an option, `schedule`, for the check of the
# headline labels under it), no early stopping, one evaluation on the test subset at the end. Per seed, every method
# sees the *same* train and test subsets and starts from the *same* initial weights (paired design): the seed fixes
# the subsets (`load_dataset`), the initialisation and the data order.
#
# Run sizes per dataset are the paper's; a **profile** scales them: `smoke` (a few hundred examples, 1 epoch, 2 seeds —
# for CI), `quick` (the paper's sizes and epochs, 3 seeds), `paper` (exactly the protocol, seeds 0–9).

# %%
#| export
import hashlib, json, math, shutil, time
from pathlib import Path
from dataclasses import dataclass, replace
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from sparse_attention_repro.data import load_dataset, get_dataset, DataOptions, resolve_device, autocast, PAPER_SIZES, MAIN_FAMILY, TEXT_VOCAB, MARKER_DESIGNS, PRECISIONS
from sparse_attention_repro.data import full_arrays, news_words, subset_indices, TEST_SEED_OFFSET
from sparse_attention_repro.model import CompactClassifier, ClassifierConfig, MaskTape, StackedClassifiers, count_parameters, DROPOUT_RNGS, ATTENTION_PATHS
from sparse_attention_repro.normalizers import resolve_normalizer
from sparse_attention_repro.runner import save_rows
from sparse_attention_repro.files import atomic_write
from sparse_attention_repro.options import option, option_defaults, config_from_options, run_options

# %%
from fastcore.test import test_eq, test_close, test_fail
from sparse_attention_repro.options import check_options


# %% [markdown]
# **One schema.** `TrainConfig` is the single description of a study A run's options. A field declared with
# `options.option(...)` is also a command-line option of `grid` (`val_fraction` is `--val-fraction`), an entry of the
# results folder's manifest, and part of the `options` the experiment notebook passes back here — so a new option is one
# field with its help text and, where needed, its check (see `options`).

# %%
#| export
SCHEDULES = ("constant", "warmup_cosine")   # learning-rate schedules; the protocol's is constant
WARMUP_SHARE = 0.05                         # warmup_cosine: the share of the run's steps spent warming up

@dataclass
class TrainConfig:
    "Everything a study A run depends on besides dataset, method and seed (defaults: the paper's main family)."
    epochs: int = option(6, "training epochs (0 = each dataset's paper epochs)", lambda v: None if v >= 0 else "must be >= 1 (or 0 for the paper's)", unset=0)
    train_limit: int = 8000
    test_limit: int = 2000
    batch_size: int = 96
    lr: float = option(1e-3, "AdamW learning rate (0 = the protocol's 1e-3)", lambda v: None if 0 <= v < 1 else "must be in (0, 1) (or 0 for the protocol's)", unset=0.0)
    weight_decay: float = 1e-4
    grad_clip: float = 5.0
    val_fraction: float = option(0.0, "carve a validation split off each train subset (leakage-free selection)",
                                 lambda v: None if 0 <= v < 1 else "must be in [0, 1)")
    mask_padding: bool = option(False, "variant: mask twenty_news padding (the paper does not)")
    patch_size: int | None = option(None, "variant: 4 for 4x4 patches (0 = the paper's 7x7 / 8x8)", lambda v: None if v >= 0 else "must be >= 0", unset=0)
    marker_vocab: int = option(TEXT_VOCAB, "variant: small vocabulary for a learnable marker task", lambda v: None if v >= 12 else "must be >= 12")
    marker_design: str = option("random", "random (the paper's ids) | balanced (label tokens only, balanced counts) | label_once (the label token once, after the marker, among fillers)",
                                choices=MARKER_DESIGNS)
    jpeg_quality: int = option(0, "variant: pass image datasets through a JPEG codec at this quality (0 = off)",
                               lambda v: None if 0 <= v <= 100 else "must be in 1..100 (0 = off)")
    learned_pad_row: bool = option(False, "variant: learn the padding embedding (the original keeps it zero and frozen)")
    dropout_rng: str = option("torch", "torch (nn.Dropout's masks, the default) | philox (faster counter-based masks)", choices=DROPOUT_RNGS)
    precision: str = option("fp32", "fp32 (default) | bf16 (autocast: for CPUs with bf16 units and GPUs)", choices=PRECISIONS)
    attention: str = option("torch", "torch (default) | fused (scores, normalizer and weighted values of each head in one C kernel, CPU only; float32 rounding differs) | fused_block (that, and each block's residual, dropout, LayerNorm and GELU in C kernels)",
                            choices=ATTENTION_PATHS)
    epoch_eval: bool = option(False, "evaluate validation and test after every epoch (learning curves; training unchanged)")
    schedule: str = option("constant", "constant (the protocol's learning rate throughout) | warmup_cosine (linear warm-up over the "
                           "first 5% of the run's steps, then cosine decay to zero at its end)", choices=SCHEDULES)
    download: bool = False           # fetch the dataset online when no offline copy is found (the source is recorded per row)
    device: str = "auto"             # auto (CUDA when available) | cpu | cuda; recorded per row
    progress: bool = True            # tqdm bar

PROFILES = {"smoke": dict(seeds=(0, 1), epochs=1, train_limit=256, test_limit=128),
            "quick": dict(seeds=(0, 1, 2)),
            "paper": dict(seeds=tuple(range(10)))}

def profile_config(profile: str, dataset: str, **overrides) -> TrainConfig:
    "The TrainConfig of `dataset` under `profile` (smoke / quick / paper), with `overrides` applied."
    if profile not in PROFILES: raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    epochs, train_limit, test_limit = get_dataset(dataset).paper_sizes     # a registered name or an entry point (one-line error)
    cfg = TrainConfig(epochs=epochs, train_limit=train_limit, test_limit=test_limit)
    scale = {k: v for k, v in PROFILES[profile].items() if k != "seeds"}
    return replace(cfg, **{**scale, **overrides})


# %%
test_eq(profile_config("paper", "kmnist").epochs, 8)
test_eq((profile_config("paper", "twenty_news").train_limit, profile_config("paper", "twenty_news").test_limit), (4000, 1500))
test_eq(profile_config("smoke", "cifar10").epochs, 1)
test_eq(profile_config("quick", "cifar10", val_fraction=0.1).val_fraction, 0.1)
test_fail(lambda: profile_config("fast", "cifar10"), contains="unknown profile")

# the options: one field each, with the command line's defaults, checks and "unset" values
test_eq(option_defaults(TrainConfig), dict(epochs=0, lr=0.0, val_fraction=0.0, mask_padding=False, patch_size=0, marker_vocab=20000,
                                marker_design="random", jpeg_quality=0, learned_pad_row=False, dropout_rng="torch",
                                precision="fp32", attention="torch", epoch_eval=False, schedule="constant"))
test_eq(config_from_options(TrainConfig, dict(lr=0.0, epochs=12, patch_size=0, mask_padding=True)), dict(epochs=12, mask_padding=True))
test_eq(profile_config("paper", "kmnist", **config_from_options(TrainConfig, option_defaults(TrainConfig))), profile_config("paper", "kmnist"))
for bad, msg in [(dict(lr=2.0), "--lr must be in (0, 1)"), (dict(precision="fp16"), "unknown --precision 'fp16'; choose one of fp32, bf16"),
                 (dict(schedule="cosine"), "unknown --schedule 'cosine'; choose one of constant, warmup_cosine"),
                 (dict(jpeg_quality=101), "--jpeg-quality must be in 1..100"), (dict(batch=3), "unknown option 'batch'")]:
    test_fail(lambda: check_options(TrainConfig, bad), contains=msg)


# %% [markdown]
# ## Evaluation
#
# Accuracy, macro-F1, mean cross-entropy and the attention density (`nonzero_ratio`: fraction of weights $> 10^{-7}$,
# averaged over layers and test batches) from one pass over a split; inference time is that pass's wall time.

# %%
#| export
def macro_f1(y: np.ndarray, pred: np.ndarray) -> float:
    "F1 averaged over the classes present in `y` or `pred` (scikit-learn's `f1_score(average='macro', zero_division=0)`)."
    labels = np.union1d(y, pred)
    k = int(labels.max()) + 1
    tp = np.bincount(y[y == pred], minlength=k)[labels].astype(np.float64)
    support = (np.bincount(y, minlength=k) + np.bincount(pred, minlength=k))[labels]     # 2 tp + fp + fn, never 0
    return float(np.mean(2 * tp / support))

# %% [markdown]
# Checked against scikit-learn (imported here only: it costs every training process over a second) on random
# predictions, including classes that never occur and ones only predicted:

# %%
from sklearn.metrics import f1_score
_rng = np.random.default_rng(0)
for _ in range(300):
    n, k = int(_rng.integers(1, 400)), int(_rng.integers(2, 12))
    y_ = _rng.integers(0, k, n); p_ = np.where(_rng.random(n) < _rng.random(), y_, _rng.integers(0, k, n))
    test_eq(macro_f1(y_, p_), float(f1_score(y_, p_, average="macro", zero_division=0)))
test_eq(macro_f1(np.array([0, 0, 1]), np.array([0, 0, 2])), (1 + 0 + 0) / 3)            # class 2 only predicted, class 1 only true

# %% [markdown]
# The learning curves (`epoch_eval`) evaluate validation and test after every epoch, so that pass costs: on 20 Newsgroups
# (T = 97) it took about a third of each epoch's time, pass included. Two things make it cheaper without changing a bit of what it reports. The
# curves keep only accuracy and loss, so they skip recording the density and the padding mass. And they run the forward
# in batches whose attention weights (one layer's `[B, H, T, T]`) fit in a few MiB of cache (`curve_batch`): a batch of
# 500 documents holds 75 MB of weights per layer, which streams through memory. On the CPU each example's logits came
# out the same bits at the batches used here (tested below, on image patches and token ids, the three attention paths
# and bf16), and the loss is still summed over the same chunks of `EVAL_BATCH`, so accuracy and loss equal the recorded
# pass exactly. A chunk of very few rows can round differently (the classifier's head is a product of as many rows as
# examples, and a BLAS may take another path for a handful), so a tail of fewer than `CURVE_MIN` examples joins the chunk
# before it. At T = 17 the rule keeps 500. A GPU keeps 500 too: its matrix products may pick other kernels at other sizes, and a cache rule
# is a CPU's.

# %%
#| export
EVAL_BATCH = 500              # evaluation's sums (loss, density, padding mass) run over chunks of this many examples
CURVE_BYTES = 8 * 2 ** 20     # the learning curves' forward batch: one layer's attention weights within this many bytes
CURVE_MIN = 32                # ... and no chunk of fewer examples (a matrix product of a few rows may round differently)

def curve_batch(model) -> int:
    """Forward batch of the learning curves' pass: on the CPU, the examples whose attention weights `[B, H, T, T]` fit in
    `CURVE_BYTES`, `CURVE_MIN` to `EVAL_BATCH`; `EVAL_BATCH` on other devices and for models without a `cfg`."""
    cfg = getattr(model, "cfg", None)
    if cfg is None or next(model.parameters()).device.type != "cpu": return EVAL_BATCH
    per_example = cfg.num_heads * (cfg.seq_len + 1) ** 2 * 4                 # float32 weights of one example, CLS included
    return int(min(EVAL_BATCH, max(CURVE_MIN, CURVE_BYTES // per_example)))

@torch.no_grad()
def evaluate(model, split, batch_size=EVAL_BATCH, precision="fp32", record=True):
    """Accuracy, macro-F1, loss, nonzero_ratio and seconds of one pass of `model` over `split`. Without `record` (the learning
    curves) no density or padding mass is kept (NaN, None) and the forward runs `curve_batch` examples at a time; accuracy and
    loss are the same bits either way (tested on the CPU; other devices keep `batch_size`)."""
    model.eval(); model.set_recording(record)
    device = next(model.parameters()).device
    split = split.to(device)
    t0 = time.perf_counter()
    n = len(split.y)
    step = batch_size if record else min(batch_size, curve_batch(model))
    starts = list(range(0, n, step))
    if not record and len(starts) > 1 and n - starts[-1] < CURVE_MIN: starts.pop()   # a short tail joins the chunk before it
    chunks, density = [], torch.zeros((), dtype=torch.float64, device=device)
    pad_mass = None                                                         # token ids: per layer, (CLS, real queries) on padding
    for i, j in zip(starts, starts[1:] + [n]):
        xb, mb = split.x[i:j], None if split.key_mask is None else split.key_mask[i:j]
        with autocast(device, precision): chunks.append(model(xb, mb).float())
        if not record: continue
        density += torch.stack(model.densities()).double().mean() * len(xb)
        if (pm := model.pad_masses())[0] is not None:
            batch = torch.tensor([[float(c), float(t)] for c, t in pm], dtype=torch.float64) * len(xb)
            pad_mass = batch if pad_mass is None else pad_mass + batch
    logits = torch.cat(chunks)
    loss = sum(F.cross_entropy(logits[i:i + batch_size], split.y[i:i + batch_size], reduction="sum").double()
               for i in range(0, n, batch_size))
    pred = logits.argmax(-1).cpu().numpy()                                # (waits for the device: part of the time)
    seconds = time.perf_counter() - t0
    model.set_recording(False)
    y = split.y.cpu().numpy()
    return dict(accuracy=float((pred == y).mean()), macro_f1=macro_f1(y, pred), loss=float(loss) / n,
                nonzero_ratio=float(density) / n if record else float("nan"), seconds=seconds,
                pad_attention=None if pad_mass is None else [dict(cls=round(float(c) / n, 6), tokens=round(float(t) / n, 6)) for c, t in pad_mass])


# %% [markdown]
# ## Training, one method or several in lock-step
#
# `train_lockstep` trains a list of models that share a seed but not their normalizer. Every step draws one batch from
# the seed's order and, through a `MaskTape`, one set of dropout masks; each model then takes its own forward, backward,
# clipping and AdamW step on that batch with those masks. A model therefore sees exactly what it would see trained alone
# — the same batches, the same masks, the same arithmetic — so lock-step results are *bit-identical* to one-at-a-time
# results (tested below); only the drawing of the masks, about a third of a softmax run on this CPU, is shared.
# A list of one model is the plain, one-run-at-a-time path (`train_model`).
#
# (Stacking the models into one with a leading model axis and batched matmuls — `train_stacked`, below, the path for
# GPUs — does not pay on this 2-core CPU: seven methods' attention maps no longer fit in cache, and the matmuls of this
# model already run near the core's peak. Lock-step keeps each model's working set as small as a plain run's.)
#
# A non-finite training loss ends that model's training with `status="failed_nonfinite_loss"` instead of crashing the
# grid; it is checked once per epoch, so the hot loop has no host synchronisation. For the adaptive entmax the per-head
# $\alpha$ — whatever its spec declares as `learned` — is logged after every epoch (`learned_history`). Each model's `seconds` is its own compute time plus the time
# the shared masks took to draw — what the run would have cost alone, so time ratios between methods stay meaningful.

# %%
#| export
def _rounded(v):
    "Nested lists of `v` (a tensor or list) with every number rounded to 5 decimals."
    v = v.tolist() if torch.is_tensor(v) else v
    return [_rounded(x) for x in v] if isinstance(v, list) else round(float(v), 5)

def _learned_snapshot(learned: dict, epoch):
    "One model's recorded normalizer parameters (name -> per-layer tensors) after `epoch`, as logged; None when it has none."
    return {"epoch": epoch, **{k: _rounded(layers) for k, layers in learned.items()}} if learned else None

@dataclass
class TrainResult:
    "Outcome of training one model."
    status: str                 # "ok" or "failed_nonfinite_loss"
    learned_history: list       # per epoch, the normalizer parameters its spec records (e.g. alpha), else []
    seconds: float              # own compute + drawing the dropout masks
    losses: torch.Tensor        # training loss of every step
    epoch_metrics: list = None  # with a `monitor`: its metrics after every epoch, e.g. [{"epoch": 1, "val_accuracy": ...}, ...]
    mask_seconds: float = 0.0   # the part of `seconds` spent drawing dropout masks shared by the lock-step group (drawn once for all)

def lr_at(cfg: TrainConfig, step: int, steps: int) -> float:
    """The learning rate of step `step` (from 0) of a run of `steps` steps: `cfg.lr` throughout (constant), or a linear
    warm-up over the first `WARMUP_SHARE` of the steps and a cosine decay from `cfg.lr` to zero at step `steps` (warmup_cosine)."""
    if cfg.schedule == "constant": return cfg.lr
    warm = max(1, round(WARMUP_SHARE * steps))
    if step < warm: return cfg.lr * step / warm
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

def _set_lr(opt, lr: float):
    for g in opt.param_groups: g["lr"] = lr

# %% [markdown]
# The warm-up and cosine decay are those of `transformers.get_cosine_schedule_with_warmup` (the step-0 rate is zero,
# as there), checked here against it on a real optimizer, step by step:

# %%
from transformers import get_cosine_schedule_with_warmup
_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=3e-3)
_sched = get_cosine_schedule_with_warmup(_opt, num_warmup_steps=round(WARMUP_SHARE * 430), num_training_steps=430)
_ref = []
for _ in range(430): _ref.append(_opt.param_groups[0]["lr"]); _opt.step(); _sched.step()
_c = TrainConfig(lr=3e-3, schedule="warmup_cosine")
test_close([lr_at(_c, k, 430) for k in range(430)], _ref, eps=1e-15)
test_eq([lr_at(TrainConfig(lr=3e-3), k, 430) for k in (0, 429)], [3e-3, 3e-3])          # the protocol's: constant
test_eq(lr_at(TrainConfig(lr=1e-3, schedule="warmup_cosine"), 10, 20), 1e-3 * 0.5 * (1 + math.cos(math.pi * 9 / 19)))  # 1 warm-up step of 20

# %%
#| export
def _checkpoint_key(cfg: TrainConfig, seed: int, models, n: int) -> str:
    "What a checkpoint must match to be continued: every setting that changes training (not the progress bar), the seed, the models' shapes, the data size."
    settings = {k: v for k, v in vars(cfg).items() if k != "progress" and not (k == "schedule" and v == "constant")}   # keys of constant runs as before
    shapes = [[tuple(p.shape) for p in m.parameters()] for m in models]
    return json.dumps(dict(settings=settings, seed=seed, shapes=shapes, n=n), sort_keys=True, default=str)

def _where(device) -> dict:
    "What bit-for-bit continuation needs besides the key: the device kind and torch's CPU thread count."
    return dict(device=torch.device(device).type, threads=torch.get_num_threads())

def save_checkpoint(path, key, models, opts, gen, results, active, step, epoch):
    "Keep the whole training state after `epoch` in `path` (atomically): weights, optimizers, every random stream, results so far."
    device = next(models[0].parameters()).device
    state = dict(key=key, epoch=epoch, step=step, active=list(active), results=results, gen=gen.get_state(),
                 rng=torch.get_rng_state(), cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                 models=[m.state_dict() for m in models], opts=[o.state_dict() for o in opts],
                 names=[getattr(m.cfg.normalizer, "name", str(m.cfg.normalizer)) for m in models], **_where(device))
    atomic_write(path, lambda tmp: torch.save(state, tmp))

def state_subset(state, names):
    """The part of a lock-step group's `state` that trains `names` (in that order): their weights, optimizers and results,
    the group's shared random streams. Lock-step training equals training each method alone, so the part continues
    as a group of `names` would have; None when the state lacks one of them (or predates recorded names)."""
    have = state.get("names") or []
    if any(n not in have for n in names): return None
    idx = [have.index(n) for n in names]
    key = json.loads(state["key"]); key["shapes"] = [key["shapes"][i] for i in idx]
    return dict(state, key=json.dumps(key, sort_keys=True, default=str), names=list(names), active=[j for j, i in enumerate(idx) if i in state["active"]],
                results=[state["results"][i] for i in idx], models=[state["models"][i] for i in idx], opts=[state["opts"][i] for i in idx])

def _same_run_but_length(a: str, b: str) -> bool:
    """Whether two checkpoint keys differ at most in the number of epochs, under a constant learning rate (a shorter run
    is then the start of a longer one; under a schedule that ends with the run, it is not)."""
    a, b = json.loads(a), json.loads(b)
    if a["settings"].get("schedule", "constant") != "constant": return a == b
    for k in (a, b): k["settings"].pop("epochs", None)
    return a == b

def load_checkpoint(path, key, models, opts, gen, device):
    """Restore the state `save_checkpoint` kept in `path` into `models`, `opts`, `gen` and torch's generators; `(results, active, step, epoch)`,
    or None when there is none or it belongs to another run. A state of the same run stopped earlier, or of the same run
    with fewer epochs (its last), is continued; one with more epochs than `key`'s run is not."""
    if not Path(path).exists(): return None
    state = torch.load(path, map_location=device, weights_only=False)      # our own file, written by save_checkpoint
    if not (isinstance(state.get("key"), str) and _same_run_but_length(state["key"], key)): return None   # another configuration: start afresh
    if state["epoch"] > json.loads(key)["settings"]["epochs"]: return None                          # a longer run's: not this one's start
    if state.get("device", "cpu") != torch.device(device).type or state.get("threads", torch.get_num_threads()) != torch.get_num_threads():
        return None                                   # made on another device or thread count: the same bits are not assured
    for m, s in zip(models, state["models"]): m.load_state_dict(s)
    for o, s in zip(opts, state["opts"]): o.load_state_dict(s)
    gen.set_state(state["gen"]); torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available(): torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["results"], state["active"], state["step"], state["epoch"]

def _fresh_results(models, steps, device) -> list:
    "One `TrainResult` per model before its first step: ok, learned parameters at epoch 0, no time, `steps` NaN losses."
    return [TrainResult("ok", [s for s in [_learned_snapshot(m.learned(), 0)] if s], 0.0,
                        torch.full((steps,), float("nan"), device=device)) for m in models]

def train_lockstep(models, train, cfg: TrainConfig, seed: int, desc="", monitor=None, checkpoint=None) -> list:
    """Train `models` (same seed, one per normalizer) in place, step by step together; one `TrainResult` per model.
    `monitor(model) -> dict`, when given, is called on every model still training after each epoch (untimed).
    `checkpoint`, a file path: the state after every epoch is kept there, and a run that finds it continues after its epoch."""
    opts = [torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay) for m in models]
    gen, tape = torch.Generator().manual_seed(seed), MaskTape()
    n, bs = len(train.y), cfg.batch_size
    steps = cfg.epochs * -(-n // bs)
    device = train.y.device
    results = _fresh_results(models, steps, device)
    active, step, done = list(range(len(models))), 0, 0
    key = _checkpoint_key(cfg, seed, models, n)
    if checkpoint is not None and (state := load_checkpoint(checkpoint, key, models, opts, gen, device)) is not None:
        results, active, step, done = state
        for r in results:                                                    # a shorter run continued: room for the new steps
            if len(r.losses) < steps: r.losses = torch.cat([r.losses, torch.full((steps - len(r.losses),), float("nan"), device=device)])
    bar = tqdm(total=steps, initial=step, desc=desc, disable=not cfg.progress, mininterval=2, leave=False)
    try:
        for m in models: m.set_mask_tape(tape)
        for epoch in range(done + 1, cfg.epochs + 1):
            for m in models: m.train()
            order = torch.randperm(n, generator=gen).to(device)             # the seed's order, the same on every device
            for i in range(0, n, bs):
                idx = order[i:i + bs]
                xb, yb = train.x[idx], train.y[idx]
                mb = None if train.key_mask is None else train.key_mask[idx]
                tape.record(); tape.seconds = 0.0
                if cfg.schedule != "constant":
                    for j in active: _set_lr(opts[j], lr_at(cfg, step, steps))
                for pos, j in enumerate(active):
                    if pos: tape.replay()
                    t0 = time.perf_counter()
                    with autocast(device, cfg.precision): loss = F.cross_entropy(models[j](xb, mb).float(), yb)
                    opts[j].zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(models[j].parameters(), cfg.grad_clip)
                    opts[j].step()
                    results[j].losses[step] = loss.detach()
                    if device.type == "cuda": torch.cuda.synchronize()                # time the work, not its launch
                    results[j].seconds += time.perf_counter() - t0 - (0.0 if pos else tape.seconds)
                for j in active:                                             # each run pays for the masks it uses
                    results[j].seconds += tape.seconds; results[j].mask_seconds += tape.seconds
                step += 1; bar.update()
            for j in list(active):
                if not torch.isfinite(results[j].losses[step - (-(-n // bs)):step].sum()):
                    results[j].status = "failed_nonfinite_loss"; active.remove(j)
                else:
                    if (s := _learned_snapshot(models[j].learned(), epoch)): results[j].learned_history.append(s)
                    if monitor is not None: results[j].epoch_metrics = (results[j].epoch_metrics or []) + [dict(epoch=epoch, **monitor(models[j]))]
            if checkpoint is not None: save_checkpoint(checkpoint, key, models, opts, gen, results, active, step, epoch)
            if not active: break
    finally:
        for m in models: m.set_mask_tape(None)
        bar.close()
    return results

def train_model(model, train, cfg: TrainConfig, seed: int, desc="", monitor=None, checkpoint=None) -> TrainResult:
    "Train one `model` in place on `train` (the plain path)."
    return train_lockstep([model], train, cfg, seed, desc, monitor, checkpoint)[0]


# %% [markdown]
# ## Training a methods × seeds grid as one stacked model
#
# `train_stacked` trains `models` — every method of `methods` for every seed, ordered method by method — as one
# `model.StackedClassifiers`: each step takes one batch per seed from that seed's own order and data subset, stacks
# them, and runs one forward, backward, per-model clipping and one AdamW step for all models at once (AdamW is
# elementwise, so one optimizer over the stacked parameters is each model's own). Each seed's dropout masks come from a
# generator in the state the seed's plain run would find it (`dropout_generators`), so on the CPU every model is its
# plain run **bit for bit** (tested below). Each model's `seconds` is an equal share of the stack's wall time.
# A model whose loss turns non-finite is marked failed after its epoch; it stays in the stack (its slices cannot
# disturb the others) but is not evaluated. With `monitors` (one per seed, as `epoch_monitor` makes them) every model
# still training is evaluated after each epoch on its own seed's splits, untimed, as on the lock-step path: the
# learning curves of the tuned-recipe protocol, on the GPU's fast path.

# %%
#| export
def dropout_generators(seed: int, device) -> tuple:
    "The (CPU, device) generators a run of `seed` draws its dropout masks from; call right after building its model."
    cpu = torch.Generator(); cpu.set_state(torch.get_rng_state())          # seeded, then advanced by the initial weights
    device = torch.device(device)
    return cpu, (cpu if device.type == "cpu" else torch.Generator(device).manual_seed(seed))

def train_stacked(models, trains, cfg: TrainConfig, seeds, generators, desc="", monitors=None) -> list:
    "Train a methods x seeds grid of `models` in place as one stack (`trains`, `generators`, `monitors`: one per seed); one `TrainResult` per model."
    S, N = len(seeds), len(models)
    stack = StackedClassifiers(models, S)
    stack.generators = generators
    opt = torch.optim.AdamW(stack.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    orders_of = [torch.Generator().manual_seed(s) for s in seeds]
    n, bs, device = len(trains[0].y), cfg.batch_size, trains[0].y.device
    if any(len(t.y) != n for t in trains): raise ValueError("every seed's train subset must have the same size to stack them")
    per_epoch = -(-n // bs); steps = cfg.epochs * per_epoch
    results = _fresh_results(models, steps, device)
    losses, step, ends = torch.full((steps, N), float("nan"), device=device), 0, [steps] * N
    bar = tqdm(total=steps, desc=desc, disable=not cfg.progress, mininterval=2, leave=False)
    t0, untimed = time.perf_counter(), 0.0
    try:
        for epoch in range(1, cfg.epochs + 1):
            stack.train()
            orders = [torch.randperm(n, generator=g).to(device) for g in orders_of]
            for i in range(0, n, bs):
                idx = [o[i:i + bs] for o in orders]
                xb, yb = torch.stack([t.x[j] for t, j in zip(trains, idx)]), torch.stack([t.y[j] for t, j in zip(trains, idx)])
                mb = None if trains[0].key_mask is None else torch.stack([t.key_mask[j] for t, j in zip(trains, idx)])
                with autocast(device, cfg.precision): logits = stack(xb, mb).float()
                loss = stack.losses(logits, yb)                                 # each model's own mean
                if cfg.schedule != "constant": _set_lr(opt, lr_at(cfg, step, steps))
                opt.zero_grad(set_to_none=True)
                loss.sum().backward()
                stack.clip_grad_norms_(cfg.grad_clip)
                opt.step()
                losses[step] = loss.detach(); step += 1; bar.update()
            for k, r in enumerate(results):
                if r.status != "ok": continue
                if not torch.isfinite(losses[step - per_epoch:step, k].sum()): r.status, ends[k] = "failed_nonfinite_loss", step
                elif (a := _learned_snapshot(stack.model_learned(k), epoch)): r.learned_history.append(a)
            if monitors is not None:                                        # model k = method k // S on seed k % S
                if device.type == "cuda": torch.cuda.synchronize()            # the epoch's own work stays timed
                t1 = time.perf_counter(); stack.write_back(models)
                for k, r in enumerate(results):
                    if r.status == "ok": r.epoch_metrics = (r.epoch_metrics or []) + [dict(epoch=epoch, **monitors[k % S](models[k]))]
                untimed += time.perf_counter() - t1
            if all(r.status != "ok" for r in results): break
        if device.type == "cuda": torch.cuda.synchronize()
    finally:
        bar.close()
    seconds = time.perf_counter() - t0 - untimed
    stack.write_back(models)
    for k, r in enumerate(results):
        end = min(step, ends[k]); r.losses[:end], r.seconds = losses[:end, k], seconds / N     # a failed model's steps end with its epoch
    return results


# %% [markdown]
# ## Runs and their rows
#
# `run_methods` trains and evaluates every method of one (dataset, seed): all models are built from
# `torch.manual_seed(seed)` — the same initial weights, the paired design — and trained in lock-step (`lockstep=True`, the
# default) or one after the other. Each returns the metrics row of the protocol; `lockstep_size` records how many runs
# trained together (1 for a run alone; methods × seeds for a stack, `run_stacked`, whose `train_seconds` are each model's
# equal share of the stack's wall time). `run_one` is the single run.

# %%
#| export
def _new_model(data, method, seed, learned_pad_row=False, device="cpu", dropout_rng="torch", attention="torch"):
    torch.manual_seed(seed); np.random.seed(seed)                      # initial weights drawn on the CPU: the same everywhere
    return CompactClassifier(ClassifierConfig(num_classes=data.num_classes, seq_len=data.seq_len, input_dim=data.input_dim,
                                              vocab_size=data.vocab_size, normalizer=method, learned_pad_row=learned_pad_row,
                                              dropout_rng=dropout_rng, attention=attention)).to(device)

def _row(dataset, method, seed, config, data, model, result: TrainResult, lockstep_size) -> dict:
    "Evaluate a trained `model` and return its metrics row."
    row = dict(dataset=dataset, method=method, seed=seed, accuracy=np.nan, macro_f1=np.nan, test_loss=np.nan,
               nonzero_ratio=np.nan, learned_alpha_mean=np.nan, train_seconds=result.seconds, mask_seconds=result.mask_seconds,
               inference_seconds=np.nan,
               param_count=count_parameters(model), train_n=len(data.train.y), test_n=len(data.test.y),
               val_n=0 if data.val is None else len(data.val.y), val_accuracy=np.nan, val_macro_f1=np.nan,
               dataset_source=data.dataset_source, status=result.status, error="", lockstep_size=lockstep_size,
               device=str(next(model.parameters()).device.type), cpu_capability=torch.backends.cpu.get_cpu_capability(),
               torch_version=torch.__version__,
               learned_history=json.dumps(result.learned_history) if result.learned_history else "",
               epoch_metrics=json.dumps(result.epoch_metrics) if result.epoch_metrics else "",
               **{f.name: getattr(config, f.name) for f in run_options(TrainConfig)})          # every option (epochs, lr, variants)
    if result.status != "ok":
        row["error"] = "training loss became NaN/inf"
        return row
    m = evaluate(model, data.test, precision=config.precision)
    row.update(accuracy=m["accuracy"], macro_f1=m["macro_f1"], test_loss=m["loss"], nonzero_ratio=m["nonzero_ratio"],
               inference_seconds=m["seconds"], pad_attention=json.dumps(m["pad_attention"]) if m["pad_attention"] else "")
    if "alpha" in (learned := model.learned()): row["learned_alpha_mean"] = float(torch.stack(learned["alpha"]).mean())
    if data.val is not None:
        v = evaluate(model, data.val, precision=config.precision)
        row.update(val_accuracy=v["accuracy"], val_macro_f1=v["macro_f1"])
    return row

def load_run_data(dataset, seed, config):
    "The seed's subsets of `dataset` as `config` asks for them (sizes, validation split, variants, download)."
    return load_dataset(dataset, seed, config.train_limit, config.test_limit, data_options(config), val_fraction=config.val_fraction,
                        download=config.download)

def data_options(config) -> DataOptions:
    "The dataset variants a `TrainConfig` asks for."
    return DataOptions(patch_size=config.patch_size, mask_padding=config.mask_padding, marker_vocab=config.marker_vocab,
                       marker_design=config.marker_design, jpeg_quality=config.jpeg_quality)

def epoch_monitor(data, precision="fp32"):
    "The `monitor` of `TrainConfig.epoch_eval`: accuracy and loss on the validation (if any) and test splits."
    def monitor(model):
        out = {}
        for name, split in (("val", data.val), ("test", data.test)):
            if split is None: continue
            m = evaluate(model, split, precision=precision, record=False)
            out.update({f"{name}_accuracy": m["accuracy"], f"{name}_loss": m["loss"]})
        return out
    return monitor

def run_methods(dataset: str, methods, seed: int, config: TrainConfig, data=None, lockstep=True, return_models=False,
                checkpoint=None) -> list:
    """Train and evaluate every method of `methods` on one (dataset, seed); one metrics row per method (and the models, if asked).
    `checkpoint` (lock-step path): the file where training keeps its state after every epoch and continues from."""
    methods = [resolve_normalizer(m) for m in methods]                # fail early on an unknown method; specs from here on
    data = load_run_data(dataset, seed, config) if data is None else data
    if not lockstep:
        if return_models: raise ValueError("return_models needs the lock-step path")
        return [r for m in methods for r in run_methods(dataset, [m], seed, config, data)]
    device = resolve_device(config.device)
    models = [_new_model(data, m, seed, config.learned_pad_row, device, config.dropout_rng, config.attention) for m in methods]
    results = train_lockstep(models, data.train.to(device), config, seed, desc=f"{dataset}/seed{seed}/" + (methods[0].name if len(methods) == 1 else f"{len(methods)} methods"),
                             monitor=epoch_monitor(data, config.precision) if config.epoch_eval else None, checkpoint=checkpoint)
    rows = [_row(dataset, m.name, seed, config, data, model, r, len(methods)) for m, model, r in zip(methods, models, results)]
    return (rows, models) if return_models else rows

def run_stacked(dataset: str, methods, seeds, config: TrainConfig, datas=None) -> list:
    "Train every method on every seed as one stack (`train_stacked`, learning curves too) and evaluate each model; rows seed by seed."
    methods = [resolve_normalizer(m) for m in methods]
    datas = [load_run_data(dataset, s, config) for s in seeds] if datas is None else datas
    device = resolve_device(config.device)
    built, generators = {}, []
    for s, data in zip(seeds, datas):
        for m in methods: built[m, s] = _new_model(data, m, s, config.learned_pad_row, device, config.dropout_rng, config.attention)
        generators.append(dropout_generators(s, device))
    keys = [(m, s) for m in methods for s in seeds]
    monitors = [epoch_monitor(d, config.precision) for d in datas] if config.epoch_eval else None
    results = dict(zip(keys, train_stacked([built[k] for k in keys], [d.train.to(device) for d in datas], config, seeds,
                                           generators, desc=f"{dataset}/{len(seeds)} seeds x {len(methods)} methods", monitors=monitors)))
    return [_row(dataset, m.name, s, config, d, built[m, s], results[m, s], len(keys)) for s, d in zip(seeds, datas) for m in methods]

def run_one(dataset: str, method: str, seed: int, config: TrainConfig, data=None) -> dict:
    "Train and evaluate one (dataset, method, seed); returns the metrics row of the protocol."
    return run_methods(dataset, [method], seed, config, data)[0]


# %% [markdown]
# `run_study_a` is what the experiment notebook calls: the profile's configuration for one dataset and the requested
# methods on each seed — all methods of a seed on the same subsets (paired design), loaded once. With `stack=True` the
# seeds are trained together as one stacked model (the GPU path, `run_stacked`), otherwise seed after seed in lock-step
# (or one method at a time with `lockstep=False`). With `rows_dir` each row is written (atomically) to
# `rows_dir/seed<k>/<method>.csv` the moment its group is done, so a killed grid loses at most the runs in flight; the
# profile name goes on every row. `threads` pins torch's CPU threads when several runs share a machine.

# %%
#| export
def with_core_share(run) -> list:
    """`run()`'s rows, each with `core_share`: the CPU time this process used while it ran over its wall time — the
    cores it had (below 1 where other jobs shared them; up to its thread count). A notebook's wall time times its share
    is the core time it took, which a loaded machine's wall time overstates."""
    cpu, wall = time.process_time(), time.perf_counter()
    rows = run()
    share = (time.process_time() - cpu) / max(time.perf_counter() - wall, 1e-9)
    return [dict(r, core_share=round(share, 4)) for r in rows]

# %% [markdown]
# A process that waits has (almost) no core; every row gets the share:

# %%
_cs = with_core_share(lambda: (time.sleep(0.3), [dict(method="a"), dict(method="b")])[1])
test_eq([set(r) for r in _cs], [{"method", "core_share"}] * 2)
assert 0 <= _cs[0]["core_share"] < 0.2, _cs

# %%
#| export
def run_rows_path(rows_dir, seed, method) -> Path:
    "The rows file of one (seed, method) run in a grid's rows folder of a dataset: the one place that names it."
    return Path(rows_dir) / f"seed{seed}" / f"{method}.csv"

def run_study_a(dataset: str, seeds, methods, profile: str, threads: int = 0, rows_dir=None, lockstep=True, stack=False,
                keep_state=False, continue_from=None, **options) -> list:
    """Rows of every method in `methods` on each of `seeds` (an int or a list) under `profile`; `options` override TrainConfig fields.
    With `rows_dir`, each lock-step group keeps its training state after every epoch beside its rows (`resume-<group>.pt`,
    deleted once its rows are written), so a killed run continues from its last finished epoch, bit for bit.
    `keep_state`: keep the final state instead (`state-<group>.pt`); `continue_from`, the `rows_dir` of a shorter run of
    the same configuration made with `keep_state`: each group starts from its final state there (when it has one)."""
    seeds = [seeds] if isinstance(seeds, int) else list(seeds)
    if not seeds or any(s < 0 for s in seeds): raise ValueError(f"seeds must be one or more integers >= 0, got {seeds}")
    methods = [resolve_normalizer(m) for m in methods]               # the edge: names become registry entries once
    if threads: torch.set_num_threads(threads)
    run = {k: v for k, v in options.items() if k in option_defaults(TrainConfig)}      # the command-line options (0 = the profile's)
    config = profile_config(profile, dataset, **config_from_options(TrainConfig, run), **{k: v for k, v in options.items() if k not in run})
    rows = []
    def keep(done):
        done = [dict(r, profile=profile) for r in done]
        if rows_dir is not None:
            for r in done: save_rows([r], run_rows_path(rows_dir, r["seed"], r["method"]))
        rows.extend(done)
    if stack:
        if keep_state or continue_from: print("stacked seeds keep no training state: keep_state and continue_from do not apply")
        keep(with_core_share(lambda: run_stacked(dataset, list(methods), seeds, config)))
    else:
        for seed in seeds:
            data = load_run_data(dataset, seed, config)
            for group in ([list(methods)] if lockstep else [[m] for m in methods]):
                ckpt = None if rows_dir is None else Path(rows_dir) / f"seed{seed}" / f"resume-{group_digest(group)}.pt"
                if ckpt is not None and continue_from is not None and not ckpt.exists():
                    start_from(ckpt, Path(continue_from) / f"seed{seed}", group, f"{dataset} seed {seed}")
                keep(with_core_share(lambda: run_methods(dataset, group, seed, config, data, checkpoint=ckpt)))
                if ckpt is not None and keep_state: ckpt.replace(ckpt.with_name(f"state-{group_digest(group)}.pt"))
                elif ckpt is not None: ckpt.unlink(missing_ok=True)
    return rows

def group_digest(methods) -> str:
    "A short name for a lock-step group of methods (its checkpoint file's)."
    return hashlib.sha1("+".join(m.name for m in methods).encode()).hexdigest()[:12]

def _grid_name(rows_dir) -> str:
    "The results folder's name of a grid's rows folder (`<out>/rows/<study>/<dataset>`), else the folder's own name: no machine path."
    p = Path(rows_dir)
    return p.parents[2].name if len(p.parents) > 2 and p.parents[1].name == "rows" else p.name

def start_from(ckpt, shorter, group, label=""):
    """Make `ckpt` the final state a shorter run kept in the folder `shorter` for `group` — its own group's, or the part for
    `group` of a larger group's — and say so; say so too when there is none."""
    names = [m.name for m in group]
    own = Path(shorter) / f"state-{group_digest(group)}.pt"
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    if own.exists():
        atomic_write(ckpt, lambda tmp: shutil.copyfile(own, tmp))
        return print(f"{label}: continuing the shorter run's final state {own.name} from {_grid_name(Path(shorter).parent)}")
    for f in sorted(Path(shorter).glob("state-*.pt")):
        if (part := state_subset(torch.load(f, map_location="cpu", weights_only=False), names)) is not None:
            atomic_write(ckpt, lambda tmp: torch.save(part, tmp))
            return print(f"{label}: continuing the shorter run's final state {f.name} from {_grid_name(Path(shorter).parent)} ({', '.join(names)} of its group)")
    print(f"{label}: no final state kept in {_grid_name(Path(shorter).parent)} for {', '.join(names)}: training from the start")


# %% [markdown]
# A small real run: 1200 Fashion-MNIST images, 3 epochs. Softmax learns (well above the 10% of chance), the same seed
# reproduces the result bit for bit on CPU, and top-k 0.25 keeps $\lceil 0.25 \cdot 17\rceil = 5$ of 17 keys. The
# opt-in paths (Philox masks, bf16 autocast) are checked on one epoch each: they learn (twice chance already), repeat
# themselves, and differ from the default path.

# %%
cfg = TrainConfig(epochs=3, train_limit=1200, test_limit=300, progress=False)
data = load_dataset("fashion_mnist", 0, 1200, 300)
r1 = run_one("fashion_mnist", "softmax", 0, cfg, data)
assert r1["accuracy"] > 0.4, r1
test_eq((r1["param_count"], r1["train_n"], r1["test_n"], r1["status"]), (104_970, 1200, 300, "ok"))
test_close(r1["nonzero_ratio"], 1.0)
test_eq({f.name: r1[f.name] for f in run_options(TrainConfig)}, {f.name: getattr(cfg, f.name) for f in run_options(TrainConfig)})  # every option, per row
test_eq(r1["device"], "cuda" if torch.cuda.is_available() else "cpu")             # "auto", the default, recorded per row
import re as _re
assert _re.fullmatch(r"[A-Z0-9_]+", r1["cpu_capability"]) and r1["torch_version"] == torch.__version__   # e.g. AVX2, AVX512: bits differ across them
rc = run_one("fashion_mnist", "softmax", 0, replace(cfg, device="cpu"), data)
test_eq(rc["device"], "cpu")
if not torch.cuda.is_available(): test_eq((rc["accuracy"], rc["test_loss"]), (r1["accuracy"], r1["test_loss"]))  # "auto" is the CPU: the same run
else: assert rc["accuracy"] > 0.4, rc                                                # on a GPU machine: a real CPU run that learns
test_fail(lambda: run_one("fashion_mnist", "softmax", 0, replace(cfg, device="tpu"), data), contains="unknown device")

c1 = replace(cfg, epochs=1)
r1_one = run_one("fashion_mnist", "softmax", 0, c1, data)
rp = [run_one("fashion_mnist", "softmax", 0, replace(c1, dropout_rng="philox"), data) for _ in range(2)]
test_eq(rp[0]["accuracy"], rp[1]["accuracy"]); assert rp[0]["accuracy"] > 0.2 and rp[0]["test_loss"] != r1_one["test_loss"]
rb16 = run_one("fashion_mnist", "entmax15", 0, replace(c1, precision="bf16"), data)   # bf16 autocast: learns, differs
assert rb16["accuracy"] > 0.2 and rb16["test_loss"] != run_one("fashion_mnist", "entmax15", 0, c1, data)["test_loss"]
rk = run_one("fashion_mnist", "topk_softmax_025", 0, c1, data)
test_close(rk["nonzero_ratio"], 5 / 17, eps=1e-6)

# %% [markdown]
# **Killed and resumed, bit for bit.** With a `checkpoint` file, training keeps its whole state after every epoch
# (weights, AdamW moments, the data-order generator, torch's generator that draws the dropout masks, the results so far)
# and a rerun continues after the last finished epoch. Below, a run is killed while its second epoch is being evaluated
# (so only epoch 1 was kept) and rerun: its losses, learning curves, learned $\alpha$ and final weights equal those of
# a run never interrupted. A checkpoint of another configuration is not continued, and `run_study_a` deletes the file
# once the group's rows are written.
#
# Under the protocol's constant learning rate a shorter run *is* the start of a longer one (under `warmup_cosine` it
# is not, and its checkpoints are continued only by a run of the same length): a checkpoint that differs only in the
# number of epochs, kept at the end of a shorter run, is continued to the longer length, and the result is the longer
# run bit for bit (below: 2 epochs, then on to 3, against 3 at once). This is what makes a longer run of the tuned
# protocol cost only its extra epochs.

# %%
import tempfile
pair, mon = ["softmax", "headwise_adaptive_entmax"], epoch_monitor(data)
def _trained(monitor, checkpoint=None):
    models = [_new_model(data, m, 0) for m in pair]
    return models, train_lockstep(models, data.train, cfg, 0, monitor=monitor, checkpoint=checkpoint)
ref_models, ref = _trained(mon)
class _Killed(Exception): pass
calls = []
def _dies_in_epoch_2(model):
    calls.append(1)
    if len(calls) > len(pair): raise _Killed()
    return mon(model)
with tempfile.TemporaryDirectory() as tmp:
    ck = Path(tmp) / "resume.pt"
    test_fail(lambda: _trained(_dies_in_epoch_2, ck))
    test_eq(torch.load(ck, weights_only=False)["epoch"], 1)
    res_models, res = _trained(mon, ck)
    for a, b, ma, mb in zip(ref, res, ref_models, res_models):
        test_eq(torch.equal(a.losses, b.losses), True)
        test_eq((a.status, a.epoch_metrics, a.learned_history), (b.status, b.epoch_metrics, b.learned_history))
        test_eq(all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values())), True)
    other = [_new_model(data, m, 0) for m in pair]                          # another learning rate: not continued
    c2 = replace(cfg, lr=3e-3)
    test_eq(load_checkpoint(ck, _checkpoint_key(c2, 0, other, len(data.train.y)), other,
                            [torch.optim.AdamW(m.parameters()) for m in other], torch.Generator(), torch.device("cpu")), None)
    test_eq(load_checkpoint(ck, _checkpoint_key(replace(cfg, epochs=1), 0, other, len(data.train.y)), other,   # 3 epochs kept: not a 1-epoch run's
                            [torch.optim.AdamW(m.parameters()) for m in other], torch.Generator(), torch.device("cpu")), None)
    ck2 = Path(tmp) / "short.pt"
    short_models = [_new_model(data, m, 0) for m in pair]
    train_lockstep(short_models, data.train, replace(cfg, epochs=2), 0, monitor=mon, checkpoint=ck2)     # a 2-epoch run, state kept
    long_models = [_new_model(data, m, 0) for m in pair]
    long = train_lockstep(long_models, data.train, cfg, 0, monitor=mon, checkpoint=ck2)                  # continued to 3
    for a, b, ma, mb in zip(ref, long, ref_models, long_models):
        test_eq(torch.equal(a.losses, b.losses), True)
        test_eq((a.status, a.epoch_metrics, a.learned_history), (b.status, b.epoch_metrics, b.learned_history))
        test_eq(all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values())), True)
    # under a schedule that ends with the run, a shorter run is not the start of a longer one: never continued
    cos = replace(cfg, schedule="warmup_cosine")
    train_lockstep(short_models, data.train, replace(cos, epochs=2), 0, checkpoint=Path(tmp) / "cos.pt")
    test_eq(load_checkpoint(Path(tmp) / "cos.pt", _checkpoint_key(cos, 0, other, len(data.train.y)), other,
                            [torch.optim.AdamW(m.parameters()) for m in other], torch.Generator(), torch.device("cpu")), None)
    test_eq(_same_run_but_length(_checkpoint_key(cfg, 0, other, 9), _checkpoint_key(replace(cfg, epochs=9), 0, other, 9)), True)
    rows = run_study_a("fashion_mnist", 0, ["softmax"], "smoke", rows_dir=tmp, progress=False)
    test_eq(sorted(p.name for p in (Path(tmp) / "seed0").iterdir()), ["softmax.csv"])   # rows written, checkpoint gone
    # the same through `run_study_a`: a 1-epoch grid keeps its end, a 2-epoch one continues it and equals a 2-epoch run made at once
    one, two, fresh = (Path(tmp) / x for x in ("one", "two", "fresh"))
    run_study_a("fashion_mnist", 0, pair, "smoke", rows_dir=one, keep_state=True, progress=False)
    test_eq(sorted(p.name for p in (one / "seed0").glob("*.pt")), [f"state-{group_digest([resolve_normalizer(m) for m in pair])}.pt"])
    cont = run_study_a("fashion_mnist", 0, pair, "smoke", rows_dir=two, continue_from=one, epochs=2, progress=False)
    made = run_study_a("fashion_mnist", 0, pair, "smoke", rows_dir=fresh, epochs=2, progress=False)
    test_eq([(r["accuracy"], r["test_loss"], r["epochs"]) for r in cont], [(r["accuracy"], r["test_loss"], r["epochs"]) for r in made])
    test_eq(list((two / "seed0").glob("*.pt")), [])                                  # continued, then its own checkpoint gone
    # one method of the pair, continued from the pair's kept state: its part of the state, the same result as the pair's run
    solo = run_study_a("fashion_mnist", 0, pair[1:], "smoke", rows_dir=Path(tmp) / "solo", continue_from=one, epochs=2, progress=False)
    test_eq([(r["accuracy"], r["test_loss"]) for r in solo], [(r["accuracy"], r["test_loss"]) for r in made[1:]])
    test_eq(state_subset(torch.load(next((one / "seed0").glob("state-*.pt")), weights_only=False), ["sparsemax"]), None)   # not in the pair

# %% [markdown]
# The adaptive entmax logs its $\alpha$ per head after each epoch (starting at 1.5), and a diverging run is recorded, not raised:

# %%
rh = run_one("fashion_mnist", "headwise_adaptive_entmax", 0, replace(cfg, epochs=1), data)
hist = json.loads(rh["learned_history"])
test_eq([h["epoch"] for h in hist], [0, 1])
test_eq(hist[0]["alpha"], [[1.5] * 4] * 2)
assert hist[1]["alpha"] != hist[0]["alpha"] and 1.05 < rh["learned_alpha_mean"] < 1.95
nan_data = replace(data, train=replace(data.train, x=torch.full_like(data.train.x, float("nan"))))
bad = run_one("fashion_mnist", "softmax", 0, replace(cfg, epochs=1), nan_data)
test_eq(bad["status"], "failed_nonfinite_loss")

# %% [markdown]
# On token ids, `evaluate` also reports the attention mass on padding per layer (`pad_attention`, see `02_model`),
# averaged over the test sentences: the batching does not change it, and image patches have none.

# %%
dn = load_dataset("twenty_news", 0, 100, 120)
mn = _new_model(dn, "sparsemax", 0)
big, small = evaluate(mn, dn.test), evaluate(mn, dn.test, batch_size=37)
test_eq(len(big["pad_attention"]), 2)
for a, b in zip(big["pad_attention"], small["pad_attention"]): test_close([a["cls"], a["tokens"]], [b["cls"], b["tokens"]], eps=1e-5)
assert 0 < big["pad_attention"][0]["cls"] < 1, big["pad_attention"]
test_eq(evaluate(_new_model(data, "softmax", 0), data.test)["pad_attention"], None)

# %% [markdown]
# The learning curves' pass (`record=False`) reports the recorded pass's accuracy and loss bit for bit, after a short
# training: image patches and token ids with masked padding, the three attention paths, fp32 and bf16, and
# forward batches that do not divide the split, their short tails joined to the chunk before (20 Newsgroups' rule gives
# 55 documents, so its 120 test documents run as 55 and 65; images keep 500, so there the batch is forced down to 37 by
# shrinking `CURVE_BYTES`, and 300 images run as 37s and a last 41).

# %%
test_eq(curve_batch(mn), 55); test_eq(curve_batch(_new_model(data, "softmax", 0)), 500)
dnm = load_dataset("twenty_news", 0, 192, 120, DataOptions(mask_padding=True))
_saved_bytes = CURVE_BYTES
try:
    for d_, forced in ((dnm, None), (data, 37 * 4 * 17 ** 2 * 4)):
        if forced: CURVE_BYTES = forced
        for method, path, precision in (("softmax", "torch", "fp32"), ("sparsemax", "fused", "fp32"), ("entmax15", "fused_block", "fp32"),
                                        ("headwise_adaptive_entmax", "torch", "bf16")):
            m_ = _new_model(d_, method, 0, attention=path)
            train_model(m_, d_.train, replace(cfg, epochs=1, precision=precision), 0)
            a_, b_ = evaluate(m_, d_.test, precision=precision), evaluate(m_, d_.test, precision=precision, record=False)
            test_eq((a_["accuracy"], a_["loss"]), (b_["accuracy"], b_["loss"]))
            assert np.isnan(b_["nonzero_ratio"]) and b_["pad_attention"] is None and 0 < a_["nonzero_ratio"] <= 1
        test_eq(curve_batch(m_), 55 if forced is None else 37)
finally: CURVE_BYTES = _saved_bytes

# %% [markdown]
# ## Attention maps: where the CLS token looks
#
# The picture readers look for first: for a trained model, the weights of the CLS query over the keys in each layer
# (averaged over heads), read off the normalizer's output with a forward hook, so the model itself is not touched.
# `attention_maps` trains one seed's methods with the protocol (the same runs as the grid's, so their accuracies can be
# checked against committed results) and keeps the maps of a few test examples, saved atomically as one `.npz` (for
# 20 Newsgroups with the examples' words, `data.news_words`).

# %%
#| export
def cls_attention(model, x, key_mask=None) -> torch.Tensor:
    "The CLS query's attention weights over all keys, per layer, averaged over heads: `[n, layers, T]`."
    grabbed = []
    hooks = [b.attn.normalizer.register_forward_hook(lambda mod, inp, out: grabbed.append(out[:, :, 0, :].float().mean(1)))
             for b in model.blocks]
    try:
        model.eval()
        with torch.no_grad(): model(x, key_mask)
    finally:
        for h in hooks: h.remove()
    return torch.stack(grabbed, 1).cpu()

def attention_maps(dataset: str, seed: int, methods, config: TrainConfig, examples: int = 4, out=None) -> dict:
    "Train `methods` on (dataset, seed), take the CLS attention of the first `examples` test items; save to `out` (.npz) if given."
    data = load_run_data(dataset, seed, config)
    rows, models = run_methods(dataset, list(methods), seed, config, data, return_models=True)
    x, mask = data.test.x[:examples], None if data.test.key_mask is None else data.test.key_mask[:examples]
    dev = next(models[0].parameters()).device
    maps = np.stack([cls_attention(m, x.to(dev), None if mask is None else mask.to(dev)).numpy() for m in models])  # [M, n, L, T]
    preds = np.stack([m(x.to(dev), None if mask is None else mask.to(dev)).argmax(-1).cpu().numpy() for m in models])
    rec = dict(dataset=np.array(dataset), seed=np.array(seed), methods=np.array(list(methods)), maps=maps, inputs=x.numpy(),
               labels=data.test.y[:examples].numpy(), predictions=preds, accuracy=np.array([r["accuracy"] for r in rows]))
    if dataset == "twenty_news":                                          # the words behind the ids, position by position
        n_test = len(full_arrays(dataset, download=config.download)[0]["test_y"])
        rec["words"] = np.array([" ".join(w) for w in news_words("test", subset_indices(n_test, config.test_limit, seed + TEST_SEED_OFFSET)[:examples])])
    if out is not None:
        def write(tmp):
            with open(tmp, "wb") as f: np.savez_compressed(f, **rec)
        atomic_write(out, write)
    return rec

# %% [markdown]
# Checked against the attention computed by hand (the first layer's softmax weights of the CLS row, from the layer's own
# projections), rows summing to one, and a short real run: the saved file holds what `attention_maps` returned, and the
# run's accuracies are those of `run_methods` for the same seed.

# %%
m_att = _new_model(data, "softmax", 0).eval()
xa = data.test.x[:3]
ca = cls_attention(m_att, xa)
test_eq(ca.shape, (3, 2, 17)); test_close(ca.sum(-1), torch.ones(3, 2), eps=1e-5)
with torch.no_grad():
    h_ = torch.cat([m_att.cls.expand(3, -1, -1), m_att.embed(xa)], 1) + m_att.pos
    q_, k_, _ = m_att.blocks[0].attn.qkv(h_).view(3, 17, 3, 4, 16).permute(2, 0, 3, 1, 4)
test_close(ca[:, 0], torch.softmax(q_ @ k_.transpose(-2, -1) / 4, -1)[:, :, 0, :].mean(1), eps=1e-5)
import tempfile
_npz = Path(tempfile.mkdtemp()) / "maps.npz"
c_maps = replace(cfg, epochs=1, train_limit=300)
rec = attention_maps("fashion_mnist", 0, ["softmax", "topk_softmax_025"], c_maps, examples=2, out=_npz)
test_eq(rec["maps"].shape, (2, 2, 2, 17)); test_eq(set((rec["maps"][0] > 0).sum(-1).ravel()), {17})   # softmax: every key
assert ((rec["maps"][1] > 0).sum(-1) >= 5).all() and ((rec["maps"][1] > 0).sum(-1) < 17).any()        # top-k: 5 per head, pooled
saved = np.load(_npz)
test_eq(saved["maps"], rec["maps"]); test_eq(saved["methods"].tolist(), ["softmax", "topk_softmax_025"])
test_eq(rec["accuracy"].tolist(), [r["accuracy"] for r in run_methods("fashion_mnist", ["softmax", "topk_softmax_025"], 0, c_maps)])
# on 20 Newsgroups the record also holds each example's words, position by position as its token ids
from sparse_attention_repro.data import hash_token
rec_n = attention_maps("twenty_news", 0, ["softmax"], replace(cfg, epochs=1, train_limit=96, test_limit=50), examples=2)
test_eq(rec_n["maps"].shape, (1, 2, 2, 97))
for w, ids in zip(rec_n["words"], rec_n["inputs"]): test_eq([hash_token(t) for t in w.split()], ids[ids != 0].tolist())

# %% [markdown]
# **Learning curves leave training untouched.** With `epoch_eval` every epoch ends with an evaluation on the validation
# and test splits (recorded as `epoch_metrics`). Evaluation draws no random numbers and changes no weight, so a
# 2-epoch run with curves ends exactly where one without them does, and its epoch-1 entry equals the final evaluation
# of a 1-epoch run; a choice of training length can then be read off one long run.

# %%
dv = load_dataset("fashion_mnist", 0, 384, 300, val_fraction=0.25)
c_one, c_two = replace(cfg, epochs=1, train_limit=384), replace(cfg, epochs=2, train_limit=384)
one = run_methods("fashion_mnist", ["softmax", "headwise_adaptive_entmax"], 0, c_one, dv)
two = run_methods("fashion_mnist", ["softmax", "headwise_adaptive_entmax"], 0, c_two, dv)
curves = run_methods("fashion_mnist", ["softmax", "headwise_adaptive_entmax"], 0, replace(c_two, epoch_eval=True), dv)
for a, b, c in zip(one, two, curves):
    test_eq((c["accuracy"], c["test_loss"], c["learned_history"]), (b["accuracy"], b["test_loss"], b["learned_history"]))
    em = json.loads(c["epoch_metrics"])
    test_eq([e["epoch"] for e in em], [1, 2])
    test_eq((em[0]["test_accuracy"], em[0]["test_loss"], em[0]["val_accuracy"]), (a["accuracy"], a["test_loss"], a["val_accuracy"]))
    test_eq((em[1]["test_accuracy"], em[1]["val_accuracy"]), (c["accuracy"], c["val_accuracy"]))
    test_eq((b["epoch_metrics"], c["lr"]), ("", 1e-3))
dv1 = load_dataset("fashion_mnist", 1, 384, 300, val_fraction=0.25)
stacked_curves = run_stacked("fashion_mnist", ["softmax", "headwise_adaptive_entmax"], [0, 1], replace(c_two, epoch_eval=True), [dv, dv1])
test_eq([r["epoch_metrics"] for r in stacked_curves if r["seed"] == 0], [c["epoch_metrics"] for c in curves])   # the stack: the same curves

# %% [markdown]
# **Lock-step is the plain path, bit for bit.** All seven methods trained together give exactly the loss curve, the
# accuracy, the learned $\alpha$ and the final weights of each method trained alone. A model that diverges is dropped
# from the group after its epoch without disturbing the others.

# %%
from sparse_attention_repro.study import PAPER_METHODS
c2 = replace(cfg, epochs=2, train_limit=288)
d2 = load_dataset("fashion_mnist", 0, 288, 300)
alone, res_alone = [], []
for m in PAPER_METHODS:                      # as a plain run does: build from the seed, then train
    alone.append(_new_model(d2, m, 0)); res_alone.append(train_model(alone[-1], d2.train, c2, 0))
together = [_new_model(d2, m, 0) for m in PAPER_METHODS]
res_together = train_lockstep(together, d2.train, c2, 0)
test_eq(len({r.mask_seconds for r in res_together}), 1); assert 0 < res_together[0].mask_seconds < res_together[0].seconds   # one shared draw, charged to each
for ra, rt, ma, mt in zip(res_alone, res_together, alone, together):
    assert torch.equal(ra.losses, rt.losses) and not ra.losses.isnan().any()
    test_eq(ra.learned_history, rt.learned_history)
    assert all(torch.equal(p, q) for p, q in zip(ma.parameters(), mt.parameters()))
assert len({float(r.losses[-1]) for r in res_alone}) == len(PAPER_METHODS)     # the methods really differ
rows = run_methods("fashion_mnist", ["softmax", "topk_softmax_025"], 0, c2, d2)
test_eq([r["accuracy"] for r in rows], [run_one("fashion_mnist", m, 0, c2, d2)["accuracy"] for m in ["softmax", "topk_softmax_025"]])
test_eq([r["lockstep_size"] for r in rows], [2, 2])

broken = [_new_model(d2, m, 0) for m in ("softmax", "sparsemax")]
with torch.no_grad(): broken[0].head.weight.fill_(float("nan"))
rb = train_lockstep(broken, d2.train, c2, 0)
test_eq([r.status for r in rb], ["failed_nonfinite_loss", "ok"])
assert torch.equal(rb[1].losses, res_alone[1].losses)

# %%
import tempfile
rows_dir = Path(tempfile.mkdtemp())
rows = run_study_a("synthetic_marker", 3, ["softmax", "sparsemax"], "smoke", rows_dir=rows_dir, train_limit=96, test_limit=50, progress=False)
test_eq(sorted(p.name for p in (rows_dir / "seed3").iterdir()), ["softmax.csv", "sparsemax.csv"])
test_eq([(r["method"], r["seed"], r["profile"], r["train_n"], r["test_n"]) for r in rows],
        [("softmax", 3, "smoke", 96, 50), ("sparsemax", 3, "smoke", 96, 50)])
test_fail(lambda: run_study_a("synthetic_marker", -1, ["softmax"], "smoke"), contains="seeds must be")
test_fail(lambda: run_study_a("synthetic_marker", 0, ["softmaxx"], "smoke"), contains="unknown normalizer")

# %% [markdown]
# **The stack is the plain path, bit for bit.** Three methods (one with a learned $\alpha$) on two seeds, trained as one
# stack for two epochs, give every model exactly the loss curve, the $\alpha$ history and the final weights of its own
# lock-step run — on image patches and on token ids with the frozen padding row and a key mask. A model that diverges
# in the stack is marked failed and leaves its neighbours' runs untouched. `run_study_a(..., stack=True)` gives the
# rows `run_study_a` gives seed by seed.

# %%
def _plain(dataset, methods, seed, cfg, data):
    models = [_new_model(data, m, seed) for m in methods]
    return models, train_lockstep(models, data.train, cfg, seed)

def _stacked(dataset, methods, seeds, cfg, datas, spoil=None):
    built, gens = {}, []
    for s, d in zip(seeds, datas):
        for m in methods: built[m, s] = _new_model(d, m, s)
        gens.append(dropout_generators(s, "cpu"))
    keys = [(m, s) for m in methods for s in seeds]
    if spoil is not None:
        with torch.no_grad(): built[spoil].head.weight.fill_(float("nan"))
    return built, dict(zip(keys, train_stacked([built[k] for k in keys], [d.train for d in datas], cfg, seeds, gens)))

three = ["softmax", "headwise_adaptive_entmax", "topk_softmax_025"]
for ds, kw in [("twenty_news", dict(mask_padding=True, train_limit=96)), ("fashion_mnist", dict(train_limit=192))]:
    c3 = replace(cfg, epochs=2, test_limit=96, **kw)
    datas = [load_run_data(ds, s, c3) for s in (0, 1)]
    built, res = _stacked(ds, three, [0, 1], c3, datas)
    for s, d in zip((0, 1), datas):
        models, results = _plain(ds, three, s, c3, d)
        for m, model, r in zip(three, models, results):
            assert torch.equal(r.losses, res[m, s].losses) and not r.losses.isnan().any(), (ds, m, s)
            test_eq(r.learned_history, res[m, s].learned_history)
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), built[m, s].parameters())), (ds, m, s)
test_eq(len(res["headwise_adaptive_entmax", 1].learned_history), 3)
built, bad = _stacked(ds, three, [0, 1], c3, datas, spoil=("softmax", 1))
test_eq([bad[k].status for k in bad], ["ok", "failed_nonfinite_loss", "ok", "ok", "ok", "ok"])
spoilt = [_new_model(datas[1], m, 1) for m in three]
with torch.no_grad(): spoilt[0].head.weight.fill_(float("nan"))
plain_bad = train_lockstep(spoilt, datas[1].train, c3, 1)                         # the same failure on the plain path
test_eq(bad["softmax", 1].status, plain_bad[0].status)
assert torch.equal(bad["softmax", 1].losses.isnan(), plain_bad[0].losses.isnan())
assert all(torch.equal(bad[k].losses, res[k].losses) for k in bad if k != ("softmax", 1))

# under the warm-up + cosine schedule too: the stack and the plain lock-step path set the same rate at every step
cw = replace(c3, schedule="warmup_cosine")
built, res = _stacked(ds, three[:2], [0, 1], cw, datas)
for s, d in zip((0, 1), datas):
    models, results = _plain(ds, three[:2], s, cw, d)
    for m, model, r in zip(three, models, results):
        assert torch.equal(r.losses, res[m, s].losses), (m, s)
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), built[m, s].parameters())), (m, s)
assert not torch.equal(results[0].losses, _plain(ds, three[:1], 1, c3, datas[1])[1][0].losses)   # and it changes training

r_stack = run_study_a("fashion_mnist", [0, 1], ["softmax", "sparsemax"], "smoke", stack=True, train_limit=192, test_limit=64, progress=False)
r_plain = run_study_a("fashion_mnist", [0, 1], ["softmax", "sparsemax"], "smoke", train_limit=192, test_limit=64, progress=False)
test_eq([(r["seed"], r["method"], r["accuracy"], r["test_loss"]) for r in r_stack],
        [(r["seed"], r["method"], r["accuracy"], r["test_loss"]) for r in r_plain])
test_eq([r["lockstep_size"] for r in r_stack], [4] * 4)
