# %% [markdown]
# # Statistics
# > Paired seed-matched tests with Holm families, equivalence, the single-seed critique, power and leakage-free selection; the verdicts that read them are in `verdicts`.

# %%
#| default_exp stats

# %% [markdown]
# Both studies report single numbers; this module turns our seed grids into the evidence needed to judge them.
# Everything here works on the two tidy result files written by the grid CLI:
#
# * `runs.csv` (Study A): one row per `(dataset, method, seed, profile)`;
# * `crisp_runs.csv` (Study B): one row per `(config, seed, split, profile)`.
#
# Only rows with `status == "ok"` are analysed. The statistics themselves come from **pingouin** (paired t-test, its CI,
# Cohen's $d_z$, Holm); this module only pairs the right rows, groups them into the papers' families and collects the
# results in tidy tables. The closed forms that pingouin does not have (power of a paired proportion test, binomial CIs)
# are written out with their assumptions.

# %%
#| export
import json, math, warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pingouin as pg
from scipy import stats as sps
from sparse_attention_repro.normalizers import parse_topk_ratio, parse_alpha_start
from sparse_attention_repro.study import (BASELINE, PAPER_METHODS, CRISP_BASELINE, CRISP_CONFIGS, method_order, PAPER_CRISP_GAINS,
                                          STUDIES)
from sparse_attention_repro.data import DATASETS, MAIN_FAMILY, PAPER_SIZES

# %%
from fastcore.test import test_eq, test_close, test_fail
import itertools, tempfile
import sparse_attention_repro

FIX = Path(sparse_attention_repro.__file__).parent.parent / "tests" / "fixtures"

# %% [markdown]
# ## Loading results
#
# The loaders keep the successful runs, and if a run was repeated (same key) keep the last row, so a rerun replaces
# a failed or stale one instead of being double counted in the pairing.

# %%
#| export
MAIN_DATASETS = MAIN_FAMILY                                                       # the paper's main family
FOLLOWUP_DATASETS = tuple(d for d in PAPER_SIZES if d not in MAIN_FAMILY)           # the follow-up family (kmnist)
SPARSE_METHODS = tuple(m for m in PAPER_METHODS if m != BASELINE)                  # the paper's six comparisons with softmax
TOPK_METHODS = tuple(m for m in SPARSE_METHODS if parse_topk_ratio(m))
CRISP_MASKED = tuple(c for c in CRISP_CONFIGS if c != CRISP_BASELINE)                 # the paper's three comparisons with dense


# %%
#| export
def _ok_rows(df, key):
    "Rows with status ok, the last one kept per `key`."
    if df is None or len(df) == 0: return None
    if "status" in df: df = df[df["status"].fillna("ok").astype(str) == "ok"]
    if "profile" not in df: df = df.assign(profile="")
    df = df.assign(profile=df["profile"].fillna("").astype(str))
    return df.drop_duplicates(key, keep="last").reset_index(drop=True)

def load_runs(path):
    "Successful Study A runs from `runs.csv` (a path or a DataFrame); None if the file is missing."
    if isinstance(path, pd.DataFrame): df = path
    elif path is None or not Path(path).exists(): return None
    else: df = pd.read_csv(path)
    return _ok_rows(df, ["dataset", "method", "seed", "profile"])

def load_crisp(path):
    "Successful Study B runs from `crisp_runs.csv` (a path or a DataFrame); None if the file is missing."
    if isinstance(path, pd.DataFrame): df = path
    elif path is None or not Path(path).exists(): return None
    else: df = pd.read_csv(path)
    return _ok_rows(df, ["config", "seed", "split", "profile"])

RESULT_COLUMNS = {s.results: s.columns for s in STUDIES.values()}   # what each study's results file must hold

def check_results_file(path):
    "Raise a one-line ValueError naming `path` and what is wrong when a results CSV cannot be analysed."
    path = Path(path)
    try: df = pd.read_csv(path)
    except pd.errors.EmptyDataError: raise ValueError(f"{path} is empty; rerun the grid that writes it") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in RESULT_COLUMNS.get(path.name, ("accuracy",)) if c not in df]
    if missing: raise ValueError(f"{path} lacks the column(s) {', '.join(missing)}; it is not a results file of this project")
    if not len(df): raise ValueError(f"{path} has a header but no rows; rerun the grid that writes it")
    acc = pd.to_numeric(df.accuracy, errors="coerce")
    if (bad := acc.isna() & df.accuracy.notna()).any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{path}: accuracy in data row {i + 1} is not a number ({df.accuracy.iloc[i]!r})")


# %%
runs, crisp = load_runs(FIX / "runs.csv"), load_crisp(FIX / "crisp_runs.csv")
raw = pd.read_csv(FIX / "runs.csv")
test_eq(len(runs), (raw.status == "ok").sum())                      # the failed run is gone
test_eq(load_runs(FIX / "nope.csv"), None)
dup = pd.concat([raw, raw.iloc[[0]].assign(accuracy=0.99)])          # a rerun of the first run ...
test_eq(load_runs(dup).query("dataset == 'cifar10' and method == 'softmax' and seed == 0").accuracy.item(), 0.99)
test_eq(len(crisp), 4 * 3 * 2)
check_results_file(FIX / "runs.csv"); check_results_file(FIX / "crisp_runs.csv")        # the real files pass
_bad = Path(tempfile.mkdtemp())
for text, msg in [("", "is empty"), ("dataset,method,seed\nx,y,0\n", "lacks the column(s) accuracy"),
                  ("dataset,method,seed,accuracy\n", "no rows"), ("dataset,method,seed,accuracy\nx,y,0,0.5\nx,y,1,high\n", "data row 2")]:
    (_bad / "runs.csv").write_text(text)
    test_fail(lambda: check_results_file(_bad / "runs.csv"), contains=msg)


# %% [markdown]
# ## One paired comparison
#
# Every comparison in both papers is *paired by seed*: the same seed fixes the data subsets (Study A) or the fine-tuning
# randomness (Study B) for both arms. So the unit of evidence is the per-seed difference $\Delta_s = a_s - b_s$, and we
# inner-join on seed — a seed that failed in one arm drops out of that comparison only. With fewer than two pairs there
# is no variance and every statistic is NaN (no crash): the table still shows `n` so the gap is visible.
#
# `pg.ttest(paired=True)` gives $t$, $p$ and the 95% CI of the mean difference, `pg.compute_effsize(eftype="cohen_dz")`
# gives $d_z = \bar\Delta / s_\Delta$ (the paired effect size; pingouin's paired `cohen` is $d_{av}$, a different quantity).
# One trap: pingouin rounds its `CI95` column to 2 decimals by default (`pg.options["round.column.CI95"]`), which
# turns a CI of a 1-pt accuracy difference into `[0.0, 0.02]`. We switch that rounding off for the call.

# %%
#| export
def _pg_get(res, *names):
    "First of `names` present in a pingouin result row (column names changed across pingouin versions)."
    for n in names:
        if n in res: return res[n]
    raise KeyError(names)

from contextlib import contextmanager

@contextmanager
def _unrounded():
    "Temporarily switch off pingouin's output rounding."
    old = dict(pg.options)
    for k in list(pg.options):
        if k == "round" or k.startswith("round.column.CI"): pg.options[k] = None
    try: yield
    finally: pg.options.clear(); pg.options.update(old)

def paired_stats(a, b):
    "n, mean Δ, 95% CI, t, p and Cohen's dz of the paired difference `a - b` (NaN when fewer than 2 pairs)."
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = ~(np.isnan(a) | np.isnan(b)); a, b = a[ok], b[ok]
    n = len(a); d = a - b
    out = dict(n=n, mean_delta=float(d.mean()) if n else np.nan, ci_low=np.nan, ci_high=np.nan,
               t=np.nan, p=np.nan, cohen_dz=np.nan)
    if n < 2: return out
    if np.allclose(d, d[0]):   # zero variance: no t-test possible; CI collapses onto the constant difference
        return dict(out, ci_low=float(d[0]), ci_high=float(d[0]))
    with warnings.catch_warnings(), _unrounded():
        warnings.simplefilter("ignore")
        r = pg.ttest(a, b, paired=True).iloc[0]
        dz = pg.compute_effsize(a, b, paired=True, eftype="cohen_dz")
    lo, hi = _pg_get(r, "CI95", "CI95%")
    return dict(out, ci_low=float(lo), ci_high=float(hi), t=float(r["T"]), p=float(_pg_get(r, "p_val", "p-val")),
                cohen_dz=float(dz))


# %% [markdown]
# Checked against scipy's `ttest_rel` and the textbook formulas for the CI ($\bar\Delta \pm t_{0.975,n-1} s/\sqrt n$)
# and $d_z$:

# %%
a = np.array([0.41, 0.39, 0.44, 0.40, 0.43]); b = np.array([0.38, 0.385, 0.41, 0.395, 0.40])
r, d = paired_stats(a, b), a - b
ref = sps.ttest_rel(a, b)
test_close(r["t"], ref.statistic); test_close(r["p"], ref.pvalue)
half = sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
test_close(r["ci_low"], d.mean() - half, eps=1e-6); test_close(r["ci_high"], d.mean() + half, eps=1e-6)
test_close(r["cohen_dz"], d.mean() / d.std(ddof=1))
test_eq(r["n"], 5)
assert pg.options["round.column.CI95"] == 2           # pingouin's own setting is restored afterwards
r1 = paired_stats([0.5], [0.4])                       # one pair: stats are NaN, n and Δ survive
test_eq(r1["n"], 1); test_close(r1["mean_delta"], 0.1); assert np.isnan(r1["p"]) and np.isnan(r1["ci_low"])
assert np.isnan(paired_stats([], [])["mean_delta"])
test_eq(paired_stats([0.5, np.nan, 0.6], [0.4, 0.3, 0.55])["n"], 2)   # a missing arm drops that pair


