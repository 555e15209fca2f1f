# %% [markdown]
# # The length study's grid
#
# > Which runs a length grid holds, where each one's files go, and the checks that refuse bad input before anything runs.

# %%
#| default_exp length_study

# %% [markdown]
# A length grid is every (task, normalizer, position scheme, learning rate, seed) of a request. Each run is one
# papermill execution of `nbs/experiments/length.ipynb`, through the same runner, results lock, manifest and resume as
# study A's and Crisp's grids (the study is `STUDIES["length"]`). This notebook turns a request into those executions.
#
# **Where things go** (under the results folder): the run's kept weights and training state in
# `runs/<task>/<normalizer>/<positions>/lr<rate>/seed<seed>/` (a run extended to more steps continues there), its rows
# in the same place under `rows/length/` as `steps<S>.csv` (trained to S steps) or `steps<S>_test<k>.csv` (and tested
# at step k), its executed notebook likewise under `notebooks/length/`, and every row of the grid in `length_runs.csv`.
#
# **Profiles** fix the model's shape and the run's length; a command line may choose tasks, normalizers, positions,
# rates and seeds within one. `smoke` is tiny (seconds per run, for tests and CI).

# %%
#| export
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from sparse_attention_repro.length_tasks import get_task
from sparse_attention_repro.length_train import LengthRunConfig, ROW_KEYS
from sparse_attention_repro.normalizers import resolve_normalizer
from sparse_attention_repro.decoder import POSITION_SCHEMES, causal_mask
from sparse_attention_repro.study import STUDIES

# %%
from fastcore.test import test_eq, test_fail
import tempfile

# %%
#| export
LENGTH = STUDIES["length"]

@dataclass(frozen=True)
class LengthProfile:
    "A length grid's defaults: the run's shape and length, what it is tested on, and the grid's axes."
    run: dict                                    # LengthRunConfig fields (model shape, steps, batch, ...)
    test_lengths: tuple                          # input lengths every run is tested at
    test_examples: int                           # shared test inputs per length
    tasks: tuple
    normalizers: tuple
    positions: tuple = ("nape",)
    rates: tuple = (1e-3,)
    seeds: tuple = (0,)

PROFILES = {
    "smoke": LengthProfile(dict(steps=20, eval_every=10, warmup=5, batch_size=8, width=16, layers=1, heads=2, ffn=32),
                           (64, 128), 16, ("flip_flop",), ("softmax", "sparsemax")),
}

# %% [markdown]
# ## Checks before anything runs
#
# Every name is resolved once, at the edge: an unknown task or normalizer, a test length the task cannot make, a
# position scheme that does not exist, a profile's model that the scheme cannot split — each is one line, before any
# notebook starts. A normalizer must also take a **causal** mask: a `[1, 1, Tq, Tk]` mask that differs from row to row,
# where the conformance suite's masks are the same for every query. One that fails is refused with what it did.

# %%
#| export
def causal_refusal(spec) -> str | None:
    "Why the normalizer `spec` cannot serve a causal decoder (one line), or None: it must give future keys exactly 0."
    torch.manual_seed(0)
    s, mask = torch.randn(2, 2, 6, 6), causal_mask(0, 6, 6)[None, None]
    try: p = spec.build(num_heads=2)(s, mask)
    except Exception as e: return f"normalizer {spec.name!r} cannot take a causal mask: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if p.shape != s.shape or not torch.isfinite(p).all() or (p.masked_select(~mask.expand_as(p)) != 0).any():
        return f"normalizer {spec.name!r} cannot take a causal mask: it gives a future key weight, or non-finite weights"
    return None

def check_request(profile: LengthProfile, tasks, normalizers, positions, test_lengths):
    "Resolve every name of a length request (raising one-line `ValueError`s); returns (tasks, normalizer specs)."
    found = [get_task(t) for t in tasks]
    for t in found:
        if too_short := [L for L in test_lengths if L < t.min_length]:
            raise ValueError(f"test length {too_short[0]} is below task {t.name}'s shortest input ({t.min_length} tokens); choose longer test lengths")
    specs = [resolve_normalizer(n) for n in normalizers]
    for s in specs:
        if why := causal_refusal(s): raise ValueError(why)
    for p in positions:
        LengthRunConfig("", positions=p, **{k: v for k, v in profile.run.items() if k != "positions"}).decoder_config(10)
    return found, specs

# %%
smoke = PROFILES["smoke"]
test_fail(lambda: check_request(smoke, ["nope"], ["softmax"], ["nape"], [64]), contains="unknown task 'nope'")
test_fail(lambda: check_request(smoke, ["mqmtar"], ["softmax"], ["nape"], [16]), contains="test length 16 is below task mqmtar's shortest input (20 tokens)")
test_fail(lambda: check_request(smoke, ["flip_flop"], ["nope"], ["nape"], [64]), contains="unknown normalizer 'nope'")
test_fail(lambda: check_request(smoke, ["flip_flop"], ["softmax"], ["alibi"], [64]), contains="unknown position scheme 'alibi'")
from sparse_attention_repro.normalizers import NormalizerSpec
def per_key_only(scores, key_mask=None):                          # reads one mask row for every query: not causal
    return torch.softmax(scores.masked_fill(~key_mask[..., -1:, :], float("-inf")) if key_mask is not None else scores, -1)
