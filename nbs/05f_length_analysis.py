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
# (rate, step) with the highest mean validation exact match over those seeds; ties go to fewer steps, then to the
# smaller rate. A run that diverged counts 0 from the step it failed at. The choice is **on an edge** where its step lies
# in the last sixth of the run (a longer run might do better) or its rate at an end of the rates tried.

# %%
#| export
import numpy as np
import pandas as pd
from scipy import stats as sps

from sparse_attention_repro.stats import paired_stats, holm, tost_paired, EQUIVALENCE_MARGINS
from sparse_attention_repro.study import BASELINE

# %%
from fastcore.test import test_eq, test_close

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
        g = full.merge(g[["step", "accuracy"]], on="step", how="left").fillna({"accuracy": 0.0})
        out.append(g.assign(**dict(zip(list(ARM) + ["lr", "seed", "steps"], key))))
    cols = list(ARM) + ["lr", "seed", "steps", "step", "accuracy"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)

def choose_recipes(rows: pd.DataFrame, seeds=SELECTION_SEEDS) -> pd.DataFrame:
    """Each arm's (lr, step) by mean validation accuracy over those of `seeds` it has run (ties: fewer steps, then smaller
    rate), with its edges."""
    cur = validation_curves(rows, seeds)
    out = []
    for arm, g in cur.groupby(list(ARM), sort=False):
        n = g.groupby(["lr", "steps", "step"]).seed.nunique()
        mean = g.groupby(["lr", "steps", "step"]).accuracy.mean()[n == g.seed.nunique()].reset_index()   # points every seed has
        if mean.empty: continue
        best = mean.sort_values(["accuracy", "step", "lr"], ascending=[False, True, True]).iloc[0]
        rates = sorted(g.lr.unique())
        out.append(dict(zip(ARM, arm), lr=best.lr, step=int(best.step), steps=int(best.steps), val_accuracy=best.accuracy,
                        step_edge=bool(best.step > EDGE_FRACTION * best.steps),
                        rate_edge=bool(len(rates) > 1 and best.lr in (rates[0], rates[-1]))))
    return pd.DataFrame(out, columns=list(ARM) + ["lr", "step", "steps", "val_accuracy", "step_edge", "rate_edge"])

# %% [markdown]
# A hand-made table checks the rule: two rates, three seeds, kept steps 10–40; the mean curve of rate 0.001 peaks at
# step 20 (0.9) and is matched at step 40 (ties go to fewer steps); rate 0.003 diverges after step 10 (0 from then on).

# %%
def toy_rows():
    rows = []
    for s in (0, 1, 2):
        for step, acc in zip((10, 20, 30, 40), (0.5, 0.9, 0.8, 0.9)):
            rows.append(dict(task="t", normalizer="softmax", positions="nape", lr=0.001, seed=s, steps=40, split="validation",
                             step=step, length=np.nan, accuracy=acc + (s - 1) * 0.01))
        rows.append(dict(task="t", normalizer="softmax", positions="nape", lr=0.003, seed=s, steps=40, split="validation",
                         step=10, length=np.nan, accuracy=0.4))
    return pd.DataFrame(rows)

r = choose_recipes(toy_rows())
test_eq(r[["lr", "step", "step_edge", "rate_edge"]].values.tolist(), [[0.001, 20, False, True]])
test_close(r.val_accuracy.iloc[0], 0.9)
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
                rows.append(dict(task="t", normalizer=norm, positions="nape", lr=0.001, seed=s, steps=40, split="test", step=20,
                                 length=L, accuracy=base - drop + 0.02 * s + (0.01 * (s % 2) if norm == "entmax15" else 0)))
                if norm == "entmax15" and L == 64:
                    rows.append(dict(task="t", normalizer=norm, positions="nape", lr=0.001, seed=s, steps=40, split="validation",
                                     step=20, length=np.nan, accuracy=0.9))
    return pd.DataFrame(rows)

rows = toy_tests()
rec = choose_recipes(rows)
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
# own recipes), with a 95 % interval, a paired t-test, and TOST at the study's margin. Holm runs within a task's family:
# every normalizer at every length of that task and position scheme.

# %%
#| export
LENGTH_MARGIN = EQUIVALENCE_MARGINS["length"]

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
            out.append(dict(task=task, positions=pos, length=int(length), normalizer=norm, baseline=baseline, **r,
                            margin=LENGTH_MARGIN, p_tost=tost_paired(a[common], base[common], LENGTH_MARGIN)))
    cols = ["task", "positions", "length", "normalizer", "baseline", "n", "mean_delta", "ci_low", "ci_high", "t", "p", "cohen_dz",
            "margin", "p_tost", "p_holm"]
    if not out: return pd.DataFrame(columns=cols)
    return holm(pd.DataFrame(out), family_cols=("task", "positions"))[cols]

# %%
g = length_gains(rows, rec).set_index(["normalizer", "length"])
test_close(g.loc[("entmax15", 64), "mean_delta"], 0.104)                 # 0.1 + 0.01 on seeds 1 and 3
test_eq(g.loc[("entmax15", 64), "n"], 5)
test_eq(len(g), 2)
assert (g.p_holm >= g.p).all()


# %% [markdown]
# ## The tables and the figure of a folder
#
# `length_tables` writes the analysis of a results folder into its `tables/` (each table declared once here: its file
# and its producer) and the figure into `figures/`: exact match against test length on a log axis, a panel per task
# (and position scheme), a line per normalizer with its 95 % band, and the best-of-3-seeds reading dashed.

# %%
#| export
LENGTH_TABLES = {"length_recipes.csv": "choose_recipes", "length_accuracy.csv": "length_accuracy", "length_gains.csv": "length_gains"}

def length_tables(folder, recipes=None) -> dict:
    """Write the length study's tables (`LENGTH_TABLES`) and figure for the results folder `folder`, at the given
    (frozen) `recipes`, else at recipes chosen from its rows now; returns the tables."""
    from pathlib import Path
    from sparse_attention_repro.runner import save_rows
    from sparse_attention_repro.study import STUDIES
    folder = Path(folder)
    rows = pd.read_csv(STUDIES["length"].results_path(folder))
    recipes = choose_recipes(rows) if recipes is None else recipes
    tables = {"length_recipes.csv": recipes, "length_accuracy.csv": length_accuracy(rows, recipes),
              "length_gains.csv": length_gains(rows, recipes)}
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
    toy_tests().assign(n=10, train_loss=np.nan, seconds=1.0, status="ok").to_csv(Path(d) / "length_runs.csv", index=False)
    tabs = length_tables(d)
    test_eq(sorted(p.name for p in (Path(d) / "tables").iterdir()), sorted(LENGTH_TABLES))
    assert (Path(d) / "figures" / "accuracy_vs_length.png").stat().st_size > 0
    test_eq(len(tabs["length_accuracy.csv"]), 4)
