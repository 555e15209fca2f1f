# %% [markdown]
# # The leaderboard
# > Every normalizer with committed runs, per dataset: its gain over softmax under the paper's recipe and at a tuned recipe, in the pretrained encoder, its density and cost — joined from the committed tables.

# %%
#| default_exp leaderboard

# %% [markdown]
# The leaderboard computes no statistic of its own: it joins what the committed tables already hold, so each number in
# it is the one the report and the experiment folders show.
#
# | column | from | Holm family |
# |---|---|---|
# | paper-recipe gain over softmax | `paper/tables/paired_tests.csv` (the seven); `<folder>/versus_baseline.csv` of every folder judged against the committed baselines (`grid --baseline`) | the paper's for the seven; each new normalizer's own |
# | tuned gain over tuned softmax | `paper/tables/tuned_tests.csv` (the protocol's grid where it has run, else the first round); `<folder>/fair_verdict.csv` of every normalizer searched with `tuned --methods` | the paper's; each new normalizer's own |
# | pretrained-encoder gain over dense | `paper/tables/crisp_normalizer_tests.csv` (SST-2 test; fewer seeds than the column's most-run normalizer: *provisional*) | its own |
# | density | the runs' `nonzero_ratio` (mean over seeds, paper recipe) | — |
# | training cost | `train_seconds` over softmax's in the same lock-step notebook (the seven only: a method run another day is not timed side by side) | — |
#
# A normalizer judged with `sparse-repro grid --methods mine --baseline outputs/paper --out outputs/mine` appears once
# its `versus_baseline.csv` exists under the outputs folder: nothing here names it. A folder whose runs used other run
# options than the main results (its `manifest.json`: padding masked, other patches, …) is a variant, read in its own
# `versus_baseline.md`, not in the paper-recipe column. The verdict words: **better** /
# **worse** — significant after Holm in its family; **n.s.** — neither; a tuned verdict keeps the protocol's words.

# %%
#| export
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sparse_attention_repro.study import BASELINE, method_order
from sparse_attention_repro.data import DATASETS
from sparse_attention_repro.catalogue import CATALOGUE

# %%
from fastcore.test import test_eq, test_close, test_fail
import tempfile

# %%
#| export
def same_recipe(folder, main_folder, study="study_a") -> bool:
    """Whether the runs in `folder` were made with the run options of `main_folder` (each `manifest.json`'s `study` options,
    compared where both record one): a variant (padding masked, other patches, …) is not the paper's recipe."""
    import json
    read = lambda f: json.loads((Path(f) / "manifest.json").read_text()).get(study, {}) if (Path(f) / "manifest.json").exists() else {}
    a, b = read(folder), read(main_folder)
    return all(a[k] == b[k] for k in a.keys() & b.keys())

LEADERBOARD_COLS = ["normalizer", "dataset", "reading", "gain", "ci_low", "ci_high", "p_holm", "verdict", "n", "margin", "p_tost", "source",
                   "test_length", "word", "provisional", "first_round"]

def _word(gain, p_holm, alpha=0.05) -> str:
    "The verdict word of a paired comparison; `untested` where no test ran (one seed: no p-value)."
    return "untested" if pd.isna(p_holm) else "n.s." if not (p_holm < alpha) else "better" if gain > 0 else "worse"

def _provisional(t):
    "Mark the tuned verdicts whose seeds have not all run at the chosen recipes (`provisional`)."
    from sparse_attention_repro.tuned_reading import _flag                       # yes/no as read back from a CSV
    done = _flag(t.complete) if "complete" in t else pd.Series(True, index=t.index)
    return t.assign(provisional=~done.to_numpy(bool))

def _rows(t, reading, source, method="method", gain="mean_delta", verdict=None, dataset="dataset", word=None):
    """Leaderboard rows of a source table `t`: its verdict as the source words it (column `verdict`, with any note of its
    protocol, e.g. `persists, under 1 pt`), its bare word (column `word` of the source; without either, `_word` of the
    gain and Holm p), and the typed notes `provisional` and `first_round`."""
    nan, no = pd.Series(np.nan, index=t.index), pd.Series(False, index=t.index)   # a table without an equivalence test (or no test length)
    words = t[verdict] if verdict else pd.Series([_word(g, p) for g, p in zip(t[gain], t.p_holm)], index=t.index)
    bare = t[word] if word else words
    return pd.DataFrame(dict(normalizer=t[method], dataset=t[dataset], reading=reading, gain=t[gain], ci_low=t.ci_low, ci_high=t.ci_high,
                             p_holm=t.p_holm, n=t.n, margin=t.get("margin", nan), p_tost=t.get("p_tost", nan), source=source,
                             test_length=t.get("length", nan), verdict=words, word=bare,
                             provisional=t.get("provisional", no).astype(bool), first_round=t.get("first_round", no).astype(bool)))

def verdict_label(r) -> str:
    "A row's verdict as the board shows it: the source's words, then `first round` and `provisional (n seeds)` where they apply."
    return str(r.verdict) + (", first round" if r.first_round else "") + (f", provisional ({int(r.n)} seeds)" if r.provisional else "")

LENGTH_ROOT, LENGTH_POSITIONS = CATALOGUE["length"].root, "nape"

def length_leaderboard_rows(outputs, baseline=BASELINE, positions=LENGTH_POSITIONS) -> pd.DataFrame:
    """The length study's rows: per task, each normalizer's exact-match gain over `baseline` at the longest test length
    that every normalizer of the task was tested at, under the study's primary position scheme; provisional where an arm
    of the task chose a step still climbing (the edge rule lengthens every arm and reads the selection again)."""
    f = Path(outputs) / LENGTH_ROOT / "tables" / "length_gains.csv"
    if not f.exists(): return pd.DataFrame(columns=LEADERBOARD_COLS)
    t = pd.read_csv(f).query("positions == @positions and baseline == @baseline")
    shared = t.groupby(["task", "normalizer"]).length.max().groupby("task").min()   # the longest length every normalizer reached
    t = t[t.length == t.task.map(shared)]
    rec = f.parent / "length_recipes.csv"
    if rec.exists():
        from sparse_attention_repro.length_analysis import edge_arms
        t = t.assign(provisional=t.task.isin(set(edge_arms(pd.read_csv(rec).query("positions == @positions")).task)))
    return _rows(t, "length", f.relative_to(outputs).as_posix(), method="normalizer", verdict="verdict", dataset="task")

def leaderboard_rows(outputs, main="paper", baseline=BASELINE) -> pd.DataFrame:
    """The long leaderboard of the committed results under `outputs`: one row per (normalizer, dataset, reading), each
    against `baseline` (the pretrained-encoder column, judged against dense, only against softmax)."""
    outputs = Path(outputs); tab = outputs / main / "tables"; parts = []
    if (f := tab / "paired_tests.csv").exists():
        t = pd.read_csv(f).query("baseline == @baseline and metric == 'accuracy'")
        parts.append(_rows(t, "paper recipe", f"{main}/tables/paired_tests.csv"))
    found = [(f, pd.read_csv(f)) for f in sorted(outputs.glob("**/versus_baseline.csv")) if same_recipe(f.parent, outputs / main)]
    seen = set()                                                          # a variant's verdicts live in its own folder
    for f, t in sorted(found, key=lambda x: -len(x[1])):                  # a method in several folders: read in its largest family
        t = t.query("baseline == @baseline")
        t = t[pd.Series([k not in seen for k in zip(t.method, t.dataset)], index=t.index, dtype=bool)]
        seen |= set(zip(t.method, t.dataset))
        parts.append(_rows(t, "paper recipe", f.relative_to(outputs).as_posix()))
    if (f := tab / "tuned_tests.csv").exists():
        t = pd.read_csv(f).query("baseline == @baseline")
        t = t[t.source == "tuned"].pipe(lambda x: pd.concat([x, t[(t.source != "tuned") & ~t.set_index(["dataset", "method"]).index.isin(
            x.set_index(["dataset", "method"]).index)]]))        # the protocol's grid first, the first round where it has not run
        t = _provisional(t.assign(first_round=t.source == "first round"))
        parts.append(_rows(t, "tuned", f"{main}/tables/tuned_tests.csv", gain="gain", verdict="verdict", word="word"))
    for f in sorted(outputs.glob("**/fair_verdict.csv")):                  # a new normalizer's own tuned search (`tuned --methods`)
        t = _provisional(pd.read_csv(f).query("baseline == @baseline"))
        if len(t): parts.append(_rows(t, "tuned", f.relative_to(outputs).as_posix(), gain="gain", verdict="verdict", word="word"))
    if baseline == BASELINE and (f := tab / "crisp_normalizer_tests.csv").exists():
        t = pd.read_csv(f); t = t[t.family.str.endswith("_test")].assign(dataset="sst2_encoder")
        r = _rows(t, "pretrained encoder", f"{main}/tables/crisp_normalizer_tests.csv")   # fewer seeds than the column's most: provisional
        parts.append(r.assign(provisional=r.n < r.n.max()))
    parts.append(length_leaderboard_rows(outputs, baseline))
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True)[LEADERBOARD_COLS] if parts else pd.DataFrame(columns=LEADERBOARD_COLS)

