# %% [markdown]
# # The report's tables
# > Every table of a results folder's report, declared once (its name, what it holds, its producer) and produced from the folder's runs: the report notebook only displays them.

# %%
#| default_exp analysis

# %% [markdown]
# The report of a results folder (`nbs/experiments/report.ipynb`) reads its tables from here: `Results` holds the
# folder's runs and every reading computed from them once (the fair-recipe readings, the ablation family, Crisp at the
# other learning rate, …), and `TABLES` declares each file of `tables/` — its name, a line on what it holds, and the
# `Results` reading that produces it. `write_tables` writes every table whose runs exist, each file whole or not at all,
# and the report then draws figures and sentences from the same `Results`. A table is declared once, here: the report,
# the leaderboard and the README's generated blocks read the files it writes.

# %%
#| export
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

from sparse_attention_repro import stats as S, verdicts as V, tuning as T, catalogue as C
from sparse_attention_repro import sensitivity as SENS, tuned_reading as TR, fresh_seeds as F, modern_recipe as MR

# %%
from fastcore.test import test_eq, test_fail
import shutil, tempfile
import sparse_attention_repro

# %% [markdown]
# ## The folder's readings
#
# One object per results folder; each reading is computed on first use and kept, so that the report's figures and
# sentences and the tables it writes come from one computation.

# %%
#| export
class Results:
    "The runs of one results folder and the readings the report's tables are made of (each computed once, on first use)."
    def __init__(self, folder):
        self.folder = Path(folder)
        self.runs, self.crisp = S.load_runs(self.folder / "runs.csv"), S.load_crisp(self.folder / "crisp_runs.csv")

    @cached_property
    def analysed(self) -> dict:
        "Study A's and Crisp's tests, the single-seed critique, the power table and the claims (`verdicts.analyse`)."
        return V.analyse(self.runs, self.crisp)

    @cached_property
    def fair(self) -> dict:
        "The fair-recipe readings (recipes, candidates, tests, curves; `tuning.fair_recipe_readings`)."
        return T.fair_recipe_readings(self.folder, self.runs)

    @cached_property
    def tuned_grid_rows(self) -> pd.DataFrame:
        "Every row of the tuned-recipe grids (the protocol's and the first round's)."
        return pd.concat([T.tuned_runs(self.folder, folder) for folder, _ in T.SOURCES.values()], ignore_index=True)

    @cached_property
    def time_to_reach(self): return TR.time_to_reach(self.fair["curves"], self.fair["recipes"], self.tuned_grid_rows) if len(self.fair["recipes"]) else None

    @cached_property
    def budget_gains(self):
        return TR.budget_gains(self.fair["curves"], TR.epoch_cost_ratios(self.tuned_grid_rows)) if len(self.fair["recipes"]) else None

    @cached_property
    def compute_matched(self): return TR.compute_matched(self.budget_gains, self.fair["recipes"]) if self.budget_gains is not None else None

    @cached_property
    def label_sensitivity(self):
        "Each tuned label under a reviewer's reanalyses (`sensitivity`), where the folder has tuned tests."
        tt = self.fair["tests"]
        return SENS.label_sensitivity(tt, SENS.capped_tests(self.folder, self.runs)) if len(tt) else None

    @cached_property
    def fresh_confirmation(self):
        "The persisting and reversed tuned labels read again on fresh seeds (`fresh_seeds`), where the folder has fresh runs."
        fc = F.fresh_curves(self.folder)
        return F.fresh_confirmation(fc, self.fair["recipes"], self.fair["tests"]) if len(fc) and len(self.fair["tests"]) else None

    @cached_property
    def modern_recipe(self):
        "The headline comparisons tuned again under warm-up + cosine decay (`modern_recipe`), where the folder has those runs."
        return MR.modern_reading(self.folder, self.fair["tests"])

    @cached_property
    def tuned_budget(self):
        cur = self.fair["curves"]
        return TR.recipe_budget(cur) if len(cur) else None

    @cached_property
    def validation_rerun(self): return S.load_runs(self.folder / "validation_rerun" / "runs.csv")

    @cached_property
    def selection(self) -> pd.DataFrame:
        """The top-k ratio chosen per dataset: on validation where the main runs have a split, else from the complete
        datasets of the validation re-run (`validation_rerun/`), else on test only (the paper's way)."""
        sel, rerun = self.analysed["selection"], self.validation_rerun
        if rerun is not None and self.runs is not None and not sel.val_selected.notna().any():
            return S.select_topk(rerun[rerun.groupby("dataset").method.transform("size") == 10 * len(S.PAPER_METHODS)])
        return sel

    @cached_property
    def ablation_runs(self) -> dict:
        "The runs of each ablation of the catalogue the folder holds."
        return {n: S.load_runs(self.folder / e.folder / "runs.csv") for n, e in C.ABLATIONS.items() if (self.folder / e.folder / "runs.csv").exists()}

    @cached_property
    def ablation_family(self):
        "Every ablation's paired change tests, Holm over all of them (`stats.ablation_family`)."
        if not self.ablation_runs: return None
        return S.ablation_family({n: S.ablation_tests(self.runs, vr, C.ABLATIONS[n].design.rename) for n, vr in self.ablation_runs.items()})

    @cached_property
    def alpha_start(self):
        at = S.alpha_start_tests(self.runs, S.load_runs(self.folder / "follow_ups" / "alpha_start" / "runs.csv"))
        return at if len(at) else None

    @cached_property
    def crisp_by_lr(self):
        "Crisp's configurations at both learning rates of the check (`crisp_lr_check/`), paired with the main runs' sentences."
        lr_check = S.load_crisp(self.folder / "crisp_lr_check" / "crisp_runs.csv")
        if lr_check is None or self.crisp is None or self.crisp.lr.nunique() != 1: return None
        same = self.crisp[self.crisp.config.isin(set(lr_check.config)) & self.crisp.train_n.isin(set(lr_check.train_n))]
        return S.crisp_by_lr(pd.concat([same, lr_check], ignore_index=True))

    @cached_property
    def crisp_normalizers(self): return S.load_crisp(self.folder / "crisp_normalizers" / "crisp_runs.csv")

    @cached_property
    def crisp_normalizer_tests(self):
        "Study A's normalizers in the pretrained encoder against its dense runs on the same sentences and rate."
        cn, crisp = self.crisp_normalizers, self.crisp
        if cn is None or crisp is None: return None
        dense = crisp[(crisp.config == S.CRISP_BASELINE) & crisp.train_n.isin(set(cn.train_n)) & crisp.lr.isin(set(cn.lr))]
        return S.crisp_normalizer_tests(pd.concat([dense, cn], ignore_index=True))

