# %% [markdown]
# # The length study's analysis
#
# > Each arm's recipe chosen on validation at the training lengths, accuracy against test length with its interval over seeds, gains over softmax with Holm, and what a best-of-3-seeds report would have said.

# %%
#| default_exp length_analysis

# %% [markdown]
# Everything here reads `length_runs.csv` (one row per validation and per tested length of every run, the schema of
# `length_train.run_rows`) and returns tables; nothing trains.
#
# **The recipe of an arm** (a task, a normalizer, a position scheme) is its learning rate and its number of steps, chosen
# together on the validation curves of the selection seeds, which are measured at the training lengths only: the
# (rate, step) with the highest mean validation exact match over those seeds; ties — common, since an easy task's
# validation set is often all right at many steps — go to the lower mean validation cross-entropy, then to fewer steps,
# then to the smaller rate (means compared to 12 decimals, so that summation order cannot break a tie). A run that
# diverged counts 0 from the step it failed at. The choice is **on an edge** where its rate first reached its best mean
# exact match in the last sixth of the run (the curve was still climbing: a longer run might do better), or where its
# rate is at an end of the rates tried. Once exact match has stopped climbing, the loss keeps falling for as long as the
# model trains, so an arm whose exact match saturated early is read near the end of its run — at the same maturity as
# every other such arm — without being an edge.

# %%
#| export
import numpy as np
import pandas as pd
from scipy import stats as sps

from sparse_attention_repro.stats import paired_stats, holm, tost_paired, fmt_pt, EQUIVALENCE_MARGINS
from sparse_attention_repro.study import BASELINE

# %%
from fastcore.test import test_eq, test_close

# %%
#| export
def load_length_runs(path):
    """The rows of a length grid's `length_runs.csv` (a path), every one kept: a run that diverged counts 0 from the
    step it failed at; None where the file is missing (the study's loader)."""
    from pathlib import Path
    return pd.read_csv(path) if path is not None and Path(path).is_file() else None

# %%
#| export
ARM = ("task", "normalizer", "positions")
SELECTION_SEEDS = (0, 1, 2)
EDGE_FRACTION = 5 / 6                     # a chosen step beyond this fraction of its run is on an edge

def validation_curves(rows: pd.DataFrame, seeds=SELECTION_SEEDS) -> pd.DataFrame:
    """Validation accuracy of each run of `seeds` at every kept step of its run (a diverged run's missing steps at 0), each
    task's runs read at their longest run length: columns ARM + lr, seed, steps, step, accuracy."""
    v = rows[(rows.split == "validation") & rows.seed.isin(seeds)]
    v = v[v.steps == v.groupby("task").steps.transform("max")]                 # a task's runs at their longest (extended) length
    out = []
    for key, g in v.groupby(list(ARM) + ["lr", "seed", "steps"], sort=False):
        every = int(g.step.min()) if len(g) else 1
        full = pd.DataFrame({"step": np.arange(every, int(key[-1]) + 1, every)})   # the steps a finished run keeps
        g = full.merge(g[["step", "accuracy", "loss"]], on="step", how="left").fillna({"accuracy": 0.0})
        out.append(g.assign(**dict(zip(list(ARM) + ["lr", "seed", "steps"], key))))
    cols = list(ARM) + ["lr", "seed", "steps", "step", "accuracy", "loss"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)

def choose_recipes(rows: pd.DataFrame, seeds=SELECTION_SEEDS) -> pd.DataFrame:
    """Each arm's (lr, step) by mean validation accuracy over those of `seeds` it has run (ties: fewer steps, then smaller
    rate), with its edges."""
    cur = validation_curves(rows, seeds)
    out = []
    for arm, g in cur.groupby(list(ARM), sort=False):
        by = g.groupby(["lr", "steps", "step"])
        mean = by.agg(accuracy=("accuracy", "mean"), loss=("loss", "mean"), seeds=("seed", "nunique"))
        mean = mean[mean.seeds == g.seed.nunique()].reset_index()                 # points every seed has
        if mean.empty: continue
        mean["accuracy"] = mean.accuracy.round(12)
        best = mean.sort_values(["accuracy", "loss", "step", "lr"], ascending=[False, True, True, True], na_position="last").iloc[0]
        first_best = int(mean[(mean.lr == best.lr) & (mean.accuracy == best.accuracy)].step.min())   # when that rate first got there
        rates = sorted(g.lr.unique())
        out.append(dict(zip(ARM, arm), lr=best.lr, step=int(best.step), steps=int(best.steps), val_accuracy=best.accuracy,
                        val_loss=best.loss, first_best_step=first_best, rates=len(rates),
                        step_edge=bool(first_best > EDGE_FRACTION * best.steps),
                        rate_edge=bool(len(rates) > 1 and best.lr in (rates[0], rates[-1]))))
    return pd.DataFrame(out, columns=list(ARM) + ["lr", "step", "steps", "val_accuracy", "val_loss", "first_best_step", "rates",
                                                  "step_edge", "rate_edge"])