# %% [markdown]
# Density and cost come from the runs themselves: density is the mean `nonzero_ratio` of a normalizer's runs at the
# paper's recipe; the cost ratio is its `train_seconds` over softmax's *in the same notebook* (the seven train in
# lock-step, one process, one core), median over seeds — a normalizer run on another day gets none. Every normalizer with
# a card also has a per-step cost: its forward + backward over softmax's, measured side by side in one process on one
# thread when the card is written, kept in `cards/step_costs.csv` (`keep_step_costs`, read by `step_costs`), so a
# normalizer measured but not yet run still gets its row.

# %%
#| export
def density_and_cost(outputs, main="paper") -> pd.DataFrame:
    "Per (normalizer, dataset): mean density over its paper-recipe runs, and the median same-notebook cost ratio to softmax."
    outputs = Path(outputs); frames = []
    for f in [outputs / main / "runs.csv", *[v for v in sorted(outputs.glob("**/versus_baseline.csv")) if same_recipe(v.parent, outputs / main)]]:
        runs = f if f.name == "runs.csv" else f.parent / "runs.csv"
        if runs.exists(): frames.append(pd.read_csv(runs).query("status == 'ok'").assign(_same=f.name == "runs.csv"))
    if not frames: return pd.DataFrame(columns=["normalizer", "dataset", "density", "cost_vs_softmax"])
    r = pd.concat(frames, ignore_index=True)
    dens = r.groupby(["method", "dataset"]).nonzero_ratio.mean().rename("density")
    same = r[r._same]
    base = same[same.method == BASELINE].set_index(["dataset", "seed"]).train_seconds
    ratio = same.assign(ratio=same.train_seconds.to_numpy() / base.reindex(list(zip(same.dataset, same.seed))).to_numpy())
    cost = ratio.groupby(["method", "dataset"]).ratio.median().rename("cost_vs_softmax")
    return pd.concat([dens, cost], axis=1).reset_index().rename(columns={"method": "normalizer"})

STEP_COSTS = "cards/step_costs.csv"
STEP_COST_COLUMNS = ["normalizer", "shape", "ms", "ratio_to_softmax", "ratio_q25", "ratio_q75", "repeats", "threads", "load_1min", "cpus", "cpu"]

def cpu_name() -> str:
    "The processor a cost was measured on, with torch's vector capability: a ratio measured on one CPU can differ on another."
    import platform
    try: name = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
    except OSError: name = ""
    return f"{name or platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()}"

def keep_step_costs(outputs, name, cost, repeats):
    "Replace `name`'s rows in `<outputs>/cards/step_costs.csv` by this measurement (`bench_normalizers` rows of the kernels path)."
    from sparse_attention_repro.files import atomic_write
    f = Path(outputs) / STEP_COSTS
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else float("nan")   # a busy machine inflates long calls most
    new = cost.assign(normalizer=name, repeats=repeats, threads=1, load_1min=load, cpus=os.cpu_count(), cpu=cpu_name())
    old = pd.read_csv(f) if f.exists() else new.iloc[:0]
    both = (pd.concat([old[old.normalizer != name], new], ignore_index=True)
            .reindex(columns=STEP_COST_COLUMNS).sort_values(["normalizer", "shape"]))   # an older file's columns in today's order
    atomic_write(f, lambda tmp: both.to_csv(tmp, index=False))

def step_costs(outputs) -> pd.DataFrame:
    "The kept per-step costs: one row per normalizer, the forward+backward ratio to softmax per shape (`T=17`, `T=97`)."
    f = Path(outputs) / STEP_COSTS
    if not f.exists(): return pd.DataFrame(columns=["normalizer"])
    t = pd.read_csv(f).assign(T=lambda d: "T=" + d["shape"].str.split("x").str[-1])
    return t.pivot_table(index="normalizer", columns="T", values="ratio_to_softmax").reset_index()

# %% [markdown]
# A new normalizer's own search may choose its rates by successive halving (`tuned --halving`), a cheaper selection the
# protocol declared before any use; the seven baselines were searched in full. Wherever such a verdict is shown, the
# board and the card say so, in `tuning.halving_note`'s words.

# %%
#| export
def halving_searched(outputs, name=None) -> list:
    "The normalizers (or only `name`) whose fair verdict under `outputs` comes from a search by successive halving."
    from sparse_attention_repro.tuning import search_rule
    found = [(f.parent, pd.read_csv(f, usecols=["method"]).method.unique()) for f in sorted(Path(outputs).glob("**/fair_verdict.csv"))]
    return [m for folder, ms in found if search_rule(folder) is not None for m in ms if name is None or m == name]

# %%
_hv = Path(tempfile.mkdtemp()); (_hv / "a" / "tuned").mkdir(parents=True); (_hv / "b" / "tuned").mkdir(parents=True)
for _f, _m in (("a", "mine"), ("b", "other")): pd.DataFrame(dict(method=[_m], baseline=["softmax"])).to_csv(_hv / _f / "fair_verdict.csv", index=False)
from sparse_attention_repro.tuning import record_search_rule, HALVING
record_search_rule(_hv / "a", HALVING); record_search_rule(_hv / "b", None)
test_eq((halving_searched(_hv), halving_searched(_hv, "other"), halving_searched(_hv, "mine")), (["mine"], [], ["mine"]))

# %% [markdown]
# ## The table
#
# `leaderboard_table` puts it in one row per normalizer: per dataset, the paper-recipe and the tuned gain with their
# verdict (points), then the pretrained-encoder gain, the mean density and the median cost ratio over datasets.

# %%
#| export
def _cell(r) -> str:
    ci = f"({100 * r.ci_low:+.1f}, {100 * r.ci_high:+.1f})" if pd.notna(r.ci_low) and pd.notna(r.ci_high) else "(no CI)"
    return f"{100 * r.gain:+.1f} {ci} {verdict_label(r)}"

def leaderboard_table(rows, extra=None, steps=None) -> pd.DataFrame:
    """One row per normalizer: `<dataset>: paper` and `<dataset>: tuned` cells, the encoder gain, density, the training time
    beside softmax's in the same notebook, and the per-step cost measured beside softmax's (`steps`, from `step_costs`)."""
    order = [d for d in DATASETS if d in set(rows.dataset)]
    names = method_order(set(rows.normalizer) | set(extra.normalizer if extra is not None else [])
                         | set(steps.normalizer if steps is not None else []))
    out = pd.DataFrame(index=pd.Index([n for n in names if n != BASELINE], name="normalizer"))
    for ds in order:
        for reading, label in (("paper recipe", "paper"), ("tuned", "tuned")):
            g = rows[(rows.dataset == ds) & (rows.reading == reading)].drop_duplicates("normalizer").set_index("normalizer")
            if len(g): out[f"{ds}: {label}"] = [(_cell(g.loc[n]) if n in g.index else "") for n in out.index]
    enc = rows[rows.reading == "pretrained encoder"].drop_duplicates("normalizer").set_index("normalizer")
    out["encoder (SST-2 test)"] = [(_cell(enc.loc[n]) if n in enc.index else "") for n in out.index]
    long = rows[rows.reading == "length"]
    for (task, length), g in (long.groupby(["dataset", "test_length"], sort=False) if len(long) else []):
        g = g.drop_duplicates("normalizer").set_index("normalizer")
        out[f"length: {task} at {int(length):,} tokens"] = [(_cell(g.loc[n]) if n in g.index else "") for n in out.index]
    if extra is not None and len(extra):
        learn = [d for d in order if d in set(rows[rows.reading == "tuned"].dataset)] or order   # the datasets searched, else all
        dens = {n: g for n, g in extra[extra.dataset.isin(learn)].dropna(subset=["density"]).groupby("normalizer")}
        def density(n):                                  # a mean over other datasets than the board's is named as such
            if n not in dens: return ""
            ran = [d for d in learn if d in set(dens[n].dataset)]
            return f"{dens[n].density.mean():.2f}" + ("" if ran == learn else f" ({', '.join(ran)})")
        out["density (mean)"] = [density(n) for n in out.index]
        cost = extra.groupby("normalizer").cost_vs_softmax.median()
        out["training time vs softmax"] = [f"{cost[n]:.2f}×" if n in cost.index and np.isfinite(cost[n]) else "" for n in out.index]
    if steps is not None and len(steps):
        st = steps.set_index("normalizer")
        out["step cost vs softmax (T=17 / 97)"] = [" / ".join(f"{st.loc[n, c]:.2f}×" for c in ("T=17", "T=97") if c in st.columns)
                                                   if n in st.index else "" for n in out.index]
    return out.reset_index()

