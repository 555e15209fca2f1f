# %% [markdown]
# # Fresh-seed confirmation
# > The tuned labels that claim a difference (*persists*, *reversed*), tested again on seeds no stage has run, at the recipes already chosen.

# %%
#| default_exp fresh_seeds

# %% [markdown]
# A tuned label is read on the seeds whose validation curves also chose each arm's epoch (seeds 0–9, and up to 29 where
# the power stage added seeds). A label that claims a difference — a gain that *persists* or one that is *reversed* — is
# the kind a reader acts on, and the kind a lucky draw of seeds makes. So the **fresh** stage, declared here before its
# runs, tests each such label again where nothing was chosen:
#
# 1. **Which labels.** Every comparison with softmax whose label reads *persists* or *reversed* once the recipes are final
#    (the complete, symmetric and finer stages have nothing left to run). For a new normalizer judged by `tuned
#    --methods … --baseline …`, the comparisons of its fair verdict.
# 2. **Which runs.** Each arm of those comparisons, softmax included, at its chosen learning rate, trained to its chosen
#    epoch on seeds 30–39 (`FRESH_SEEDS`: beyond `MAX_SEEDS`, so no stage has run them). With a constant learning rate, a
#    run to epoch *e* is the first *e* epochs of a longer run (the tuning notebook checks this against the main grid), so
#    nothing is lost by stopping there. The runs go to `<folder>/fresh/`, apart from `tuned/`, so that no recipe or label
#    of the protocol ever reads them; softmax's fresh runs live in the baseline's folder and serve every comparison with it.
# 3. **The reading.** Per comparison, the paired test of the ten fresh pairs' test accuracies, Holm within the folder's
#    confirmation family, TOST at ±1 pt, and the fresh label by the same words (`verdicts.gain_word`). A label is
#    **confirmed** when its fresh label is the same; otherwise it is not, and the fresh label says how it moved.

# %%
#| export
import numpy as np
import pandas as pd
from pathlib import Path
from sparse_attention_repro.study import BASELINE
from sparse_attention_repro.stats import holm, equivalence_word
from sparse_attention_repro.verdicts import gain_word
from sparse_attention_repro.tuning import (MAX_SEEDS, TUNED_MARGIN, grids_of, tuned_comparison, tuned_runs, tuned_curves, diverged,
                                           search_rule, tuned_plan, symmetric_plan, finer_plan, fair_recipe_readings)

# %%
from fastcore.test import test_eq, test_close, test_fail
from scipy import stats as sps

# %%
#| export
FRESH_SEEDS = tuple(range(MAX_SEEDS, MAX_SEEDS + 10))   # seeds 30-39: no stage runs them; declared before the stage's runs
FRESH_WORDS = ("persists", "reversed")                  # the labels that claim a difference, the ones confirmed
FRESH_FOLDER = "fresh"                                  # <folder>/fresh/<dataset>_lr<rate>_ep<epoch>: read by nothing in tuned/

def to_confirm(tests, baseline=BASELINE) -> pd.DataFrame:
    "The comparisons with `baseline` in `tests` (a `tuned_tests` or fair-verdict table) whose `word` claims a difference."
    return tests[(tests.baseline == baseline) & tests.word.isin(FRESH_WORDS)]

# %%
test_eq(FRESH_SEEDS[0], 30); test_eq(len(FRESH_SEEDS), 10)
_tests = pd.DataFrame(dict(dataset=["kmnist", "kmnist", "kmnist", "kmnist", "cifar10"],
                           method=["sparsemax", "entmax15", "topk_softmax_025", "headwise_adaptive_entmax", "sparsemax"],
                           baseline=["softmax", "softmax", "softmax", "entmax15", "softmax"],
                           word=["reversed", "undecided", "persists", "different", "gone"]))
test_eq(to_confirm(_tests).method.tolist(), ["sparsemax", "topk_softmax_025"])    # A5 (against entmax-1.5) is no gain over softmax

# %% [markdown]
# ## The plan
#
# `fresh_plan` turns the labels to confirm into grids: per dataset, each arm and softmax at its chosen (rate, epoch), on
# the fresh seeds it has not run yet; arms that share a (rate, epoch) share a grid, as in every other stage.

# %%
#| export
def fresh_plan(recipes, tests, fresh_curves=None, baseline=BASELINE, seeds=FRESH_SEEDS, sides=("baseline", "compared")) -> list:
    """Grids (`tuning.grids_of` dicts) of every arm of the comparisons `to_confirm` and of `baseline`, at their recipes
    (`recipes`: dataset, method, lr, epoch), on the `seeds` that `fresh_curves` (the fresh runs so far) lacks; `sides`
    plans the baseline's arm, the compared arms, or both (a new normalizer's runs and softmax's go to different folders)."""
    rec, plan = recipes.set_index(["dataset", "method"]), []
    for ds, g in to_confirm(tests, baseline).groupby("dataset", sort=False):
        wants = {}
        for m in [baseline] * ("baseline" in sides) + list(g.method) * ("compared" in sides):
            r = rec.loc[(ds, m)]
            ran = set() if fresh_curves is None or not len(fresh_curves) else set(fresh_curves[
                (fresh_curves.dataset == ds) & (fresh_curves.method == m) & np.isclose(fresh_curves.lr, r.lr) & (fresh_curves.epoch == r.epoch)].seed)
            for s in seeds:
                if s not in ran: wants.setdefault((float(r.lr), int(r.epoch), s), []).append(m)
        plan += grids_of(ds, wants)
    return plan