# %% [markdown]
# ## The tables
#
# Each entry: the file's name (under `tables/`), what a row is, and its producer — a `Results` → table (None: the
# folder lacks the runs it needs) or, for a family of files, → {name: table}.

# %%
#| export
@dataclass(frozen=True)
class Table:
    "One file of `tables/` (or a family of files, `name` ending in `*`): what a row is, and the reading that produces it."
    name: str
    rows: str
    producer: Callable

def _analysed(name): return lambda r: r.analysed[name]

def _fair(key): return lambda r: r.fair[key] if len(r.fair["recipes"]) else None

def _per_ablation(r) -> dict:
    fam = r.ablation_family
    return {} if fam is None else {f"ablation_{n}": fam[fam.ablation == n].drop(columns="ablation").reset_index(drop=True) for n in r.ablation_runs}

TABLES = [
    Table("paired_tests", "a sparse method against softmax (or the adaptive against entmax-1.5) on one dataset, under the paper's recipe, paired by seed", _analysed("paired_tests")),
    Table("crisp_tests", "a Crisp configuration against dense on one split, paired by seed", _analysed("crisp_tests")),
    Table("single_seed", "how often one seed pair alone would report each gain", _analysed("single_seed")),
    Table("seed_deltas", "one seed pair's gain over the baseline", _analysed("seed_deltas")),
    Table("exceedance", "how often one Crisp seed pair reaches the paper's gain", _analysed("exceedance")),
    Table("power", "the smallest paired effect a design detects", _analysed("power")),
    Table("accuracy_ci", "the paper's single-run accuracies with their binomial intervals", _analysed("accuracy_ci")),
    Table("claims", "one claim of either paper, our estimate and verdict", _analysed("claims")),
    Table("selection", "a dataset's top-k ratio chosen on validation and on test", lambda r: r.selection),
    Table("tuned_tests", "an arm against tuned softmax (or the adaptive against entmax-1.5), each at its own recipe", _fair("tests")),
    Table("tuned_recipes", "an arm's chosen learning rate and epoch, with its edges", _fair("recipes")),
    Table("tuned_candidates", "a candidate learning rate of an arm, as the selection read it", _fair("candidates")),
    Table("label_sensitivity", "a tuned label under each reanalysis, and whether it is robust", lambda r: r.label_sensitivity),
    Table("fresh_confirmation", "a persisting or reversed tuned label read again on seeds 30-39, at the chosen recipes", lambda r: r.fresh_confirmation),
    Table("modern_recipe", "a headline comparison tuned again under warm-up + cosine decay, beside its committed label", lambda r: r.modern_recipe),
    Table("tuned_budget", "an arm's best tuned gain over softmax within a training length", lambda r: r.tuned_budget),
    Table("val_test_agreement", "how well validation ranks the candidates of a dataset as test does", lambda r: TR.val_test_agreement(r.fair["curves"]) if len(r.fair["recipes"]) else None),
    Table("time_to_reach", "the epochs and seconds an arm needs to reach softmax's best", lambda r: r.time_to_reach),
    Table("budget_gains", "an arm's gain over softmax at its best recipe within a budget", lambda r: r.budget_gains),
    Table("compute_matched", "an arm's gain at the paper's budget and at softmax's, in equal epochs and equal seconds", lambda r: r.compute_matched),
    Table("ablation_family", "a gain's change under one ablation, Holm over all ablations", lambda r: r.ablation_family),
    Table("ablation_*", "the same, one file per ablation", _per_ablation),
    Table("alpha_start", "a start value's final α per layer, against α started at 1.5 and against its start", lambda r: r.alpha_start),
    Table("crisp_by_lr", "a Crisp configuration against dense at each learning rate of the check", lambda r: r.crisp_by_lr),
    Table("crisp_normalizer_tests", "a study A normalizer in the pretrained encoder against dense", lambda r: r.crisp_normalizer_tests),
]