# %% [markdown]
# On made-up tables: a gain significant after Holm reads *better*, the protocol's tuned reading replaces the first
# round where both exist, and a normalizer judged in its own folder joins the table with no edit.

# %%
_o = Path(tempfile.mkdtemp()); (_o / "paper" / "tables").mkdir(parents=True); (_o / "mine").mkdir()
_pt = dict(profile="paper", baseline="softmax", metric="accuracy", n=10, t=1.0, p=0.01, cohen_dz=1.0, mean_delta_f1=0.0, margin=np.nan, p_tost=np.nan)
pd.DataFrame([dict(family="main", dataset="cifar10", method="sparsemax", mean_delta=0.02, ci_low=0.01, ci_high=0.03, p_holm=0.01, **_pt),
              dict(family="main", dataset="cifar10", method="entmax15", mean_delta=0.01, ci_low=-0.01, ci_high=0.03, p_holm=0.2, **_pt)]
             ).to_csv(_o / "paper" / "tables" / "paired_tests.csv", index=False)
pd.DataFrame([dict(dataset="cifar10", method=m, baseline="softmax", gain=g, ci_low=g - 0.01, ci_high=g + 0.01, p_holm=0.5, n=10, verdict=v, word=v, source=s)
              for m, g, v, s in [("sparsemax", -0.004, "gone", "tuned"), ("sparsemax", 0.003, "undecided", "first round"),
                                 ("entmax15", -0.009, "undecided", "first round")]]).to_csv(_o / "paper" / "tables" / "tuned_tests.csv", index=False)
pd.DataFrame([dict(family="versus:mine", dataset="cifar10", method="mine", baseline=b, n=10, mean_delta=-0.03, ci_low=-0.05,
                   ci_high=-0.01, p=0.001, p_holm=0.003) for b in ("softmax", "entmax15")]).to_csv(_o / "mine" / "versus_baseline.csv", index=False)
pd.DataFrame([dict(family="versus:mine", dataset="cifar10", method="mine", baseline="softmax", n=10, gain=0.002, ci_low=-0.004,
                   ci_high=0.008, p_holm=0.9, verdict="gone", word="gone")]).to_csv(_o / "mine" / "fair_verdict.csv", index=False)
import json
for _f, _mask in ((_o / "paper", False), (_o / "mine", False), (_o / "mine_masked", True)):
    _f.mkdir(exist_ok=True); (_f / "manifest.json").write_text(json.dumps({"study_a": {"mask_padding": _mask, "profile": "paper"}}))
pd.DataFrame([dict(family="versus:mine", dataset="cifar10", method="mine", baseline="softmax", n=10, mean_delta=0.05, ci_low=0.04,
                   ci_high=0.06, p=0.001, p_holm=0.001)]).to_csv(_o / "mine_masked" / "versus_baseline.csv", index=False)
test_eq([same_recipe(_o / f, _o / "paper") for f in ("mine", "mine_masked")], [True, False])
test_eq(_provisional(pd.DataFrame(dict(verdict=["gone", "undecided", "reversed"], complete=["True", "False", False], n=[10, 4.0, 6]))).provisional.tolist(),
        [False, True, True])                                                 # as read back from CSVs
(_o / "mine" / "control").mkdir(); (_o / "mine" / "control" / "manifest.json").write_text((_o / "mine" / "manifest.json").read_text())
pd.DataFrame([dict(family="versus:mine", dataset="cifar10", method="mine", baseline=b, n=10, mean_delta=-0.03, ci_low=-0.05, ci_high=-0.01,
                   p=0.001, p_holm=0.001) for b in ("softmax",)]).to_csv(_o / "mine" / "control" / "versus_baseline.csv", index=False)   # a smaller family
_lb = leaderboard_rows(_o)                                                # the masked variant's +5 pt is not a paper-recipe row
test_eq(_lb[(_lb.normalizer == "mine") & (_lb.reading == "paper recipe")].source.tolist(), ["mine/versus_baseline.csv"])   # read once
test_eq(sorted(zip(_lb.normalizer, _lb.reading, [verdict_label(r) for r in _lb.itertuples()])),
        [("entmax15", "paper recipe", "n.s."), ("entmax15", "tuned", "undecided, first round"), ("mine", "paper recipe", "worse"),
         ("mine", "tuned", "gone"), ("sparsemax", "paper recipe", "better"), ("sparsemax", "tuned", "gone")])
_tab = leaderboard_table(_lb).set_index("normalizer")
test_eq(_tab.loc["sparsemax", "cifar10: paper"], "+2.0 (+1.0, +3.0) better"); test_eq(_tab.loc["mine", "cifar10: tuned"], "+0.2 (-0.4, +0.8) gone")
test_eq(list(_tab.index), ["sparsemax", "entmax15", "mine"])
_e = Path(tempfile.mkdtemp()); (_e / "paper" / "tables").mkdir(parents=True)     # an encoder column whose runs are still coming in
pd.DataFrame([dict(family="crisp_normalizers_test", method=m, baseline="dense", n=n, mean_delta=-0.01, ci_low=-0.02, ci_high=0.0, p_holm=p)
              for m, n, p in (("entmax15", 5, 0.01), ("sparsemax", 2, 0.5))]).to_csv(_e / "paper" / "tables" / "crisp_normalizer_tests.csv", index=False)
test_eq([verdict_label(r) for r in leaderboard_rows(_e).itertuples()], ["worse", "n.s., provisional (2 seeds)"])
test_eq(leaderboard_rows(_e).provisional.tolist(), [False, True]); test_eq(leaderboard_rows(_e).word.tolist(), ["worse", "n.s."])   # typed, not parsed
_one = pd.DataFrame([dict(normalizer="stick", dataset="sst2_encoder", reading="pretrained encoder", gain=-0.065, ci_low=np.nan, ci_high=np.nan,
                          p_holm=np.nan, n=1, source="x")])                 # one seed: no interval, no test
test_eq(_rows(_one.rename(columns=dict(normalizer="method", gain="mean_delta")), "pretrained encoder", "x").verdict.tolist(), ["untested"])
test_eq(leaderboard_table(_one.assign(verdict="untested", word="untested", provisional=True, first_round=False)).set_index("normalizer").loc["stick", "encoder (SST-2 test)"],
        "-6.5 (no CI) untested, provisional (1 seeds)")
_steps = pd.DataFrame(dict(normalizer=["sparsemax", "newcomer"], **{"T=17": [1.5, 2.0], "T=97": [1.25, 3.0]}))
_tab2 = leaderboard_table(_lb, steps=_steps).set_index("normalizer")
test_eq(_tab2.loc["sparsemax", "step cost vs softmax (T=17 / 97)"], "1.50× / 1.25×")
test_eq((_tab2.loc["newcomer", "cifar10: paper"], _tab2.loc["newcomer", "step cost vs softmax (T=17 / 97)"]), ("", "2.00× / 3.00×"))  # measured, not run: a row

# %% [markdown]
# The length column reads the length study's gains at the longest test length every normalizer of the task reached
# (the headline normalizers also run at 4,096 tokens; the rest stop at 1,024), under the primary position scheme only.

# %%
_L = Path(tempfile.mkdtemp()); (_L / LENGTH_ROOT / "tables").mkdir(parents=True)
pd.DataFrame([dict(task="flip_flop", positions=pos, length=L, normalizer=n, baseline="softmax", n=10, mean_delta=g, ci_low=g - 0.05,
                   ci_high=g + 0.05, p=0.01, cohen_dz=1.0, margin=0.05, p_tost=0.5, p_holm=0.02, verdict=v)
              for pos, L, n, g, v in [("nape", 1024, "entmax15", 0.30, "better"), ("nape", 4096, "entmax15", 0.50, "better"),
                                      ("nape", 1024, "sparsemax", -0.20, "worse"), ("rope", 1024, "sparsemax", 0.40, "better")]]
             ).to_csv(_L / LENGTH_ROOT / "tables" / "length_gains.csv", index=False)
_lr = leaderboard_rows(_L)
test_eq(sorted(zip(_lr.normalizer, _lr.test_length, _lr.gain)), [("entmax15", 1024, 0.30), ("sparsemax", 1024, -0.20)])
test_eq(leaderboard_table(_lr).set_index("normalizer")["length: flip_flop at 1,024 tokens"].to_dict(),
        {"entmax15": "+30.0 (+25.0, +35.0) better", "sparsemax": "-20.0 (-25.0, -15.0) worse"})
test_eq(len(leaderboard_rows(_L, baseline="entmax15")), 0)                # gains over softmax only