# %% [markdown]
# On KMNIST, sparsemax (reversed) and top-k 0.25 (persists) are confirmed against softmax; softmax and top-k share the
# recipe 3·10⁻³ at 36 epochs and so a grid, sparsemax runs 35 epochs at 10⁻³. Once seeds 30–34 of softmax have run, only
# 35–39 are left for it.

# %%
_rec = pd.DataFrame(dict(dataset="kmnist", method=["softmax", "sparsemax", "entmax15", "topk_softmax_025"],
                         lr=[3e-3, 1e-3, 3e-3, 3e-3], epoch=[36, 35, 52, 36], complete=True, lr_bracketed=True, epoch_bracketed=True))
_fp = fresh_plan(_rec, _tests)
test_eq([(p["lr"], p["epochs"], p["methods"], p["seeds"], p["folder"]) for p in _fp],
        [(1e-3, 35, ["sparsemax"], list(range(30, 40)), "kmnist_lr0.001_ep35"),
         (3e-3, 36, ["softmax", "topk_softmax_025"], list(range(30, 40)), "kmnist_lr0.003")])   # 36 is the declared length: no suffix
_ran = pd.DataFrame(dict(dataset="kmnist", method="softmax", lr=3e-3, epoch=36, seed=range(30, 35)))
test_eq([(p["methods"], p["seeds"]) for p in fresh_plan(_rec, _tests, _ran)],
        [(["sparsemax"], list(range(30, 40))), (["topk_softmax_025"], list(range(30, 35))),
         (["softmax", "topk_softmax_025"], list(range(35, 40)))])       # two grids into one folder, on distinct seeds
test_eq([p["methods"] for p in fresh_plan(_rec, _tests, sides=("baseline",))], [["softmax"]])
test_eq([p["methods"] for p in fresh_plan(_rec, _tests, sides=("compared",))], [["sparsemax"], ["topk_softmax_025"]])
test_eq(fresh_plan(_rec, _tests[_tests.word == "gone"]), [])                               # nothing claims a difference: nothing to run

# %% [markdown]
# ## The reading
#
# `fresh_confirmation` reads each comparison on the fresh seeds with the tuned protocol's own paired comparison
# (`tuning.tuned_comparison`: the arms at their recipes, paired by seed), Holm over the rows (the folder's confirmation
# family), and the fresh label by the same words as the label it re-tests.

# %%
#| export
FRESH_COLS = ["dataset", "method", "baseline", "recipe", "baseline_recipe", "label", "n", "complete", "gain", "ci_low", "ci_high",
              "p", "p_holm", "p_tost", "fresh_word", "confirmed"]

def fresh_confirmation(fresh_curves, recipes, tests, baseline=BASELINE, seeds=FRESH_SEEDS) -> pd.DataFrame:
    """Each label `to_confirm` in `tests`, read on the fresh runs (`fresh_curves`) at the recipes of `recipes`: the paired
    gain over `baseline`, Holm within the table, TOST at ±1 pt, the fresh label and whether it confirms the label."""
    todo = to_confirm(tests, baseline)
    if not len(todo) or fresh_curves is None or not len(fresh_curves): return pd.DataFrame(columns=FRESH_COLS)
    rec, rows = recipes.set_index(["dataset", "method"]), []
    for t in todo.itertuples():
        c = tuned_comparison(fresh_curves, rec, t.dataset, t.method, baseline, "fresh", TUNED_MARGIN)
        rows.append(dict(family="fresh", dataset=t.dataset, method=t.method, baseline=baseline, recipe=c["recipe"],
                         baseline_recipe=c["baseline_recipe"], label=t.word, n=c["n"], complete=c["n"] == len(seeds), gain=c["gain"],
                         ci_low=c["ci_low"], ci_high=c["ci_high"], p=c["p"], p_tost=c["p_tost"]))
    out = holm(pd.DataFrame(rows))
    out["fresh_word"] = [gain_word(g, ph, equivalence_word(pt, ph) == "equivalent") for g, ph, pt in zip(out.gain, out.p_holm, out.p_tost)]
    out["confirmed"] = out.fresh_word == out.label
    return out[FRESH_COLS]

# %% [markdown]
# Hand-made fresh runs: top-k 0.25 1.5 pt below softmax on every fresh seed (a small spread), sparsemax within a few tenths of it.
# Sparsemax's "reversed" is not confirmed (its fresh label is *gone*), and top-k's "persists" is not confirmed either: it
# reads *reversed*. The p-values are scipy's paired t-test on the same numbers, and Holm over two is checked by hand.