def produce(results: Results) -> dict:
    "Every table `results` has the runs for, by file stem, in `TABLES` order."
    out = {}
    for t in TABLES:
        made = t.producer(results)
        if isinstance(made, dict): out.update(made)
        elif made is not None: out[t.name] = made
    return out

def write_tables(results: Results, folder) -> dict:
    "Write every table of `results` to `folder` (`<name>.csv`, each file whole or not at all); returns them."
    from sparse_attention_repro.runner import save_rows
    tables = produce(results)
    for name, df in tables.items(): save_rows(df, Path(folder) / f"{name}.csv")
    return tables

# %% [markdown]
# On the fixtures (study A's and Crisp's runs, no tuned grids or ablations): the tables of the runs present are written,
# each declared; those whose runs are absent are not.

# %%
_fix = Path(sparse_attention_repro.__file__).parent.parent / "tests" / "fixtures"
_dir = Path(tempfile.mkdtemp()); shutil.copy(_fix / "runs.csv", _dir); shutil.copy(_fix / "crisp_runs.csv", _dir)
_r = Results(_dir)
_t = write_tables(_r, _dir / "tables")
test_eq(sorted(p.stem for p in (_dir / "tables").glob("*.csv")), sorted(_t))
test_eq(list(_t)[:9], ["paired_tests", "crisp_tests", "single_seed", "seed_deltas", "exceedance", "power", "accuracy_ci", "claims", "selection"])
assert not {"tuned_tests", "ablation_family", "crisp_by_lr"} & set(_t)                  # no such runs: no such table
declared = {t.name for t in TABLES}
assert all(n in declared or any(d.endswith("*") and n.startswith(d[:-1]) for d in declared) for n in _t)
pd.testing.assert_frame_equal(pd.read_csv(_dir / "tables" / "paired_tests.csv"), S.paired_tests(_r.runs).reset_index(drop=True), check_dtype=False)
