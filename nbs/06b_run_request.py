# %% [markdown]
# # Run requests
# > One typed request per grid, from its declaration to its notebooks: what runs, where, with which options, how.

# %%
#| default_exp run_request

# %% [markdown]
# A grid is asked for in four ways: on the command line, by a catalogue entry (an ablation, a follow-up), by the
# tuned-recipe protocol's plan, and by `reproduce`. Each builds one **request** — a frozen dataclass of typed values —
# and nothing else crosses into execution: no argument list is written to be parsed again, and no option is looked up
# by name on a namespace. `grid_tasks` and `crisp_tasks` check a request once, at the edge (every name resolved, every
# option checked, the data readable) and turn it into papermill tasks; `run_study` runs them into the results folder.
# The command line (`cli`) only turns argv into requests.

# %%
#| export
import os, sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar
from sparse_attention_repro.runner import NotebookTask, TaskGroup, run_task_groups, check_manifest, results_lock, experiments_dir
from sparse_attention_repro.study import STUDIES
from sparse_attention_repro.options import option_defaults, check_options, option_flags

# %%
from fastcore.test import test_eq, test_fail
import tempfile
import sparse_attention_repro

# %%
#| export
class UsageError(ValueError):
    "A bad argument: reported as one line on stderr with exit status 2."

def _check_dataset(name):
    "A dataset the notebooks can resolve by name: registered, or an entry point of the datasets group (one line otherwise)."
    from sparse_attention_repro.data import get_dataset, DATASET_ENTRY_POINT_GROUP
    if ":" in name: raise UsageError(f"--datasets {name}: a dataset from outside the library is named by its entry point "
                                     f"(group {DATASET_ENTRY_POINT_GROUP} in its package's metadata), which the run notebooks resolve")
    try: get_dataset(name)
    except ValueError as e: raise UsageError(str(e)) from None

# %% [markdown]
# ## The requests
#
# `Execution` says how a request's notebooks run; `GridRequest`, `CrispRequest` and `LengthRequest` say what runs, and
# each names its study (`STUDIES`), whose planner checks it and turns it into tasks (`execute`). A field left empty
# (`()`) takes the profile's value (or the baseline's); `options` holds the run options that differ from their
# defaults, by the names of the study's configuration (`TrainConfig`, `FinetuneConfig`, `LengthRunConfig`), and `command_line` writes the
# request as the command that makes it, to print.

# %%
#| export
DEVICES = ("auto", "cpu", "cuda")

@dataclass(frozen=True)
class Execution:
    "How a request's notebooks run: `jobs` at once, by `executor` (local threads, or dask at `scheduler`), on `device`; `download` fetches missing data."
    jobs: int = 1
    executor: str = "local"
    scheduler: str | None = None
    device: str = "auto"
    download: bool = False

    def check(self) -> "Execution":
        "Itself, or a `UsageError` (one line) for the first bad field."
        if self.executor not in ("local", "dask"): raise UsageError(f"unknown executor {self.executor!r}; choose local or dask")
        if self.scheduler and self.executor != "dask": raise UsageError("--scheduler needs --executor dask")
        if self.jobs < 1: raise UsageError(f"--jobs must be >= 1, got {self.jobs}")
        if self.device not in DEVICES: raise UsageError(f"unknown device {self.device!r}; choose one of {', '.join(DEVICES)}")
        return self

def checked_seeds(seeds) -> list:
    "`seeds` as integers, or a one-line `UsageError` for a negative one."
    seeds = [int(s) for s in seeds]
    if any(s < 0 for s in seeds): raise UsageError(f"seeds must be >= 0, got {min(seeds)}")
    return seeds

@dataclass(frozen=True)
class GridRequest:
    "One study A grid: datasets × methods × seeds of a profile into `out`, with its run options and how it executes."
    study: ClassVar[str] = "study_a"
    out: str
    profile: str = "smoke"
    datasets: tuple = ()              # () : the profile's, or the baseline's
    methods: tuple = ()               # names, package.module:name or entry points; () : the paper's seven
    seeds: tuple = ()                 # () : the profile's, or the baseline's
    options: dict = field(default_factory=dict)   # `TrainConfig` options that differ from their defaults
    plain: bool = False               # each method alone instead of in lock-step
    stack_seeds: int = 1              # seeds trained as one stacked model
    fast: bool = False                # the speed levers measured to pay here (`bench.calibrate_fast`)
    baseline: str | None = None       # a committed folder whose seeds and options this grid pairs with
    keep_state: bool = False          # keep each group's final training state
    continue_from: str | None = None  # a shorter run of this grid whose kept states it continues
    execution: Execution = Execution()

    def run_options(self) -> dict:
        "Every `TrainConfig` option of the grid: the defaults, overridden by `options`."
        from sparse_attention_repro.train import TrainConfig
        return {**option_defaults(TrainConfig), **self.options}

    def command_line(self) -> str:
        "The `sparse-repro grid` command that makes this request (to print)."
        parts = ["sparse-repro", "grid", "--profile", self.profile, "--out", str(self.out)]
        parts += (["--datasets", *self.datasets] if self.datasets else []) + (["--methods", *self.methods] if self.methods else [])
        parts += (["--seeds", *map(str, self.seeds)] if self.seeds else []) + option_flags(self.options)
        parts += option_flags(dict(plain=self.plain, fast=self.fast, keep_state=self.keep_state))
        parts += (["--stack-seeds", str(self.stack_seeds)] if self.stack_seeds != 1 else [])
        parts += (["--baseline", str(self.baseline)] if self.baseline else []) + (["--continue-from", str(self.continue_from)] if self.continue_from else [])
        return " ".join(parts)