# %%
_rng = np.random.default_rng(0)
_soft = 0.92 + 0.003 * _rng.standard_normal(10)
_acc = dict(softmax=_soft, topk_softmax_025=_soft - 0.015 + 0.002 * _rng.standard_normal(10),
            sparsemax=_soft + 0.0005 + 0.003 * _rng.standard_normal(10))
_fc = pd.DataFrame([dict(dataset="kmnist", method=m, seed=30 + i, lr=r.lr, epoch=e, val_accuracy=0.5, test_accuracy=(a[i] if e == r.epoch else 0.1))
                    for m, a in _acc.items() for r in [_rec.set_index("method").loc[m]] for i in range(10) for e in (r.epoch - 1, r.epoch)])
_fcf = fresh_confirmation(_fc, _rec, _tests).set_index("method")
_p = {m: sps.ttest_rel(_acc[m], _soft).pvalue for m in ("sparsemax", "topk_softmax_025")}
test_close([_fcf.p[m] for m in _p], list(_p.values()), eps=1e-9)
_lo, _hi = sorted(_p.values())
test_close(sorted(_fcf.p_holm), [min(1, 2 * _lo), max(min(1, 2 * _lo), _hi)], eps=1e-9)
test_close(_fcf.loc["topk_softmax_025", "gain"], (_acc["topk_softmax_025"] - _soft).mean(), eps=1e-12)
test_eq(_fcf[["label", "fresh_word", "confirmed", "n", "complete"]].values.tolist(),
        [["reversed", "gone", False, 10, True], ["persists", "reversed", False, 10, True]])
_more = _tests.assign(word=["reversed", "undecided", "reversed", "different", "gone"])      # top-k's label as the fresh runs read it
test_eq(fresh_confirmation(_fc, _rec, _more).set_index("method").confirmed.to_dict(), {"sparsemax": False, "topk_softmax_025": True})
test_eq(fresh_confirmation(_fc[_fc.seed < 35], _rec, _more).complete.tolist(), [False, False])   # five pairs: not the declared ten
test_eq(len(fresh_confirmation(_fc.iloc[:0], _rec, _tests)), 0)

# %% [markdown]
# ## A results folder's stage
#
# The labels re-tested are the folder's own: Study A's tuned tests (`tuning.fair_recipe_readings`), or, for a new
# normalizer judged against a baseline folder, its fair verdict. The stage runs only once the recipes are final:
# `waiting_stages` lists what the complete, symmetric and finer stages still need in a folder, and the command refuses
# while anything is listed.

# %%
#| export
def waiting_stages(results_dir, search=None) -> dict:
    "{stage: grids still to run} of the stages that must finish before the fresh one (complete, symmetric, finer) in `results_dir`."
    runs = tuned_runs(results_dir)
    curves, failed, rule = tuned_curves(runs), diverged(runs), search_rule(results_dir)
    plans = dict(complete=tuned_plan(curves, failed, search, stage="complete", rule=rule),
                 symmetric=symmetric_plan(curves, failed, search, rule=rule), finer=finer_plan(curves, failed, search, rule=rule))
    return {k: len(v) for k, v in plans.items() if v}

def fresh_curves(*folders) -> pd.DataFrame:
    "The learning curves of the fresh runs under each of `folders` (`<folder>/fresh/*/runs.csv`), together."
    return pd.concat([tuned_curves(tuned_runs(f, FRESH_FOLDER)) for f in folders], ignore_index=True)

def labels_to_confirm(results_dir, main_runs=None, baseline_dir=None, methods=()) -> tuple:
    """(recipes, tests) whose labels the fresh stage re-tests: `results_dir`'s tuned tests, or with `baseline_dir` the fair
    verdicts of `methods` (new normalizers under `results_dir`) against the baselines there."""
    if baseline_dir is None:
        r = fair_recipe_readings(results_dir, main_runs)
        return r["recipes"], r["tests"]
    from sparse_attention_repro.tuned_reading import fair_verdict
    got = [fair_verdict(results_dir, baseline_dir, m)[:2] for m in methods]
    return (pd.concat([r for _, r in got], ignore_index=True).drop_duplicates(["dataset", "method"]),
            pd.concat([t for t, _ in got], ignore_index=True))

def write_fresh_confirmation(results_dir, baseline_dir, methods) -> Path:
    "A new normalizer's confirmation table beside its fair verdict: `<results_dir>/fresh_confirmation.csv` (softmax's runs from `baseline_dir`)."
    from sparse_attention_repro.files import atomic_write
    recipes, tests = labels_to_confirm(results_dir, None, baseline_dir, methods)
    table = fresh_confirmation(fresh_curves(results_dir, baseline_dir), recipes, tests)
    out = Path(results_dir) / "fresh_confirmation.csv"
    atomic_write(out, lambda tmp: table.to_csv(tmp, index=False))
    return out

# %% [markdown]
# In an empty folder nothing waits and nothing is to be confirmed; the committed folder's reading is checked by the
# tests of the results (`tests/`), which hold the committed runs.

# %%
import tempfile
_empty = Path(tempfile.mkdtemp())
test_eq(waiting_stages(_empty), {})
test_eq(len(fresh_curves(_empty, _empty)), 0)
test_eq(len(labels_to_confirm(_empty)[1]), 0)