# %% [markdown]
# ## Holm within a family
#
# A family is the set of comparisons one claim is corrected over. The paper's are: **main** = 4 datasets × 6 sparse
# methods = 24 tests; **kmnist** = 6. "HAE vs entmax-1.5 is tested separately per dataset": we read that literally —
# each dataset's HAE-vs-entmax15 test is its own family of one, so its Holm p equals its raw p (family name
# `hae_vs_entmax15:<dataset>`). This is the paper's choice, kept so our numbers are comparable; a reader who prefers to
# correct over the 5 datasets can do so from the `p` column. Crisp has two families of three (`crisp_validation`,
# `crisp_test`: each config vs dense). Tests with a NaN p are left out of the family (they are not a test) and get a
# NaN Holm p.

# %%
#| export
def holm(df, family_cols=("family",), p_col="p"):
    "Add `p_holm`: Holm-adjusted `p_col` within each group of `family_cols` (pingouin's multicomp)."
    df = df.copy(); df["p_holm"] = np.nan
    if len(df) == 0: return df
    for _, g in df.groupby(list(family_cols), dropna=False):
        idx = g.index; p = df.loc[idx, p_col].to_numpy(float); ok = ~np.isnan(p)
        if ok.any():
            _, adj = pg.multicomp(p[ok], method="holm")
            df.loc[np.asarray(idx)[ok], "p_holm"] = adj
    return df


# %% [markdown]
# Holm by hand, from its definition: sort ascending, multiply the $i$-th smallest by $(m - i + 1)$, take the running
# maximum, cap at 1.

# %%
def manual_holm(p):
    p = np.asarray(p, float); order = np.argsort(p); m = len(p)
    adj = np.maximum.accumulate([min(1, (m - i) * p[j]) for i, j in enumerate(order)])
    out = np.empty(m); out[order] = adj; return out

t = pd.DataFrame(dict(family=["a"] * 4 + ["b"] * 2, p=[0.01, 0.04, 0.03, 0.005, 0.02, np.nan]))
h = holm(t)
test_close(h.p_holm[:4].to_numpy(), manual_holm([0.01, 0.04, 0.03, 0.005]))
test_close(manual_holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])   # by hand: .005*4, .01*3, max(.03*2,.03), max(.04,.06)
test_close(h.p_holm[4], 0.02)                   # the NaN is not counted: family b has one test
assert np.isnan(h.p_holm[5])

# %% [markdown]
# ## Equivalence: "no difference" needs a margin fixed in advance
#
# A non-significant paired t-test is absence of evidence, not evidence of "≈". To say two arms are the same we use the
# two one-sided tests (TOST, Schuirmann 1987) on the paired differences: the arms are *equivalent within ±m* when both
# "Δ ≤ −m" and "Δ ≥ +m" are rejected at 5 % — the same as the 90 % confidence interval of Δ lying inside (−m, +m). The
# margins are declared in the protocol notebook before the runs they judge, and live here, in one place:
#
# | margin | judges | value |
# |---|---|---|
# | `hae_vs_entmax15` | the adaptive entmax against entmax-1.5 (claim A5) | ±0.5 pt |
# | `ablation` | "the ablation does not change a gain" | ±1 pt |
# | `crisp` | a Crisp configuration against dense | ±0.5 pt |
# | `recipe` | "the gain over softmax is gone" once every arm is trained to its best recipe | ±1 pt |
# | `fast_path` | a method's accuracy on the fast path against the default path | ±0.5 pt |
# | `alpha_start` | the learned α (not accuracy) against a reference α | ±0.05 |
# | `length` | a normalizer's exact match against softmax's at one test length (the length study; the literature's claims there are tens of points) | ±5 pt |

# %%
#| export
from sparse_attention_repro.study import EQUIVALENCE_MARGINS     # declared once, in the study design; the catalogue names them too

def tost_paired(a, b, margin):
    "TOST p-value that the paired mean of `a - b` lies within ±`margin` (pingouin's `tost`; NaN with fewer than 2 pairs)."
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = ~(np.isnan(a) | np.isnan(b)); a, b = a[ok], b[ok]
    if len(a) < 2: return np.nan
    d = a - b
    if np.allclose(d, d[0]): return 0.0 if abs(d[0]) < margin else 1.0      # no spread: the constant decides
    with _unrounded(): return float(_pg_get(pg.tost(a, b, bound=margin, paired=True).iloc[0], "pval", "p-val"))

# %% [markdown]
# Checked against the definition: the larger of the two one-sided p-values of one-sample t-tests of the differences
# against −m (alternative "greater") and +m ("less"), computed with scipy.

# %%
_rng = np.random.default_rng(3)
_a = _rng.normal(0.40, 0.02, 10); _b = _a - _rng.normal(0.002, 0.003, 10)
for _m in (0.001, 0.005, 0.02):
    _ref = max(sps.ttest_1samp(_a - _b, -_m, alternative="greater").pvalue, sps.ttest_1samp(_a - _b, _m, alternative="less").pvalue)
    test_close(tost_paired(_a, _b, _m), _ref, eps=1e-9)
assert tost_paired(_a, _b, 0.02) < 0.05 < tost_paired(_a, _b, 0.001)        # a wide margin is met, a tight one is not
assert np.isnan(tost_paired([0.5], [0.4], 0.01))
test_eq(tost_paired([0.5, 0.6], [0.5, 0.6], 0.01), 0.0)                      # identical arms: equivalent at any margin

# %% [markdown]
# The verdict reads three ways. *Equivalent within ±m* when TOST rejects; a difference can be significant and still
# inside the margin (a small, consistent offset) — the sentence then says so. *Different* when TOST does not reject but
# the two-sided test does (with its Holm-adjusted p where it belongs to a family). *Undecided* otherwise: the seeds
# cannot tell.

# %%
#| export
def equivalence_word(p_tost, p_diff, alpha=0.05) -> str:
    "'equivalent', 'different' or 'undecided' from a TOST p and a (Holm) two-sided p: the word tables carry as a column."
    if np.isfinite(p_tost) and p_tost < alpha: return "equivalent"
    if np.isfinite(p_diff) and p_diff < alpha: return "different"
    return "undecided"

def equivalence_verdict(p_tost, p_diff, margin, alpha=0.05, unit="pt"):
    "The same reading in words for a reader: 'equivalent within ±m', 'different' or 'undecided'."
    m = f"±{100 * margin:.1f} pt" if unit == "pt" else f"±{margin:g}"
    w = equivalence_word(p_tost, p_diff, alpha)
    return f"equivalent within {m}" if w == "equivalent" else w

# %%
test_eq([equivalence_word(0.01, 0.002), equivalence_word(0.3, 0.002), equivalence_word(0.3, 0.4), equivalence_word(np.nan, np.nan)],
        ["equivalent", "different", "undecided", "undecided"])
test_eq(equivalence_verdict(0.01, 0.002, 0.005), "equivalent within ±0.5 pt")
test_eq(equivalence_verdict(0.30, 0.002, 0.005), "different")
test_eq(equivalence_verdict(0.30, 0.40, 0.01), "undecided")
test_eq(equivalence_verdict(np.nan, np.nan, 0.05, unit="alpha"), "undecided")
test_eq(equivalence_verdict(0.01, np.nan, 0.05, unit="alpha"), "equivalent within ±0.05")

# %% [markdown]
# ## Study A: every sparse method vs softmax
#
# `paired_tests` runs one comparison per `(profile, dataset, method)` against the baseline, on `metric`, and carries the
# mean Δ of macro-F1 along (same pairing) so a reader sees whether accuracy and F1 agree. The family of a dataset follows
# the paper (main or kmnist; any other dataset is its own family). Results for different `profile`s (smoke vs full grid)
# are never mixed: the profile is part of the key and of the Holm family.

# %%
#| export
TEST_COLS = ["family", "profile", "dataset", "method", "baseline", "metric", "n", "mean_delta", "ci_low", "ci_high",
             "t", "p", "cohen_dz", "p_holm", "mean_delta_f1", "margin", "p_tost"]

def family_of(dataset):
    "The paper's Holm family of a Study A dataset."
    return "main" if dataset in MAIN_DATASETS else "kmnist" if dataset in FOLLOWUP_DATASETS else str(dataset)

def _compare(df, arm_col, arm, base, metric, f1_metric=None, pair_col="seed", margin=np.nan):
    "One paired comparison of `arm` vs `base` within `df` (one group), rows matched by inner join on `pair_col`; TOST at `margin`."
    cols = [pair_col, metric] + ([f1_metric] if f1_metric else [])
    j = pd.merge(df.loc[df[arm_col] == arm, cols], df.loc[df[arm_col] == base, cols], on=pair_col,
                 how="inner", suffixes=("_a", "_b"))
    r = paired_stats(j[f"{metric}_a"], j[f"{metric}_b"])
    d = (j[f"{f1_metric}_a"] - j[f"{f1_metric}_b"]).dropna() if f1_metric else pd.Series(dtype=float)
    r["mean_delta_f1"] = float(d.mean()) if len(d) else np.nan
    r["margin"] = margin
    r["p_tost"] = tost_paired(j[f"{metric}_a"], j[f"{metric}_b"], margin) if np.isfinite(margin) else np.nan
    return r