@dataclass(frozen=True)
class CrispRequest:
    "One Crisp grid: configurations × seeds of a profile into `out`, on `model`, with its fine-tuning options."
    study: ClassVar[str] = "crisp"
    out: str
    profile: str = "smoke"
    configs: tuple = ()               # () : the paper's four
    seeds: tuple = ()                 # () : the profile's
    model: str = ""                   # "" : the profile's model
    options: dict = field(default_factory=dict)   # `FinetuneConfig` options that differ from their defaults
    execution: Execution = Execution()

    def run_options(self) -> dict:
        "Every `FinetuneConfig` option of the grid: the defaults, overridden by `options`."
        from sparse_attention_repro.crisp import FinetuneConfig
        return {**option_defaults(FinetuneConfig), **self.options}

@dataclass(frozen=True)
class LengthRequest:
    """One length-study grid: tasks × normalizers × position schemes × rates × seeds of a profile, or one `stage` of its
    fair protocol (select, complete, budgets), into `out`."""
    study: ClassVar[str] = "length"
    out: str
    profile: str = "smoke"
    tasks: tuple = ()                 # registered names, package.module:name or entry points; () : the profile's
    normalizers: tuple = ()           # () : the profile's
    positions: tuple = ()             # () : the profile's
    rates: tuple = ()                 # () : the profile's (select: its ladder)
    seeds: tuple = ()                 # () : the profile's (a stage: the protocol's)
    test_lengths: tuple = ()          # () : the profile's
    stage: str | None = None          # None: the plain grid, each run tested at its last step
    options: dict = field(default_factory=dict)   # `LengthRunConfig` options that differ from their defaults
    execution: Execution = Execution()

# %%
_r = GridRequest("res", "paper", ("kmnist",), ("softmax",), (0, 1), dict(lr=3e-3, epoch_eval=True), keep_state=True)
test_eq(_r.command_line(), "sparse-repro grid --profile paper --out res --datasets kmnist --methods softmax --seeds 0 1 --lr 0.003 --epoch-eval --keep-state")
test_eq((_r.run_options()["lr"], _r.run_options()["epochs"]), (3e-3, 0))                 # the rest at their defaults (0: the profile's)
test_fail(lambda: Execution(jobs=0).check(), exc=UsageError, contains="--jobs must be >= 1")
test_fail(lambda: Execution(scheduler="tcp://h:1").check(), exc=UsageError, contains="needs --executor dask")
test_fail(lambda: Execution(device="tpu").check(), exc=UsageError, contains="unknown device 'tpu'")
test_eq([r.study for r in (_r, CrispRequest("x"), LengthRequest("x"))], ["study_a", "crisp", "length"])

# %% [markdown]
# A catalogue entry's design (`catalogue.Design`) becomes a request here, and only here: its study, datasets, methods,
# options, seeds and profile; `fast` in its options is how it runs, not a run option; the folder it is paired with is
# named relative to a results root.

# %%
#| export
def design_request(e, out, profile=None, seeds=(), execution=Execution(), baseline_root=None, stack_seeds=1, fast=False):
    """The request that makes catalogue entry `e`'s design into `out`: at `profile` (default: the design's, else its
    study's committed one), on `seeds` (default: the design's, else the profile's), paired with its baseline folder
    under `baseline_root` where it names one."""
    from sparse_attention_repro.catalogue import STUDY_PROFILES
    d = e.design
    seeds, profile = tuple(seeds) or tuple(d.seeds or ()), profile or d.profile or STUDY_PROFILES[d.study]
    if d.study == "crisp": return CrispRequest(str(out), profile, d.methods, seeds, options=dict(d.options), execution=execution)
    return GridRequest(str(out), profile, d.datasets, d.methods, seeds, {k: v for k, v in d.options.items() if k != "fast"},
                       stack_seeds=stack_seeds, fast=fast or bool(d.options.get("fast")),
                       baseline=str(Path(baseline_root) / d.baseline) if d.baseline and baseline_root else None, execution=execution)

# %%
from sparse_attention_repro.catalogue import CATALOGUE
test_eq(design_request(CATALOGUE["patch4"], "x").command_line(),
        "sparse-repro grid --profile paper --out x --datasets fashion_mnist --methods softmax topk_softmax_0125 topk_softmax_025 topk_softmax_05 --patch-size 4")
test_eq(design_request(CATALOGUE["masked_padding"], "x").command_line().split()[-1], "--mask-padding")
test_eq(design_request(CATALOGUE["selection_marker"], "x").command_line().split()[8:],
        ["--marker-design", "label_once", "--epochs", "3", "--epoch-eval", "--val-fraction", "0.25"])
test_eq((design_request(CATALOGUE["fashion_mnist_fast"], "x").fast, design_request(CATALOGUE["fashion_mnist_fast"], "x").options), (True, {}))
test_eq(design_request(CATALOGUE["literature"], "x", baseline_root="o").baseline, "o/paper")
test_eq(type(design_request(CATALOGUE["crisp_lr_check"], "x")).__name__, "CrispRequest")


