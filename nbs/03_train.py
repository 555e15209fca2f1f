# %% [markdown]
# # Training study A
# > One run = one dataset, one normalizer, one seed, trained with the paper's protocol and evaluated once at the end.

# %%
#| default_exp train

# %% [markdown]
# PROTOCOL.md fixes the recipe: AdamW (lr $10^{-3}$, weight decay $10^{-4}$), batch 96, gradient-norm clipping at 5,
# cross-entropy, no schedule, no early stopping, one evaluation on the test subset at the end. Per seed, every method
# sees the *same* train and test subsets and starts from the *same* initial weights (paired design): the seed fixes
# the subsets (`load_dataset`), the initialisation and the data order.
#
# Run sizes per dataset are the paper's; a **profile** scales them: `smoke` (a few hundred examples, 1 epoch, 2 seeds —
# for CI), `quick` (the paper's sizes and epochs, 3 seeds), `paper` (exactly PROTOCOL.md, seeds 0–9).

# %%
#| export
import json, time
from pathlib import Path
from dataclasses import dataclass, replace
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import f1_score
from tqdm.auto import tqdm
from sparse_attention_repro.data import load_dataset
from sparse_attention_repro.model import CompactClassifier, ClassifierConfig, count_parameters
from sparse_attention_repro.normalizers import get_normalizer
from sparse_attention_repro.runner import save_rows

# %%
from fastcore.test import test_eq, test_close, test_fail


# %%
#| export
@dataclass
class TrainConfig:
    "Everything a study A run depends on besides dataset, method and seed (defaults: the paper's main family)."
    epochs: int = 6
    train_limit: int = 8000
    test_limit: int = 2000
    batch_size: int = 96
    lr: float = 1e-3
    weight_decay: float = 1e-4
    grad_clip: float = 5.0
    val_fraction: float = 0.0        # > 0: carve a validation split off the train subset (leakage-free selection)
    mask_padding: bool = False       # variant: mask padding tokens of twenty_news (the paper does not)
    patch_size: int | None = None    # variant: 4 for 4x4 patches (None = the paper's 7x7 / 8x8)
    marker_vocab: int = 20000        # variant: a small vocabulary makes the marker task learnable
    progress: bool = True            # tqdm bar

# Paper sizes per dataset: epochs, train / test examples (PROTOCOL.md, "run family" table)
PAPER_SIZES = {"fashion_mnist": (6, 8000, 2000), "cifar10": (6, 8000, 2000), "twenty_news": (6, 4000, 1500),
               "synthetic_marker": (6, 8000, 2000), "kmnist": (8, 12000, 3000)}
MAIN_FAMILY = ("cifar10", "fashion_mnist", "twenty_news", "synthetic_marker")
PROFILES = {"smoke": dict(seeds=(0, 1), epochs=1, train_limit=256, test_limit=128),
            "quick": dict(seeds=(0, 1, 2)),
            "paper": dict(seeds=tuple(range(10)))}

def profile_config(profile: str, dataset: str, **overrides) -> TrainConfig:
    "The TrainConfig of `dataset` under `profile` (smoke / quick / paper), with `overrides` applied."
    if profile not in PROFILES: raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    if dataset not in PAPER_SIZES: raise ValueError(f"unknown dataset {dataset!r}; choose from {', '.join(PAPER_SIZES)}")
    epochs, train_limit, test_limit = PAPER_SIZES[dataset]
    cfg = TrainConfig(epochs=epochs, train_limit=train_limit, test_limit=test_limit)
    scale = {k: v for k, v in PROFILES[profile].items() if k != "seeds"}
    return replace(cfg, **{**scale, **overrides})


# %%
test_eq(profile_config("paper", "kmnist").epochs, 8)
test_eq((profile_config("paper", "twenty_news").train_limit, profile_config("paper", "twenty_news").test_limit), (4000, 1500))
test_eq(profile_config("smoke", "cifar10").epochs, 1)
test_eq(profile_config("quick", "cifar10", val_fraction=0.1).val_fraction, 0.1)
test_fail(lambda: profile_config("fast", "cifar10"), contains="unknown profile")


# %% [markdown]
# ## Evaluation
#
# Accuracy, macro-F1, mean cross-entropy and the attention density (`nonzero_ratio`: fraction of weights $> 10^{-7}$,
# averaged over layers and test batches) from one pass over a split; inference time is that pass's wall time.