def paired_tests(runs, metric="accuracy", baseline=BASELINE, methods=SPARSE_METHODS, hae_vs_entmax=True):
    "Tidy table: each sparse method vs `baseline` per dataset (Holm within the paper's families), plus HAE vs entmax15."
    rows = []
    if runs is None or len(runs) == 0: return pd.DataFrame(columns=TEST_COLS)
    f1 = "macro_f1" if metric == "accuracy" and "macro_f1" in runs else None
    for (prof, ds), g in runs.groupby(["profile", "dataset"], sort=False):
        if baseline in set(g.method):
            for m in methods:
                if m in set(g.method):
                    rows.append(dict(family=family_of(ds), profile=prof, dataset=ds, method=m, baseline=baseline,
                                     metric=metric, **_compare(g, "method", m, baseline, metric, f1)))
        if hae_vs_entmax and {"headwise_adaptive_entmax", "entmax15"} <= set(g.method):
            rows.append(dict(family=f"hae_vs_entmax15:{ds}", profile=prof, dataset=ds,
                             method="headwise_adaptive_entmax", baseline="entmax15", metric=metric,
                             **_compare(g, "method", "headwise_adaptive_entmax", "entmax15", metric, f1,
                                        margin=EQUIVALENCE_MARGINS["hae_vs_entmax15"])))
    out = holm(pd.DataFrame(rows), family_cols=("profile", "family")) if rows else pd.DataFrame(columns=TEST_COLS)
    return out[TEST_COLS]


# %% [markdown]
# The fixture grid has 5 datasets × 3 seeds. The table must have 24 main + 6 kmnist + 5 HAE rows, and one Holm p must
# match an independent recomputation: scipy `ttest_rel` on the seed-joined arms of all 24 main comparisons, then Holm by
# hand.

# %%
pt = paired_tests(runs)
test_eq(pt.family.value_counts()[["main", "kmnist"]].tolist(), [24, 6])
test_eq(pt.family.str.startswith("hae_vs").sum(), 5)
test_eq(list(pt.columns), TEST_COLS)

def scipy_p(ds, m, base="softmax"):
    g = runs[runs.dataset == ds]
    j = pd.merge(g[g.method == m][["seed", "accuracy"]], g[g.method == base][["seed", "accuracy"]], on="seed",
                 suffixes=("", "_b"))
    return sps.ttest_rel(j.accuracy, j.accuracy_b).pvalue

from sparse_attention_repro import crisp as _crisp
test_eq((FOLLOWUP_DATASETS, TOPK_METHODS), (("kmnist",), ("topk_softmax_0125", "topk_softmax_025", "topk_softmax_05")))
keys = [(ds, m) for ds in MAIN_DATASETS for m in SPARSE_METHODS]
ps = np.array([scipy_p(ds, m) for ds, m in keys]); ref = manual_holm(ps)
main = pt[pt.family == "main"].set_index(["dataset", "method"])
test_close(main.loc[[k for k in keys], "p"].to_numpy(), ps)
test_close(main.loc[[k for k in keys], "p_holm"].to_numpy(), ref)
hae = pt[pt.family == "hae_vs_entmax15:cifar10"].iloc[0]
test_close(hae.p_holm, hae.p); test_close(hae.p, scipy_p("cifar10", "headwise_adaptive_entmax", "entmax15"))
# mean Δ macro-F1 from the raw columns
g = runs[runs.dataset == "cifar10"].pivot(index="seed", columns="method", values="macro_f1")
test_close(main.loc[("cifar10", "entmax15"), "mean_delta_f1"], (g.entmax15 - g.softmax).mean())

# %% [markdown]
# Seeds are matched by inner join: drop one arm's seed and that comparison has n = 2 while the others keep 3; leave a
# single seed and the row is NaN, not an error.

# %%
pt2 = paired_tests(runs.drop(runs[(runs.dataset == "cifar10") & (runs.method == "sparsemax") & (runs.seed == 0)].index))
test_eq(pt2.set_index(["family", "dataset", "method"]).loc[("main", "cifar10", "sparsemax"), "n"], 2)
one = paired_tests(runs[runs.seed == 0])
assert one.p.isna().all() and one.p_holm.isna().all() and (one.n == 1).all()
test_eq(len(paired_tests(None)), 0)


# %% [markdown]
# ## Study B: Crisp configs vs dense
#
# The same test per split, paired by seed, with the families `crisp_validation` and `crisp_test`. The validation split
# (872 sentences) is what the paper reports; the test split (1821) answers the review's point 5.

# %%
#| export
def crisp_tests(crisp, baseline=CRISP_BASELINE, configs=CRISP_MASKED, family="crisp"):
    "Tidy table: each Crisp config vs `baseline` per split, paired by seed, Holm within `<family>_<split>`."
    rows = []
    if crisp is None or len(crisp) == 0: return pd.DataFrame(columns=TEST_COLS)
    for (prof, split), g in crisp.groupby(["profile", "split"], sort=False):
        if baseline not in set(g.config): continue
        for c in configs:
            if c in set(g.config):
                rows.append(dict(family=f"{family}_{split}", profile=prof, dataset="sst2", method=c, baseline=baseline,
                                 metric="accuracy", **_compare(g, "config", c, baseline, "accuracy", margin=EQUIVALENCE_MARGINS["crisp"])))
    out = holm(pd.DataFrame(rows), family_cols=("profile", "family")) if rows else pd.DataFrame(columns=TEST_COLS)
    return out[TEST_COLS]

def crisp_normalizer_tests(crisp, baseline=CRISP_BASELINE):
    "Registered normalizers run as Crisp configurations (e.g. entmax15) vs dense, per split; Holm within `crisp_normalizers_<split>`."
    if crisp is None or len(crisp) == 0: return pd.DataFrame(columns=TEST_COLS)
    return crisp_tests(crisp, baseline, [c for c in dict.fromkeys(crisp.config) if c not in CRISP_CONFIGS], family="crisp_normalizers")


# %%
ct = crisp_tests(crisp)
test_eq(sorted(ct.family.unique()), ["crisp_test", "crisp_validation"])
v = crisp[crisp.split == "validation"].pivot(index="seed", columns="config", values="accuracy")
cv = ct[ct.family == "crisp_validation"].set_index("method")
ps = [sps.ttest_rel(v[c], v.dense).pvalue for c in CRISP_MASKED]
test_close(cv.loc[list(CRISP_MASKED), "p_holm"].to_numpy(), manual_holm(ps))
test_close(cv.loc["adaptive_080", "mean_delta"], (v.adaptive_080 - v.dense).mean())
with_entmax = pd.concat([crisp, crisp[crisp.config == "fixed_080"].assign(config="entmax15")])   # a normalizer run as a config
test_eq(crisp_tests(with_entmax), ct)                                                            # the paper's family is untouched
cn = crisp_normalizer_tests(with_entmax)
test_eq(sorted(cn.family), ["crisp_normalizers_test", "crisp_normalizers_validation"])
test_close(cn.set_index("family").loc["crisp_normalizers_validation", "mean_delta"], cv.loc["fixed_080", "mean_delta"])


# %% [markdown]
# ## The single-seed critique
#
# ### (a) How often would one run have told the wrong story?
#
# Both papers' headline comparisons rest on one number per arm (Crisp: one run; Study A's per-seed tables invite reading
# one seed). For every comparison we list the per-seed Δs and count the seeds whose Δ has the *opposite sign to the mean
# over seeds*: the chance that a single-seed study would have reported the wrong direction.

# %%
#| export
def seed_deltas(runs=None, crisp=None, baseline=BASELINE, crisp_baseline=CRISP_BASELINE):
    "Long table of per-seed Δ accuracy: every sparse method vs softmax (Study A) and every config vs dense (Study B)."
    out = []
    if runs is not None and len(runs):
        p = runs.pivot_table(index=["profile", "dataset", "seed"], columns="method", values="accuracy")
        for m in p.columns:
            if m == baseline or baseline not in p: continue
            d = (p[m] - p[baseline]).dropna().rename("delta").reset_index()
            out.append(d.assign(family=d.dataset.map(family_of), method=m, baseline=baseline))
    if crisp is not None and len(crisp):
        p = crisp.pivot_table(index=["profile", "split", "seed"], columns="config", values="accuracy")
        for c in p.columns:
            if c == crisp_baseline or crisp_baseline not in p: continue
            d = (p[c] - p[crisp_baseline]).dropna().rename("delta").reset_index()
            out.append(d.assign(family="crisp_" + d.split, dataset="sst2", method=c, baseline=crisp_baseline)
                       .drop(columns="split"))
    cols = ["family", "profile", "dataset", "method", "baseline", "seed", "delta"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)

def single_seed_summary(deltas):
    "Per comparison: n, mean and sd of the per-seed Δ, range, and the fraction of seeds whose Δ opposes the mean's sign."
    def f(d):
        m = d.mean(); s = np.sign(d)
        return pd.Series(dict(n=len(d), mean_delta=m, sd_delta=d.std(ddof=1) if len(d) > 1 else np.nan,
                              min_delta=d.min(), max_delta=d.max(),
                              frac_opposite_sign=float((s == -np.sign(m)).mean()) if m != 0 else np.nan))
    keys = ["family", "profile", "dataset", "method", "baseline"]
    if len(deltas) == 0: return pd.DataFrame(columns=keys + ["n", "mean_delta", "sd_delta", "min_delta", "max_delta",
                                                             "frac_opposite_sign"])
    return deltas.groupby(keys, sort=False)["delta"].apply(f).unstack().reset_index()


# %%
sd = seed_deltas(runs, crisp)
test_eq(len(sd), 5 * 6 * 3 + 2 * 3 * 3)
ss = single_seed_summary(pd.DataFrame(dict(family="x", profile="", dataset="d", method="m", baseline="b",
                                           seed=range(4), delta=[0.02, 0.01, -0.005, 0.015])))
test_close(ss.frac_opposite_sign.item(), 0.25); test_close(ss.mean_delta.item(), 0.01)
s2 = single_seed_summary(sd).set_index(["family", "dataset", "method"])
test_close(s2.loc[("crisp_validation", "sst2", "adaptive_080"), "mean_delta"], cv.loc["adaptive_080", "mean_delta"])