# %% [markdown]
# Jobs and threads are counted on the cores this process may use (its CPU affinity: `taskset`, a container's or a
# batch system's CPU set), not on the machine's: a grid pinned to one core of an 8-core machine runs one thread, not 8
# threads fighting for that core (which is slow, and changes results, since they are bit-identical only at one thread
# count). Cores already busy with other work count as taken too: the free cores are the usable ones less the
# one-minute load average when the grid starts. Measured here, with four other single-thread trainings on the two
# cores, one model's training step took 60 ms at one thread and 452 ms at two (softmax, CIFAR-10's shapes; 65 and
# 556 ms for Scalable-Softmax): threads that outnumber the free cores wait on each other. So a grid into a new folder
# takes the usable cores shared out, cut down to the free ones, and says so in one line when it cuts. The count is
# then the folder's: it is recorded in its `manifest.json`, and a resumed grid, or a longer one that continues the
# folder's kept states (`--continue-from`), takes it again whatever the load — a run is bit-identical only at one
# thread count, and a kept state continues only at the count it was made with (a search whose continuation silently
# restarted from scratch after a thread change is what taught us this). Where the recorded count outnumbers the free
# cores, the grid keeps it and warns in one line, with the fix (`taskset -c`, or wait).

# %%
#| export
def usable_cores() -> int:
    "How many CPU cores this process may run on (its affinity set where the OS reports one, else the machine's count)."
    try: return max(1, len(os.sched_getaffinity(0)))
    except AttributeError: return max(1, os.cpu_count() or 1)

def load_average() -> float:
    "The one-minute load average (0 where the OS does not report one)."
    try: return os.getloadavg()[0]
    except (AttributeError, OSError): return 0.0

def free_cores(load=None) -> int:
    "Usable cores not busy with other work: `usable_cores()` less the load average (`load`, else `load_average()`), at least one."
    load = load_average() if load is None else load
    return max(1, min(usable_cores(), int(usable_cores() - load + 0.5)))

def threads_per_job(jobs: int) -> int:
    "torch threads for each of `jobs` notebooks run at once: the usable cores shared out, at least one."
    return max(1, usable_cores() // max(1, jobs))

def recorded_threads(folder, study) -> int | None:
    "The torch threads per notebook recorded in `folder`'s manifest for `study`, or None."
    import json
    f = Path(folder) / "manifest.json" if folder else None
    return json.loads(f.read_text()).get("threads", {}).get(study) if f is not None and f.is_file() else None

def record_threads(folder, study, threads: int):
    "Record `study`'s threads per notebook in `folder`'s manifest (beside the run options)."
    import json
    from sparse_attention_repro.files import atomic_write
    f = Path(folder) / "manifest.json"
    manifest = json.loads(f.read_text()) if f.is_file() else {}
    manifest["threads"] = {**manifest.get("threads", {}), study: int(threads)}
    atomic_write(f, lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=1, sort_keys=True)))