# %% [markdown]
# ## What the leaderboard says
#
# Three readings a user asks for first, each computed from the rows above (no statistic of its own):
#
# - **Beats the tuned baseline after Holm**, per dataset: a tuned gain above zero with Holm p < 0.05 in the normalizer's
#   family — against tuned softmax, and against tuned entmax-1.5 where a family holds that comparison — with how many
#   were judged there and how their verdicts fall (better / worse after Holm, equivalent within the margin, undecided),
#   so that "none" is read against its denominator; Holm is per normalizer, not across the board, and the list says so;
# - **Not judged yet**: the normalizers with a row in the table but no complete tuned verdict on a dataset (a provisional
#   verdict, one whose seeds have not all run at the chosen recipes, is listed here and not counted as a win), and those
#   without a pretrained-encoder verdict;
# - **Where the reading changes** from the paper's recipe to the tuned one. The words pair as *better* ↔ *persists*,
#   *worse* ↔ *reversed*, *n.s.* ↔ *gone* or *undecided*; any other pair is a change. An *n.s.* that becomes *gone* is not
#   a change — the tuned test adds an equivalence reading the paper-recipe column does not make.

# %%
#| export
SAME_READING = {"better": {"persists"}, "worse": {"reversed"}, "n.s.": {"gone", "undecided"}}


def changed_word(paper: str, tuned: str) -> str:
    """The tuned word as a change reads it: *persists* and *reversed* name what happened to a significant paper-recipe
    result, so after an *n.s.* (or the opposite result) they read *better* and *worse*, as significant after Holm."""
    return {"persists": "better", "reversed": "worse"}.get(tuned, tuned) if tuned not in SAME_READING.get(paper, ()) else tuned

def judged(rows, reading="tuned") -> pd.DataFrame:
    "The rows of `reading` whose verdict is complete: not provisional (a missing verdict counts as not judged)."
    r = rows[rows.reading == reading]
    return r[r.verdict.notna() & ~r.provisional.astype(bool)]

def searched(rows) -> list:
    "The datasets with any tuned reading, in table order."
    return [d for d in DATASETS if d in set(rows[rows.reading == "tuned"].dataset)]

def verdict_changes(rows) -> pd.DataFrame:
    "Per (normalizer, dataset) read against softmax under both recipes: both gains and words, and whether the reading changed."
    key = ["normalizer", "dataset"]; cols = key + ["gain", "word"]
    p = rows[(rows.reading == "paper recipe") & (rows.word != "untested")].drop_duplicates(key)[cols]   # one seed: nothing to change
    both = p.merge(judged(rows).drop_duplicates(key)[cols], on=key, suffixes=("_paper", "_tuned"))
    both["changed"] = [w not in SAME_READING[pw] for pw, w in zip(both.word_paper, both.word_tuned)]
    order = {n: i for i, n in enumerate(method_order(both.normalizer))}
    return both.sort_values(key, key=lambda c: c.map(order) if c.name == "normalizer" else c.map(DATASETS.index)).reset_index(drop=True)

def beats_after_holm(rows, alpha=0.05) -> dict:
    "Per dataset: the normalizers whose complete tuned verdict is a gain with Holm p < `alpha`, as (name, gain, Holm p)."
    t = judged(rows); win = t[(t.gain > 0) & (t.p_holm < alpha)]
    return {ds: [(r.normalizer, r.gain, r.p_holm) for r in win[win.dataset == ds].itertuples()] for ds in [d for d in DATASETS if d in set(t.dataset)]}

def _tally(t, alpha=0.05) -> str:
    "One dataset's complete tuned verdicts counted: better / worse after Holm, equivalent within the margin, undecided."
    better, worse = (t.gain > 0) & (t.p_holm < alpha), (t.gain < 0) & (t.p_holm < alpha)
    w = t.word
    equiv = ~better & ~worse & w.isin(("gone", "equivalent"))
    counts = [(int(better.sum()), "better"), (int(worse.sum()), "worse"), (int(equiv.sum()), "equivalent"),
              (int((~better & ~worse & ~equiv).sum()), "undecided")]
    return ", ".join(f"{n} {k}" for n, k in counts if n)

def _wins(rows, searched) -> str:
    """Per dataset: who beats the baseline after Holm, of how many judged, with the tally of all their verdicts. A winner
    whose family does not cover every dataset of `searched` yet says which it covers: its Holm p can still grow."""
    t = judged(rows); found = beats_after_holm(rows)
    def name(n, g, p):
        has = [d for d in searched if ((t.normalizer == n) & (t.dataset == d)).any()]
        return f"`{n}` ({100 * g:+.1f} pt, Holm p {p:.2g}" + (f"; its family so far covers {', '.join(has)} only" if len(has) < len(searched) else "") + ")"
    return "; ".join(f"{ds} — " + (", ".join(name(*w) for w in found[ds]) or "none")
                     + f" of {(t.dataset == ds).sum()} judged ({_tally(t[t.dataset == ds])})" for ds in found)

HOLM_NOTE = ("- *Holm* runs within each normalizer's own family — the paper's families for the seven (its 24 tests, KMNIST's 6, each "
             "adaptive-vs-fixed entmax test alone at ±0.5 pt), a new normalizer's comparisons with the seven on the datasets searched "
             "so far — not across the normalizers on the board: among many normalizers, one win is a lead to confirm with more seeds.")

def leaderboard_findings(rows, vs_entmax=None, names=None) -> list:
    """Markdown lines: who beats tuned softmax (and tuned entmax-1.5) after Holm per dataset, who of `names` (default: the
    normalizers in `rows`) is not judged yet, and the changes."""
    tuned = judged(rows)
    learnable = searched(rows)
    lines = [f"- **Beats tuned softmax after Holm:** {_wins(rows, learnable) or 'no tuned verdict yet'}."]
    if vs_entmax is not None and len(vs_entmax):
        lines.append(f"- **Beats tuned entmax-1.5 after Holm** (where a family holds that comparison): "
                     f"{_wins(vs_entmax, learnable) or 'no tuned verdict yet'}.")
    lines.append(HOLM_NOTE)
    names = [n for n in method_order(rows.normalizer if names is None else names) if n != BASELINE]
    todo = {n: [d for d in learnable if not ((tuned.normalizer == n) & (tuned.dataset == d)).any()] for n in names}
    todo = {n: d for n, d in todo.items() if d}
    lines.append("- **Not judged at a tuned recipe yet:** " + ("; ".join(f"`{n}` on {', '.join(d)}" for n, d in todo.items()) + "."
                 if todo else f"none: every normalizer has a tuned verdict on {', '.join(learnable)}." if learnable else "no tuned search yet."))
    enc = set(judged(rows, "pretrained encoder").normalizer)
    if enc and (no_enc := [n for n in names if n not in enc]):
        lines.append(f"- **No pretrained-encoder verdict yet:** {', '.join(f'`{n}`' for n in no_enc)}.")
    ch = verdict_changes(rows); moved = ch[ch.changed]
    lines.append(f"- **The reading changes from the paper's recipe to the tuned one** for {len(moved)} of the {len(ch)} (normalizer, "
                 "dataset) pairs read both ways" + (": " + "; ".join(f"`{r.normalizer}` on {r.dataset} ({r.word_paper} {100 * r.gain_paper:+.1f} pt "
                 f"→ {changed_word(r.word_paper, r.word_tuned)} {100 * r.gain_tuned:+.1f} pt)" for r in moved.itertuples()) if len(moved) else "") + ".")
    return lines

# %% [markdown]
# On the made-up tables: `sparsemax` was *better* under the paper's recipe and is *gone* tuned (a change); `mine` was *worse*
# and is *gone* (a change); `entmax15` has only a first-round tuned reading, *undecided*, against an *n.s.* (no change).
# Nothing beats tuned softmax; a made-up `winner` that does, and a provisional one that does not count yet, show the wording.

# %%
_ch = verdict_changes(_lb)
test_eq([changed_word(p, t) for p, t in [("n.s.", "persists"), ("better", "reversed"), ("n.s.", "reversed"),
                                          ("better", "persists"), ("better", "gone")]], ["better", "worse", "worse", "persists", "gone"])
test_eq(list(zip(_ch.normalizer, _ch.changed)), [("sparsemax", True), ("entmax15", False), ("mine", True)])
_one_seed = pd.DataFrame([dict(normalizer="mine", dataset="kmnist", reading=r, gain=0.01, ci_low=None, ci_high=None, p_holm=None,
                               verdict=v, word=v, provisional=pv, first_round=False, n=1, source="x")
                          for r, v, pv in [("paper recipe", "untested", True), ("tuned", "gone", False)]])
test_eq(verdict_changes(pd.concat([_lb, _one_seed], ignore_index=True)).normalizer.tolist(), _ch.normalizer.tolist())   # a one-seed reading is not read
_win = pd.concat([_lb, pd.DataFrame([dict(normalizer="winner", dataset="cifar10", reading="tuned", gain=0.02, ci_low=0.01, ci_high=0.03,
                                          p_holm=0.01, verdict="persists", word="persists", provisional=False, first_round=False, n=10, source="x"),
                                     dict(normalizer="early", dataset="cifar10", reading="tuned", gain=0.05, ci_low=0.01, ci_high=0.09,
                                          p_holm=0.01, verdict="persists", word="persists", provisional=True, first_round=False, n=3, source="x")])],
                 ignore_index=True)