# %% [markdown]
# ### (b) Would one seed pair show the published Crisp gain?
#
# The paper's +0.97 pt (adaptive_080 vs dense, validation) is one draw of "adaptive run minus dense run". Given our
# seeds we ask how likely one such draw is to reach it. Two estimates, both stated:
#
# * **normal model**: one paired Δ ~ N($\bar\Delta$, $s_\Delta^2$) with our mean and sd over matched seeds, so
#   $P(\Delta \ge g) = 1 - \Phi((g - \bar\Delta)/s_\Delta)$;
# * **empirical**: the fraction of our matched seed pairs with Δ ≥ g, and, because the paper need not have used the same
#   seed for both arms, the fraction over *all* (config seed, dense seed) combinations.

# %%
#| export
PUBLISHED_CRISP_GAIN = PAPER_CRISP_GAINS["adaptive_080"]   # adaptive_080 vs dense on SST-2 validation, one run each

def single_pair_exceedance(crisp, config="adaptive_080", baseline=CRISP_BASELINE, split="validation",
                           gain=PUBLISHED_CRISP_GAIN):
    "P(one seed pair shows Δ ≥ `gain`): normal model with our mean/sd of paired Δ, and empirical fractions."
    out = dict(config=config, baseline=baseline, split=split, gain=gain, n_seeds=0, mean_delta=np.nan,
               sd_delta=np.nan, p_normal=np.nan, frac_matched=np.nan, frac_all_pairs=np.nan, n_all_pairs=0)
    if crisp is None or len(crisp) == 0: return out
    g = crisp[crisp.split == split]
    a = g[g.config == config].groupby("seed").accuracy.mean(); b = g[g.config == baseline].groupby("seed").accuracy.mean()
    d = (a - b).dropna()
    allp = (a.to_numpy()[:, None] - b.to_numpy()[None, :]).ravel()
    out.update(n_seeds=len(d), n_all_pairs=len(allp), frac_all_pairs=float((allp >= gain).mean()) if len(allp) else np.nan)
    if len(d):
        out.update(mean_delta=float(d.mean()), frac_matched=float((d >= gain).mean()))
    if len(d) > 1:
        s = float(d.std(ddof=1)); out["sd_delta"] = s
        out["p_normal"] = float(sps.norm.sf((gain - d.mean()) / s)) if s > 0 else float(d.mean() >= gain)
    return out


# %%
e = single_pair_exceedance(crisp)
dv = (v.adaptive_080 - v.dense)
test_close(e["p_normal"], 1 - sps.norm.cdf((0.0097 - dv.mean()) / dv.std(ddof=1)))
allp = [x - y for x, y in itertools.product(v.adaptive_080, v.dense)]        # brute force over all 9 combinations
test_close(e["frac_all_pairs"], np.mean([x >= 0.0097 for x in allp])); test_eq(e["n_all_pairs"], 9)
assert np.isnan(single_pair_exceedance(None)["p_normal"])


# %% [markdown]
# ### (c) The smallest difference an 872- or 1821-sentence evaluation can detect
#
# Two models scored on the *same* sentences are compared by McNemar's test, which only looks at the discordant sentences
# (one model right, the other wrong). With discordance rate $\psi = p_{10} + p_{01}$ and true difference
# $\delta = p_{10} - p_{01}$, the normal approximation (Connor 1987) needs
# $n = \big(z_{1-\alpha/2}\sqrt{\psi} + z_{1-\beta}\sqrt{\psi - \delta^2}\big)^2 / \delta^2$; we solve it for $\delta$.
# $\psi$ is the unknown that matters. We offer two sources, both labelled in the table:
#
# * an **assumed** value (default 0.06: two fine-tuned DistilBERTs at ~90% typically disagree on a few percent of SST-2);
# * a **bound from our runs**: if sentences flip independently, the variance over seeds of a paired accuracy
#   difference measured on $n$ sentences is ≈ $\psi/n$, so $\hat\psi = n\, s_\Delta^2$ (averaged over the Crisp configs).
#   Seed-to-seed *training* noise inflates it, so it is an upper bound; above 1 it is no rate at all (training noise
#   dwarfs test-sample noise — itself a finding) and the row is left out. When $\hat\psi$ is so small that no
#   $\delta \le \psi$ reaches the power, the MDE is NaN.
#
# For comparison, the **unpaired** two-proportion test (two independent samples of $n$ at accuracy $p$) needs
# $\delta = (z_{1-\alpha/2} + z_{1-\beta})\sqrt{2p(1-p)/n}$ — what one gets when predictions are not paired.

# %%
#| export
def mde_paired(n, discordance, alpha=0.05, power=0.8):
    "Minimum detectable accuracy difference for McNemar's test on `n` paired items with discordance rate `discordance`."
    za, zb = sps.norm.ppf(1 - alpha / 2), sps.norm.ppf(power)
    f = lambda d: (za * math.sqrt(discordance) + zb * math.sqrt(max(discordance - d * d, 0))) ** 2 / (d * d) - n
    hi = min(discordance, 1) - 1e-12
    if f(hi) > 0: return np.nan   # not detectable at any δ ≤ ψ
    from scipy.optimize import brentq
    return float(brentq(f, 1e-9, hi))

def mde_unpaired(n, p=0.9, alpha=0.05, power=0.8):
    "Minimum detectable difference of two independent proportions near `p`, `n` items each (normal approximation)."
    za, zb = sps.norm.ppf(1 - alpha / 2), sps.norm.ppf(power)
    return float((za + zb) * math.sqrt(2 * p * (1 - p) / n))

def discordance_from_deltas(deltas, n_eval):
    "ψ estimated from the seed variance of paired accuracy differences measured on `n_eval` items: n·s²."
    d = pd.Series(deltas).dropna()
    return float(n_eval * d.var(ddof=1)) if len(d) > 1 else np.nan


# %% [markdown]
# The closed form must agree with the $\sqrt{\psi/n}$ shortcut when $\delta^2 \ll \psi$, and with a simulation:
# draw 872 sentence pairs with $(p_{10}, p_{01}) = ((\psi+\delta)/2, (\psi-\delta)/2)$ at $\delta$ = the MDE, run McNemar
# ($z = (n_{10}-n_{01})/\sqrt{n_{10}+n_{01}}$) and count rejections: the power must come out near 80%. The unpaired
# formula is checked the same way with two independent binomials.

# %%
za, zb = sps.norm.ppf(0.975), sps.norm.ppf(0.8)
d872 = mde_paired(872, 0.06)
assert abs(d872 - (za + zb) * math.sqrt(0.06 / 872)) < 0.002
rng = np.random.default_rng(0)
cnt = rng.multinomial(872, [(0.06 + d872) / 2, (0.06 - d872) / 2, 1 - 0.06], size=4000)
z = (cnt[:, 0] - cnt[:, 1]) / np.sqrt(np.maximum(cnt[:, 0] + cnt[:, 1], 1))
assert abs((np.abs(z) > za).mean() - 0.8) < 0.03, (np.abs(z) > za).mean()
du = mde_unpaired(872, 0.9)
k1, k2 = rng.binomial(872, 0.9 - du / 2, 4000), rng.binomial(872, 0.9 + du / 2, 4000)
pp = (k1 + k2) / (2 * 872); zu = (k2 - k1) / 872 / np.sqrt(2 * pp * (1 - pp) / 872)
assert abs((np.abs(zu) > za).mean() - 0.8) < 0.03
assert mde_paired(1821, 0.06) < d872 < du            # more sentences and pairing both help
test_close(discordance_from_deltas([0.01, -0.01], 872), 872 * 2e-4)


# %%
#| export
def power_table(n_evals=(872, 1821), discordances=(0.03, 0.06, 0.10), p=0.9, alpha=0.05, power=0.8, crisp=None):
    "MDE at `power`, two-sided `alpha`: McNemar at several ψ (assumed and, with `crisp`, estimated) and unpaired at `p`."
    rows = []
    psis = [(f"assumed ψ={q:g}", q) for q in discordances]
    if crisp is not None and len(crisp):
        for split, g in crisp.groupby("split"):
            n = int(g.n_eval.median()) if "n_eval" in g else None
            p_ = g.pivot_table(index="seed", columns="config", values="accuracy")
            if CRISP_BASELINE not in p_ or not n: continue
            v_ = [discordance_from_deltas(p_[c] - p_[CRISP_BASELINE], n) for c in p_.columns if c != CRISP_BASELINE]
            psi = float(np.nanmean(v_)) if np.isfinite(v_).any() else np.nan   # pooled over configs
            # n·var(Δ) over seeds also holds training noise, so it only bounds ψ; above 1 it is no discordance rate at all
            # (the seed-to-seed spread then dwarfs test-sample noise) and is left out.
            if np.isfinite(psi) and 0 < psi <= 1: psis.append((f"bound from crisp {split} seeds", psi))
    for n in n_evals:
        for label, q in psis:
            rows.append(dict(n_eval=n, test="McNemar (paired)", assumption=label, discordance=q, p=np.nan,
                             mde=mde_paired(n, q, alpha, power), mde_sentences=mde_paired(n, q, alpha, power) * n))
        u = mde_unpaired(n, p, alpha, power)
        rows.append(dict(n_eval=n, test="two-proportion (unpaired)", assumption=f"p={p:g}", discordance=np.nan, p=p,
                         mde=u, mde_sentences=u * n))
    return pd.DataFrame(rows)


# %%
pw = power_table(crisp=crisp)
test_eq(set(pw.n_eval), {872, 1821})
assert pw.assumption.str.startswith("bound from crisp").any()                       # fixture spreads give ψ ≤ 1
assert (pw.discordance.dropna() <= 1).all()
big = crisp.assign(accuracy=np.where(crisp.config == "dense", crisp.accuracy, crisp.accuracy + 0.3 * (2 * (crisp.seed % 2) - 1)))
assert not power_table(crisp=big).assumption.str.startswith("bound").any()        # ψ̂ > 1 is not a discordance rate
test_close(pw.query("n_eval == 872 and test.str.startswith('two')").mde.item(), mde_unpaired(872, 0.9))