def grid_threads(out, study, jobs: int, continue_from=None, load=None) -> tuple:
    """(threads per notebook, a one-line note or None) for a grid of `jobs` notebooks into `out`: the count recorded for
    `out` (or for the folder it continues), else the usable cores shared out, cut down to the free cores."""
    load = load_average() if load is None else load
    free, usable = free_cores(load), usable_cores()
    for folder in (out, continue_from):
        if (n := recorded_threads(folder, study)) is not None:
            if n > 1 and n * jobs > free:
                return n, (f"warning: {folder} was made with {n} threads per job, but only {free} of {usable} cores are free (one-minute "
                           f"load average {load:.1f}); it keeps {n} (runs are bit-identical only at one count), which can train several "
                           f"times slower: pin the grid to {n * jobs} core(s) with `taskset -c` or wait")
            return n, None
    n = threads_per_job(jobs)
    if n > 1 and n * jobs > free:
        cut = max(1, free // max(1, jobs))
        return cut, (f"note: {cut} thread(s) per job, not {n}: only {free} of {usable} cores are free (one-minute load average {load:.1f}); "
                     f"{out} keeps {cut} when resumed or continued")
    return n, None

# %%
test_eq(threads_per_job(10_000), 1)
import json
_tdir = Path(tempfile.mkdtemp())
old_set = os.sched_getaffinity(0)
try:                                                            # pinned to one core: one thread, whatever the machine has
    os.sched_setaffinity(0, {min(old_set)}); test_eq((usable_cores(), threads_per_job(1)), (1, 1))
    test_eq(grid_threads(_tdir / "a", "study_a", 1, load=5.0), (1, None))       # one thread: nothing to wait on
    if len(old_set) >= 2:                                       # two cores: two threads for one job, one each for two
        os.sched_setaffinity(0, set(sorted(old_set)[:2])); test_eq((usable_cores(), threads_per_job(1), threads_per_job(2)), (2, 2, 1))
        test_eq([free_cores(l) for l in (0.0, 0.4, 0.6, 1.0, 7.0)], [2, 2, 1, 1, 1])              # busy cores are taken
        test_eq(grid_threads(_tdir / "a", "study_a", 1, load=0.2), (2, None)); test_eq(grid_threads(_tdir / "a", "study_a", 2, load=3.0), (1, None))
        n, note = grid_threads(_tdir / "a", "study_a", 1, load=1.0)                 # a new folder on a busy machine: cut to the free core
        test_eq(n, 1); assert note.startswith("note: 1 thread(s) per job, not 2") and "keeps 1" in note
        record_threads(_tdir / "a", "study_a", 2)                                    # a folder made at two threads ...
        n, warn = grid_threads(_tdir / "a", "study_a", 1, load=1.0)                  # ... keeps them, and says what it costs
        test_eq(n, 2); assert warn.startswith("warning:") and "taskset" in warn
        test_eq(grid_threads(_tdir / "b", "study_a", 1, continue_from=_tdir / "a", load=0.0), (2, None))   # a continuation: its source's
        test_eq(grid_threads(_tdir / "a", "crisp", 1, load=1.0)[0], 1)               # recorded per study
        record_threads(_tdir / "a", "crisp", 1)
        test_eq(json.loads((_tdir / "a" / "manifest.json").read_text())["threads"], {"study_a": 2, "crisp": 1})
finally: os.sched_setaffinity(0, old_set)


# %% [markdown]
# ## Study A grid
#
# `grid_tasks` checks every part of a request — profile, datasets, methods, seeds, device, and that each dataset can be read —
# and returns one papermill task per (dataset, seed) with the options that define the results folder. Nothing is
# written yet, so a bad argument leaves no trace.

# %%
#| export
STUDY_A = STUDIES["study_a"]

# %% [markdown]
# **Against a committed baseline.** With `--baseline DIR` the grid trains only the new methods, on the seeds and
# datasets of `DIR`'s runs (unless given) and with exactly `DIR`'s options — a folder made with other options is refused
# in one line —, plus softmax once more on each dataset's first seed: the pairing check of `stats.pairing_check`.

# %%
#| export
def _baseline_runs(folder):
    "The committed runs of a baseline folder, or a UsageError saying what is missing."
    from sparse_attention_repro.stats import load_runs, check_results_file
    path = STUDY_A.results_path(folder)
    if not path.is_file() or not (Path(folder) / "manifest.json").is_file():
        raise UsageError(f"--baseline {folder} holds no runs.csv and manifest.json; give a results folder made by `sparse-repro grid`")
    try: check_results_file(path)
    except ValueError as e: raise UsageError(str(e)) from None
    return load_runs(path)

def _check_baseline(folder, base, options, datasets, seeds):
    "Refuse, in one line, a baseline made with other options or lacking a requested (dataset, seed)."
    import json
    from sparse_attention_repro.train import TrainConfig
    made = json.loads((Path(folder) / "manifest.json").read_text()).get(STUDY_A.name)
    if made is None: raise UsageError(f"--baseline {folder} has no study A grid in its manifest.json")
    made = {**option_defaults(TrainConfig), **made}
    if diff := [k for k in sorted(options) if made.get(k) != options[k]]:
        raise UsageError(f"--baseline {folder} was made with " + ", ".join(f"{k}={made.get(k)!r} (this grid: {options[k]!r})" for k in diff)
                         + "; give the same options or another baseline")
    have = set(zip(base.dataset, base.seed.astype(int)))
    if missing := [f"{d} seed {s}" for d in datasets for s in seeds if (d, s) not in have]:
        raise UsageError(f"--baseline {folder} has no runs for {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}; choose its seeds and datasets")

# %%
#| export
def _check_shorter_run(folder, options):
    "Refuse, in one line, a --continue-from folder that is not this grid's with fewer epochs."
    import json
    from sparse_attention_repro.train import TrainConfig
    made = Path(folder) / "manifest.json"
    if not made.is_file() or STUDY_A.name not in (m := json.loads(made.read_text())):
        raise UsageError(f"--continue-from {folder} holds no study A grid (manifest.json); give a results folder made by `sparse-repro grid --keep-state`")
    made = {**option_defaults(TrainConfig), **m[STUDY_A.name]}
    if diff := [k for k in sorted(options) if k != "epochs" and made.get(k) != options[k]]:
        raise UsageError(f"--continue-from {folder} was made with " + ", ".join(f"{k}={made.get(k)!r} (this grid: {options[k]!r})" for k in diff)
                         + "; only --epochs may differ")
    if not (made["epochs"] and options["epochs"] and made["epochs"] < options["epochs"]):
        raise UsageError(f"--continue-from {folder} ran --epochs {made['epochs']}; give this grid more (now --epochs {options['epochs']}; 0, the paper's, does not count)")

# %%
#| export
def _fast_calibration(req: GridRequest, specs, datasets, stacked, run, threads) -> dict:
    """--fast's levers: the results folder's own calibration when it has one (every run of a folder takes one path),
    else the baseline's (a comparison pairs runs of one path), else `bench.calibrate_fast` on this machine (cached)."""
    import json
    from sparse_attention_repro.data import has_bf16_units, resolve_device
    from sparse_attention_repro.bench import calibrate_fast
    from sparse_attention_repro.normalizers import fused_refusal
    for folder in [req.out] + ([req.baseline] if req.baseline else []):
        made = Path(folder) / "manifest.json"
        if made.is_file() and (cal := json.loads(made.read_text()).get(STUDY_A.name, {}).get("fast_calibration")): return cal
    device = resolve_device(req.execution.device)
    print(f"--fast: timing its levers on this machine ({', '.join(datasets)}; once per CPU, build and grid) …", flush=True)
    cal = calibrate_fast(datasets, [s.name for s in specs], req.profile, run, threads, device,
                         bf16=has_bf16_units(device), fused=not fused_refusal(specs, device, stacked))
    print(f"--fast: {cal['label']} (ms per step: " + "; ".join(f"{d}: " + ", ".join(f"{k} {v:.1f}" for k, v in t.items())
                                                           for d, t in cal["ms_per_step"].items()) + ")", flush=True)
    return cal

@dataclass(frozen=True)
class ExecutionPlan:
    "How a grid's runs execute, resolved and checked once at the edge: device, container, and the run options that choose the path."
    device: str                 # as asked (auto | cpu | cuda), checked to exist here
    container: str              # plain (one model at a time) | lockstep (a seed's methods together) | stacked (seeds as one model)
    stack_seeds: int            # seeds per stacked model (1 unless stacked)
    run: dict                   # TrainConfig's options, checked: the attention path, dropout generator and precision among them
    calibration: dict | None    # what --fast measured, when it chose the levers in `run`
    threads: int = 1            # torch threads per notebook (`grid_threads`: the folder's, else the free cores shared out)
    threads_note: str | None = None   # one line on how they were chosen, when they are not the usable cores shared out

def execution_plan(req: GridRequest, specs, datasets) -> ExecutionPlan:
    "The grid's `ExecutionPlan`: every path option checked (and --fast resolved into measured levers) before anything runs."
    from sparse_attention_repro.train import TrainConfig
    from sparse_attention_repro.normalizers import fused_refusal
    from sparse_attention_repro.data import resolve_device
    from sparse_attention_repro.model import FUSED_PATHS
    try: device = resolve_device(req.execution.device)
    except ValueError as e: raise UsageError(str(e)) from None
    run = req.run_options()                                             # TrainConfig's options, checked by their own rules
    try: check_options(TrainConfig, run)
    except ValueError as e: raise UsageError(str(e)) from None
    if req.stack_seeds < 1: raise UsageError(f"--stack-seeds must be >= 1, got {req.stack_seeds}")
    if req.stack_seeds > 1 and req.plain: raise UsageError("--plain and --stack-seeds exclude each other: a stack trains every method together")
    stacked = req.stack_seeds > 1
    if req.fast and (run["dropout_rng"], run["precision"], run["attention"]) != ("torch", "fp32", "torch"):
        raise UsageError("--fast sets --dropout-rng, --precision and --attention itself; drop them")
    threads, note = grid_threads(req.out, STUDY_A.name, req.execution.jobs, req.continue_from)
    calibration = None
    if req.fast:                                                            # resolved here into the levers measured to pay here
        calibration = _fast_calibration(req, specs, datasets, stacked, run, threads)
        run.update(calibration["levers"])
    elif run["attention"] in FUSED_PATHS and (why := fused_refusal(specs, device, stacked)):
        raise UsageError(f"--attention {run['attention']}: {why}; use --attention torch")
    return ExecutionPlan(req.execution.device, "stacked" if stacked else "plain" if req.plain else "lockstep", req.stack_seeds, run, calibration,
                         threads, note)

def grid_tasks(req: GridRequest):
    "Check every part of `req` and return (tasks, options): one papermill task per (dataset, seed group), nothing written."
    req.execution.check()
    from sparse_attention_repro.train import PROFILES, PAPER_SIZES, run_rows_path
    from sparse_attention_repro.normalizers import resolve_normalizer
    from sparse_attention_repro.study import PAPER_METHODS, BASELINE
    from sparse_attention_repro.data import load_dataset, DataOptions, DataUnavailableError
    if req.profile not in PROFILES: raise UsageError(f"unknown profile {req.profile!r}; choose one of {', '.join(PROFILES)}")
    base = _baseline_runs(req.baseline) if req.baseline else None
    datasets = list(req.datasets) if req.datasets else list(PAPER_SIZES) if base is None else [d for d in PAPER_SIZES if d in set(base.dataset)]
    for d in datasets:
        _check_dataset(d)
    refs = list(req.methods) or list(PAPER_METHODS)
    try: specs = [resolve_normalizer(m) for m in refs]                  # the edge: each method resolved (and checked) once
    except ValueError as e: raise UsageError(str(e)) from None
    methods = [s.name for s in specs]
    if len(set(methods)) < len(methods): raise UsageError(f"--methods names a method twice: {' '.join(refs)}")
    ref_of = dict(zip(methods, refs))                                   # what a notebook resolves: the name, or package.module:name
    seeds = checked_seeds(req.seeds) if req.seeds else list(PROFILES[req.profile]["seeds"]) if base is None else sorted(set(base.seed.astype(int)))
    opts = req.run_options()
    for d in datasets:                           # data present and readable? (also warms the decode cache once)
        try: load_dataset(d, 0, 1, 1, DataOptions(patch_size=opts["patch_size"] or None, marker_vocab=opts["marker_vocab"],
                                                  marker_design=opts["marker_design"]), download=req.execution.download)
        except DataUnavailableError as e: raise UsageError(str(e).splitlines()[0]) from None
        except ValueError as e: raise UsageError(str(e)) from None
    plan = execution_plan(req, specs, datasets)                        # after the data: --fast measures on it
    run, calibration = plan.run, plan.calibration
    options = dict(profile=req.profile, **run, **({"fast_calibration": calibration} if calibration else {}))
    if base is not None: _check_baseline(req.baseline, base, options, datasets, seeds)
    if req.continue_from: _check_shorter_run(req.continue_from, options)
    out, nb = Path(req.out).resolve(), experiments_dir() / STUDY_A.notebook
    threads = plan.threads
    if plan.threads_note: print(plan.threads_note, file=sys.stderr)
    tasks = []
    for d in datasets:
        rows_dir = (STUDY_A.rows_dir(out) / d).resolve()
        for i in range(0, len(seeds), plan.stack_seeds):
            group = seeds[i:i + plan.stack_seeds]
            name = f"seed{group[0]}" if len(group) == 1 else f"seeds{group[0]}-{group[-1]}"
            todo = [m for m in methods if any(not run_rows_path(rows_dir, s, m).exists() for s in group)] or methods
            record = out / "notebooks" / d / f"{name}.ipynb"
            others = any(f.stem not in todo for s in group if (rows_dir / f"seed{s}").is_dir() for f in (rows_dir / f"seed{s}").glob("*.csv"))
            n = 1
            while others and record.exists():    # rows this run will not write exist: the notebook that wrote them is kept beside it
                record = out / "notebooks" / d / f"{name}_resume{n}.ipynb"; n += 1
            check = base is not None and i == 0 and BASELINE not in methods   # the pairing check: the baseline's first seed again
            if check and not run_rows_path(rows_dir, group[0], BASELINE).exists():
                todo, ref_of = todo + [BASELINE], {**ref_of, BASELINE: BASELINE}
            tasks.append(NotebookTask(f"{d}/{name}", nb, record,
                                      [run_rows_path(rows_dir, s, m) for s in group for m in methods] +
                                      ([run_rows_path(rows_dir, group[0], BASELINE)] if check else []),
                                      dict(dataset=d, seeds=group, methods=[ref_of[m] for m in todo], threads=threads, rows_dir=str(rows_dir),
                                           lockstep=plan.container != "plain", stack=len(group) > 1, download=req.execution.download,
                                           device=plan.device, profile=req.profile, options=run, keep_state=req.keep_state,
                                           continue_from=str((STUDY_A.rows_dir(Path(req.continue_from)) / d).resolve()) if req.continue_from else "")))
    return tasks, options

# %%
_plan = lambda **k: execution_plan(GridRequest("x", execution=Execution(device="cpu"), **k), [], ["synthetic_marker"])
test_eq([(p.container, p.stack_seeds) for p in (_plan(), _plan(plain=True), _plan(stack_seeds=3))],
        [("lockstep", 1), ("plain", 1), ("stacked", 3)])
test_eq((_plan(options=dict(precision="bf16")).run["precision"], _plan().calibration), ("bf16", None))
test_fail(lambda: _plan(plain=True, stack_seeds=2), exc=UsageError, contains="exclude each other")

# %%
_out = Path(tempfile.mkdtemp()) / "res"
_G = lambda **k: GridRequest(str(_out), **{"datasets": ("synthetic_marker",), "seeds": (3,), **k})   # a request into `_out`
tasks, opts = grid_tasks(_G(methods=("softmax", "entmax15")))
test_eq([t.name for t in tasks], ["synthetic_marker/seed3"])
test_eq({k: tasks[0].parameters[k] for k in ("dataset", "seeds", "methods", "profile", "device", "stack")},
        dict(dataset="synthetic_marker", seeds=[3], methods=["softmax", "entmax15"], profile="smoke", device="auto", stack=False))
test_eq([Path(p).name for p in tasks[0].produces], ["softmax.csv", "entmax15.csv"])
test_eq(opts["profile"], "smoke"); assert not _out.exists()                    # validated, nothing written
# a later grid into a seed another grid already ran (other methods, e.g. the power stage's second arm) keeps the earlier record;
# a plain re-run whose rows are gone writes over its own
(_out / "notebooks" / "synthetic_marker").mkdir(parents=True); (_out / "notebooks" / "synthetic_marker" / "seed3.ipynb").write_text("{}")
_rec = lambda *m: grid_tasks(_G(methods=m))[0][0].output.name
test_eq(_rec("softmax"), "seed3.ipynb")
(_rd := _out / "rows" / "study_a" / "synthetic_marker" / "seed3").mkdir(parents=True); (_rd / "softmax.csv").write_text("x")
test_eq((_rec("softmax"), _rec("entmax15"), _rec("softmax", "entmax15")), ("seed3.ipynb", "seed3_resume1.ipynb", "seed3_resume1.ipynb"))
import shutil; shutil.rmtree(_out)
_ph = grid_tasks(_G(options=dict(dropout_rng="philox")))
test_eq((_ph[1]["dropout_rng"], _ph[0][0].parameters["options"]["dropout_rng"], opts["dropout_rng"]), ("philox", "philox", "torch"))
test_fail(lambda: grid_tasks(_G(options=dict(dropout_rng="mt"))), exc=UsageError, contains="unknown --dropout-rng")
test_fail(lambda: grid_tasks(_G(options=dict(precision="fp16"))), exc=UsageError, contains="unknown --precision 'fp16'; choose one of fp32, bf16")
test_fail(lambda: grid_tasks(_G(options=dict(learning_rate=1e-3))), exc=UsageError, contains="unknown option 'learning_rate'")
test_fail(lambda: grid_tasks(_G(seeds=(-1,))), exc=UsageError, contains="seeds must be >= 0")
_st = grid_tasks(_G(seeds=(0, 1, 2, 3, 4), stack_seeds=2))[0]
test_eq([(t.name, t.parameters["seeds"], t.parameters["stack"], len(t.produces)) for t in _st],
        [("synthetic_marker/seeds0-1", [0, 1], True, 14), ("synthetic_marker/seeds2-3", [2, 3], True, 14), ("synthetic_marker/seed4", [4], False, 7)])
test_fail(lambda: grid_tasks(_G(stack_seeds=0)), exc=UsageError, contains="--stack-seeds must be")
test_fail(lambda: grid_tasks(_G(stack_seeds=2, plain=True)), exc=UsageError, contains="exclude each other")
_lr = grid_tasks(_G(options=dict(lr=3e-3, epochs=12, epoch_eval=True)))
test_eq([_lr[0][0].parameters["options"][k] for k in ("lr", "epochs", "epoch_eval")], [3e-3, 12, True])
test_eq([opts[k] for k in ("lr", "epochs", "epoch_eval")], [0.0, 0, False])          # 0: the protocol's values
# a longer run continuing a shorter one: only --epochs may differ, and it must grow
import json
_short = Path(tempfile.mkdtemp()) / "short"; _short.mkdir()
(_short / "manifest.json").write_text(json.dumps({"study_a": dict(_lr[1], epochs=6)}))
_cont = grid_tasks(_G(options=dict(lr=3e-3, epochs=12, epoch_eval=True), continue_from=str(_short), keep_state=True))
test_eq((_cont[0][0].parameters["continue_from"], _cont[0][0].parameters["keep_state"]), (str((_short / "rows" / "study_a" / "synthetic_marker").resolve()), True))
test_eq((_lr[0][0].parameters["continue_from"], _lr[0][0].parameters["keep_state"]), ("", False))
for more, msg in [(dict(lr=1e-3, epochs=12), "was made with lr=0.003 (this grid: 0.001); only --epochs may differ"),
                  (dict(lr=3e-3, epochs=6), "ran --epochs 6; give this grid more")]:
    test_fail(lambda: grid_tasks(_G(options=dict(epoch_eval=True, **more), continue_from=str(_short))), exc=UsageError, contains=msg)
test_fail(lambda: grid_tasks(_G(continue_from=str(_out))), exc=UsageError, contains="holds no study A grid")
# `--fast` takes the levers its calibration chose. A folder that already holds a calibration keeps it (every run of a
# folder takes one path); here one written by hand, Philox and fused attention, is applied to the tasks and recorded:
_fo = Path(tempfile.mkdtemp()); _cal = dict(levers=dict(dropout_rng="philox", precision="fp32", attention="fused"), label="philox+fused",
                                            ms_per_step={"synthetic_marker": {"default": 9.0, "philox+fused": 7.0}})
(_fo / "manifest.json").write_text(json.dumps({"study_a": {"fast_calibration": _cal}}))
_fast = grid_tasks(GridRequest(str(_fo), datasets=("synthetic_marker",), seeds=(3,), fast=True, execution=Execution(device="cpu")))
test_eq([_fast[1][k] for k in ("dropout_rng", "precision", "attention")], ["philox", "fp32", "fused"])
test_eq(_fast[1]["fast_calibration"], _cal)
test_eq(_fast[0][0].parameters["options"]["dropout_rng"], "philox")
test_fail(lambda: grid_tasks(_G(fast=True, options=dict(precision="bf16"))), exc=UsageError, contains="--fast sets")
test_fail(lambda: grid_tasks(_G(methods=("softmax", "entmax15_bisect"), options=dict(attention="fused"), execution=Execution(device="cpu"))),
          exc=UsageError, contains="entmax15_bisect has no fused kernel")
for bad, msg in [(dict(lr=-1.0), "--lr must be"), (dict(lr=2.0), "--lr must be"), (dict(epochs=-3), "--epochs must be")]:
    test_fail(lambda: grid_tasks(_G(options=bad)), exc=UsageError, contains=msg)

# %% [markdown]
# A baseline folder sets the seeds and datasets, adds the softmax re-run of the first seed, and refuses other options or
# seeds it does not have:

# %%
_base = Path(tempfile.mkdtemp()) / "base"; _base.mkdir()
shutil.copy(Path(sparse_attention_repro.__file__).parent.parent / "tests" / "fixtures" / "runs.csv", _base / "runs.csv")
(_base / "manifest.json").write_text(json.dumps({"study_a": dict(profile="smoke", val_fraction=0.0, mask_padding=False, patch_size=0, marker_vocab=20000)}))  # an older manifest
_B = lambda **k: grid_tasks(GridRequest(str(_out), methods=("sparsemax",), baseline=str(_base), **k))
_vs, _vo = _B(datasets=("synthetic_marker",))
test_eq([(t.name, t.parameters["methods"]) for t in _vs],
        [("synthetic_marker/seed0", ["sparsemax", "softmax"]), ("synthetic_marker/seed1", ["sparsemax"]), ("synthetic_marker/seed2", ["sparsemax"])])
test_eq(Path(_vs[0].produces[-1]).name, "softmax.csv")
test_fail(lambda: _B(options=dict(lr=3e-3)), exc=UsageError, contains="was made with lr=0.0 (this grid: 0.003)")
test_fail(lambda: _B(seeds=(7,)), exc=UsageError, contains="has no runs for cifar10 seed 7")   # the first dataset in registry order
test_fail(lambda: grid_tasks(GridRequest(str(_out), baseline=str(_out))), exc=UsageError, contains="holds no runs.csv")
test_fail(lambda: grid_tasks(_G(methods=("softmax", "sparsemax", "softmax"))), exc=UsageError, contains="twice")

# %% [markdown]
# `run_study` holds the results folder (one writer at a time), checks it was made with the same options and runs
# what is not done yet.

# %%
#| export
def study_group(study, out, tasks, options, name="") -> TaskGroup:
    "`out`'s manifest checked against `options` (over `study`'s own defaults), and `tasks` as one group of `study`'s rows in `out`."
    check_manifest(out, study.name, options, defaults=option_defaults(study.config_class()))
    if tasks: record_threads(out, study.name, tasks[0].parameters["threads"])   # the folder's count from now on
    return TaskGroup(list(tasks), study.results_path(out), study.keys, study.rows_dir(out), Path(out), name=name)

@dataclass(frozen=True)
class Planned:
    "A request planned once by its study (`Study.plan`: everything checked, nothing written): its tasks and options, ready to run."
    request: object
    tasks: tuple
    options: dict

def plan_request(request) -> Planned:
    "Plan `request` through its study, once; a bad request raises a one-line `UsageError` before anything is written."
    tasks, options = STUDIES[request.study].plan(request)
    return Planned(request, tuple(tasks), options)

def run_planned(planned: Planned, then=None) -> dict:
    "Run a planned request into its folder (then `then()`, the folder still held); returns the failures."
    r = planned.request
    return run_study(STUDIES[r.study], r.out, r.execution, list(planned.tasks), planned.options, then)

def execute(request, then=None) -> dict:
    "Plan `request` through its study and run it into its folder; returns the failures."
    return run_planned(plan_request(request), then)

def run_study(study, out, execution: Execution, tasks, options, then=None) -> dict:
    "Run `study`'s `tasks` into `out` by `execution`, the folder held and its manifest checked (then `then()`, still held); returns the failures."
    with results_lock(out):
        fails = run_task_groups([study_group(study, out, tasks, options)], jobs=execution.jobs, executor=execution.executor,
                                scheduler=execution.scheduler, desc=f"{study.title} notebooks")
        if then is not None: then()
        return fails

# %% [markdown]
# ## Crisp grid
#
# The same for study B: one task per (configuration, seed); SST-2 must be readable (or downloadable with `--download`)
# before anything starts.

# %%
#| export
CRISP = STUDIES["crisp"]

# %%
#| export
def crisp_tasks(req: CrispRequest):
    "Check every part of `req` and return (tasks, options): one papermill task per (configuration, seed), nothing written."
    req.execution.check()
    from sparse_attention_repro.crisp import CRISP_CONFIGS, CRISP_PROFILES, FinetuneConfig, sst2_path, crisp_normalizer
    from sparse_attention_repro.data import DataUnavailableError
    if req.profile not in CRISP_PROFILES: raise UsageError(f"unknown profile {req.profile!r}; choose one of {', '.join(CRISP_PROFILES)}")
    configs = list(req.configs) or list(CRISP_CONFIGS)
    for c in configs:
        try: crisp_normalizer(c)                                     # the paper's four, or any registered normalizer
        except ValueError as e: raise UsageError(str(e)) from None
    seeds = checked_seeds(req.seeds) if req.seeds else list(CRISP_PROFILES[req.profile]["seeds"])
    run = req.run_options()                                            # FinetuneConfig's options, checked by their own rules
    try: check_options(FinetuneConfig, run)
    except ValueError as e: raise UsageError(str(e)) from None
    options = dict(profile=req.profile, model=req.model, **run)
    for split in ("train", "validation", "test"):  # SST-2 present (or downloaded now), before any notebook starts
        try: sst2_path(split, download=req.execution.download)
        except DataUnavailableError as e: raise UsageError(str(e)) from None
    out, nb = Path(req.out).resolve(), experiments_dir() / CRISP.notebook
    threads, note = grid_threads(req.out, CRISP.name, req.execution.jobs)
    if note: print(note, file=sys.stderr)
    rows = lambda c, s: (CRISP.rows_dir(out) / c / f"seed{s}.csv").resolve()
    tasks = [NotebookTask(f"{c}/seed{s}", nb, out / "notebooks" / "crisp" / c / f"seed{s}.ipynb", [rows(c, s)],
                          dict(config=c, seed=s, profile=req.profile, model=req.model, threads=threads, rows_path=str(rows(c, s)),
                               download=req.execution.download, device=req.execution.device, options=run))
             for c in configs for s in seeds]
    return tasks, options

# %%
from sparse_attention_repro.data import resolve_data_root
if resolve_data_root() and (resolve_data_root() / "sst2" / "train.tsv").is_file():
    _C = lambda **k: crisp_tasks(CrispRequest(str(_out), **k))
    tasks, opts = _C(configs=("dense", "fixed_080"), seeds=(0, 1))
    test_eq([t.name for t in tasks], ["dense/seed0", "dense/seed1", "fixed_080/seed0", "fixed_080/seed1"])
    test_eq((opts["precision"], opts["train_n"], tasks[0].parameters["config"]), ("fp32", 0, "dense"))
    test_eq(_C(options=dict(train_n=1200))[0][0].parameters["options"]["train_n"], 1200)
    test_eq(_C(options=dict(lr=2e-5))[0][0].parameters["options"]["lr"], 2e-5)
    test_fail(lambda: _C(options=dict(lr=-1.0)), exc=UsageError, contains="--lr must be")
    test_fail(lambda: _C(configs=("sparse",)), exc=UsageError, contains="unknown Crisp config")
    test_eq([t.parameters["config"] for t in _C(configs=("entmax15",), seeds=(0,))[0]], ["entmax15"])