# %%
#| export
@torch.no_grad()
def evaluate(model, split, batch_size=500):
    "Accuracy, macro-F1, loss, nonzero_ratio and seconds of one pass of `model` over `split`."
    model.eval(); model.set_recording(True)
    t0 = time.perf_counter()
    preds, loss, density = [], torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for i in range(0, len(split.y), batch_size):
        xb, yb = split.x[i:i + batch_size], split.y[i:i + batch_size]
        mb = None if split.key_mask is None else split.key_mask[i:i + batch_size]
        logits = model(xb, mb)
        loss += F.cross_entropy(logits, yb, reduction="sum").double()
        density += torch.stack(model.densities()).double().mean() * len(yb)
        preds.append(logits.argmax(-1))
    seconds = time.perf_counter() - t0
    model.set_recording(False)
    pred, n = torch.cat(preds).numpy(), len(split.y)
    y = split.y.numpy()
    return dict(accuracy=float((pred == y).mean()), macro_f1=float(f1_score(y, pred, average="macro", zero_division=0)),
                loss=float(loss) / n, nonzero_ratio=float(density) / n, seconds=seconds)


# %% [markdown]
# ## One run
#
# `run_one` trains and evaluates one (dataset, method, seed). A non-finite training loss ends the run with
# `status="failed_nonfinite_loss"` instead of crashing the grid; it is checked once per epoch, so the hot loop has no
# host synchronisation. For the adaptive entmax the per-head $\alpha$ is logged after every epoch (`alpha_history`).

# %%
#| export
def _alpha_snapshot(model, epoch):
    a = model.alphas()
    return None if a is None else {"epoch": epoch, "alpha": [[round(float(v), 5) for v in layer] for layer in a]}