# %% [markdown]
# ### (d) How precise is one run's accuracy on 872 sentences?
#
# A single accuracy is a proportion over $n$ sentences. Its sampling uncertainty (over sentences, ignoring seed noise,
# which only adds to it): the Wald half-width $z\sqrt{\hat p(1-\hat p)/n}$, the Wilson interval (scipy's `binomtest`), and
# a percentile bootstrap over sentences. Resampling $n$ sentences of which $k$ are correct draws the number correct from
# Binomial($n$, $k/n$), so the bootstrap is drawn that way (identical distribution, no per-sentence data needed).

# %%
#| export
def fmt_pt(v, signed=True) -> str:
    "A fraction as points with one decimal (`+1.2`; unsigned `1.2`), `–` where there is none: every table's and sentence's way."
    return "–" if v is None or not np.isfinite(v) else (f"{100 * v:+.1f}" if signed else f"{100 * v:.1f}")

# %%
test_eq([fmt_pt(0.0123), fmt_pt(-0.004), fmt_pt(0.5, signed=False), fmt_pt(np.nan), fmt_pt(None)], ["+1.2", "-0.4", "50.0", "–", "–"])

# %%
#| export
def accuracy_ci(acc, n, n_boot=10000, level=0.95, seed=0):
    "Wald, Wilson and bootstrap CIs of one run's accuracy `acc` measured on `n` items."
    k = int(round(acc * n)); ph = k / n; z = sps.norm.ppf(0.5 + level / 2)
    w = z * math.sqrt(ph * (1 - ph) / n)
    wil = sps.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    bs = np.random.default_rng(seed).binomial(n, ph, n_boot) / n
    lo, hi = np.quantile(bs, [(1 - level) / 2, (1 + level) / 2])
    return dict(accuracy=ph, n=n, k=k, wald_low=ph - w, wald_high=ph + w, half_width=w,
                wilson_low=wil.low, wilson_high=wil.high, boot_low=float(lo), boot_high=float(hi))


# %%
c = accuracy_ci(0.9062, 872)
test_close(c["half_width"], 0.0194, eps=5e-4)                 # the ±1.9 pt quoted in the review
# bootstrap by resampling an explicit 0/1 vector of sentences agrees with the binomial shortcut
vec = np.r_[np.ones(c["k"]), np.zeros(872 - c["k"])]
bs = vec[np.random.default_rng(1).integers(0, 872, (2000, 872))].mean(1)
test_close(np.quantile(bs, 0.025), c["boot_low"], eps=0.003); test_close(np.quantile(bs, 0.975), c["boot_high"], eps=0.003)
assert c["wilson_low"] < 0.9062 < c["wilson_high"]


# %% [markdown]
# ## Selection without test leakage
#
# The paper picked the top-k ratio on *test* accuracy, so the reported top-k gain is optimistically biased. The honest
# protocol picks the ratio with the best mean **validation** accuracy over seeds and reports the *test* accuracy of that
# choice. `select_topk` shows both side by side, with the Δ vs softmax on test for each. Without validation columns
# (a grid run without a validation split) the validation choice is NaN and the `note` says so.

# %%
#| export
def select_topk(runs, methods=TOPK_METHODS, baseline=BASELINE):
    "Per dataset: top-k ratio chosen on validation vs on test, and the test accuracy (and Δ vs softmax) of each choice."
    cols = ["profile", "dataset", "val_selected", "val_selected_test_acc", "val_selected_delta", "test_selected",
            "test_selected_test_acc", "test_selected_delta", "same_choice", "optimism", "n_seeds", "note"]
    if runs is None or len(runs) == 0: return pd.DataFrame(columns=cols)
    rows = []
    for (prof, ds), g in runs.groupby(["profile", "dataset"], sort=False):
        g = g[g.method.isin(list(methods) + [baseline])]
        k = g[g.method.isin(methods)]
        if len(k) == 0: continue
        test_m = k.groupby("method").accuracy.mean()
        base = g[g.method == baseline].accuracy.mean() if (g.method == baseline).any() else np.nan
        ts = test_m.idxmax()
        val_m = k.groupby("method").val_accuracy.mean() if "val_accuracy" in k else pd.Series(dtype=float)
        val_m = val_m.dropna()
        if len(val_m):
            vs, note = val_m.idxmax(), ""
            if len(val_m) < len(test_m): note = "validation accuracy missing for some ratios"
        else:
            vs, note = None, "no validation accuracy in runs.csv: rerun the grid with a validation split"
        rows.append(dict(profile=prof, dataset=ds, val_selected=vs,
                         val_selected_test_acc=test_m.get(vs, np.nan) if vs else np.nan,
                         val_selected_delta=test_m.get(vs, np.nan) - base if vs else np.nan,
                         test_selected=ts, test_selected_test_acc=test_m[ts], test_selected_delta=test_m[ts] - base,
                         same_choice=(vs == ts) if vs else np.nan,
                         optimism=test_m[ts] - test_m[vs] if vs else np.nan,
                         n_seeds=k.seed.nunique(), note=note))
    return pd.DataFrame(rows, columns=cols)


# %%
sel = select_topk(runs).set_index("dataset")
g = runs[runs.dataset == "fashion_mnist"]
tm = g[g.method.isin(TOPK_METHODS)].groupby("method")[["accuracy", "val_accuracy"]].mean()
test_eq(sel.loc["fashion_mnist", "test_selected"], tm.accuracy.idxmax())
test_eq(sel.loc["fashion_mnist", "val_selected"], tm.val_accuracy.idxmax())
test_close(sel.loc["fashion_mnist", "val_selected_test_acc"], tm.accuracy[tm.val_accuracy.idxmax()])
assert (sel.optimism >= 0).all()              # the test-selected choice can only look as good or better on test
nov = select_topk(runs.assign(val_accuracy=np.nan)).set_index("dataset")
assert nov.val_selected.isna().all() and nov.note.str.contains("validation").all()
assert select_topk(runs.drop(columns="val_accuracy")).val_selected.isna().all()


# %% [markdown]
# ## Learned α, training time, per-layer sparsity
#
# Small tidy helpers for the report figures: the α trajectories stored in `learned_history` (JSON: per epoch, per layer, per
# head), the training time of each run relative to softmax on the same dataset and seed, and Crisp's per-layer sparsity.

# %%
#| export
def alpha_long(runs, methods=("headwise_adaptive_entmax",)):
    "Long table (profile, dataset, method, seed, epoch, layer, head, alpha) from the `learned_history` JSON of `methods`' runs."
    cols = ["profile", "dataset", "method", "seed", "epoch", "layer", "head", "alpha"]
    if runs is None or "learned_history" not in runs: return pd.DataFrame(columns=cols)
    rows = []
    for r in runs[runs.method.isin(methods)].itertuples():
        h = r.learned_history
        if not isinstance(h, str) or not h.strip(): continue
        for ep in json.loads(h):
            for li, layer in enumerate(ep["alpha"]):
                for hi, a in enumerate(layer):
                    rows.append((r.profile, r.dataset, r.method, r.seed, ep["epoch"], li, hi, float(a)))
    return pd.DataFrame(rows, columns=cols)

def pad_attention(runs):
    "Per dataset, method and layer: mean attention mass on padding (CLS query; real-token queries) over the runs that recorded it."
    cols = ["dataset", "method", "layer", "runs", "cls", "tokens"]
    if runs is None or "pad_attention" not in runs: return pd.DataFrame(columns=cols)
    rows = [dict(dataset=r.dataset, method=r.method, seed=r.seed, layer=li, cls=l["cls"], tokens=l["tokens"])
            for r in runs.itertuples() if isinstance(r.pad_attention, str) and r.pad_attention.strip()
            for li, l in enumerate(json.loads(r.pad_attention))]
    if not rows: return pd.DataFrame(columns=cols)
    g = pd.DataFrame(rows).groupby(["dataset", "method", "layer"], sort=False)
    return g.agg(runs=("seed", "nunique"), cls=("cls", "mean"), tokens=("tokens", "mean")).reset_index()[cols]

def time_ratios(runs, baseline=BASELINE, col="train_seconds"):
    "Per run: `col` divided by the baseline's on the same profile, dataset and seed."
    if runs is None or len(runs) == 0: return pd.DataFrame(columns=["profile", "dataset", "seed", "method", "ratio"])
    b = runs[runs.method == baseline].set_index(["profile", "dataset", "seed"])[col].rename("base")
    j = runs.join(b, on=["profile", "dataset", "seed"], how="inner")
    return j.assign(ratio=j[col] / j.base)[["profile", "dataset", "seed", "method", "ratio"]]

def layer_sparsity(crisp):
    "Long table (config, seed, split, layer, sparsity) from Crisp's `sparsity_per_layer` JSON."
    cols = ["profile", "config", "seed", "split", "layer", "sparsity"]
    if crisp is None or "sparsity_per_layer" not in crisp: return pd.DataFrame(columns=cols)
    rows = [(r.profile, r.config, r.seed, r.split, i, float(s)) for r in crisp.itertuples()
            if isinstance(r.sparsity_per_layer, str) and r.sparsity_per_layer.strip()
            for i, s in enumerate(json.loads(r.sparsity_per_layer))]
    return pd.DataFrame(rows, columns=cols)


# %%
al = alpha_long(runs)
test_eq(len(al), sum(len(json.loads(h)) * 8 for h in runs[runs.method == "headwise_adaptive_entmax"].learned_history))
last = al[al.epoch == al.groupby(["dataset", "seed"]).epoch.transform("max")]
hae_rows = runs[runs.method == "headwise_adaptive_entmax"].set_index(["dataset", "seed"]).learned_alpha_mean
test_close(last.groupby(["dataset", "seed"]).alpha.mean().sort_index().to_numpy(), hae_rows.sort_index().to_numpy(), eps=1e-4)
tr = time_ratios(runs)
test_close(tr[tr.method == "softmax"].ratio.to_numpy(), 1.0)
test_eq(set(layer_sparsity(crisp).layer), set(range(6)))