# %% [markdown]
# A hand-made table checks the rule: two rates, three seeds, kept steps 10–40; the mean curve of rate 0.001 peaks at
# step 20 (0.9) and is matched at step 40, whose loss is lower (the tie goes to it); rate 0.003 diverges after step 10
# (0 from then on). With equal losses the tie goes to fewer steps.

# %%
def toy_rows():
    rows = []
    for s in (0, 1, 2):
        for step, acc in zip((10, 20, 30, 40), (0.5, 0.9, 0.8, 0.9)):
            rows.append(dict(task="t", normalizer="softmax", positions="nape", lr=0.001, seed=s, steps=40, split="validation",
                             step=step, length=np.nan, accuracy=acc + (s - 1) * 0.01, loss=1 / step))
        rows.append(dict(task="t", normalizer="softmax", positions="nape", lr=0.003, seed=s, steps=40, split="validation",
                         step=10, length=np.nan, accuracy=0.4, loss=1.0))
    return pd.DataFrame(rows)

r = choose_recipes(toy_rows())
test_eq(r[["lr", "step", "first_best_step", "step_edge", "rate_edge", "rates"]].values.tolist(), [[0.001, 40, 20, False, True, 2]])
late = toy_rows().assign(accuracy=lambda d: np.where(d.step == 40, 0.95, d.accuracy))    # still climbing at the end
test_eq(choose_recipes(late)[["step", "first_best_step", "step_edge"]].values.tolist(), [[40, 40, True]])
test_close(r.val_accuracy.iloc[0], 0.9)
test_eq(choose_recipes(toy_rows().assign(loss=0.5)).step.tolist(), [20])
test_eq(len(validation_curves(toy_rows()).query("lr == 0.003")), 12)      # 4 steps x 3 seeds, 3 of them filled with 0


# %% [markdown]
# ## Accuracy against length
#
# At each arm's recipe, every seed's weights at the chosen step are tested at every length; the table gives the mean
# exact match over seeds with a 95 % t-interval, and beside it what a **best-of-3-seeds** report gives: of the first
# three seeds, the one whose test accuracy averaged over the lengths is highest, reported at each length (one model, as
# the anchor reports one model per normalizer).

# %%
#| export
def tested_at_recipes(rows: pd.DataFrame, recipes: pd.DataFrame) -> pd.DataFrame:
    "The test rows of each arm's runs at its chosen rate and step (every seed that has them)."
    t = rows[rows.split == "test"]
    keep = recipes[list(ARM) + ["lr", "step", "steps"]]
    return t.merge(keep, on=list(ARM) + ["lr", "step", "steps"], how="inner")

def _t_interval(x):
    x = np.asarray(x, float)
    if len(x) < 2: return (np.nan, np.nan)
    h = sps.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return (x.mean() - h, x.mean() + h)

ACCURACY_COLS = list(ARM) + ["length", "seeds", "accuracy", "ci_low", "ci_high", "best_of_3", "best_seed"]

def length_accuracy(rows: pd.DataFrame, recipes: pd.DataFrame, best_of=SELECTION_SEEDS) -> pd.DataFrame:
    "Per arm and test length: seeds, mean exact match, its 95% t-interval, and the best-of-`best_of` seed's accuracy."
    t = tested_at_recipes(rows, recipes)
    out = []
    for arm, g in t.groupby(list(ARM), sort=False):
        first = g[g.seed.isin(best_of)]
        best_seed = first.groupby("seed").accuracy.mean().idxmax() if len(first) else None
        for length, h in g.groupby("length"):
            lo, hi = _t_interval(h.accuracy)
            b = h[h.seed == best_seed].accuracy
            out.append(dict(zip(ARM, arm), length=int(length), seeds=len(h), accuracy=h.accuracy.mean(), ci_low=lo, ci_high=hi,
                            best_of_3=float(b.iloc[0]) if len(b) else np.nan, best_seed=best_seed))
    return pd.DataFrame(out, columns=ACCURACY_COLS)