test_eq(beats_after_holm(_lb), {"cifar10": []}); test_eq(beats_after_holm(_win), {"cifar10": [("winner", 0.02, 0.01)]})
_fl = leaderboard_findings(_win)
_extra = pd.DataFrame(dict(normalizer=["sparsemax", "sparsemax", "sparsemax", "mine"], dataset=["cifar10", "kmnist", "synthetic_marker", "cifar10"],
                           density=[0.4, 0.2, 0.05, 0.9], cost_vs_softmax=[1.2, 1.4, 9.0, np.nan]))
_t3 = leaderboard_table(pd.concat([_win, _win[_win.normalizer == "sparsemax"].assign(dataset="kmnist")]), _extra).set_index("normalizer")
test_eq(_t3["density (mean)"].to_dict(), {"sparsemax": "0.30", "entmax15": "", "mine": "0.90 (cifar10)", "winner": "", "early": ""})  # the marker task is not searched
test_eq(_t3["training time vs softmax"].to_dict(), {"sparsemax": "1.40×", "entmax15": "", "mine": "", "winner": "", "early": ""})    # median over datasets
test_eq(_fl[0], "- **Beats tuned softmax after Holm:** cifar10 — `winner` (+2.0 pt, Holm p 0.01) of 4 judged (1 better, 2 equivalent, 1 undecided).")
test_eq(_fl[1:3], [HOLM_NOTE, "- **Not judged at a tuned recipe yet:** `early` on cifar10."])
test_eq(leaderboard_findings(_win, names=[*_win.normalizer, "measured_only"])[2],
        "- **Not judged at a tuned recipe yet:** `early` on cifar10; `measured_only` on cifar10.")   # a row with no runs yet
_paper_only = _lb[_lb.reading == "paper recipe"]                          # before any tuned search
test_eq(leaderboard_findings(_paper_only)[:3], ["- **Beats tuned softmax after Holm:** no tuned verdict yet.", HOLM_NOTE,
                                                "- **Not judged at a tuned recipe yet:** no tuned search yet."])
test_eq(len(judged(_win.assign(verdict=np.nan))), 0)                     # a missing verdict is not judged
_two = pd.concat([_win, _win[_win.normalizer == "sparsemax"].assign(dataset="kmnist")])   # `winner` searched on cifar10 only
assert "`winner` (+2.0 pt, Holm p 0.01; its family so far covers cifar10 only)" in leaderboard_findings(_two)[0]
_enc = pd.concat([_win, _lb[_lb.normalizer == "sparsemax"].head(1).assign(reading="pretrained encoder", dataset="sst2_encoder")])
test_eq(leaderboard_findings(_enc)[3], "- **No pretrained-encoder verdict yet:** `entmax15`, `early`, `mine`, `winner`.")
assert _fl[3].startswith("- **The reading changes from the paper's recipe to the tuned one** for 2 of the 3") and "`mine` on cifar10 (worse -3.0 pt → gone +0.2 pt)" in _fl[3]

# %% [markdown]
# The README carries the short form between two marker comments (`sparse-repro leaderboard --readme README.md` rewrites
# it): who beats the tuned baselines after Holm, and how much of the board is filled, with a link to the whole.

# %%
#| export
LEADERBOARD_MARKERS = ("<!-- leaderboard:start (generated by `sparse-repro leaderboard --readme`; do not edit) -->", "<!-- leaderboard:end -->")

def leaderboard_short(rows, vs_entmax=None, names=None, link="outputs/leaderboard.md") -> str:
    "The README's few lines: the 'beats after Holm' findings and how many normalizers have each verdict, linking the whole board."
    names = [n for n in method_order(rows.normalizer if names is None else names) if n != BASELINE]
    found = leaderboard_findings(rows, vs_entmax, names)
    beats = found[:found.index(HOLM_NOTE) + 1]                           # the findings open with the wins and Holm's scope
    tuned = judged(rows)
    learnable = searched(rows)
    full = [n for n in names if learnable and all(((tuned.normalizer == n) & (tuned.dataset == d)).any() for d in learnable)]
    enc = set(judged(rows, "pretrained encoder").normalizer)
    return "\n".join(beats + [f"- **On the board:** {len(names)} normalizers besides softmax; {len(full)} with a complete tuned verdict "
                               f"on all {len(learnable)} datasets searched, {sum(n in enc for n in names)} with a pretrained-encoder "
                               f"verdict. The whole table, the paper-recipe column, what changes between the two recipes and what is "
                               f"not judged yet: [{Path(link).name}]({link})."])

# %%
assert "0 with a complete tuned verdict on all 0 datasets" in leaderboard_short(_paper_only)
test_eq(leaderboard_short(_win, link="outputs/leaderboard.md").splitlines(),
        ["- **Beats tuned softmax after Holm:** cifar10 — `winner` (+2.0 pt, Holm p 0.01) of 4 judged (1 better, 2 equivalent, 1 undecided).", HOLM_NOTE,
         "- **On the board:** 5 normalizers besides softmax; 4 with a complete tuned verdict on all 1 datasets searched, 0 with a "
         "pretrained-encoder verdict. The whole table, the paper-recipe column, what changes between the two recipes and what is "
         "not judged yet: [leaderboard.md](outputs/leaderboard.md)."])

# %% [markdown]
# On the committed results: every row's gain is the committed table's, and every normalizer of the committed runs is
# there.

# %%
#| export
def verdict_words(rows) -> str:
    "The legend of the verdict words the rows use, with the equivalence margins, and the notes only where a cell carries them."
    from sparse_attention_repro.tuning import TUNED_MARGIN
    enc = rows[rows.reading == "pretrained encoder"].margin.dropna()
    out = ("Verdict words. Paper recipe and encoder: **better** / **worse** — significant after Holm in the normalizer's family; "
           "**n.s.** — neither (no equivalence reading" + (f"; the encoder's TOST p at ±{100 * enc.iloc[0]:g} pt is in `leaderboard.csv`"
                                                          if len(enc) else "") + "). Tuned: **persists** / **reversed** — a gain above / "
           f"below zero with Holm p < 0.05; **gone** — equivalent to zero within ±{100 * TUNED_MARGIN:g} pt (TOST p < 0.05, in "
           "`leaderboard.csv`); **undecided** — neither.")
    if rows.first_round.astype(bool).any():
        out += " *First round*: the earlier, smaller grid (three methods, two or three rates), read where the protocol's grid has not run yet."
    if rows.provisional.astype(bool).any(): out += " *Provisional*: not every seed has run at the chosen recipes (the tuned column), fewer seeds than the column's most (the encoder), or a selection the edge rule is still lengthening (the length column)."
    return out

# %%
assert "±1 pt" in verdict_words(_lb) and "First round" in verdict_words(_lb) and "Provisional" not in verdict_words(_lb)
assert "Provisional" in verdict_words(_win) and "encoder's TOST" not in verdict_words(_lb)

# %%
#| export
def encoder_setup(results) -> str:
    "How the pretrained-encoder column was run, read from its runs: model, sentences, epochs, learning rate, seeds."
    f = Path(results) / "crisp_normalizers" / "crisp_runs.csv"
    if not f.exists(): return ""
    r = pd.read_csv(f)
    one = lambda c: ", ".join(str(v) for v in sorted(set(r[c].dropna()))) if c in r else "?"
    return (f"; every layer's softmax replaced in {one('model_name')}, fine-tuned on {one('train_n')} SST-2 sentences for "
            f"{one('epochs')} epochs at lr {one('lr')}, up to {r.seed.nunique()} seeds paired with dense (each cell's own count in `leaderboard.csv`)")

def leaderboard_parts(outputs, main="paper") -> tuple:
    "The leaderboard's rows against softmax, its rows against entmax-1.5, and its one-row-per-normalizer table."
    rows = leaderboard_rows(outputs, main)
    return rows, leaderboard_rows(outputs, main, baseline="entmax15"), leaderboard_table(rows, density_and_cost(outputs, main), step_costs(outputs))