# %% [markdown]
# Before the Crisp grid, the budget: a learning curve of the dense model's accuracy against the number of training
# sentences, one Crisp folder per point (`<folder>/n<N>/crisp_runs.csv`). The claim needs a model that is not
# under-trained — in the paper's regime the dense baseline is at 90.6% — so the curve says how close a budget gets.

# %%
#| export
def crisp_learning_curve(folder, config=CRISP_BASELINE):
    "Mean accuracy of `config` per (model, training sentences, epochs) and split over the Crisp folders under `folder`."
    frames = [f for p in sorted(Path(folder).glob("*/crisp_runs.csv")) if (f := load_crisp(p)) is not None]
    cols = ["model_name", "train_n", "epochs", "split", "seeds", "accuracy", "train_seconds"]
    d = pd.concat(frames) if frames else None
    if d is None or not len(d := d[d.config == config]): return pd.DataFrame(columns=cols)
    g = d.groupby(["model_name", "train_n", "epochs", "split"])
    return g.agg(seeds=("seed", "nunique"), accuracy=("accuracy", "mean"), train_seconds=("train_seconds", "median")
                 ).reset_index()[cols].sort_values(["model_name", "split", "train_n"], ignore_index=True)

# %%
with tempfile.TemporaryDirectory() as _d:
    raw_c = pd.read_csv(FIX / "crisp_runs.csv")
    for n_ in (600, 1200):
        (Path(_d) / f"n{n_}").mkdir()
        raw_c.assign(train_n=n_, accuracy=raw_c.accuracy + n_ / 1e5).to_csv(Path(_d) / f"n{n_}" / "crisp_runs.csv", index=False)
    lc = crisp_learning_curve(_d)
    dense_val = raw_c[(raw_c.config == "dense") & (raw_c.split == "validation")].accuracy.mean()
    test_eq(list(lc[lc.split == "validation"].train_n), [600, 1200])
    test_close(lc[lc.split == "validation"].accuracy.to_numpy(), [dense_val + 0.006, dense_val + 0.012], eps=1e-9)
    test_eq(set(lc.seeds), {raw_c[raw_c.config == "dense"].seed.nunique()})
    test_eq(len(crisp_learning_curve(Path(_d) / "none")), 0)

# %%
_pa = pd.DataFrame(dict(dataset="twenty_news", method=["softmax", "softmax", "sparsemax"], seed=[0, 1, 0],
                        pad_attention=[json.dumps([dict(cls=0.2, tokens=0.3), dict(cls=0.4, tokens=0.5)]),
                                       json.dumps([dict(cls=0.4, tokens=0.1), dict(cls=0.0, tokens=0.5)]), ""]))
test_eq(pad_attention(_pa).round(6).values.tolist(), [["twenty_news", "softmax", 0, 2, 0.3, 0.2], ["twenty_news", "softmax", 1, 2, 0.2, 0.5]])
test_eq(len(pad_attention(runs)), 0)                       # the fixture's runs predate the column

# %% [markdown]
# **Crisp's learning rate.** The paper does not give one; our CPU runs used 10⁻⁴, five times the usual 2·10⁻⁵ of
# DistilBERT fine-tuning recipes. `crisp_by_lr` sets the dense accuracy and each masking configuration's gain over dense
# side by side per learning rate (and split), paired by seed, with the Crisp equivalence margin (±0.5 pt).

# %%
#| export
def crisp_by_lr(crisp, baseline=CRISP_BASELINE):
    "Per learning rate, split and config: dense accuracy, the paired gain over dense with CI, Holm within (lr, split), TOST ±0.5 pt."
    cols = ["lr", "split", "method", "n", "baseline_accuracy", "mean_delta", "ci_low", "ci_high", "p", "p_holm", "p_tost", "equivalence"]
    if crisp is None or not len(crisp): return pd.DataFrame(columns=cols)
    rows = []
    for (_, _, _, lr, split), g in crisp.groupby(["profile", "model_name", "train_n", "lr", "split"], sort=True):
        if baseline not in set(g.config): continue
        for c in [c for c in CRISP_MASKED if c in set(g.config)]:
            r = _compare(g, "config", c, baseline, "accuracy", margin=EQUIVALENCE_MARGINS["crisp"])
            rows.append(dict(lr=lr, split=split, method=c, baseline_accuracy=float(g[g.config == baseline].accuracy.mean()),
                             family=(g.profile.iloc[0], g.model_name.iloc[0], g.train_n.iloc[0], lr, split), **r))
    if not rows: return pd.DataFrame(columns=cols)
    out = holm(pd.DataFrame(rows))
    out["equivalence"] = [equivalence_verdict(a, b, EQUIVALENCE_MARGINS["crisp"]) for a, b in zip(out.p_tost, out.p_holm)]
    return out[cols]

# %%
_cb = crisp_by_lr(pd.concat([crisp, crisp.assign(lr=1e-4, accuracy=crisp.accuracy + np.where(crisp.config == "dense", 0.0, 0.01))]))
test_eq(sorted(set(_cb.lr)), sorted({1e-4, *crisp.lr}))
_a = _cb.set_index(["lr", "split", "method"])
for split in ("validation", "test"):
    test_close(_a.loc[(1e-4, split, "adaptive_080"), "mean_delta"] - _a.loc[(crisp.lr.iloc[0], split, "adaptive_080"), "mean_delta"], 0.01, eps=1e-9)
test_eq(len(crisp_by_lr(None)), 0)

# %% [markdown]
# **Where does the learned α go?** "α stays ≈ 1.50–1.52" (A6) has two readings: α *settles* there from anywhere, or α
# barely moves from its start of 1.5 in six epochs. The start-value control trains the adaptive entmax with every head
# started at 1.2 and at 1.8 (`headwise_adaptive_entmax_start12`, `_start18`) on the main runs' seeds. For each start,
# dataset and layer, the final α (mean over heads) is compared by paired TOST (±0.05) with the runs started at 1.5
# (*settles*) and by TOST against the start itself (*stays where it started*); neither: *undecided*.

# %%
#| export
def alpha_start_tests(main, variant, base="headwise_adaptive_entmax"):
    "Per dataset, start value and layer ('all' = both): final α against the runs started at 1.5 and against the start (TOST ±0.05)."
    cols = ["dataset", "start", "layer", "n", "alpha_final", "alpha_from_15", "p_tost_settle", "p_tost_stay", "verdict"]
    if main is None or variant is None or not len(variant): return pd.DataFrame(columns=cols)
    starts = sorted(m for m in set(variant.method) if m.startswith(base + "_start"))
    la = pd.concat([alpha_long(main, (base,)), alpha_long(variant, starts)], ignore_index=True)
    if not len(la): return pd.DataFrame(columns=cols)
    fin = la[la.epoch == la.groupby(["dataset", "method", "seed"]).epoch.transform("max")]
    per_layer = fin.groupby(["dataset", "method", "seed", "layer"]).alpha.mean().reset_index()
    both = fin.groupby(["dataset", "method", "seed"]).alpha.mean().reset_index().assign(layer="all")
    tab, margin, rows = pd.concat([both, per_layer.assign(layer=per_layer.layer.astype(int))]), EQUIVALENCE_MARGINS["alpha_start"], []
    for (ds, layer), g in tab.groupby(["dataset", "layer"], sort=False):
        ref = g[g.method == base].set_index("seed").alpha
        for m in starts:
            j = pd.concat(dict(a=g[g.method == m].set_index("seed").alpha, b=ref), axis=1).dropna()
            if not len(j): continue
            start = parse_alpha_start(m)
            settle, stay = tost_paired(j.a, j.b, margin), tost_paired(j.a, np.full(len(j), start), margin)
            rows.append(dict(dataset=ds, start=start, layer=layer, n=len(j), alpha_final=float(j.a.mean()), alpha_from_15=float(j.b.mean()),
                             p_tost_settle=settle, p_tost_stay=stay,
                             verdict="settles" if settle < 0.05 else "stays where it started" if stay < 0.05 else "undecided"))
    return pd.DataFrame(rows, columns=cols)

# %% [markdown]
# Known answers: runs that end at their start ±0.01 "stay"; runs that end at the 1.5-start runs' α ±0.01 "settle".

# %%
def _hist(final):                       # an learned_history with epoch 0 at the start and epoch 6 at `final` (2 layers x 4 heads)
    return json.dumps([{"epoch": 0, "alpha": [[1.5] * 4] * 2}, {"epoch": 6, "alpha": [[final] * 4] * 2}])
_w = [0.004, -0.004, 0.002, -0.002, 0.0]
_main = pd.DataFrame([dict(profile="", dataset="fashion_mnist", method="headwise_adaptive_entmax", seed=k,
                           learned_history=_hist(1.51 + _w[k])) for k in range(5)])
_var = pd.DataFrame([dict(profile="", dataset="fashion_mnist", method=m, seed=k, learned_history=_hist(f + _w[(k + 1) % 5]))
                     for k in range(5) for m, f in [("headwise_adaptive_entmax_start12", 1.2), ("headwise_adaptive_entmax_start18", 1.515)]])
_at = alpha_start_tests(_main, _var)
test_eq(len(_at), 2 * 3)                                          # two starts x (all, layer 0, layer 1)
test_eq(_at.set_index(["start", "layer"]).loc[(1.2, "all"), "verdict"], "stays where it started")
test_eq(_at.set_index(["start", "layer"]).loc[(1.8, "all"), "verdict"], "settles")
test_close(_at.set_index(["start", "layer"]).loc[(1.8, 0), "alpha_final"], 1.515, eps=1e-9)
test_eq(len(alpha_start_tests(_main, None)), 0)

# %% [markdown]
# **One new draw.** A single run's number (the Crisp paper reports one run per configuration) is compared with the
# interval that holds one new seed's result with 95 % probability, not with the CI of our mean.