# %%
def toy_tests():
    rows = toy_rows().to_dict("records")
    for norm, base in (("softmax", 0.5), ("entmax15", 0.6)):
        for s in range(5):
            for L, drop in ((64, 0.0), (128, 0.2)):
                rows.append(dict(task="t", normalizer=norm, positions="nape", lr=0.001, seed=s, steps=40, split="test", step=20, loss=0.1,
                                 length=L, accuracy=base - drop + 0.02 * s + (0.01 * (s % 2) if norm == "entmax15" else 0)))
                if norm == "entmax15" and L == 64:
                    rows.append(dict(task="t", normalizer=norm, positions="nape", lr=0.001, seed=s, steps=40, split="validation",
                                     step=20, length=np.nan, accuracy=0.9, loss=0.01))
    return pd.DataFrame(rows)

rows = toy_tests()
rec = choose_recipes(rows.assign(loss=rows.loss.where(rows.step != 40, 1.0)))     # softmax tested at its step 20: make 40 no better
test_eq(rec.set_index("normalizer").loc["entmax15", "step"], 20)
acc = length_accuracy(rows, rec).set_index(["normalizer", "length"])
test_close(acc.loc[("softmax", 64), "accuracy"], 0.54)                      # 0.5 + 0.02 * mean(0..4)
test_close(acc.loc[("softmax", 128), "best_of_3"], 0.34)                    # seed 2 of 0-2: 0.3 + 0.04
lo, hi = acc.loc[("softmax", 64), ["ci_low", "ci_high"]]
x = 0.5 + 0.02 * np.arange(5)
test_close(hi - lo, 2 * sps.t.ppf(0.975, 4) * x.std(ddof=1) / np.sqrt(5))


# %% [markdown]
# ## Gains over softmax
#
# At each task, position scheme and length, every normalizer's accuracy minus softmax's, paired by seed (both at their
# own recipes), with a 95 % t-interval and TOST at the study's margin. The p-value of the difference is an exact
# **sign-flip permutation test** (every one of the $2^n$ sign patterns of the paired differences; a fixed sample of
# 100,000 beyond 16 pairs): at long lengths accuracies pile up at 0 and 100 %, where a t-test is unreliable and a
# constant difference has no t at all, yet ten seeds that all differ the same way are evidence. Holm runs within a task's
# family: every normalizer at every length of that task and position scheme. The verdict: *better* / *worse* (Holm
# p < 0.05, by the sign of the mean), else *equivalent* (TOST p < 0.05, not adjusted), else *undecided*.

# %%
#| export
LENGTH_MARGIN = EQUIVALENCE_MARGINS["length"]

def sign_flip_p(d, exact_up_to: int = 16, samples: int = 100_000, seed: int = 0) -> float:
    "Two-sided p of the paired differences `d` under random signs: |mean| at least the observed one (NaN below 2 pairs)."
    d = np.asarray(d, float)
    if len(d) < 2: return np.nan
    if len(d) <= exact_up_to:
        signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)        # every sign pattern
    else: signs = np.random.default_rng(seed).choice([-1.0, 1.0], (samples, len(d)))
    return float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))

def verdict(mean_delta: float, p_holm: float, p_tost: float, alpha: float = 0.05) -> str:
    "better / worse (Holm), equivalent (TOST), undecided."
    if np.isfinite(p_holm) and p_holm < alpha: return "better" if mean_delta > 0 else "worse"
    if np.isfinite(p_tost) and p_tost < alpha: return "equivalent"
    return "undecided"