def write_leaderboard(outputs, main="paper", readme=None) -> dict:
    """Write `<outputs>/leaderboard.csv` (long), `leaderboard.md` and `leaderboard.png` (gains with CIs, a panel per dataset);
    with `readme` (a README, or its source notebook), also its block between `LEADERBOARD_MARKERS`."""
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sparse_attention_repro.files import atomic_write
    from sparse_attention_repro.tuning import halving_note
    outputs = Path(outputs); rows, vs_entmax, table = leaderboard_parts(outputs, main)
    findings = leaderboard_findings(rows, vs_entmax, names=table.normalizer)
    write_readme = None
    if readme is not None:                                   # a README without the block stops here, before any file is written
        from sparse_attention_repro.files import prepare_block
        link = Path(os.path.relpath(outputs / "leaderboard.md", Path(readme).parent)).as_posix()
        write_readme = prepare_block(readme, leaderboard_short(rows, vs_entmax, table.normalizer, link), LEADERBOARD_MARKERS, name="leaderboard")
    atomic_write(outputs / "leaderboard.csv", lambda tmp: rows.to_csv(tmp, index=False))
    md = ["# Leaderboard", "", "Gain in accuracy over softmax (points; 95% CI over seeds; verdict after Holm in the normalizer's family), "
          "per dataset under the paper's recipe (AdamW 10⁻³, 6–8 epochs) and at a tuned recipe (each arm at its own learning rate and "
          f"length, chosen on validation), and in the pretrained encoder (over dense, SST-2 test{encoder_setup(outputs / main)}). "
          "Generated by `sparse-repro leaderboard` from the committed tables (sources in `leaderboard.csv`); an empty cell has not been "
          "run. Density: the mean share of non-zero attention weights over a normalizer's paper-recipe runs, averaged over the "
          "datasets searched at a tuned recipe (where it ran on fewer, they are named). Training time: `train_seconds` over softmax's "
          "in the same lock-step notebook, the median over datasets of each dataset's median over seeds (the seven only). Step cost: the "
          "normalizer's forward + backward over softmax's, measured side by side in one process on one thread by `sparse-repro "
          "card` (`cards/step_costs.csv`, with the CPU of each row), at CIFAR-10's and the text datasets' sequence lengths.", "", verdict_words(rows), "",
          *([halving_note("The " + ", ".join(f"`{n}`" for n in hv) + " fair verdicts' own"), ""] if (hv := halving_searched(outputs)) else []),
          "## What it says", "", *findings, "", "## The table", "", table.to_markdown(index=False, disable_numparse=True), ""]
    atomic_write(outputs / "leaderboard.md", lambda tmp: Path(tmp).write_text("\n".join(md), encoding="utf-8"))
    dsets = [d for d in DATASETS if d in set(rows.dataset)] + (["sst2_encoder"] if (rows.dataset == "sst2_encoder").any() else [])
    fig, axes = plt.subplots(1, len(dsets), figsize=(3.3 * len(dsets), 0.32 * len(table) + 1.6), sharey=True, squeeze=False)
    names = list(table.normalizer)
    for ax, ds in zip(axes[0], dsets):
        for k, (reading, colour, dy) in enumerate((("paper recipe", "C0", -0.15), ("tuned", "C3", 0.15), ("pretrained encoder", "C2", 0.0))):
            g = rows[(rows.dataset == ds) & (rows.reading == reading)].drop_duplicates("normalizer")
            g = g[g.normalizer.isin(names)]
            y = np.array([names.index(n) for n in g.normalizer]) + dy
            ax.errorbar(100 * g.gain, y, xerr=[100 * (g.gain - g.ci_low), 100 * (g.ci_high - g.gain)], fmt="o", ms=3, color=colour,
                        label=reading, capsize=2, lw=1)
        ax.axvline(0, color="k", lw=0.8); ax.set_title(ds, fontsize=9); ax.set_xlabel("gain (pt)")
    axes[0][0].set_yticks(range(len(names))); axes[0][0].set_yticklabels(names, fontsize=8); axes[0][0].invert_yaxis()
    handles, labels = [], []
    for ax in axes[0]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels: handles.append(h); labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    atomic_write(outputs / "leaderboard.png", lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    if write_readme: write_readme()
    return dict(csv=outputs / "leaderboard.csv", md=outputs / "leaderboard.md", png=outputs / "leaderboard.png", rows=len(rows), normalizers=len(table))

# %%
_es = Path(tempfile.mkdtemp()); (_es / "crisp_normalizers").mkdir()
pd.DataFrame([dict(config="entmax15", seed=s, model_name="all-MiniLM-L6-v2", train_n=4800, epochs=3, lr=1e-4) for s in range(5)]
             ).to_csv(_es / "crisp_normalizers" / "crisp_runs.csv", index=False)
test_eq(encoder_setup(_es), "; every layer's softmax replaced in all-MiniLM-L6-v2, fine-tuned on 4800 SST-2 sentences for 3 epochs at "
        "lr 0.0001, up to 5 seeds paired with dense (each cell's own count in `leaderboard.csv`)")
test_eq(encoder_setup(_o / "paper"), "")

# %%
out = write_leaderboard(_o)
test_eq((out["rows"], out["normalizers"]), (6, 3)); assert out["png"].stat().st_size > 5000
test_eq(pd.read_csv(out["csv"]).gain.round(4).tolist(), _lb.gain.round(4).tolist())
import re
assert re.search(r"\| sparsemax +\| \+2\.0 \(\+1\.0, \+3\.0\) better", out["md"].read_text())
assert "## What it says\n\n- **Beats tuned softmax after Holm:** cifar10 — none of 3 judged (2 equivalent, 1 undecided)." in out["md"].read_text()
(_o / "README.md").write_text(f"# Lab\n\n{LEADERBOARD_MARKERS[0]}\nold\n{LEADERBOARD_MARKERS[1]}\n")
write_leaderboard(_o, readme=_o / "README.md")
_block = (_o / "README.md").read_text().splitlines()[3:7]
test_eq(_block[:2], ["- **Beats tuned softmax after Holm:** cifar10 — none of 3 judged (2 equivalent, 1 undecided).",
                     "- **Beats tuned entmax-1.5 after Holm** (where a family holds that comparison): no tuned verdict yet."])
test_eq(_block[2], HOLM_NOTE); assert _block[3].startswith("- **On the board:** 3 normalizers besides softmax; 3 with a complete tuned verdict")
assert "[leaderboard.md](leaderboard.md)" in (_o / "README.md").read_text() and "\nold\n" not in (_o / "README.md").read_text()
(_o / "bare.md").write_text("# no block\n"); (_o / "leaderboard.md").unlink()
test_fail(lambda: write_leaderboard(_o, readme=_o / "bare.md"), contains="has no leaderboard block")
assert not (_o / "leaderboard.md").exists()                              # refused before anything was written

# %% [markdown]
# ## A normalizer's exact match against test length
#
# Where the length study has tested a normalizer, its card shows the curve behind its length column: mean exact match over
# seeds with its 95 % CI at each test length, beside softmax's, under the primary position scheme.

# %%
#| export
def length_curve(outputs, name, positions=LENGTH_POSITIONS) -> pd.DataFrame:
    "`name`'s and softmax's rows of the length study's accuracy table under `positions` (empty where it has no test)."
    f = Path(outputs) / LENGTH_ROOT / "tables" / "length_accuracy.csv"
    acc = pd.read_csv(f) if f.exists() else pd.DataFrame(columns=["task", "normalizer", "positions"])
    acc = acc[(acc.positions == positions) & acc.task.isin(set(acc[acc.normalizer == name].task))]
    return acc[acc.normalizer.isin([BASELINE, name])].reset_index(drop=True)

# %%
_acc = pd.DataFrame([dict(task="flip_flop", normalizer=n, positions=pos, lr=1e-3, step=1000, steps=1000, length=L, seeds=10,
                          accuracy=a, ci_low=a - 0.1, ci_high=a + 0.1, best_of_3=a, best_seed=0)
                     for n, pos, L, a in [("softmax", "nape", 64, 1.0), ("softmax", "nape", 1024, 0.5), ("sparsemax", "nape", 64, 1.0),
                                          ("sparsemax", "rope", 64, 0.9), ("entmax15", "nape", 64, 0.9)]])
_acc.to_csv(_L / LENGTH_ROOT / "tables" / "length_accuracy.csv", index=False)
test_eq(sorted(zip(length_curve(_L, "sparsemax").normalizer, length_curve(_L, "sparsemax").length)),
        [("softmax", 64), ("softmax", 1024), ("sparsemax", 64)])
test_eq(len(length_curve(_L, "relu_attention")), 0)                       # not tested: no curve, not softmax's alone

# %% [markdown]
# ## A normalizer's gain against training length
#
# The tuned verdict reads one (learning rate, epoch) per arm. The curve behind it says whether a gain is an early-training
# effect: at each length, the normalizer and softmax each take their best learning rate for that many epochs (on
# validation, `tuned_reading.recipe_budget`), and the point is the mean paired test gain with its 95 % CI. The normalizer's
# grids are every `tuned/` folder under the outputs that holds its runs; softmax's are the main results' protocol grids.

# %%
#| export
def gain_curves(outputs, name, main="paper") -> pd.DataFrame:
    "Per dataset and epoch: `name`'s test gain over softmax, each at its best rate for that length on validation (empty if unsearched)."
    from sparse_attention_repro.tuning import tuned_runs, tuned_curves
    from sparse_attention_repro.tuned_reading import recipe_budget
    outputs = Path(outputs); base = tuned_runs(outputs / main)
    others = sorted({f.parent.parent.parent for f in outputs.glob("**/tuned/*/runs.csv")} - {outputs / main})
    held = (r[r.method == name] for r in (base, *map(tuned_runs, others)) if len(r) and (r.method == name).any())
    runs = next(held, None)                          # the first folder holding it: the main results' own, where it is a paper method
    if runs is None or not len(base): return pd.DataFrame(columns=["dataset", "epoch", "method", "lr", "baseline_lr", "n", "gain", "ci_low", "ci_high"])
    mine = tuned_curves(runs)
    curves = pd.concat([mine, tuned_curves(base[base.method == BASELINE])], ignore_index=True)
    return recipe_budget(curves[curves.dataset.isin(set(mine.dataset))]).query("method == @name").reset_index(drop=True)

def gain_curve_figure(curves, path) -> Path:
    "One panel per dataset: the gain against epochs with its CI band; the paper's length dotted."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sparse_attention_repro.data import PAPER_SIZES
    from sparse_attention_repro.files import atomic_write
    dsets = [d for d in DATASETS if d in set(curves.dataset)]
    fig, axes = plt.subplots(1, len(dsets), figsize=(4.2 * len(dsets), 3.4), squeeze=False)
    for ax, ds in zip(axes[0], dsets):
        g = curves[curves.dataset == ds].sort_values("epoch")
        ax.plot(g.epoch, 100 * g.gain, marker="o", ms=3, color="C3"); ax.fill_between(g.epoch, 100 * g.ci_low, 100 * g.ci_high, color="C3", alpha=0.15)
        ax.axhline(0, color="k", lw=0.8); ax.axvline(PAPER_SIZES[ds][0], color="0.5", ls=":", lw=1)
        lo, hi = int(g.n.min()), int(g.n.max())
        ax.set_title(f"{ds} ({lo}{'' if lo == hi else f'–{hi}'} seeds)", fontsize=9)
        ax.set_xlabel("training epochs (dotted: the paper's)"); ax.set_ylabel("test gain over softmax (pt)")
    fig.tight_layout()
    atomic_write(Path(path), lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return Path(path)

# %% [markdown]
# A hand-made search: `mine` at one rate, softmax at two, three seeds, four epochs, in two results folders. At every
# length `mine` leads softmax's better rate by exactly 2 pt on test, so each point is +2.0 with a zero-width CI.

# %%
import json
def _tuned_grid(folder, method, lr, val, test):
    em = lambda s: json.dumps([dict(epoch=e, val_accuracy=val + 0.01 * e, val_loss=1.0, test_accuracy=test + 0.01 * e + 0.001 * s, test_loss=1.0)
                               for e in range(1, 5)])
    f = folder / "tuned" / f"kmnist_lr{lr:g}"; f.mkdir(parents=True, exist_ok=True)
    old = pd.read_csv(f / "runs.csv") if (f / "runs.csv").exists() else None
    new = pd.DataFrame([dict(dataset="kmnist", method=method, seed=s, lr=lr, status="ok", epochs=4, epoch_metrics=em(s)) for s in range(3)])
    pd.concat([old, new], ignore_index=True).to_csv(f / "runs.csv", index=False)
_gc_o = Path(tempfile.mkdtemp())
_tuned_grid(_gc_o / "paper", "softmax", 1e-3, 0.50, 0.40); _tuned_grid(_gc_o / "paper", "softmax", 3e-3, 0.55, 0.45)
_tuned_grid(_gc_o / "literature" / "fair" / "mine", "mine", 1e-3, 0.60, 0.47)
_gc = gain_curves(_gc_o, "mine")
test_eq(_gc.epoch.tolist(), [1, 2, 3, 4]); test_eq(_gc.baseline_lr.unique().tolist(), [3e-3]); test_eq(_gc.n.unique().tolist(), [3])
test_close(_gc.gain.to_numpy(), np.full(4, 0.02), eps=1e-12); test_close(_gc.ci_high - _gc.ci_low, np.zeros(4), eps=1e-12)
test_eq(len(gain_curves(_gc_o, "unsearched")), 0)
assert gain_curve_figure(_gc, _gc_o / "mine.png").stat().st_size > 3000

# %% [markdown]
# ## A normalizer's card
#
# `normalizer_card` writes one page per normalizer, `<outputs>/cards/<name>.md`: what it computes and the choices it
# makes (for a normalizer from outside the library, the docstring of the module that registered it: its formula, its
# paper, and how it differs from the reference code, each difference pinned by that package's tests), its leaderboard rows against softmax
# and against entmax-1.5 where a table holds that comparison (the new normalizers' `versus_baseline.csv` and
# `fair_verdict.csv`, the adaptive entmax's A5 tests), its chosen recipes, its density, and its cost. The cost is
# measured when the card is made, side by side with softmax in one process: the median forward + backward time of the
# normalizer over softmax's on the lab's two score shapes (T = 17 and 97 keys, `bench.bench_normalizers`), not a ratio
# of training times taken on different days.

# %%
#| export
def definition(spec) -> str:
    """What a normalizer computes and the choices it makes, from the module that registered it (its docstring: the formula,
    the paper, how it differs from the reference code); the library's own are registered in `00_normalizers`, defined and
    tested in their family's notebook."""
    import importlib, inspect
    from sparse_attention_repro.normalizers import _library_tested
    if _library_tested(spec):
        return ("One of the library's normalizers, registered in `nbs/00_normalizers.ipynb`, defined in its family's notebook "
                "(`nbs/00b_sparsemax.ipynb`, `00c_entmax`, `00d_topk`) and tested there against the `entmax` package, brute force "
                "and finite differences.")
    try: doc = inspect.getdoc(importlib.import_module(spec.source))
    except ImportError: doc = None
    return f"From `{spec.source}`:\n\n" + "\n".join("> " + l if l else ">" for l in doc.splitlines()) if doc else \
        f"`{spec.source}` has no module docstring: write the formula and its choices there, and the card shows them."

def _tost(p, margin) -> str:
    return f"{p:.2g} (±{100 * margin:g} pt)" if pd.notna(p) and pd.notna(margin) else "—"

def card_gain_tables(rows, vs_entmax, name) -> list:
    """The card's two tables, as markdown lines: `name`'s leaderboard rows against softmax (`rows`) and against entmax-1.5
    (`vs_entmax`, both from `leaderboard_rows`), with the TOST p at the comparison's margin where its table runs one (the
    tuned protocol's ±1 pt, the encoder's ±0.5 pt)."""
    from sparse_attention_repro.study import PAPER_METHODS
    fmt = lambda t: pd.DataFrame({"dataset": t.dataset, "reading": t.reading, "gain (pt)": (100 * t.gain).map("{:+.2f}".format),
                                  "95% CI (pt)": [f"{100 * a:+.2f} to {100 * b:+.2f}" for a, b in zip(t.ci_low, t.ci_high)],
                                  "Holm p": t.p_holm.map("{:.3g}".format), "TOST p (margin)": [_tost(p, m) for p, m in zip(t.p_tost, t.margin)],
                                  "verdict": [verdict_label(r) for r in t.itertuples()], "seeds": t.n.astype(int), "from": t.source}).to_markdown(index=False, disable_numparse=True)
    rows, vs_ent = rows[rows.normalizer == name], vs_entmax[vs_entmax.normalizer == name]
    lines = ["## Against softmax", "", fmt(rows) if len(rows) else "No committed comparison yet.", ""]
    if name == "entmax15": return lines
    absent = ("Not in its Holm families: the paper's tests compare each of its methods with softmax (and the adaptive entmax with "
              "entmax-1.5); a normalizer judged beside the seven is compared with each of them." if name in PAPER_METHODS
              else "No committed comparison yet.")
    return lines + ["## Against entmax-1.5", "", fmt(vs_ent) if len(vs_ent) else absent, ""]

def normalizer_card(outputs, name, main="paper", cost_repeats=30, measure=False) -> Path:
    """Write `<outputs>/cards/<name>.md`: the normalizer's gains, recipes, density and step cost; returns its path. The cost
    is the committed measurement (`cards/step_costs.csv`, with the CPU and load it was taken at); it is measured here, and
    kept, only where none is committed or with `measure`."""
    from sparse_attention_repro.bench import bench_normalizers
    from sparse_attention_repro.files import atomic_write
    from sparse_attention_repro.normalizers import resolve_normalizer
    outputs = Path(outputs); spec = resolve_normalizer(name); ref, name = str(name), spec.name   # `module:name` reads as its registered name
    lines = [f"# `{name}`", "", f"Registered as `{spec.name}`; sums to one: {spec.sums_to_one}; learned parameters: "
             f"{', '.join(spec.learned) or 'none'}. Generated by `sparse-repro card {ref}` from the committed tables.", ""]
    lines += ["## Definition, reference and choices", "", definition(spec), ""]
    lines += card_gain_tables(leaderboard_rows(outputs, main), leaderboard_rows(outputs, main, baseline="entmax15"), name)
    recipes = [pd.read_csv(f).pipe(lambda t: t[t.method == name]) for f in [outputs / main / "tables" / "tuned_recipes.csv",
                                                                *sorted(outputs.glob("**/fair_recipes.csv"))] if f.exists()]
    recipes = (pd.concat(recipes, ignore_index=True).drop_duplicates(["dataset", "method"])   # each fair search repeats the seven's
               .dropna(axis=1, how="all") if recipes else pd.DataFrame())
    lines += ["## Chosen recipes (on validation)", "", recipes.to_markdown(index=False) if len(recipes) else "Not searched yet.", ""]
    if halving_searched(outputs, name):
        from sparse_attention_repro.tuning import halving_note
        lines += [halving_note(), ""]
    if len(recipes) and len(gc := gain_curves(outputs, name, main)):    # once the search has chosen a recipe
        gain_curve_figure(gc, outputs / "cards" / f"{name}.png")
        lines += ["## Gain against training length", "", "At each length the normalizer and softmax each take their best learning rate for "
                  "that many epochs (on validation); mean paired test gain over softmax with its 95% CI; dotted: the paper's length.", "",
                  f"![{name}: gain over softmax against epochs]({name}.png)", ""]
    if name != BASELINE and len(lc := length_curve(outputs, name)):
        from sparse_attention_repro.length_analysis import accuracy_figure
        accuracy_figure(lc, outputs / "cards" / f"{name}_length.png")
        lines += ["## Exact match against test length (the length study)", "", "Trained at 32–64 tokens at its own recipe chosen on "
                  f"validation; mean exact match over seeds with its 95% CI at each test length, beside softmax's ({LENGTH_POSITIONS} "
                  f"positions; `{LENGTH_ROOT}/tables/length_accuracy.csv`).", "", f"![{name}: exact match against test length]({name}_length.png)", "",
                  lc[["task", "normalizer", "length", "seeds", "accuracy", "ci_low", "ci_high", "best_of_3"]].round(3).to_markdown(index=False), ""]
    dc = density_and_cost(outputs, main).pipe(lambda t: t[t.normalizer == name])
    if len(dc): lines += ["## Density (paper recipe)", "", dc[["dataset", "density"]].round(3).to_markdown(index=False), ""]
    f = outputs / STEP_COSTS
    kept = pd.read_csv(f).query("normalizer == @name") if f.exists() else pd.DataFrame()
    if measure or not len(kept):
        threads = torch.get_num_threads(); torch.set_num_threads(1)    # one thread, as a grid job per core (and `bench normalizers`)
        try: cost = bench_normalizers(repeats=cost_repeats, methods=tuple(dict.fromkeys([BASELINE, name])))
        finally: torch.set_num_threads(threads)
        keep_step_costs(outputs, name, cost[(cost.implementation == "kernels") & (cost.normalizer == name)], cost_repeats)
        kept = pd.read_csv(f).query("normalizer == @name")
    m = kept.iloc[0]
    lines += ["## Cost, measured side by side with softmax in one process", "",
              f"Forward + backward of the normalizer alone, one thread, over softmax's in the same round, with freed memory kept by the "
              f"allocator (`bench.keep_freed_memory`: no round pays fresh page faults another process history would not): the median of {int(m.repeats)} "
              "interleaved rounds' ratios, with their quartiles; a wide range means the rounds disagreed, so read that ratio as rough. "
              f"Measured on {int(m.cpus)} cores ({m.cpu}), load average {m.load_1min:.1f} when measured (`{STEP_COSTS}`; `sparse-repro "
              "card --measure` measures it again on this machine); a load above the core count lengthens the slower normalizers' calls "
              "most, so read such ratios as upper bounds; on another CPU the ratios can differ.", "",
              kept[["shape", "ms", "ratio_to_softmax", "ratio_q25", "ratio_q75"]].round(3).to_markdown(index=False), ""]
    out = outputs / "cards" / f"{name}.md"; out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: Path(tmp).write_text("\n".join(lines), encoding="utf-8"))
    return out

# %%
_card = normalizer_card(_o, "sparsemax", cost_repeats=2).read_text()
assert "## Definition, reference and choices\n\nOne of the library's normalizers" in _card
from sparse_attention_repro.normalizers import resolve_normalizer
test_eq(definition(resolve_normalizer("topk_softmax_0125")).split(",")[0], "One of the library's normalizers")
import types, sys as _sys
_mod = types.ModuleType("_card_probe"); _mod.__doc__ = "Probe softmax.\n\nChoices: none."; _sys.modules["_card_probe"] = _mod
from dataclasses import replace as _replace
test_eq(definition(_replace(resolve_normalizer("sparsemax"), source="_card_probe")), "From `_card_probe`:\n\n> Probe softmax.\n>\n> Choices: none.")
assert "## Against softmax" in _card and "+2.00" in _card and "better" in _card and "ratio_to_softmax" in _card
assert "96x4x97x97" in _card and "Not searched yet." in _card
_fr = Path(tempfile.mkdtemp()); (_fr / "paper" / "tables").mkdir(parents=True); (_fr / "a").mkdir(); (_fr / "b").mkdir()
_rec = pd.DataFrame([dict(dataset="kmnist", method="sparsemax", lr=1e-3, epoch=30, source="tuned")])
_rec.to_csv(_fr / "paper" / "tables" / "tuned_recipes.csv", index=False)
for _f in ("a", "b"): _rec.drop(columns="source").to_csv(_fr / _f / "fair_recipes.csv", index=False)   # a fair search repeats the baselines'
_rc = normalizer_card(_fr, "sparsemax", cost_repeats=1).read_text()
_before = (_o / STEP_COSTS).read_bytes()
test_eq(normalizer_card(_o, "sparsemax", cost_repeats=2).read_text(), _card)   # a committed cost is read, not measured again
test_eq((_o / STEP_COSTS).read_bytes(), _before)
_again = pd.read_csv(_o / STEP_COSTS).assign(ms=-1.0); _again.to_csv(_o / STEP_COSTS, index=False)
assert "|   -1 |" in normalizer_card(_o, "sparsemax").read_text()               # the card shows the kept numbers, whatever they are
_m = normalizer_card(_o, "sparsemax", cost_repeats=1, measure=True).read_text()
assert "|   -1 |" not in _m and (pd.read_csv(_o / STEP_COSTS).ms > 0).all()      # `measure` measures again and keeps it
test_eq(_rc.count("| kmnist    | sparsemax |"), 1)                    # each recipe once
_sc = step_costs(_o).set_index("normalizer")
test_eq(list(_sc.index), ["sparsemax"]); assert _sc.loc["sparsemax", "T=17"] > 0 and _sc.loc["sparsemax", "T=97"] > 0
_kept = pd.read_csv(_o / STEP_COSTS)                                    # each measurement keeps the machine's load beside it
test_eq(_kept.cpus.unique().tolist(), [os.cpu_count()]); assert (_kept.load_1min >= 0).all() and "load average" in _card
test_eq(_kept.cpu.unique().tolist(), [cpu_name()]); assert cpu_name().endswith(torch.backends.cpu.get_cpu_capability()) and f"({cpu_name()})" in _card
assert (_kept.ratio_q25 <= _kept.ratio_to_softmax).all() and (_kept.ratio_to_softmax <= _kept.ratio_q75).all() and "ratio_q75" in _card

# %% [markdown]
# A file kept before the quartiles existed has its columns in another order and lacks two of them; the next card
# rewrites it in today's column order, the old rows' quartiles left empty.

# %%
_old = Path(tempfile.mkdtemp()); (_old / "cards").mkdir()
pd.DataFrame([dict(normalizer="entmax15", shape="96x4x17x17", ms=1.0, ratio_to_softmax=1.8, repeats=10, threads=1,
                   load_1min=0.5, cpus=2)]).to_csv(_old / STEP_COSTS, index=False)
keep_step_costs(_old, "sparsemax", pd.DataFrame([dict(shape="96x4x17x17", ms=0.5, ratio_to_softmax=1.2, ratio_q25=1.1, ratio_q75=1.3)]), 3)
_both = pd.read_csv(_old / STEP_COSTS)
test_eq(list(_both.columns), STEP_COST_COLUMNS); test_eq(_both.normalizer.tolist(), ["entmax15", "sparsemax"])
assert _both.ratio_q25.isna().tolist() == [True, False] and _both.ratio_to_softmax.tolist() == [1.8, 1.2]