# %%
#| export
def prediction_interval(x, level=0.95):
    "Interval that holds one new draw with probability `level`: mean ± t·s·√(1 + 1/n)."
    x = pd.Series(x, dtype=float).dropna(); n = len(x)
    if n < 2: return np.nan, np.nan
    h = sps.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) * math.sqrt(1 + 1 / n)
    return float(x.mean() - h), float(x.mean() + h)

# %%
_x = np.random.default_rng(0).normal(0.5, 0.1, 8)
_lo, _hi = prediction_interval(_x)
_h = sps.t.ppf(0.975, 7) * np.std(_x, ddof=1) * math.sqrt(1 + 1 / 8)
test_close((_lo, _hi), (_x.mean() - _h, _x.mean() + _h))
_draws = np.random.default_rng(1).normal(0, 1, (4000, 9))                  # 8 to build the interval, the 9th to fall in it
_cover = np.mean([lo <= d[8] <= hi for d in _draws for lo, hi in [prediction_interval(d[:8])]])
assert 0.93 < _cover < 0.97, _cover
assert all(np.isnan(prediction_interval([0.3])))                             # one draw: no interval

# %% [markdown]
# ## Ablations: does an effect survive when a confound is removed?
#
# Each ablation reruns part of the grid with one thing changed — padding masked, the original's approximate entmax
# gradient, 4×4 patches, a learnable marker task, Fashion-MNIST through the JPEG codec of the offline CIFAR-10 copy, a
# learned padding embedding — on the *same seeds and subsets* as the
# main runs, into its own results folder. `ablation_tests` pairs the two by seed, per dataset and method, and answers three
# questions with paired t-tests: the method's gain over softmax in the main runs, the same gain in the variant (Holm over
# the variant's methods), and how much the variant changes that gain — $(m_v - s_v) - (m_m - s_m)$ per seed. It also
# reports the variant's direct effect on the method, $m_v - m_m$. A variant folder without softmax (the gradient ablation
# only reruns entmax) is compared against the main softmax, which the change does not touch. `rename` maps a variant's
# method names onto the main ones (`entmax15_bisect` → `entmax15`). Each ablation trains only the methods its question
# is about (with softmax, the baseline), which keeps them affordable on a CPU; a subset trained in lock-step gives the
# same numbers as the full set (see `03_train`), so the pairing with the main runs holds.

# %%
#| export
ABLATION_COLS = ["dataset", "method", "n", "gain_main", "gain_variant", "gain_variant_ci_low", "gain_variant_ci_high",
                 "gain_variant_p_holm", "gain_change", "gain_change_ci_low", "gain_change_ci_high", "gain_change_p",
                 "gain_change_p_tost", "variant_minus_main", "variant_minus_main_p", "accuracy_variant"]

def _by_seed(df, dataset, method):
    return df[(df.dataset == dataset) & (df.method == method)].set_index("seed").accuracy

def ablation_tests(main, variant, rename=None, baseline=BASELINE):
    "Per dataset and method: gain over softmax in main and variant, the change of that gain, and variant − main (paired by seed)."
    if main is None or variant is None or not len(variant): return pd.DataFrame(columns=ABLATION_COLS)
    variant = variant.assign(method=variant.method.replace(rename or {}))
    rows = []
    for ds in dict.fromkeys(variant.dataset):
        s_m = _by_seed(main, ds, baseline)
        s_v = _by_seed(variant, ds, baseline) if baseline in set(variant[variant.dataset == ds].method) else s_m
        for m in [m for m in method_order(variant[variant.dataset == ds].method) if m != baseline]:
            m_m, m_v = _by_seed(main, ds, m), _by_seed(variant, ds, m)
            j = pd.concat(dict(mm=m_m, mv=m_v, sm=s_m, sv=s_v), axis=1, join="inner")
            gm, gv = paired_stats(j.mm, j.sm), paired_stats(j.mv, j.sv)
            ch = paired_stats(j.mv - j.sv, j.mm - j.sm)
            vm = paired_stats(j.mv, j.mm)
            rows.append(dict(dataset=ds, method=m, n=len(j), gain_main=gm["mean_delta"], gain_variant=gv["mean_delta"],
                             gain_variant_ci_low=gv["ci_low"], gain_variant_ci_high=gv["ci_high"], p=gv["p"],
                             gain_change=ch["mean_delta"], gain_change_ci_low=ch["ci_low"], gain_change_ci_high=ch["ci_high"],
                             gain_change_p=ch["p"], variant_minus_main=vm["mean_delta"], variant_minus_main_p=vm["p"],
                             gain_change_p_tost=tost_paired(j.mv - j.sv, j.mm - j.sm, EQUIVALENCE_MARGINS["ablation"]),
                             accuracy_variant=float(j.mv.mean()), family=ds))
    if not rows: return pd.DataFrame(columns=ABLATION_COLS)
    out = holm(pd.DataFrame(rows), family_cols=("family",))
    return out.rename(columns={"p_holm": "gain_variant_p_holm"})[ABLATION_COLS]


# %% [markdown]
# A known-answer check on the fixture grid: a variant in which entmax-1.5 scores exactly 1 pt more on every seed and
# everything else is unchanged has a gain change of +1 pt (zero variance: no p-value), the other methods' gains are
# untouched, and renaming maps a variant's method names onto the main ones.

# %%
main_fx = runs[runs.profile == runs.profile.iloc[0]]
var_fx = main_fx[main_fx.dataset == "twenty_news"].copy()
var_fx.loc[var_fx.method == "entmax15", "accuracy"] += 0.01
ab = ablation_tests(main_fx, var_fx).set_index("method")
test_close(ab.loc["entmax15", "gain_change"], 0.01, eps=1e-12); test_close(ab.loc["entmax15", "variant_minus_main"], 0.01, eps=1e-12)
test_close(ab.loc["sparsemax", "gain_change"], 0.0, eps=1e-12)
test_close(ab.loc["sparsemax", "gain_variant"], pt.set_index(["family", "dataset", "method"]).loc[("main", "twenty_news", "sparsemax"), "mean_delta"])
test_eq(len(ab), 6); test_eq(set(ab.dataset), {"twenty_news"})
only = var_fx[var_fx.method == "entmax15"].assign(method="entmax15_bisect")      # no softmax in the variant: main's is used
ab2 = ablation_tests(main_fx, only, rename={"entmax15_bisect": "entmax15"}).set_index("method")
test_eq(list(ab2.index), ["entmax15"]); test_close(ab2.loc["entmax15", "gain_change"], 0.01, eps=1e-12)
test_eq(len(ablation_tests(main_fx, None)), 0)

# %% [markdown]
# **The ablation family.** Each ablation asks whether removing one confound *changes* a gain. Those change tests, across
# all ablations, form one Holm family (`gain_change_p_holm`), so running more ablations cannot manufacture a finding.
# "No change" is claimed only by equivalence (TOST, ±1 pt, declared in the protocol notebook): `change_verdict` reads
# *equivalent within ±1.0 pt*, *different* (Holm p < 0.05 and not equivalent) or *undecided*.

# %%
#| export
def ablation_family(tables: dict):
    "Concatenate `ablation_tests` tables (name -> table), Holm-adjust the gain changes across them all, add the change verdict."
    parts = [t.assign(ablation=name) for name, t in tables.items() if len(t)]
    if not parts: return pd.DataFrame(columns=["ablation", *ABLATION_COLS, "gain_change_p_holm", "change_word", "change_verdict"])
    out = holm(pd.concat(parts, ignore_index=True).assign(_family="ablations"), family_cols=("_family",), p_col="gain_change_p")
    out = out.rename(columns={"p_holm": "gain_change_p_holm"}).drop(columns="_family")
    out["change_word"] = [equivalence_word(a, b) for a, b in zip(out.gain_change_p_tost, out.gain_change_p_holm)]
    out["change_verdict"] = [equivalence_verdict(a, b, EQUIVALENCE_MARGINS["ablation"])
                             for a, b in zip(out.gain_change_p_tost, out.gain_change_p_holm)]
    return out[["ablation", *ABLATION_COLS, "gain_change_p_holm", "change_word", "change_verdict"]]

# %% [markdown]
# On the fixture: a second table whose changes share the family halves no p-value the wrong way — each adjusted p equals
# Holm by hand over the pooled raw p-values — and a gain that moved by exactly +1 pt on every seed (no spread) is not
# equivalent within ±1 pt.

# %%
ab_noise = ab.reset_index().assign(gain_change_p=[0.01, 0.2, 0.03, 0.5, 0.04, 0.002])
fam = ablation_family({"a": ab_noise, "b": ab_noise.assign(gain_change_p=ab_noise.gain_change_p * 2)})
test_eq(len(fam), 12); test_eq(list(fam.ablation.unique()), ["a", "b"])
test_close(fam.gain_change_p_holm.to_numpy(), manual_holm(np.r_[ab_noise.gain_change_p, 2 * ab_noise.gain_change_p]))
test_eq(fam.set_index(["ablation", "method"]).loc[("a", "entmax15"), "change_verdict"], "undecided")   # +1 pt, not inside ±1, Holm p 1
test_eq(fam.set_index(["ablation", "method"]).loc[("a", "topk_softmax_05"), "change_verdict"], "equivalent within ±1.0 pt")  # unchanged, whatever its p
fam1 = ablation_family({"a": ab.reset_index()}).set_index("method")
test_eq(fam1.loc["entmax15", "change_verdict"], "undecided")            # a constant +1 pt: not inside ±1 pt, no t-test possible
test_eq(fam1.loc["sparsemax", "change_verdict"], "equivalent within ±1.0 pt")   # unchanged on every seed
test_eq(len(ablation_family({})), 0)

# %% [markdown]
# ## Follow-up experiments and learning curves
#
# The follow-ups are grids on the main runs' seeds, each into `<results>/follow_ups/<name>`. A run made with
# `--epoch-eval` carries its learning curve (`epoch_metrics`, JSON); `run_curves` unpacks the rows of a grid into one
# long table, one row per (dataset, method, seed, learning rate, epoch). The tuned-recipe protocol (`05b_tuning`) reads
# its grids through it.