def length_gains(rows: pd.DataFrame, recipes: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    "Paired gains over `baseline` per task, positions, length and normalizer; Holm within (task, positions)."
    t = tested_at_recipes(rows, recipes)
    out = []
    for (task, pos, length), g in t.groupby(["task", "positions", "length"], sort=False):
        base = g[g.normalizer == baseline].set_index("seed").accuracy
        for norm, h in g[g.normalizer != baseline].groupby("normalizer", sort=False):
            a = h.set_index("seed").accuracy
            common = a.index.intersection(base.index)
            r = paired_stats(a[common], base[common])
            r["p"] = sign_flip_p(a[common].to_numpy() - base[common].to_numpy())
            out.append(dict(task=task, positions=pos, length=int(length), normalizer=norm, baseline=baseline, **r,
                            margin=LENGTH_MARGIN, p_tost=tost_paired(a[common], base[common], LENGTH_MARGIN)))
    cols = ["task", "positions", "length", "normalizer", "baseline", "n", "mean_delta", "ci_low", "ci_high", "p", "cohen_dz",
            "margin", "p_tost", "p_holm", "verdict"]
    if not out: return pd.DataFrame(columns=cols)
    df = holm(pd.DataFrame(out), family_cols=("task", "positions"))
    df["verdict"] = [verdict(m, ph, pt) for m, ph, pt in zip(df.mean_delta, df.p_holm, df.p_tost)]
    return df[cols]

# %%
test_close(sign_flip_p([1.0] * 10), 2 / 1024)                                  # ten seeds, all one way: 2 of 1,024 patterns
import itertools
def brute_sign_flip(d):                                                        # every pattern written out
    sums = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(v >= abs(sum(d)) for v in sums) / len(sums)
for d in ([1.0, -1.0, 2.0], [3.0, 1.0, 2.0], [0.5, 0.2, -0.1, 0.4, 0.3]):
    test_close(sign_flip_p(d), brute_sign_flip(d))
test_close(sign_flip_p(np.ones(20), samples=20000), 0.0, eps=1e-3)           # beyond 16 pairs: sampled
test_eq(verdict(0.3, 0.01, 0.9), "better"); test_eq(verdict(-0.3, 0.01, 0.9), "worse"); test_eq(verdict(0.0, 0.5, 0.01), "equivalent")
g = length_gains(rows, rec).set_index(["normalizer", "length"])
test_close(g.loc[("entmax15", 64), "mean_delta"], 0.104)                 # 0.1 + 0.01 on seeds 1 and 3
test_eq(g.loc[("entmax15", 64), "n"], 5)
test_eq(len(g), 2)
assert (g.p_holm >= g.p).all()


# %% [markdown]
# ## Budgets, and whether the task was learned
#
# `length_budgets` reads the selection seeds at their arm's chosen rate at every step they were tested at (the budgets
# stage tests a quarter, half and all of the run): accuracy against length at several step budgets. `task_learned`
# applies the protocol's gate: a task (and position scheme) on which softmax does not reach 95 % exact match at the
# shortest test length answers nothing, and its gains are not read.

# %%
#| export
LEARNED_AT = 0.95

def length_budgets(rows: pd.DataFrame, recipes: pd.DataFrame, seeds=SELECTION_SEEDS) -> pd.DataFrame:
    "Mean exact match of each arm's `seeds` at its chosen rate, per tested step and length."
    t = rows[(rows.split == "test") & rows.seed.isin(seeds)].merge(recipes[list(ARM) + ["lr", "steps"]], on=list(ARM) + ["lr", "steps"])
    cols = list(ARM) + ["step", "length", "seeds", "accuracy"]
    if t.empty: return pd.DataFrame(columns=cols)
    out = t.groupby(list(ARM) + ["step", "length"]).agg(seeds=("seed", "nunique"), accuracy=("accuracy", "mean")).reset_index()
    return out[cols]

def task_learned(acc: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    "Per task and positions: the baseline's mean exact match at its shortest test length, and whether it reaches 95 %."
    b = acc[acc.normalizer == baseline]
    if b.empty: return pd.DataFrame(columns=["task", "positions", "length", "accuracy", "learned"])
    first = b.sort_values("length").groupby(["task", "positions"], sort=False).head(1)
    return first.assign(learned=first.accuracy >= LEARNED_AT)[["task", "positions", "length", "accuracy", "learned"]]

# %%
bud = length_budgets(rows, rec)
test_eq(sorted(set(bud.step)), [20]); test_eq(bud.seeds.max(), 3)
learned = task_learned(length_accuracy(rows, rec))
test_eq(learned[["length", "learned"]].values.tolist(), [[64, False]])       # the toy softmax reaches 54 % at 64 tokens


# %% [markdown]
# ## The anchor beside us
#
# Every number the anchor reports (`study.LENGTH_ANCHOR`), beside ours at the same task, normalizer and ratio of test
# length to the longest training input: our mean over seeds with its interval, and our best-of-3 reading, which is the
# one comparable in kind to theirs. A row we have not run says so. The scale differs on every row: see the protocol.

# %%
#| export
from sparse_attention_repro.study import LENGTH_ANCHOR, LENGTH_ANCHOR_TRAIN_MAX

def anchor_table(acc: pd.DataFrame, positions: str = "nape") -> pd.DataFrame:
    "The anchor's reported exact match (%) per task, normalizer and length ratio, beside ours (`length_accuracy` rows) under `positions`."
    ours = acc[acc.positions == positions].set_index(["task", "normalizer", "length"]) if len(acc) else None
    out = []
    for (task, norm), by_ratio in LENGTH_ANCHOR.items():
        for ratio, theirs in by_ratio.items():
            L = int(round(ratio * LENGTH_ANCHOR_TRAIN_MAX))
            r = ours.loc[(task, norm, L)] if ours is not None and (task, norm, L) in ours.index else None
            out.append(dict(task=task, normalizer=norm, ratio=ratio, length=L, anchor_best_of_3=theirs,
                            ours_mean=np.nan if r is None else 100 * r.accuracy, ours_ci_low=np.nan if r is None else 100 * r.ci_low,
                            ours_ci_high=np.nan if r is None else 100 * r.ci_high, ours_best_of_3=np.nan if r is None else 100 * r.best_of_3,
                            seeds=0 if r is None else int(r.seeds), note="" if r is not None else "not run here yet"))
    return pd.DataFrame(out)

# %%
a = anchor_table(pd.DataFrame([dict(task="sort", normalizer="entmax15", positions="nape", length=128, seeds=10, accuracy=0.5,
                                    ci_low=0.4, ci_high=0.6, best_of_3=0.7, best_seed=1)]))
row = a[(a.task == "sort") & (a.normalizer == "entmax15") & (a.ratio == 2)].iloc[0]
test_eq((row.anchor_best_of_3, row.ours_mean, row.ours_best_of_3, row.seeds, row.note), (100.0, 50.0, 70.0, 10, ""))
test_eq(a[(a.task == "reverse") & (a.ratio == 1.5)].length.unique().tolist(), [96])
test_eq(len(a), sum(len(v) for v in LENGTH_ANCHOR.values()))


# %% [markdown]
# ## What the track cost
#
# Core-hours per task and normalizer, from the rows: each run's training seconds (its last validation row's, which
# exclude validation) and its tests' seconds, every run on one thread.

# %%
#| export
def length_cost(rows: pd.DataFrame) -> pd.DataFrame:
    "Runs, training and test core-hours per task and normalizer (one thread per run)."
    run = ["task", "normalizer", "positions", "lr", "seed", "steps"]
    v, t = rows[rows.split == "validation"], rows[rows.split == "test"]
    train = v.groupby(run).seconds.max().groupby(["task", "normalizer"]).agg(["count", "sum"])
    test = t.groupby(["task", "normalizer"]).seconds.sum()
    out = pd.DataFrame({"runs": train["count"], "train_core_hours": train["sum"] / 3600,
                        "test_core_hours": test.reindex(train.index).fillna(0.0) / 3600}).reset_index()
    return out.assign(core_hours=out.train_core_hours + out.test_core_hours)

# %%
c = length_cost(rows.assign(seconds=np.where(rows.split == "test", 36.0, rows.step * 3.6)))
test_eq(c.set_index("normalizer").runs.to_dict(), {"entmax15": 5, "softmax": 6})   # validated runs: 5 seeds; 2 rates x 3 seeds
test_close(c.set_index("normalizer").loc["entmax15", "train_core_hours"], 5 * 20 * 3.6 / 3600)


# %% [markdown]
# ## The tables and the figure of a folder
#
# `length_tables` writes the analysis of a results folder into its `tables/` (each table declared once here: its file
# and its producer) and the figure into `figures/`: exact match against test length on a log axis, a panel per task
# (and position scheme), a line per normalizer with its 95 % band, and the best-of-3-seeds reading dashed.

# %%
#| export
LENGTH_TABLES = {"length_recipes.csv": "choose_recipes", "length_accuracy.csv": "length_accuracy", "length_gains.csv": "length_gains",
                 "length_budgets.csv": "length_budgets", "length_learned.csv": "task_learned", "length_cost.csv": "length_cost",
                 "length_anchor.csv": "anchor_table"}

def length_tables(folder, recipes=None) -> dict:
    """Write the length study's tables (`LENGTH_TABLES`) and figure for the results folder `folder`, at the given
    (frozen) `recipes`, else at recipes chosen from its rows now; returns the tables."""
    from pathlib import Path
    from sparse_attention_repro.runner import save_rows
    from sparse_attention_repro.study import STUDIES
    folder = Path(folder)
    rows = STUDIES["length"].load(folder)
    recipes = choose_recipes(rows) if recipes is None else recipes
    acc = length_accuracy(rows, recipes)
    tables = {"length_recipes.csv": recipes, "length_accuracy.csv": acc, "length_gains.csv": length_gains(rows, recipes),
              "length_budgets.csv": length_budgets(rows, recipes), "length_learned.csv": task_learned(acc),
              "length_cost.csv": length_cost(rows), "length_anchor.csv": anchor_table(acc)}
    for name, df in tables.items(): save_rows(df, folder / "tables" / name)
    if len(tables["length_accuracy.csv"]): accuracy_figure(tables["length_accuracy.csv"], folder / "figures" / "accuracy_vs_length.png")
    return tables

def accuracy_figure(acc: pd.DataFrame, path):
    "Exact match against test length (log axis), a panel per (task, positions), mean over seeds with its 95% band, best-of-3 dashed."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sparse_attention_repro.files import atomic_write
    panels = list(acc.groupby(["task", "positions"], sort=False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, ((task, pos), g) in zip(axes[0], panels):
        for i, (norm, h) in enumerate(g.groupby("normalizer", sort=False)):
            h = h.sort_values("length"); c = f"C{i % 10}"
            ax.plot(h.length, 100 * h.accuracy, marker="o", color=c, label=f"{norm} ({int(h.seeds.min())} seeds)")
            ax.fill_between(h.length, 100 * h.ci_low.fillna(h.accuracy), 100 * h.ci_high.fillna(h.accuracy), color=c, alpha=0.15)
            ax.plot(h.length, 100 * h.best_of_3, ls="--", color=c, alpha=0.6)
        ax.set_xscale("log", base=2); ax.set_xlabel("test input length (tokens)"); ax.set_ylabel("exact match (%)")
        ax.set_title(f"{task}, {pos} (dashed: best of 3 seeds)"); ax.set_ylim(-3, 103); ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)

# %%
import tempfile
from pathlib import Path
with tempfile.TemporaryDirectory() as d:
    rows.assign(n=10, train_loss=np.nan, seconds=1.0, status="ok", loss=rows.loss.where(rows.step != 40, 1.0)).to_csv(Path(d) / "length_runs.csv", index=False)
    tabs = length_tables(d)
    test_eq(sorted(p.name for p in (Path(d) / "tables").iterdir()), sorted(LENGTH_TABLES))
    assert (Path(d) / "figures" / "accuracy_vs_length.png").stat().st_size > 0
    test_eq(len(tabs["length_accuracy.csv"]), 4)

# %% [markdown]
# ## The answer, in the README's words
#
# `length_answer` turns the committed tables into the README's length lines, one per task and position scheme: whether
# softmax learned the task, then at the protocol's 16× (every normalizer) and 64× (the headline ones) — the longest
# tested where neither was — softmax's mean exact match and each verdict word with the normalizers that carry it and
# their gains. No number is typed by hand: the README is filled from these tables when it is built.

# %%
#| export
LENGTH_MARKERS = ("<!-- length:start (generated from outputs/length/tables by `sparse-repro readme`; do not edit) -->", "<!-- length:end -->")


ANSWER_RATIOS = (16, 64)                   # the protocol's: 16× for every normalizer, 64× for the headline ones

EXTENSION = 2        # an arm whose chosen step is still climbing lengthens every arm of its task this many times

def edge_arms(recipes: pd.DataFrame) -> pd.DataFrame:
    "The first arm of each (task, positions) whose chosen step is still climbing (`step_edge`): the edge rule's trigger."
    return recipes[recipes.step_edge.astype(bool)].drop_duplicates(["task", "positions"])

def _pending_extension(recipes, task, positions) -> str:
    "A sentence where an arm of the task chose a step still climbing (the edge rule extends every arm), else ''."
    if recipes is None: return ""
    edge = edge_arms(recipes).query("task == @task and positions == @positions")
    if not len(edge): return ""
    e = edge.iloc[0]
    return (f" *Provisional:* `{e.normalizer}` chose step {int(e.step):,} of {int(e.steps):,}, still climbing, so the protocol "
            f"extends every arm ({EXTENSION}× the run length at a time, until no chosen step is still climbing or the cap) and reads "
            f"the selection again; these verdicts are at the {int(e.steps):,}-step recipes.")

def length_answer(acc: pd.DataFrame, gains: pd.DataFrame, learned: pd.DataFrame, ratios=ANSWER_RATIOS, recipes=None) -> str:
    """The README's length lines from the `length_accuracy`, `length_gains` and `task_learned` tables (markdown): per
    task, the verdicts at `ratios` times the shortest test length (where tested), else at the longest tested; with the
    frozen `recipes`, a task whose selection an edge is still lengthening says its verdicts are provisional."""
    lines = []
    for r in learned.itertuples():
        a = acc[(acc.task == r.task) & (acc.positions == r.positions)]
        g = gains[(gains.task == r.task) & (gains.positions == r.positions)]
        head = f"- **{r.task}** ({r.positions} positions; softmax {100 * r.accuracy:.1f} % at {r.length} tokens"
        if not r.learned:
            lines.append(head + f", under the {100 * LEARNED_AT:.0f} % gate): not learned, so no verdict is read."); continue
        tested = set(a.length.astype(int))
        parts = []
        for L in sorted({int(k * r.length) for k in ratios if int(k * r.length) in tested} or {max(tested)}):
            base = a[(a.normalizer == BASELINE) & (a.length == L)]
            at = g[g.length == L]
            if base.empty or at.empty: continue
            words = [f"{w} {', '.join(f'`{x.normalizer}` {fmt_pt(x.mean_delta)}' for x in at[at.verdict == w].itertuples())}"
                     for w in ("better", "worse", "equivalent", "undecided") if (at.verdict == w).any()]
            seeds = f"{int(at.n.min())}–{int(at.n.max())}" if at.n.min() != at.n.max() else f"{int(at.n.min())}"
            parts.append(f"at {L:,} tokens ({L // int(r.length)}×) softmax {100 * base.accuracy.iloc[0]:.1f} %, against it (pt, "
                         f"{seeds} seeds): " + "; ".join(words))
        lines.append(head + "): " + ". ".join(x[0].upper() + x[1:] if i else x for i, x in enumerate(parts)) + "."
                     + _pending_extension(recipes, r.task, r.positions))
    return "\n".join(lines) if lines else "No length run tested yet."

# %%
with tempfile.TemporaryDirectory() as d:
    rows.assign(n=10, train_loss=np.nan, seconds=1.0, status="ok", loss=rows.loss.where(rows.step != 40, 1.0)).to_csv(Path(d) / "length_runs.csv", index=False)
    tabs = length_tables(d)
    _ans = length_answer(tabs["length_accuracy.csv"], tabs["length_gains.csv"], tabs["length_learned.csv"])
_g128 = tabs["length_gains.csv"].set_index("length").loc[128]
test_eq(_ans, f"- **t** (nape positions; softmax 54.0 % at 64 tokens, under the 95 % gate): not learned, so no verdict is read.")
_learned = tabs["length_learned.csv"].assign(accuracy=0.96, learned=True)             # the same tables, as if softmax had learned it
_ans2 = length_answer(tabs["length_accuracy.csv"], tabs["length_gains.csv"], _learned)
assert _ans2.startswith("- **t** (nape positions; softmax 96.0 % at 64 tokens): at 128 tokens (2×) softmax 34.0 %"), _ans2
assert f"`entmax15` {100 * _g128.mean_delta:+.1f}" in _ans2 and f"{_g128.verdict} `entmax15`" in _ans2, _ans2
_edge = tabs["length_recipes.csv"].assign(step_edge=lambda d: d.normalizer == "entmax15", step=950, steps=1000)
assert length_answer(tabs["length_accuracy.csv"], tabs["length_gains.csv"], _learned, recipes=_edge).endswith(
    "*Provisional:* `entmax15` chose step 950 of 1,000, still climbing, so the protocol extends every arm (2× the run length at "
    "a time, until no chosen step is still climbing or the cap) and reads the selection again; these verdicts are at the 1,000-step recipes.")
test_eq(length_answer(tabs["length_accuracy.csv"], tabs["length_gains.csv"], _learned, recipes=_edge.assign(step_edge=False)), _ans2)