def train_model(model, train, cfg: TrainConfig, seed: int, desc=""):
    "Train `model` in place on `train`; returns (status, alpha_history, seconds)."
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    n, bs = len(train.y), cfg.batch_size
    history = [s for s in [_alpha_snapshot(model, 0)] if s]
    status, t0 = "ok", time.perf_counter()
    bar = tqdm(total=cfg.epochs * -(-n // bs), desc=desc, disable=not cfg.progress, mininterval=2, leave=False)
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        order, total = torch.randperm(n, generator=gen), torch.zeros(())
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            mb = None if train.key_mask is None else train.key_mask[idx]
            loss = F.cross_entropy(model(train.x[idx], mb), train.y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            total += loss.detach()
            bar.update()
        if not torch.isfinite(total):
            status = "failed_nonfinite_loss"; break
        if (s := _alpha_snapshot(model, epoch)): history.append(s)
    bar.close()
    return status, history, time.perf_counter() - t0

def run_one(dataset: str, method: str, seed: int, config: TrainConfig, data=None) -> dict:
    "Train and evaluate one (dataset, method, seed); returns the metrics row of PROTOCOL.md."
    get_normalizer(method, num_heads=1)                      # fail early on an unknown method
    if data is None:
        data = load_dataset(dataset, seed, config.train_limit, config.test_limit, val_fraction=config.val_fraction,
                            patch_size=config.patch_size, mask_padding=config.mask_padding, marker_vocab=config.marker_vocab)
    torch.manual_seed(seed); np.random.seed(seed)
    model = CompactClassifier(ClassifierConfig(num_classes=data.num_classes, seq_len=data.seq_len, input_dim=data.input_dim,
                                               vocab_size=data.vocab_size, normalizer=method))
    status, history, train_seconds = train_model(model, data.train, config, seed, desc=f"{dataset}/{method}/seed{seed}")
    row = dict(dataset=dataset, method=method, seed=seed, accuracy=np.nan, macro_f1=np.nan, test_loss=np.nan,
               nonzero_ratio=np.nan, learned_alpha_mean=np.nan, train_seconds=train_seconds, inference_seconds=np.nan,
               param_count=count_parameters(model), epochs=config.epochs, train_n=len(data.train.y), test_n=len(data.test.y),
               val_n=0 if data.val is None else len(data.val.y), val_accuracy=np.nan, val_macro_f1=np.nan,
               dataset_source=data.dataset_source, status=status, error="",
               alpha_history=json.dumps(history) if history else "")
    if status != "ok":
        row["error"] = "training loss became NaN/inf"
        return row
    m = evaluate(model, data.test)
    row.update(accuracy=m["accuracy"], macro_f1=m["macro_f1"], test_loss=m["loss"], nonzero_ratio=m["nonzero_ratio"],
               inference_seconds=m["seconds"])
    if model.alphas() is not None: row["learned_alpha_mean"] = float(torch.stack(model.alphas()).mean())
    if data.val is not None:
        v = evaluate(model, data.val)
        row.update(val_accuracy=v["accuracy"], val_macro_f1=v["macro_f1"])
    return row


# %% [markdown]
# `run_study_a` is what the experiment notebook calls: the profile's configuration for one dataset, the requested
# methods on one seed — all on the same subsets (paired design), loaded once — and the profile name on every row.
# With `rows_dir` each method's row is written (atomically) the moment it is done, so a killed grid loses at most the
# training run in flight. `threads` pins torch's CPU threads when several runs share a machine.

# %%
#| export
def run_study_a(dataset: str, seed: int, methods, profile: str, threads: int = 0, rows_dir=None, **options) -> list:
    "Rows of every method in `methods` for one (dataset, seed) under `profile`; `options` override TrainConfig fields."
    if seed < 0: raise ValueError(f"seed must be >= 0, got {seed}")
    for m in methods: get_normalizer(m, num_heads=1)
    if threads: torch.set_num_threads(threads)
    config = profile_config(profile, dataset, **options)
    data = load_dataset(dataset, seed, config.train_limit, config.test_limit, val_fraction=config.val_fraction,
                        patch_size=config.patch_size, mask_padding=config.mask_padding, marker_vocab=config.marker_vocab)
    rows = []
    for m in methods:
        rows.append(dict(run_one(dataset, m, seed, config, data=data), profile=profile))
        if rows_dir is not None: save_rows(rows[-1:], Path(rows_dir) / f"{m}.csv")
    return rows


# %% [markdown]
# A small real run: 1200 Fashion-MNIST images, 3 epochs. Softmax learns (well above the 10% of chance), the same seed
# reproduces the result bit for bit on CPU, and top-k 0.25 keeps $\lceil 0.25 \cdot 17\rceil = 5$ of 17 keys.

# %%
cfg = TrainConfig(epochs=3, train_limit=1200, test_limit=300, progress=False)
data = load_dataset("fashion_mnist", 0, 1200, 300)
r1 = run_one("fashion_mnist", "softmax", 0, cfg, data)
r2 = run_one("fashion_mnist", "softmax", 0, cfg, data)
assert r1["accuracy"] > 0.4, r1
test_eq((r1["accuracy"], r1["test_loss"]), (r2["accuracy"], r2["test_loss"]))
test_eq((r1["param_count"], r1["train_n"], r1["test_n"], r1["status"]), (104_970, 1200, 300, "ok"))
test_close(r1["nonzero_ratio"], 1.0)
rk = run_one("fashion_mnist", "topk_softmax_025", 0, cfg, data)
test_close(rk["nonzero_ratio"], 5 / 17, eps=1e-6)

# %% [markdown]
# The adaptive entmax logs its $\alpha$ per head after each epoch (starting at 1.5), and a diverging run is recorded, not raised:

# %%
rh = run_one("fashion_mnist", "headwise_adaptive_entmax", 0, replace(cfg, epochs=1), data)
hist = json.loads(rh["alpha_history"])
test_eq([h["epoch"] for h in hist], [0, 1])
test_eq(hist[0]["alpha"], [[1.5] * 4] * 2)
assert hist[1]["alpha"] != hist[0]["alpha"] and 1.05 < rh["learned_alpha_mean"] < 1.95
nan_data = replace(data, train=replace(data.train, x=torch.full_like(data.train.x, float("nan"))))
bad = run_one("fashion_mnist", "softmax", 0, replace(cfg, epochs=1), nan_data)
test_eq(bad["status"], "failed_nonfinite_loss")

# %%
import tempfile
rows_dir = Path(tempfile.mkdtemp())
rows = run_study_a("synthetic_marker", 3, ["softmax", "sparsemax"], "smoke", rows_dir=rows_dir, train_limit=96, test_limit=50, progress=False)
test_eq(sorted(p.name for p in rows_dir.iterdir()), ["softmax.csv", "sparsemax.csv"])
test_eq([(r["method"], r["seed"], r["profile"], r["train_n"], r["test_n"]) for r in rows],
        [("softmax", 3, "smoke", 96, 50), ("sparsemax", 3, "smoke", 96, 50)])
test_fail(lambda: run_study_a("synthetic_marker", -1, ["softmax"], "smoke"), contains="seed must be")
test_fail(lambda: run_study_a("synthetic_marker", 0, ["softmaxx"], "smoke"), contains="unknown normalizer")