test_eq(causal_refusal(NormalizerSpec("per_key_only", lambda num_heads=1: per_key_only)),
        "normalizer 'per_key_only' cannot take a causal mask: it gives a future key weight, or non-finite weights")
assert causal_refusal(resolve_normalizer("entmax15")) is None


# %% [markdown]
# ## The runs of a request

# %%
#| export
@dataclass(frozen=True)
class LengthRun:
    "One run of a grid: its configuration, what it is tested on, and where its files go."
    cfg: LengthRunConfig
    test_step: int                               # 0: train only; else test the weights kept at this step
    test_lengths: tuple
    test_examples: int
    out: Path

    @property
    def key(self) -> str:
        c = self.cfg
        return f"{c.task}/{c.normalizer}/{c.positions}/lr{c.lr:g}/seed{c.seed}"
    @property
    def folder(self) -> Path: return self.out / "runs" / self.key
    @property
    def rows(self) -> Path: return LENGTH.rows_dir(self.out) / f"{self.key}/{self.name}.csv"
    @property
    def notebook(self) -> Path: return self.out / "notebooks" / "length" / f"{self.key}/{self.name}.ipynb"
    @property
    def name(self) -> str:
        "`steps<S>` (trained to S steps, not tested) or `steps<S>_test<k>` (and tested at step k)."
        return f"steps{self.cfg.steps}" + (f"_test{self.test_step}" if self.test_step else "")

def plan_runs(out, profile: LengthProfile, tasks, normalizers, positions, rates, seeds, test_lengths=None, test_step=None,
              **run_options) -> list:
    """The runs of a request, each tested at `test_step` (None: its last step; 0: not tested). `tasks` and `normalizers`
    are checked names; the rest of each run comes from the profile and `run_options`."""
    test_lengths = tuple(test_lengths or profile.test_lengths)
    base = {**profile.run, **run_options}
    return [LengthRun(cfg, cfg.steps if test_step is None else test_step, test_lengths, profile.test_examples, Path(out))
            for t in tasks for n in normalizers for p in positions for lr in rates for s in seeds
            for cfg in [LengthRunConfig(t, n, p, s, lr, **base)]]

# %%
runs = plan_runs("out", smoke, ["flip_flop"], ["softmax", "sparsemax"], ["nape"], [1e-3, 3e-3], [0, 1])
test_eq(len(runs), 8)
test_eq(runs[1].key, "flip_flop/softmax/nape/lr0.001/seed1")
test_eq(runs[1].rows.as_posix(), "out/rows/length/flip_flop/softmax/nape/lr0.001/seed1/steps20_test20.csv")
test_eq(replace(runs[1], test_step=0).notebook.as_posix(), "out/notebooks/length/flip_flop/softmax/nape/lr0.001/seed1/steps20.ipynb")
test_eq(runs[0].cfg.width, 16); test_eq(runs[0].test_lengths, (64, 128))
test_eq(plan_runs("out", smoke, ["reverse"], ["softmax"], ["rope"], [1e-3], [0], steps=40)[0].cfg.steps, 40)
assert set(ROW_KEYS) == set(LENGTH.keys)                            # the study's row keys are the run rows' keys


# %% [markdown]
# Each run becomes one papermill task of the shared runner: done when its rows file exists, so a killed grid resumes
# (and the run itself continues from its last kept weights).

# %%
#| export
from sparse_attention_repro.runner import NotebookTask, experiments_dir

def notebook_task(run: LengthRun, threads: int = 1) -> NotebookTask:
    "The papermill execution of `run` (absolute paths)."
    out = run.out.resolve()
    run = replace(run, out=out)
    return NotebookTask(f"{run.key}/{run.name}", experiments_dir() / LENGTH.notebook, run.notebook, [run.rows],
                        dict(run={k: list(v) if isinstance(v, tuple) else v for k, v in asdict(run.cfg).items()},   # papermill passes lists, not tuples
                             run_folder=str(run.folder), test_step=run.test_step,
                             test_lengths=list(run.test_lengths), test_examples=run.test_examples, threads=threads,
                             rows_path=str(run.rows)))

# %%
t = notebook_task(runs[0])
test_eq(t.parameters["run"]["normalizer"], "softmax"); test_eq(t.parameters["test_step"], 20); test_eq(t.parameters["run"]["train_lengths"], [32, 64])
assert t.notebook.name == "length.ipynb" and t.notebook.exists() and Path(t.parameters["rows_path"]).is_absolute()