# %%
#| export
CURVE_COLS = ["dataset", "method", "seed", "lr", "epoch", "val_accuracy", "val_loss", "test_accuracy", "test_loss"]

def run_curves(runs) -> pd.DataFrame:
    "Long table of the learning curves (`epoch_metrics`) of the rows of `runs`: one row per (dataset, method, seed, lr, epoch)."
    out = []
    if runs is not None and "epoch_metrics" in runs:
        for row in runs.itertuples():
            if isinstance(row.epoch_metrics, str) and row.epoch_metrics:
                out += [dict(dataset=row.dataset, method=row.method, seed=int(row.seed), lr=float(row.lr), **e)
                        for e in json.loads(row.epoch_metrics)]
    return pd.DataFrame(out, columns=CURVE_COLS)

# %%
_em = json.dumps([dict(epoch=e, val_accuracy=0.5 + e / 10, val_loss=1.0, test_accuracy=0.4, test_loss=1.0) for e in (1, 2)])
_rc = run_curves(pd.DataFrame([dict(dataset="kmnist", method="softmax", seed=3, lr=3e-3, epoch_metrics=_em),
                               dict(dataset="kmnist", method="sparsemax", seed=3, lr=3e-3, epoch_metrics=np.nan)]))
test_eq(_rc[["method", "seed", "lr", "epoch", "val_accuracy"]].values.tolist(), [["softmax", 3, 3e-3, 1, 0.6], ["softmax", 3, 3e-3, 2, 0.7]])

# %% [markdown]
# ## A new method against the committed baselines
#
# A researcher with a new normalizer trains only it (`sparse-repro grid --methods mine --baseline outputs/paper`), on
# the committed runs' seeds, subsets and options: each of its runs then starts from the same initial weights, sees the
# same batches and draws the same dropout masks as the committed runs of its seed. `versus_baseline` pairs it by seed
# with each of the seven committed methods per dataset: the accuracy difference with its 95 % CI and p, Holm-adjusted
# within **the new method's own family** (all its comparisons, every dataset) — the paper's families are untouched —,
# the attention density of both, and the median per-seed ratio of training time. The time ratio compares runs made at
# different times (and the committed ones in lock-step with six other methods), so it is a rough guide, not a benchmark.
#
# `pairing_check` is the proof that the pairing is real: the grid re-runs softmax on the first seed of every dataset,
# and its accuracy must equal the committed one bit for bit.
#
# When a folder holds several new methods trained together — a normalizer and its control, such as Scalable-Softmax and
# a learned-temperature softmax — `between_new_methods` pairs them with each other by seed, per dataset, as one more
# Holm family of its own.

# %%
#| export
DATASET_ORDER = DATASETS            # the report's order: the registry's (a dataset registered later comes last)

def _in_dataset_order(datasets) -> list:
    "`datasets` in the report's order, any other dataset after them by name."
    ds = set(datasets)
    return [d for d in DATASET_ORDER if d in ds] + sorted(ds - set(DATASET_ORDER))

VERSUS_COLS = ["family", "dataset", "method", "baseline", "n", "mean_delta", "ci_low", "ci_high", "p", "p_holm",
               "density", "baseline_density", "time_ratio"]

def _paired_row(family, ds, method, baseline, a, b) -> dict:
    "One comparison row: runs `a` of `method` against runs `b` of `baseline` (both indexed by seed), paired by seed."
    j = a.join(b, how="inner", lsuffix="_a", rsuffix="_b")
    r = paired_stats(j.accuracy_a, j.accuracy_b)
    return dict(family=family, dataset=ds, method=method, baseline=baseline, **{k: r[k] for k in ("n", "mean_delta", "ci_low", "ci_high", "p")},
                density=float(j.nonzero_ratio_a.mean()), baseline_density=float(j.nonzero_ratio_b.mean()),
                time_ratio=float((j.train_seconds_a / j.train_seconds_b).median()))

def versus_baseline(new, base, methods=None, baselines=PAPER_METHODS):
    "Each of `methods` (default: those of `new` that are not `baselines`) against each baseline method of `base`, per dataset, paired by seed."
    if new is None or base is None or not len(new) or not len(base): return pd.DataFrame(columns=VERSUS_COLS)
    methods = [m for m in method_order(new.method) if m not in baselines] if methods is None else list(methods)
    rows = []
    for m in methods:
        for ds in _in_dataset_order(new[new.method == m].dataset):         # a folder's methods need not share datasets
            a = new[(new.dataset == ds) & (new.method == m)].set_index("seed")
            for b_name in [b for b in baselines if b in set(base[base.dataset == ds].method)]:
                b = base[(base.dataset == ds) & (base.method == b_name)].set_index("seed")
                rows.append(_paired_row(f"versus:{m}", ds, m, b_name, a, b))
    return holm(pd.DataFrame(rows))[VERSUS_COLS] if rows else pd.DataFrame(columns=VERSUS_COLS)

def between_new_methods(new, baselines=PAPER_METHODS):
    "The new methods of `new` against each other, each pair per dataset, paired by seed; Holm over all these pairs (one family)."
    methods = [m for m in method_order(new.method) if m not in baselines] if new is not None and len(new) else []
    rows = []
    for ds in _in_dataset_order(new.dataset) if methods else []:
        for i, m in enumerate(methods):
            for other in methods[i + 1:]:
                a, b = (new[(new.dataset == ds) & (new.method == x)].set_index("seed") for x in (m, other))
                if len(a.index.intersection(b.index)): rows.append(_paired_row("between new methods", ds, m, other, a, b))
    return holm(pd.DataFrame(rows))[VERSUS_COLS] if rows else pd.DataFrame(columns=VERSUS_COLS)

def pairing_check(new, base, method=BASELINE):
    "The runs of `method` in `new` beside the committed ones of the same (dataset, seed): `identical` when the accuracies are equal bit for bit."
    cols = ["dataset", "seed", "committed", "rerun", "identical"]
    if new is None or base is None: return pd.DataFrame(columns=cols)
    j = pd.merge(new[new.method == method][["dataset", "seed", "accuracy"]], base[base.method == method][["dataset", "seed", "accuracy"]],
                 on=["dataset", "seed"], suffixes=("_new", "_base"))
    return pd.DataFrame(dict(dataset=j.dataset, seed=j.seed, committed=j.accuracy_base, rerun=j.accuracy_new,
                             identical=j.accuracy_base.to_numpy() == j.accuracy_new.to_numpy()))[cols]

# %% [markdown]
# Checked on the fixture grid: a "new" method that is sparsemax under another name must differ from sparsemax by exactly
# zero, and its comparison with softmax must be scipy's paired t-test of sparsemax against softmax; Holm runs over the new
# method's 35 comparisons (5 datasets × 7), recomputed by hand. The paper's own tests do not change.

# %%
new = runs[runs.method == "sparsemax"].assign(method="my_norm")
vt = versus_baseline(new, runs)
test_eq(len(vt), 5 * 7); test_eq(set(vt.family), {"versus:my_norm"})
same = vt[vt.baseline == "sparsemax"]
test_eq(same.mean_delta.abs().max(), 0.0)
row = vt[(vt.dataset == "cifar10") & (vt.baseline == "softmax")].iloc[0]
j = runs[runs.dataset == "cifar10"].pivot(index="seed", columns="method", values="accuracy")
test_close(row.p, sps.ttest_rel(j.sparsemax, j.softmax).pvalue); test_close(row.mean_delta, (j.sparsemax - j.softmax).mean())
ok = vt.p.notna()
test_close(vt.p_holm[ok].to_numpy(), manual_holm(vt.p[ok].to_numpy()))
test_close(row.density, runs[(runs.dataset == "cifar10") & (runs.method == "sparsemax")].nonzero_ratio.mean())
test_eq(paired_tests(pd.concat([runs, new])), paired_tests(runs))                     # the paper's tests ignore the new method
# two new methods (sparsemax and top-k 0.25 under other names): their pair is scipy's paired t-test of the originals
two = pd.concat([new, runs[runs.method == "topk_softmax_025"].assign(method="my_other")])
bt = between_new_methods(two)
test_eq((len(bt), set(bt.method), set(bt.baseline), set(bt.family)), (5, {"my_norm"}, {"my_other"}, {"between new methods"}))
b = bt[bt.dataset == "cifar10"].iloc[0]
test_close(b.p, sps.ttest_rel(j.sparsemax, j.topk_softmax_025).pvalue); test_close(b.mean_delta, (j.sparsemax - j.topk_softmax_025).mean())
test_close(bt.p_holm[bt.p.notna()].to_numpy(), manual_holm(bt.p[bt.p.notna()].to_numpy()))
test_eq(len(between_new_methods(new)), 0)                                          # one new method: no pair
# a method run on fewer datasets than its folder's others is compared where it ran, and its Holm family is that size
part = pd.concat([new, runs[(runs.method == "entmax15") & (runs.dataset == "kmnist")].assign(method="my_late")])
vp = versus_baseline(part, runs)
test_eq((len(vp[vp.method == "my_late"]), set(vp[vp.method == "my_late"].dataset)), (7, {"kmnist"}))
late = vp[(vp.method == "my_late") & vp.p.notna()]                                # against entmax-1.5 itself: no p
test_eq(len(late), 6); test_close(late.p_holm.to_numpy(), manual_holm(late.p.to_numpy()))
pc = pairing_check(runs[runs.method == "softmax"].iloc[:2], runs)
test_eq(pc.identical.tolist(), [True, True])
pc = pairing_check(runs[runs.method == "softmax"].iloc[:2].assign(accuracy=lambda d: d.accuracy + 1e-12), runs)
test_eq(pc.identical.tolist(), [False, False])

