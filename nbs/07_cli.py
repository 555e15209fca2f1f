# %% [markdown]
# # Command line
# > `sparse-repro grid | crisp | report | reproduce | site`: the grids as papermill executions, resumable, with one-line errors.

# %%
#| default_exp cli

# %% [markdown]
# The command line is a thin layer over the runner: it checks every argument *before* touching the results folder
# (a bad method, dataset, profile, seed or a folder of another profile gives one line on stderr and exit status 2),
# turns the request into one papermill task per (dataset, seed) — or per (config, seed) for Crisp — and lets the
# runner execute what is not done yet, in the results folder of the study (`study.STUDIES`: its results file, row keys,
# rows folder and manifest entry). Exit status 1 means some notebooks failed (each is summarised in one line
# and kept for inspection); rerunning the same command retries only those.

# %%
#| export
import argparse, os, sys
from dataclasses import asdict, dataclass
from pathlib import Path
from sparse_attention_repro.runner import NotebookTask, TaskGroup, run_task_groups, check_manifest, results_lock, experiments_dir
from sparse_attention_repro.study import STUDIES
from sparse_attention_repro.options import add_option_arguments, option_defaults, check_options, config_from_options

# %%
from fastcore.test import test_eq, test_fail
import tempfile, io, contextlib
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

def _split(values):
    "Accept both `--x a b` and `--x a,b`."
    return [v for item in values for v in str(item).split(",") if v]

def _seeds(values):
    try: seeds = [int(s) for s in _split(values)]
    except ValueError: raise UsageError(f"seeds must be integers, got {' '.join(map(str, values))}") from None
    if any(s < 0 for s in seeds): raise UsageError(f"seeds must be >= 0, got {min(seeds)}")
    return seeds


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

# %%
test_eq(_split(["a,b", "c"]), ["a", "b", "c"]); test_eq(_seeds(["0,2", 5]), [0, 2, 5])
test_fail(lambda: _seeds(["-1"]), exc=UsageError, contains=">= 0"); test_fail(lambda: _seeds(["x"]), exc=UsageError, contains="integers")

# %% [markdown]
# ## The parser
#
# Every command is a sub-command with its own options; an unknown option or a missing required one raises
# `UsageError` (reported as one line, status 2) instead of argparse's usage dump and exit. The commands that run notebooks
# share the options of `_executor_args`.

# %%
#| export
class _Parser(argparse.ArgumentParser):
    def error(self, message): raise UsageError(message)

def _executor_args(sp):
    "Options shared by the commands that run notebooks: parallelism, executor, data download, device."
    jobs = dict(type=int, default=min(4, usable_cores()), help="notebooks run in parallel (local) / LocalCluster workers (dask)")
    sp.add_argument("--jobs", **jobs)
    sp.add_argument("--executor", default="local", help="local (threads driving kernels) or dask (dask.distributed)")
    sp.add_argument("--scheduler", default=None, help="dask scheduler address (tcp://host:8786); none = a LocalCluster")
    sp.add_argument("--download", action="store_true", help="fetch missing datasets from their official online sources")
    sp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="auto = CUDA when available, else CPU")

# %%
#| export
FAST_HELP = ("the opt-in speed levers that pay on this machine: Philox dropout masks, bf16 autocast (where the CPU or GPU has "
             "bf16 units) and fused attention (one C kernel per head, where every method has it), each combination timed "
             "here on a few steps at first use (cached) and the fastest kept, the default path included; the choice and "
             "its timings go in the manifest, the levers in each row; results change run by run (see BENCHMARKS.md for what that did to the verdicts)")

def _grid_args(sub):
    "`grid`: the study A grid and its variants."
    g = sub.add_parser("grid", help="study A: every dataset x method x seed of a profile")
    g.add_argument("--profile", default="smoke", help="smoke | quick | paper")
    g.add_argument("--out", required=True, help="results folder (runs.csv, notebooks/, rows/)")
    g.add_argument("--datasets", nargs="+"); g.add_argument("--methods", nargs="+"); g.add_argument("--seeds", nargs="+")
    g.add_argument("--plain", action="store_true", help="train each method alone instead of in lock-step (same results, slower)")
    g.add_argument("--stack-seeds", type=int, default=1, help="train this many seeds (all methods) as one stacked model per task: the GPU path")
    from sparse_attention_repro.train import TrainConfig
    add_option_arguments(g, TrainConfig)                                       # the run options are TrainConfig's own fields
    g.add_argument("--fast", action="store_true", help=FAST_HELP)
    g.add_argument("--baseline", default=None, help="a committed results folder (e.g. outputs/paper): train only --methods on its seeds "
                                                    "and options, pair them with its runs and write versus_baseline.md")
    g.add_argument("--keep-state", action="store_true", help="keep each lock-step group's final training state beside its rows "
                                                           "(state-<group>.pt, not committed), so that a longer run can continue it")
    g.add_argument("--continue-from", default=None, help="a results folder of this grid with fewer --epochs, made with --keep-state: "
                                                        "each group continues from its final state there (the same result, bit for bit, "
                                                        "as a run made at once; a group without one starts afresh)")
    _executor_args(g)
    return g

def _crisp_args(sub):
    "`crisp`: the Crisp grid."
    c = sub.add_parser("crisp", help="study B: Crisp configurations x seeds")
    c.add_argument("--profile", default="smoke"); c.add_argument("--out", required=True)
    c.add_argument("--configs", nargs="+", help="dense fixed_080 adaptive_060 adaptive_080 (the paper's), or any registered normalizer, e.g. entmax15"); c.add_argument("--seeds", nargs="+"); c.add_argument("--model", default="")
    from sparse_attention_repro.crisp import FinetuneConfig
    add_option_arguments(c, FinetuneConfig)                                    # the run options are FinetuneConfig's own fields
    _executor_args(c)
    return c

# %%
#| export
def _report_args(sub):
    "`report`: statistics, figures and claims of a results folder."
    r = sub.add_parser("report", help="statistics, figures and the claims table of a results folder")
    r.add_argument("--results", required=True)
    r.add_argument("--readme", default=None, help="also rewrite the answer block of this README from the report's tables (in its source "
                   "notebook nbs/index.ipynb, when the README has one, and the README from it)")
    return r

def _index_args(sub):
    "`index`: the index of the committed results."
    i = sub.add_parser("index", help="write <outputs>/README.md: every catalogue experiment with runs there, its question and verdict line")
    i.add_argument("--outputs", default="outputs", help="the folder of results roots (paper/, literature/, speed/, …)")
    return i

def _leaderboard_args(sub):
    "`leaderboard`: every normalizer with committed runs, from the committed tables."
    b = sub.add_parser("leaderboard", help="write <outputs>/leaderboard.csv/.md/.png: every normalizer's gains over softmax, from the committed tables")
    b.add_argument("--outputs", default="outputs", help="the folder of results roots (paper/, literature/, …)")
    b.add_argument("--main", default="paper", help="the results root holding the baselines and the report's tables")
    b.add_argument("--readme", default=None, help="also rewrite the leaderboard block of this README (in its source notebook "
                   "nbs/index.ipynb, when the README has one, and the README from it)")
    return b

def _card_args(sub):
    "`card`: one normalizer's page."
    c = sub.add_parser("card", help="write <outputs>/cards/<name>.md: a normalizer's gains under both recipes, recipes, density, length curve and step cost")
    c.add_argument("names", nargs="+", help="normalizers (by name, module:name or entry point)")
    c.add_argument("--outputs", default="outputs", help="the outputs folder: the results read, and where cards/ is written")
    c.add_argument("--main", default="paper", help="the main results folder inside --outputs (its tuned grids are the baselines)")
    c.add_argument("--measure", action="store_true", help="measure the step cost again on this machine (default: read the committed "
                   "cards/step_costs.csv; measured only where it holds no row for the normalizer)")
    c.add_argument("--repeats", type=int, default=None, help="interleaved repeats of the cost measurement (default: normalizer_card's)")
    return c

def _readme_args(sub):
    "`readme`: the README from the home notebook."
    r = sub.add_parser("readme", help="write the README from its source, the home notebook nbs/index.ipynb")
    r.add_argument("--index", default="nbs/index.ipynb", help="the home notebook")
    r.add_argument("--out", default="README.md", help="the README to write")
    return r

def _site_args(sub):
    "`site`: the notebooks as HTML."
    s = sub.add_parser("site", help="render the library notebooks (and a report) to HTML")
    s.add_argument("--out", default="outputs/site"); s.add_argument("--report", default=None)
    s.add_argument("--no-execute", action="store_true", help="render the notebooks as stored (without outputs) instead of executing them")
    return s

def _reproduce_args(sub):
    "`reproduce`: grid, Crisp and report in one folder."
    a = sub.add_parser("reproduce", help="study A grid + Crisp grid + report in one folder")
    a.add_argument("--profile", default="quick"); a.add_argument("--out", default=None); a.add_argument("--model", default="")
    a.add_argument("--val-fraction", type=float, default=0.1, help="validation split for leakage-free ratio selection")
    a.add_argument("--stack-seeds", type=int, default=1, help="study A: seeds trained as one stacked model per task (the GPU path)")
    a.add_argument("--fast", action="store_true", help="study A: " + FAST_HELP)
    _executor_args(a)
    return a

# %%
#| export
def _named_grids_args(sub, command, text, names, stack_help, fast=False):
    "A command that runs named grids into `<out>/<folder>/<name>` on a main grid's seeds (`ablations`, `follow-ups`)."
    x = sub.add_parser(command, help=text)
    x.add_argument("--profile", default="paper"); x.add_argument("--out", required=True, help="the main results folder")
    x.add_argument("--only", nargs="+", help=f"{names} names (default: all, in order)"); x.add_argument("--seeds", nargs="+")
    x.add_argument("--stack-seeds", type=int, default=1, help=stack_help)
    if fast: x.add_argument("--fast", action="store_true", help=FAST_HELP)
    _executor_args(x)
    return x

def _ablations_args(sub):
    "`ablations`: the confound ablations, each a grid into `<out>/ablations/<name>`."
    return _named_grids_args(sub, "ablations", "the ablations of the paper's confounds, paired with a main grid's seeds", "ablation",
                             "seeds trained as one stacked model per task (the GPU path)", fast=True)

def _follow_ups_args(sub):
    "`follow-ups`: the named grids of `catalogue.FOLLOW_UPS` into `<out>/follow_ups/<name>`."
    return _named_grids_args(sub, "follow-ups", "the follow-up experiments of the catalogue (e.g. alpha_start), paired with a "
                             "main grid's seeds", "follow-up", "seeds trained as one stacked model per task")

def _tuned_args(sub):
    "`tuned`: the tuned-recipe protocol of `tuning.TUNED_SEARCH`, stage by stage, into `<out>/tuned/<dataset>_lr<rate>`."
    x = sub.add_parser("tuned", help="every arm at its own learning rate and length, chosen on validation (the tuned-recipe protocol)")
    x.add_argument("--out", required=True, help="the main results folder: the grids go to <out>/tuned/<dataset>_lr<rate>")
    x.add_argument("--stage", default="select", choices=["select", "complete", "power"],
                   help="select: every candidate learning rate on the selection seeds; complete: the other seeds at each arm's chosen "
                        "rate; power: more seeds for the headline comparisons, at their chosen recipes, until TOST at ±1 pt has 80%% power")
    x.add_argument("--datasets", nargs="+", help="datasets of the search (default: all of tuning.TUNED_SEARCH)")
    x.add_argument("--profile", default="paper")
    x.add_argument("--dry-run", action="store_true", help="print the grid commands the stage still needs and run nothing")
    x.add_argument("--methods", nargs="+", help="search these normalizers only (a new one: by name, module:name or entry point), "
                   "into --out; with --baseline, judged against the baselines' tuned grids at each arm's own recipe")
    x.add_argument("--baseline", default=None, help="a results folder whose tuned/ grids are the baselines (e.g. outputs/paper): "
                   "writes <out>/fair_verdict.md/.csv once the new method's grids exist")
    x.add_argument("--stack-seeds", type=int, default=1, help="train this many seeds of a grid (all its methods) as one stacked model "
                   "per notebook, learning curves included: the GPU path")
    x.add_argument("--halving", action="store_true", help="select by successive halving: every rate for a third of the length, the best two "
                   "continued to the end (two thirds of the select stage's cost; it chose the full stage's rate for every committed "
                   "baseline arm); a new folder's choice, recorded in <out>/tuned/search.json")
    _executor_args(x)

def _maps_args(sub):
    "`attention-maps`: one seed's methods trained, the CLS attention of a few test items saved for the report."
    a = sub.add_parser("attention-maps", help="train one seed's methods and save where the CLS token looks on a few test items")
    a.add_argument("--out", required=True, help="results folder: maps go to <out>/attention_maps/<dataset>.npz")
    a.add_argument("--datasets", nargs="+", help="image datasets or twenty_news (default: fashion_mnist cifar10)"); a.add_argument("--seed", type=int, default=0)
    a.add_argument("--examples", type=int, default=4, help="test items per dataset"); a.add_argument("--profile", default="paper")
    a.add_argument("--download", action="store_true", help="fetch missing datasets from their official online sources")
    a.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a.add_argument("--threads", type=int, default=1, help="torch CPU threads; results are bit-identical only at the thread count of the runs compared with (a grid job per core: 1)")
    return a

def _bench_args(sub):
    "`bench`: speed, side by side in one process."
    b = sub.add_parser("bench", help="speed benchmarks: ratios measured side by side in one process")
    b.add_argument("what", choices=["normalizers", "grid", "fast", "steps", "stack", "profile", "compare", "floor", "fair-cost", "long"],
                   help="normalizers (forward+backward), grid (training epochs), fast (time --fast's lever combinations here, "
                        "as its calibration does, and cache the choice), steps (one training step per attention path, "
                        "the paths alternating step by step), stack (seeds in lock-step vs one stacked model), "
                        "profile (a whole profile on the stacked path, beside one lock-step seed per dataset), "
                        "compare (two results folders), floor (a results folder against the machine's matmul rate) "
                        "or long (one causal attention layer at 256-4,096 tokens in query blocks against torch's SDPA, with peak memory)")
    b.add_argument("--results", nargs="+", help="compare: two results folders (e.g. default path vs --plain)")
    b.add_argument("--repeats", type=int, default=None, help="interleaved repeats (default 20 for normalizers, 1 for grid)")
    b.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 = as in one grid job per core)")
    b.add_argument("--datasets", nargs="+", help="grid: datasets (default fashion_mnist twenty_news)")
    b.add_argument("--epochs", type=int, default=1, help="grid: epochs per run")
    b.add_argument("--train-limit", type=int, default=0, help="grid: train examples (0 = the paper's)")
    b.add_argument("--jobs", type=int, default=2, help="grid: parallel jobs assumed by the projection")
    b.add_argument("--stack-seeds", type=int, nargs="+", default=[2], help="stack: stack sizes (seeds) to measure")
    b.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="stack, profile: where to train (auto = CUDA when available)")
    b.add_argument("--profile", default="paper", help="profile: the profile to run (its seeds, sizes and epochs)")
    b.add_argument("--out", default=None, help="profile: a folder for its runs.csv (stacked), lockstep_runs.csv (the anchor's seeds) and times.csv; "
                                               "long: a folder for long_attention.csv")
    return b

# %%
#| export
def _length_args(sub):
    "`length`: the length study's grid."
    l = sub.add_parser("length", help="the length study: train a causal decoder short, test it long; task x normalizer x positions x rate x seed")
    l.add_argument("--profile", default="smoke", help="smoke (tiny, for tests)")
    l.add_argument("--out", required=True, help="results folder (length_runs.csv, runs/, notebooks/, rows/)")
    l.add_argument("--tasks", nargs="+", help="registered tasks, package.module:name, or entry points (default: the profile's)")
    l.add_argument("--normalizers", nargs="+", help="registered normalizers (default: the profile's)")
    l.add_argument("--positions", nargs="+", help="nape | rope | none (default: the profile's)")
    l.add_argument("--rates", nargs="+", type=float, help="learning rates (default: the profile's)")
    l.add_argument("--seeds", nargs="+")
    l.add_argument("--test-lengths", nargs="+", type=int, help="input lengths to test every run at (default: the profile's)")
    from sparse_attention_repro.length_train import LengthRunConfig
    add_option_arguments(l, LengthRunConfig)                                   # the run options are LengthRunConfig's own fields
    l.add_argument("--stage", default=None, help="a stage of the fair protocol: select (rates x selection seeds, validation only), "
                                                 "complete (every seed at each arm's chosen recipe, tested), budgets (tested at fractions of the run); "
                                                 "none: the plain grid, each run tested at its last step")
    l.add_argument("--dry-run", action="store_true", help="print the runs the grid still needs and run nothing")
    l.add_argument("--tables", action="store_true", help="write the analysis of --out (recipes, accuracy against length, gains "
                                                       "over softmax, the figure) from its rows, and run nothing")
    _executor_args(l)
    return l

SUBCOMMANDS = {"grid": _grid_args, "crisp": _crisp_args, "length": _length_args, "report": _report_args, "readme": _readme_args, "index": _index_args, "leaderboard": _leaderboard_args, "card": _card_args, "site": _site_args,
               "reproduce": _reproduce_args,
               "ablations": _ablations_args, "follow-ups": _follow_ups_args, "tuned": _tuned_args,
               "attention-maps": _maps_args, "bench": _bench_args}

def build_parser(command=None):
    "The `sparse-repro` argument parser: one sub-command per task (only `command`'s, when it names one: its options may import the library)."
    p = _Parser(prog="sparse-repro", description="Reproduce Canay (2026) and Crisp Attention with papermill-executed notebooks.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in [SUBCOMMANDS[command]] if command in SUBCOMMANDS else dict.fromkeys(SUBCOMMANDS.values()): add(sub)
    return p

# %%
a = build_parser().parse_args(["grid", "--out", "x", "--datasets", "kmnist", "--seeds", "0,1", "--mask-padding"])
test_eq((a.command, a.profile, a.datasets, a.seeds, a.mask_padding, a.device, a.jobs >= 1), ("grid", "smoke", ["kmnist"], ["0,1"], True, "auto", True))
test_eq(build_parser().parse_args(["crisp", "--out", "x", "--precision", "bf16"]).precision, "bf16")
test_eq(build_parser().parse_args(["reproduce"]).val_fraction, 0.1)
test_fail(lambda: build_parser().parse_args(["grid"]), exc=UsageError, contains="--out")
test_fail(lambda: build_parser().parse_args(["grid", "--out", "x", "--device", "tpu"]), exc=UsageError, contains="invalid choice")
test_eq(build_parser("report").parse_args(["report", "--results", "r"]).results, "r")      # only the command asked for is built
test_fail(lambda: build_parser("report").parse_args(["grid", "--out", "x"]), exc=UsageError, contains="invalid choice")   # only `report` built
test_fail(lambda: build_parser("follow-ups").parse_args(["tuned", "--out", "x"]), exc=UsageError, contains="invalid choice")
_all = build_parser("nonsense")                                                  # no command named: every command is there
test_eq([_all.parse_args(a).command for a in (["grid", "--out", "x"], ["tuned", "--out", "x"], ["bench", "floor"])], ["grid", "tuned", "bench"])

# %% [markdown]
# ## Study A grid
#
# `grid_tasks` checks every argument — profile, datasets, methods, seeds, device, and that each dataset can be read —
# and returns one papermill task per (dataset, seed) with the options that define the results folder. Nothing is
# written yet, so a bad argument leaves no trace.

# %%
#| export
STUDY_A = STUDIES["study_a"]
def _check_executor(args):
    if args.executor not in ("local", "dask"): raise UsageError(f"unknown executor {args.executor!r}; choose local or dask")
    if args.scheduler and args.executor != "dask": raise UsageError("--scheduler needs --executor dask")
    if args.jobs < 1: raise UsageError(f"--jobs must be >= 1, got {args.jobs}")

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
def _fast_calibration(args, specs, datasets, stacked, run, threads) -> dict:
    """--fast's levers: the results folder's own calibration when it has one (every run of a folder takes one path),
    else the baseline's (a comparison pairs runs of one path), else `bench.calibrate_fast` on this machine (cached)."""
    import json
    from sparse_attention_repro.data import has_bf16_units, resolve_device
    from sparse_attention_repro.bench import calibrate_fast
    from sparse_attention_repro.normalizers import fused_refusal
    for folder in [args.out] + ([args.baseline] if getattr(args, "baseline", None) else []):
        made = Path(folder) / "manifest.json"
        if made.is_file() and (cal := json.loads(made.read_text()).get(STUDY_A.name, {}).get("fast_calibration")): return cal
    device = resolve_device(args.device)
    print(f"--fast: timing its levers on this machine ({', '.join(datasets)}; once per CPU, build and grid) …", flush=True)
    cal = calibrate_fast(datasets, [s.name for s in specs], args.profile, run, threads, device,
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

def execution_plan(args, specs, datasets) -> ExecutionPlan:
    "The grid's `ExecutionPlan`: every path option checked (and --fast resolved into measured levers) before anything runs."
    from sparse_attention_repro.train import TrainConfig
    from sparse_attention_repro.normalizers import fused_refusal
    from sparse_attention_repro.data import resolve_device
    from sparse_attention_repro.model import FUSED_PATHS
    try: device = resolve_device(args.device)
    except ValueError as e: raise UsageError(str(e)) from None
    run = {k: getattr(args, k) for k in option_defaults(TrainConfig)}    # TrainConfig's options, checked by their own rules
    try: check_options(TrainConfig, run)
    except ValueError as e: raise UsageError(str(e)) from None
    if args.stack_seeds < 1: raise UsageError(f"--stack-seeds must be >= 1, got {args.stack_seeds}")
    if args.stack_seeds > 1 and args.plain: raise UsageError("--plain and --stack-seeds exclude each other: a stack trains every method together")
    stacked = args.stack_seeds > 1
    fast = getattr(args, "fast", False)
    if fast and (run["dropout_rng"], run["precision"], run["attention"]) != ("torch", "fp32", "torch"):
        raise UsageError("--fast sets --dropout-rng, --precision and --attention itself; drop them")
    threads, note = grid_threads(args.out, STUDY_A.name, args.jobs, getattr(args, "continue_from", None))
    calibration = None
    if fast:                                                            # resolved here into the levers measured to pay here
        calibration = _fast_calibration(args, specs, datasets, stacked, run, threads)
        run.update(calibration["levers"])
    elif run["attention"] in FUSED_PATHS and (why := fused_refusal(specs, device, stacked)):
        raise UsageError(f"--attention {run['attention']}: {why}; use --attention torch")
    return ExecutionPlan(args.device, "stacked" if stacked else "plain" if args.plain else "lockstep", args.stack_seeds, run, calibration,
                         threads, note)

def grid_tasks(args):
    "Validate the grid arguments and return (tasks, options)."
    _check_executor(args)
    from sparse_attention_repro.train import PROFILES, PAPER_SIZES, run_rows_path
    from sparse_attention_repro.normalizers import resolve_normalizer
    from sparse_attention_repro.study import PAPER_METHODS, BASELINE
    from sparse_attention_repro.data import load_dataset, DataOptions, DataUnavailableError
    if args.profile not in PROFILES: raise UsageError(f"unknown profile {args.profile!r}; choose one of {', '.join(PROFILES)}")
    base = _baseline_runs(args.baseline) if getattr(args, "baseline", None) else None
    datasets = _split(args.datasets) if args.datasets else list(PAPER_SIZES) if base is None else [d for d in PAPER_SIZES if d in set(base.dataset)]
    for d in datasets:
        _check_dataset(d)
    refs = _split(args.methods) if args.methods else list(PAPER_METHODS)
    try: specs = [resolve_normalizer(m) for m in refs]                  # the edge: each method resolved (and checked) once
    except ValueError as e: raise UsageError(str(e)) from None
    methods = [s.name for s in specs]
    if len(set(methods)) < len(methods): raise UsageError(f"--methods names a method twice: {' '.join(refs)}")
    ref_of = dict(zip(methods, refs))                                   # what a notebook resolves: the name, or package.module:name
    seeds = _seeds(args.seeds) if args.seeds else list(PROFILES[args.profile]["seeds"]) if base is None else sorted(set(base.seed.astype(int)))
    for d in datasets:                           # data present and readable? (also warms the decode cache once)
        try: load_dataset(d, 0, 1, 1, DataOptions(patch_size=args.patch_size or None, marker_vocab=args.marker_vocab,
                                                  marker_design=args.marker_design), download=args.download)
        except DataUnavailableError as e: raise UsageError(str(e).splitlines()[0]) from None
        except ValueError as e: raise UsageError(str(e)) from None
    plan = execution_plan(args, specs, datasets)                        # after the data: --fast measures on it
    run, calibration = plan.run, plan.calibration
    options = dict(profile=args.profile, **run, **({"fast_calibration": calibration} if calibration else {}))
    if base is not None: _check_baseline(args.baseline, base, options, datasets, seeds)
    if getattr(args, "continue_from", None): _check_shorter_run(args.continue_from, options)
    out, nb = Path(args.out).resolve(), experiments_dir() / STUDY_A.notebook
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
                                           lockstep=plan.container != "plain", stack=len(group) > 1, download=args.download,
                                           device=plan.device, profile=args.profile, options=run,
                                           keep_state=bool(getattr(args, "keep_state", False)),
                                           continue_from=str((STUDY_A.rows_dir(Path(args.continue_from)) / d).resolve()) if getattr(args, "continue_from", None) else "")))
    return tasks, options

# %%
_plan = lambda *a: execution_plan(build_parser().parse_args(["grid", "--out", "x", "--device", "cpu", *a]), [], ["synthetic_marker"])
test_eq([(p.container, p.stack_seeds) for p in (_plan(), _plan("--plain"), _plan("--stack-seeds", "3"))],
        [("lockstep", 1), ("plain", 1), ("stacked", 3)])
test_eq((_plan("--precision", "bf16").run["precision"], _plan().calibration), ("bf16", None))
test_fail(lambda: _plan("--plain", "--stack-seeds", "2"), exc=UsageError, contains="exclude each other")

# %%
_out = Path(tempfile.mkdtemp()) / "res"
tasks, opts = grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "3", "--methods", "softmax,entmax15"]))
test_eq([t.name for t in tasks], ["synthetic_marker/seed3"])
test_eq({k: tasks[0].parameters[k] for k in ("dataset", "seeds", "methods", "profile", "device", "stack")},
        dict(dataset="synthetic_marker", seeds=[3], methods=["softmax", "entmax15"], profile="smoke", device="auto", stack=False))
test_eq([Path(p).name for p in tasks[0].produces], ["softmax.csv", "entmax15.csv"])
test_eq(opts["profile"], "smoke"); assert not _out.exists()                    # validated, nothing written
# a later grid into a seed another grid already ran (other methods, e.g. the power stage's second arm) keeps the earlier record;
# a plain re-run whose rows are gone writes over its own
(_out / "notebooks" / "synthetic_marker").mkdir(parents=True); (_out / "notebooks" / "synthetic_marker" / "seed3.ipynb").write_text("{}")
_rec = lambda *m: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "3", "--methods", *m]))[0][0].output.name
test_eq(_rec("softmax"), "seed3.ipynb")
(_rd := _out / "rows" / "study_a" / "synthetic_marker" / "seed3").mkdir(parents=True); (_rd / "softmax.csv").write_text("x")
test_eq((_rec("softmax"), _rec("entmax15"), _rec("softmax,entmax15")), ("seed3.ipynb", "seed3_resume1.ipynb", "seed3_resume1.ipynb"))
import shutil; shutil.rmtree(_out)
_ph = grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "3", "--dropout-rng", "philox"]))
test_eq((_ph[1]["dropout_rng"], _ph[0][0].parameters["options"]["dropout_rng"], opts["dropout_rng"]), ("philox", "philox", "torch"))
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--dropout-rng", "mt"])), exc=UsageError, contains="unknown --dropout-rng")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--precision", "fp16"])), exc=UsageError, contains="unknown --precision 'fp16'; choose one of fp32, bf16")
_st = grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "0", "1", "2", "3", "4", "--stack-seeds", "2"]))[0]
test_eq([(t.name, t.parameters["seeds"], t.parameters["stack"], len(t.produces)) for t in _st],
        [("synthetic_marker/seeds0-1", [0, 1], True, 14), ("synthetic_marker/seeds2-3", [2, 3], True, 14), ("synthetic_marker/seed4", [4], False, 7)])
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--stack-seeds", "0"])), exc=UsageError, contains="--stack-seeds must be")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--stack-seeds", "2", "--plain"])), exc=UsageError, contains="exclude each other")
_lr = grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "3", "--lr", "3e-3", "--epochs", "12", "--epoch-eval"]))
test_eq([_lr[0][0].parameters["options"][k] for k in ("lr", "epochs", "epoch_eval")], [3e-3, 12, True])
test_eq([opts[k] for k in ("lr", "epochs", "epoch_eval")], [0.0, 0, False])          # 0: the protocol's values
# a longer run continuing a shorter one: only --epochs may differ, and it must grow
import json
_short = Path(tempfile.mkdtemp()) / "short"; _short.mkdir()
(_short / "manifest.json").write_text(json.dumps({"study_a": dict(_lr[1], epochs=6)}))
_cont = grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "3", "--lr", "3e-3", "--epochs", "12",
                                              "--epoch-eval", "--continue-from", str(_short), "--keep-state"]))
test_eq((_cont[0][0].parameters["continue_from"], _cont[0][0].parameters["keep_state"]), (str((_short / "rows" / "study_a" / "synthetic_marker").resolve()), True))
test_eq((_lr[0][0].parameters["continue_from"], _lr[0][0].parameters["keep_state"]), ("", False))
for more, msg in [(["--lr", "1e-3", "--epochs", "12"], "was made with lr=0.003 (this grid: 0.001); only --epochs may differ"),
                  (["--lr", "3e-3", "--epochs", "6"], "ran --epochs 6; give this grid more")]:
    test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--seeds", "3", "--epoch-eval",
                                                             "--continue-from", str(_short), *more])), exc=UsageError, contains=msg)
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--datasets", "synthetic_marker", "--continue-from", str(_out)])),
          exc=UsageError, contains="holds no study A grid")
# `--fast` takes the levers its calibration chose. A folder that already holds a calibration keeps it (every run of a
# folder takes one path); here one written by hand, Philox and fused attention, is applied to the tasks and recorded:
import json
_fo = Path(tempfile.mkdtemp()); _cal = dict(levers=dict(dropout_rng="philox", precision="fp32", attention="fused"), label="philox+fused",
                                            ms_per_step={"synthetic_marker": {"default": 9.0, "philox+fused": 7.0}})
(_fo / "manifest.json").write_text(json.dumps({"study_a": {"fast_calibration": _cal}}))
_fast = grid_tasks(build_parser().parse_args(["grid", "--out", str(_fo), "--datasets", "synthetic_marker", "--seeds", "3", "--fast", "--device", "cpu"]))
test_eq([_fast[1][k] for k in ("dropout_rng", "precision", "attention")], ["philox", "fp32", "fused"])
test_eq(_fast[1]["fast_calibration"], _cal)
test_eq(_fast[0][0].parameters["options"]["dropout_rng"], "philox")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--fast", "--precision", "bf16"])), exc=UsageError, contains="--fast sets")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--methods", "softmax,entmax15_bisect", "--attention", "fused",
                                                         "--device", "cpu"])), exc=UsageError, contains="entmax15_bisect has no fused kernel")
for bad, msg in [(["--lr", "-1"], "--lr must be"), (["--lr", "2"], "--lr must be"), (["--epochs", "-3"], "--epochs must be")]:
    test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), *bad])), exc=UsageError, contains=msg)

# %% [markdown]
# A baseline folder sets the seeds and datasets, adds the softmax re-run of the first seed, and refuses other options or
# seeds it does not have:

# %%
import json, shutil
_base = Path(tempfile.mkdtemp()) / "base"; _base.mkdir()
shutil.copy(Path(sparse_attention_repro.__file__).parent.parent / "tests" / "fixtures" / "runs.csv", _base / "runs.csv")
(_base / "manifest.json").write_text(json.dumps({"study_a": dict(profile="smoke", val_fraction=0.0, mask_padding=False, patch_size=0, marker_vocab=20000)}))  # an older manifest
_vs, _vo = grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--methods", "sparsemax", "--baseline", str(_base), "--datasets", "synthetic_marker"]))
test_eq([(t.name, t.parameters["methods"]) for t in _vs],
        [("synthetic_marker/seed0", ["sparsemax", "softmax"]), ("synthetic_marker/seed1", ["sparsemax"]), ("synthetic_marker/seed2", ["sparsemax"])])
test_eq(Path(_vs[0].produces[-1]).name, "softmax.csv")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--methods", "sparsemax", "--baseline", str(_base), "--lr", "3e-3"])),
          exc=UsageError, contains="was made with lr=0.0 (this grid: 0.003)")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--methods", "sparsemax", "--baseline", str(_base), "--seeds", "7"])),
          exc=UsageError, contains="has no runs for cifar10 seed 7")   # the first dataset in registry order
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--baseline", str(_out)])), exc=UsageError, contains="holds no runs.csv")
test_fail(lambda: grid_tasks(build_parser().parse_args(["grid", "--out", str(_out), "--methods", "softmax", "sparsemax", "softmax"])), exc=UsageError, contains="twice")

# %% [markdown]
# `cmd_grid` holds the results folder (one writer at a time), checks it was made with the same options and runs
# what is not done yet.

# %%
#| export
def study_group(study, out, tasks, options, name="") -> TaskGroup:
    "`out`'s manifest checked against `options` (over `study`'s own defaults), and `tasks` as one group of `study`'s rows in `out`."
    check_manifest(out, study.name, options, defaults=option_defaults(study.config_class()))
    if tasks: record_threads(out, study.name, tasks[0].parameters["threads"])   # the folder's count from now on
    return TaskGroup(list(tasks), study.results_path(out), study.keys, study.rows_dir(out), Path(out), name=name)

def run_study(study, args, tasks, options, then=None) -> dict:
    "Run `study`'s `tasks` into `args.out`, the folder held and its manifest checked (then `then()`, still held); returns the failures."
    with results_lock(args.out):
        fails = run_task_groups([study_group(study, args.out, tasks, options)], jobs=args.jobs, executor=args.executor,
                                scheduler=args.scheduler, desc=f"{study.title} notebooks")
        if then is not None: then()
        return fails

def cmd_grid(args):
    "Run the study A grid (and, with --baseline, write the comparison with the committed runs); returns the failures."
    tasks, options = grid_tasks(args)
    def versus():
        if getattr(args, "baseline", None) and STUDY_A.results_path(args.out).exists():
            from sparse_attention_repro.report import versus_report
            print(f"versus baseline: {versus_report(args.out, args.baseline)}")
    return run_study(STUDY_A, args, tasks, options, then=versus)

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
def crisp_tasks(args):
    "Validate the Crisp arguments and return (tasks, options)."
    _check_executor(args)
    from sparse_attention_repro.crisp import CRISP_CONFIGS, CRISP_PROFILES, FinetuneConfig, sst2_path, crisp_normalizer
    from sparse_attention_repro.data import DataUnavailableError
    if args.profile not in CRISP_PROFILES: raise UsageError(f"unknown profile {args.profile!r}; choose one of {', '.join(CRISP_PROFILES)}")
    configs = _split(args.configs) if args.configs else list(CRISP_CONFIGS)
    for c in configs:
        try: crisp_normalizer(c)                                     # the paper's four, or any registered normalizer
        except ValueError as e: raise UsageError(str(e)) from None
    seeds = _seeds(args.seeds) if args.seeds else list(CRISP_PROFILES[args.profile]["seeds"])
    run = {k: getattr(args, k) for k in option_defaults(FinetuneConfig)}   # FinetuneConfig's options, checked by their own rules
    try: check_options(FinetuneConfig, run)
    except ValueError as e: raise UsageError(str(e)) from None
    options = dict(profile=args.profile, model=args.model or "", **run)
    for split in ("train", "validation", "test"):  # SST-2 present (or downloaded now), before any notebook starts
        try: sst2_path(split, download=args.download)
        except DataUnavailableError as e: raise UsageError(str(e)) from None
    out, nb = Path(args.out).resolve(), experiments_dir() / CRISP.notebook
    threads, note = grid_threads(args.out, CRISP.name, args.jobs)
    if note: print(note, file=sys.stderr)
    rows = lambda c, s: (CRISP.rows_dir(out) / c / f"seed{s}.csv").resolve()
    tasks = [NotebookTask(f"{c}/seed{s}", nb, out / "notebooks" / "crisp" / c / f"seed{s}.ipynb", [rows(c, s)],
                          dict(config=c, seed=s, profile=args.profile, model=args.model or "", threads=threads, rows_path=str(rows(c, s)),
                               download=args.download, device=args.device, options=run))
             for c in configs for s in seeds]
    return tasks, options

# %%
from sparse_attention_repro.data import resolve_data_root
if resolve_data_root() and (resolve_data_root() / "sst2" / "train.tsv").is_file():
    tasks, opts = crisp_tasks(build_parser().parse_args(["crisp", "--out", str(_out), "--configs", "dense,fixed_080", "--seeds", "0,1"]))
    test_eq([t.name for t in tasks], ["dense/seed0", "dense/seed1", "fixed_080/seed0", "fixed_080/seed1"])
    test_eq((opts["precision"], opts["train_n"], tasks[0].parameters["config"]), ("fp32", 0, "dense"))
    test_eq(crisp_tasks(build_parser().parse_args(["crisp", "--out", str(_out), "--train-n", "1200"]))[0][0].parameters["options"]["train_n"], 1200)
    test_eq(crisp_tasks(build_parser().parse_args(["crisp", "--out", str(_out), "--lr", "2e-5"]))[0][0].parameters["options"]["lr"], 2e-5)
    test_fail(lambda: crisp_tasks(build_parser().parse_args(["crisp", "--out", str(_out), "--lr", "-1"])), exc=UsageError, contains="--lr must be")
    test_fail(lambda: crisp_tasks(build_parser().parse_args(["crisp", "--out", str(_out), "--configs", "sparse"])), exc=UsageError, contains="unknown Crisp config")
    test_eq([t.parameters["config"] for t in crisp_tasks(build_parser().parse_args(["crisp", "--out", str(_out), "--configs", "entmax15", "--seeds", "0"]))[0]], ["entmax15"])

# %%
#| export
def cmd_crisp(args):
    "Run the Crisp grid; returns the failures."
    return run_study(CRISP, args, *crisp_tasks(args))

# %% [markdown]
# ## Report, site, and the whole study
#
# `report` runs the report notebook on a results folder, `site` renders the notebooks, `reproduce` validates both grids
# before running either, then runs them and the report into one folder.

# %%
#| export
def cmd_report(args):
    from sparse_attention_repro.report import make_report
    if not Path(args.results).is_dir(): raise UsageError(f"results folder {args.results} does not exist; run `sparse-repro grid --out {args.results}` first")
    from sparse_attention_repro.stats import check_results_file, RESULT_COLUMNS
    for name in RESULT_COLUMNS:                                       # a malformed file: one line, before the notebook runs
        if (Path(args.results) / name).exists():
            try: check_results_file(Path(args.results) / name)
            except ValueError as e: raise UsageError(str(e)) from None
    readme = getattr(args, "readme", None)                             # `reproduce` reports without touching a README
    if readme and not Path(readme).is_file(): raise UsageError(f"--readme {readme} is not a file; give the README to update")
    print(f"report: {make_report(args.results)}")
    if readme:
        from sparse_attention_repro.tuning import sync_readme
        from sparse_attention_repro.report import write_readme
        source = Path(readme).parent / "nbs" / "index.ipynb"            # the README's source, where it has one
        if not source.is_file(): print(f"readme: {readme} {'updated' if sync_readme(readme, args.results) else 'already current'}")
        else:                                                           # built from its source, blocks from the committed tables
            print(f"readme: {readme} {'updated' if write_readme(source, readme) else 'already current'} from {source} and outputs/")
    return {}

def cmd_index(args):
    "Write the index of the committed results from the catalogue."
    from sparse_attention_repro.catalogue import outputs_index
    from sparse_attention_repro.files import atomic_write
    if not Path(args.outputs).is_dir(): raise UsageError(f"--outputs {args.outputs} is not a folder; give the folder of results roots")
    text, path = outputs_index(args.outputs), Path(args.outputs) / "README.md"
    same = path.exists() and path.read_text(encoding="utf-8") == text
    if not same: atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    print(f"index: {path} {'already current' if same else 'written'}")
    return {}

def cmd_leaderboard(args):
    "Write the leaderboard files from the committed tables."
    from sparse_attention_repro.leaderboard import write_leaderboard, LEADERBOARD_MARKERS
    if not (Path(args.outputs) / args.main / "tables").is_dir():
        raise UsageError(f"{Path(args.outputs) / args.main / 'tables'} does not exist; run `sparse-repro report --results {Path(args.outputs) / args.main}` first")
    readme = args.readme
    if readme and not Path(readme).is_file(): raise UsageError(f"--readme {readme} is not a file; give the README to update")
    source = Path(readme).parent / "nbs" / "index.ipynb" if readme else None      # the README's source, where it has one
    built = source is not None and source.is_file()                   # a README built from its source: never written into
    if built and LEADERBOARD_MARKERS[0] not in source.read_text(encoding="utf-8"):
        raise UsageError(f"{source} has no leaderboard block; add the lines {' and '.join(LEADERBOARD_MARKERS)} to one markdown cell")
    try: out = write_leaderboard(args.outputs, args.main, readme=None if built else readme)   # checks a plain README's block first
    except ValueError as e: raise UsageError(str(e)) from None
    print(f"leaderboard: {out['normalizers']} normalizers, {out['rows']} rows -> {out['md']}, {out['csv']}, {out['png']}")
    if built:
        from sparse_attention_repro.report import write_readme
        print(f"readme: {readme} {'updated' if write_readme(source, readme) else 'already current'} from {source} and outputs/")
    elif readme: print(f"readme: {readme} leaderboard block written")
    return {}

def cmd_card(args):
    "Write each named normalizer's card."
    from sparse_attention_repro.leaderboard import normalizer_card
    from sparse_attention_repro.normalizers import resolve_normalizer
    for n in _split(args.names):
        try: resolve_normalizer(n)
        except (KeyError, ValueError, ImportError) as e: raise UsageError(str(e).splitlines()[0]) from None
    if args.repeats is not None and args.repeats < 1: raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    repeats = {} if args.repeats is None else {"cost_repeats": args.repeats}
    for n in _split(args.names): print(f"card: {normalizer_card(args.outputs, n, args.main, measure=args.measure, **repeats)}")   # as given: the card's command reruns
    return {}

def cmd_readme(args):
    "Write the README from the home notebook."
    from sparse_attention_repro.report import write_readme
    if not Path(args.index).is_file(): raise UsageError(f"--index {args.index} is not a notebook; give the home notebook (nbs/index.ipynb)")
    print(f"readme: {args.out} {'written' if write_readme(args.index, args.out) else 'already current'} from {args.index}")
    return {}

def cmd_site(args):
    from sparse_attention_repro.report import render_site
    print(f"site: {render_site(args.out, report=args.report, execute=not args.no_execute)}")
    return {}

# %%
#| export
def cmd_reproduce(args):
    "Study A grid, Crisp grid and the report into one folder."
    from sparse_attention_repro.train import TrainConfig
    from sparse_attention_repro.crisp import FinetuneConfig
    args.out = args.out or f"outputs/{args.profile}"
    run = dict(profile=args.profile, out=args.out, seeds=None, jobs=args.jobs, executor=args.executor, scheduler=args.scheduler,
               download=args.download, device=args.device)
    grid = argparse.Namespace(**run, **{**option_defaults(TrainConfig), "val_fraction": args.val_fraction}, datasets=None, methods=None,
                              plain=False, stack_seeds=args.stack_seeds, baseline=None, fast=args.fast)
    crisp = argparse.Namespace(**run, configs=None, model=args.model, **option_defaults(FinetuneConfig))
    grid_tasks(grid); crisp_tasks(crisp)                    # validate everything before running anything
    fails = {**cmd_grid(grid), **cmd_crisp(crisp)}
    cmd_report(argparse.Namespace(results=args.out))
    return fails

# %% [markdown]
# ## Ablations
#
# `ablations` runs each ablation of the catalogue (`catalogue.ABLATIONS`) — masked padding, the original's gradient, 4×4 patches, a learnable
# marker task, a learned padding embedding — as a grid with its options into `<out>/ablations/<name>`, on the profile's
# seeds (the main runs' seeds), one after the other; every grid resumes like any other, and the report of `<out>` picks
# them up. All are validated before the first one starts.

# %%
#| export
def ablation_grids(args, table=None, kind="ablation"):
    "The grid arguments of every requested catalogue entry of `table` (default `catalogue.ABLATIONS`), validated, in order."
    from sparse_attention_repro.catalogue import ABLATIONS
    table = ABLATIONS if table is None else table
    names = _split(args.only) if args.only else list(table)
    for n in names:
        if n not in table: raise UsageError(f"unknown {kind} {n!r}; choose from {', '.join(table)}")
    grids = []
    for n in names:
        argv = ["grid", "--profile", args.profile, "--out", str(Path(args.out) / table[n].folder), *table[n].grid_args(),
                "--jobs", str(args.jobs), "--executor", args.executor, "--device", args.device]
        argv += (["--seeds", *args.seeds] if args.seeds else []) + (["--scheduler", args.scheduler] if args.scheduler else [])
        argv += (["--download"] if args.download else []) + ["--stack-seeds", str(args.stack_seeds)] + (["--fast"] if getattr(args, "fast", False) else [])
        g = build_parser().parse_args(argv)
        grid_tasks(g)
        grids.append((n, g))
    return grids

def _run_named_grids(args, table=None, kind="ablation"):
    "Run the requested named grids of `table` one after the other; returns the failures."
    fails = {}
    for name, g in ablation_grids(args, table, kind):
        print(f"{kind} {name}: {g.out}")
        fails.update({f"{name}:{k}": v for k, v in cmd_grid(g).items()})
    return fails

def cmd_ablations(args):
    "Run the requested ablation grids (`catalogue.ABLATIONS`) one after the other; returns the failures."
    return _run_named_grids(args)

def cmd_follow_ups(args):
    "Run the follow-up grids (`catalogue.FOLLOW_UPS`) one after the other; returns the failures."
    from sparse_attention_repro.catalogue import FOLLOW_UPS
    return _run_named_grids(args, FOLLOW_UPS, "follow-up")

# %% [markdown]
# `tuned` runs the tuned-recipe protocol (`05b_tuning`): it reads what has run under `<out>/tuned/`, asks `tuned_plan`
# for the grids the stage still needs, and runs each as a `grid` into its (dataset, learning rate) folder. The *select*
# stage repeats until its plan is empty, because a learning rate chosen on the edge of its axis adds the next rate of
# the ladder; *complete* then runs the other seeds at each arm's chosen rate. `--dry-run` prints the grid commands.

# %%
#| export
def tuned_grids(args):
    "The `grid` arguments of what the requested stage of the tuned-recipe protocol still needs, validated, with their command lines."
    from sparse_attention_repro import tuning as T
    datasets = _split(args.datasets) if args.datasets else list(T.TUNED_SEARCH)
    for d in datasets:
        if d not in T.TUNED_SEARCH: raise UsageError(f"dataset {d!r} has no declared recipe search; choose from {', '.join(T.TUNED_SEARCH)}")
    methods = _split(args.methods) if getattr(args, "methods", None) else None
    if methods:
        from sparse_attention_repro.normalizers import resolve_normalizer
        for m in methods:
            try: resolve_normalizer(m)
            except (KeyError, ValueError, ImportError) as e: raise UsageError(str(e).splitlines()[0]) from None
        if args.stage == "power": raise UsageError("--stage power adds seeds to the paper's headline comparisons; drop --methods")
    base = getattr(args, "baseline", None)
    if base and not list(Path(base, "tuned").glob("*/runs.csv")):
        raise UsageError(f"--baseline {base} holds no tuned grids ({Path(base) / 'tuned'}/*/runs.csv); run `sparse-repro tuned --out {base}` first")
    search = T.search_for(methods) if methods else None
    runs = T.tuned_runs(args.out)
    rule = tuned_rule(args, runs)
    curves, failed = T.tuned_curves(runs), T.diverged(runs)
    if args.stage == "power":
        rec = T.choose_recipes(curves, failed, rule=rule)
        plan = [p for p in T.power_plan(curves, rec, T.tuned_tests(curves, rec)) if p["dataset"] in datasets] if len(rec) else []
    else: plan = T.tuned_plan(curves, failed, search, stage=args.stage, datasets=datasets, rule=rule)
    grids = []
    for p in plan:
        argv = ["grid", "--profile", args.profile, "--out", str(Path(args.out) / "tuned" / p["folder"]), "--datasets", p["dataset"],
                "--methods", *p["methods"], "--seeds", *map(str, p["seeds"]), "--lr", f"{p['lr']:g}", "--epochs", str(p["epochs"]),
                "--epoch-eval", "--val-fraction", f"{T.TUNED_VAL_FRACTION:g}"]
        argv += ["--keep-state"] if p.get("keep_state") else []
        if p.get("continue_from") and (Path(args.out) / "tuned" / p["continue_from"] / "manifest.json").is_file():
            argv += ["--continue-from", str(Path(args.out) / "tuned" / p["continue_from"])]   # the shorter run's kept states
        run = ["--jobs", str(args.jobs), "--executor", args.executor, "--device", args.device, "--stack-seeds", str(args.stack_seeds)]
        run += (["--scheduler", args.scheduler] if args.scheduler else []) + (["--download"] if args.download else [])
        g = build_parser("grid").parse_args(argv + run)
        grid_tasks(g)
        grids.append((" ".join(["sparse-repro", *argv]), g))
    return grids

def tuned_rule(args, runs):
    "The selection rule of `args.out`'s tuned grids: the one recorded there, or `--halving` for a folder with no tuned run yet."
    from sparse_attention_repro import tuning as T
    stored = T.search_rule(args.out)
    if getattr(args, "halving", False) and stored is None and len(runs):
        raise UsageError(f"{Path(args.out) / 'tuned'} was searched with the full select stage; --halving starts a new search (give another --out)")
    return T.HALVING if getattr(args, "halving", False) or stored is not None else None

def tuned_groups(stack, grids) -> list:
    """One `TaskGroup` per grid of a tuned stage, each results folder held once (in `stack`, an `ExitStack`): the power
    stage sends several grids into one folder (other methods on other seeds), whose notebooks must then be distinct.
    `cmd_tuned` starts their notebooks seed by seed, so that a stopped stage leaves whole pairs of an arm and softmax,
    but for the pairs in flight."""
    groups, held = [], {}
    for _, g in grids:
        tasks, options = grid_tasks(g)
        if g.out not in held: stack.enter_context(results_lock(g.out)); held[g.out] = set()
        if clash := held[g.out] & {str(t.output) for t in tasks}:
            raise ValueError(f"two grids of one stage would write {sorted(clash)[0]} (a bug in the stage's plan: please report it)")
        held[g.out] |= {str(t.output) for t in tasks}
        groups.append(study_group(STUDY_A, g.out, tasks, options, name=Path(g.out).name))
    return groups

def cmd_tuned(args):
    "Run the requested stage of the tuned-recipe protocol until it needs nothing more (or a notebook fails); returns the failures."
    from contextlib import ExitStack
    _check_executor(args)
    fails = {}
    ran = None
    while grids := tuned_grids(args):                     # every argument checked before anything is written
        if getattr(args, "halving", False) and not args.dry_run and ran is None:
            from sparse_attention_repro import tuning as T
            T.record_search_rule(args.out, T.HALVING)       # the folder's rule, read back by every later command
        lines = [line for line, _ in grids]
        if lines == ran:                                    # its rows should have changed the plan: never loop on a settled grid
            raise ValueError(f"tuned ({args.stage}): the plan still asks for {lines[0]} after it ran; its runs.csv rows do not settle "
                             f"the selection (a bug: please report it with {Path(args.out) / 'tuned'})")
        for line in lines: print(f"tuned ({args.stage}): {line}")
        if args.dry_run: return {}
        with ExitStack() as stack:                          # every grid's folder held and checked, then one pool for all their notebooks
            groups = tuned_groups(stack, grids)
            fails = run_task_groups(groups, jobs=args.jobs, executor=args.executor, scheduler=args.scheduler,
                                    desc=f"tuned ({args.stage}) notebooks", order=lambda t: min(t.parameters["seeds"]))
        if fails or args.stage != "select": break
        ran = lines
    else: print(f"tuned ({args.stage}): nothing left to run in {Path(args.out) / 'tuned'}")
    if getattr(args, "baseline", None) and getattr(args, "methods", None) and not args.dry_run:
        from sparse_attention_repro.tuning import write_fair_verdict
        for m in _split(args.methods):
            try: print(f"tuned: the fair verdict of {m}: {write_fair_verdict(args.out, args.baseline, m)}")
            except ValueError as e: print(f"tuned: no verdict for {m} yet ({e})")
    return fails

# %%
_tg = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "fashion_mnist", "--jobs", "1"]))
test_eq([(g.lr, g.epochs, g.epoch_eval, g.val_fraction, g.seeds, len(g.methods), g.out) for _, g in _tg],
        [(lr, 36, True, 0.25, ["0", "1", "2"], 7, str(_out / "tuned" / f"fashion_mnist_lr{lr:g}")) for lr in (3e-4, 1e-3, 3e-3, 1e-2)])
assert _tg[1][0].startswith("sparse-repro grid --profile paper --out ") and "--lr 0.001 --epochs 36 --epoch-eval" in _tg[1][0]
test_eq(tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "kmnist", "--stage", "complete"])), [])
_tm = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "fashion_mnist", "--methods", "sparsemax"]))
test_eq([(g.methods, g.lr, g.seeds) for _, g in _tm], [(["sparsemax"], lr, ["0", "1", "2"]) for lr in (3e-4, 1e-3, 3e-3, 1e-2)])   # its own search
_ts = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "fashion_mnist", "--stack-seeds", "3"]))
test_eq([(g.stack_seeds, g.epoch_eval) for _, g in _ts], [(3, True)] * 4)                  # on a GPU: the selection seeds as one stack
test_eq([len(grid_tasks(g)[0]) for _, g in _ts], [1] * 4)                                  # one notebook per rate
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--methods", "sparsemaxx"])), exc=UsageError,
          contains="unknown normalizer 'sparsemaxx'")
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--methods", "sparsemax", "--baseline", str(_out)])),
          exc=UsageError, contains="holds no tuned grids")
test_eq(tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--stage", "power"])), [])   # nothing complete yet
import tempfile
from contextlib import ExitStack
from sparse_attention_repro.runner import FolderBusyError
with tempfile.TemporaryDirectory() as _td:                                    # the power stage: two grids into one folder
    _pg = lambda methods, seeds: ("", build_parser().parse_args(["grid", "--profile", "smoke", "--out", f"{_td}/tuned/kmnist_lr0.001",
                                  "--datasets", "kmnist", "--methods", *methods, "--seeds", *seeds, "--jobs", "1"]))
    with ExitStack() as _st:
        _gs = tuned_groups(_st, [_pg(["softmax", "sparsemax"], ["10"]), _pg(["softmax"], ["11", "12"])])
        test_eq([len(g.tasks) for g in _gs], [1, 2])                                # one folder, held once, notebooks by seed
        test_fail(lambda: tuned_groups(ExitStack(), [_pg(["softmax"], ["10"])]), exc=FolderBusyError, contains="in use by")
    with ExitStack() as _st:
        test_fail(lambda: tuned_groups(_st, [_pg(["softmax"], ["10"]), _pg(["sparsemax"], ["10"])]), exc=ValueError, contains="two grids")
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", "x", "--datasets", "synthetic_marker"])), exc=UsageError,
          contains="no declared recipe search")

# %%
_ab = ablation_grids(build_parser().parse_args(["ablations", "--profile", "smoke", "--out", str(_out), "--only", "learnable_marker,patch4", "--seeds", "0"]))
test_eq([n for n, _ in _ab], ["learnable_marker", "patch4"])
test_eq(ablation_grids(build_parser().parse_args(["ablations", "--profile", "smoke", "--out", str(_out), "--only", "patch4", "--fast"]))[0][1].fast, True)
test_eq((_ab[0][1].marker_vocab, _ab[0][1].datasets, _ab[1][1].patch_size, _ab[1][1].out), (12, ["synthetic_marker"], 4, str(_out / "ablations" / "patch4")))
test_fail(lambda: ablation_grids(build_parser().parse_args(["ablations", "--out", "x", "--only", "dropout"])), exc=UsageError, contains="unknown ablation")
from sparse_attention_repro.catalogue import FOLLOW_UPS
_fu = ablation_grids(build_parser().parse_args(["follow-ups", "--profile", "smoke", "--out", str(_out), "--seeds", "0"]), FOLLOW_UPS, "follow-up")
test_eq([(n, g.methods, g.out) for n, g in _fu],
        [("alpha_start", ["headwise_adaptive_entmax_start12", "headwise_adaptive_entmax_start18"], str(_out / "follow_ups" / "alpha_start")),
         ("selection_marker", None, str(_out / "follow_ups" / "selection_marker"))])          # None: every paper method
test_eq((_fu[1][1].marker_design, _fu[1][1].epochs, _fu[1][1].epoch_eval, _fu[1][1].val_fraction), ("label_once", 3, True, 0.25))
assert not _out.exists()

# %% [markdown]
# ## Benchmarks
#
# `bench` prints ratio tables measured side by side in one process (see `08_bench`): the normalizers, a training epoch of
# every method, or two results folders compared per method.

# %%
#| export
def cmd_attention_maps(args):
    "Train seed `--seed` of each dataset (all the paper's methods) and save the CLS attention maps; a finished dataset is skipped."
    from sparse_attention_repro.train import PROFILES, PAPER_SIZES, profile_config, attention_maps
    from sparse_attention_repro.study import PAPER_METHODS, BASELINE
    if args.profile not in PROFILES: raise UsageError(f"unknown profile {args.profile!r}; choose one of {', '.join(PROFILES)}")
    datasets = _split(args.datasets) if args.datasets else ["fashion_mnist", "cifar10"]
    real = [d for d in PAPER_SIZES if d != "synthetic_marker"]
    for d in datasets:
        if d not in real: raise UsageError(f"attention maps are drawn over image patches or 20 Newsgroups words: choose from {', '.join(real)}, not {d!r}")
    if args.seed < 0 or args.examples < 1: raise UsageError(f"--seed must be >= 0 and --examples >= 1, got {args.seed} and {args.examples}")
    if args.threads < 1: raise UsageError(f"--threads must be >= 1, got {args.threads}")
    import torch, pandas as pd
    torch.set_num_threads(args.threads)
    committed = Path(args.out) / "runs.csv"
    for d in datasets:
        out = Path(args.out) / "attention_maps" / f"{d}.npz"
        if out.exists(): print(f"attention maps {d}: {out} (already there)"); continue
        rec = attention_maps(d, args.seed, PAPER_METHODS, profile_config(args.profile, d, download=args.download, device=args.device),
                             examples=args.examples, out=out)
        same = ""
        if committed.exists():                             # the same training as the grid's: are the accuracies the committed ones?
            r = pd.read_csv(committed).query("dataset == @d and seed == @args.seed").set_index("method").accuracy
            hits = [m for m, a in zip(rec["methods"], rec["accuracy"]) if m in r.index and r[m] == a]
            same = f"; {len(hits)} of {len(rec['methods'])} test accuracies identical to {committed}"
        print(f"attention maps {d}: {out}{same}")
    return {}

def _bench_fair_cost(args, bench):
    "bench fair-cost: the core-hours of each arm of the tuned grids, and the cheaper searches checked against them."
    if len(args.results or []) != 1 or not Path(args.results[0], "tuned").is_dir():
        raise UsageError("bench fair-cost needs one results folder with tuned grids: --results DIR (e.g. outputs/paper)")
    from sparse_attention_repro import tuning as T
    cost_runs = bench.fair_cost_runs(args.results[0])                  # every executed notebook read once
    cost = bench.fair_cost(args.results[0], runs=cost_runs)
    print("core-hours per arm of the tuned-recipe protocol: the executed notebooks' wall times × the share of a core each "
          f"process had (recorded for {cost_runs.core_share.notna().sum()} of {len(cost_runs)} runs; the others count their whole wall time, an upper bound):")
    print(cost.round(3).to_string(index=False))
    per = cost.groupby("dataset").core_hours.median()
    print("median arm per dataset: " + ", ".join(f"{d} {h:.2f} h" for d, h in per.items()) + f"; sum {per.sum():.2f} core-hours")
    if T.search_rule(args.results[0]) is not None:
        print("\nthese grids were searched by halving: the cost above is that search as it ran (no full grid to replay cheaper searches on)")
        return
    runs = T.tuned_runs(args.results[0])
    curves, failed = T.tuned_curves(runs), T.diverged(runs)
    print("\ncheaper searches on these grids: the share of the selection stage each costs, and the arms whose rate it chooses "
          "as the full stage did (a rule qualifies only with every arm right)")
    print(T.cheaper_search_check(curves, failed).to_string(index=False))
    proj = T.projected_cost(cost_runs, curves, failed)
    per = proj.groupby("dataset")[["core_hours", "projected_core_hours"]].median()
    print("\none new normalizer's fair search, charged from these runs' measured times: as run, and with --halving and continued "
          "extensions (a projection from measured per-epoch costs, not a run); median arm per dataset, core-hours:")
    print(per.round(2).to_string())
    print(f"sum over datasets: {per.core_hours.sum():.2f} as run, {per.projected_core_hours.sum():.2f} projected")

def _bench_floor(args, bench):
    "bench floor: a results folder's training time per seed against the machine's matmul rate."
    import torch, pandas as pd
    if len(args.results or []) != 1 or not (Path(args.results[0]) / "runs.csv").exists():
        raise UsageError("bench floor needs one results folder with a runs.csv: --results DIR")
    rate = bench.matmul_rate(threads=args.threads)
    print(f"best fp32 matmul rate at the model's shapes, {args.threads} thread(s): {rate:.1f} GFLOP/s "
          f"(bf16: {bench.matmul_rate(threads=args.threads, dtype=torch.bfloat16):.1f})")
    print("training time per seed (all methods) against the arithmetic floor (FLOPs / that rate):")
    print(bench.floor_table(pd.read_csv(Path(args.results[0]) / "runs.csv"), rate).round(2).to_string(index=False))

def _bench_compare(args, bench):
    "bench compare: two results folders paired by (dataset, seed), and the study's conclusions on each."
    if len(args.results or []) != 2: raise UsageError("bench compare needs two results folders: --results A B")
    for d in args.results:
        if not (Path(d) / "runs.csv").exists(): raise UsageError(f"{d}/runs.csv does not exist; run `sparse-repro grid --out {d}` first")
    print(f"A = {args.results[0]}, B = {args.results[1]}: accuracy per method, paired by (dataset, seed)")
    print(bench.compare_runs(*(Path(d) / "runs.csv" for d in args.results)).round(4).to_string(index=False))
    print("\nthe study's conclusions on each path: gains over softmax (pt), Holm within each dataset, and their change A − B")
    print(bench.compare_gains(*(Path(d) / "runs.csv" for d in args.results)).to_string(index=False))

def _bench_normalizers(args, bench):
    "bench normalizers: forward+backward of every paper method against softmax's, in one process."
    df = bench.bench_normalizers(repeats=args.repeats)
    print("forward+backward time as a ratio to softmax's (kernels = this library's default on CPU float32)")
    print(bench.normalizer_table(df).to_string())
    print("softmax ms: " + ", ".join(f"{r.shape}: {r.ms:.2f}" for r in df.query("normalizer == 'softmax'").itertuples()))

def _bench_long(args, bench):
    "bench long: one causal attention layer at long T, each normalizer in query blocks against softmax through torch's SDPA."
    df = bench.bench_long_attention(repeats=args.repeats)
    if args.out:
        from sparse_attention_repro.runner import save_rows
        from sparse_attention_repro.leaderboard import cpu_name
        save_rows(df.assign(cpu=cpu_name(), threads=args.threads), Path(args.out) / "long_attention.csv")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))

def _bench_steps(args, bench):
    "bench steps: one training step per attention path (torch, fused, fused_block), the paths alternating step by step."
    from sparse_attention_repro.study import PAPER_METHODS
    from sparse_attention_repro.data import has_bf16_units
    paths = ("torch", "fused", "fused_block") if bench.fused_ok(PAPER_METHODS) else ("torch",)
    for ds in args.datasets or ["fashion_mnist", "twenty_news"]:
        for precision in ("fp32", "bf16") if has_bf16_units("cpu") else ("fp32",):
            df = bench.bench_steps(ds, paths=paths, steps=args.repeats, precision=precision)
            t = df.pivot_table(index="method", columns="path", values="ratio").reindex(columns=list(paths)).round(3)
            print(f"{ds}, {precision}: ms per step on the torch path, and each path's median per-step ratio to it (below 1: faster)")
            print(t.assign(torch_ms=df.query("path == 'torch'").set_index("method").ms_per_step.round(2)).to_string())

def _bench_datasets(args) -> list:
    "The datasets of a training benchmark (default Fashion-MNIST and 20 Newsgroups), checked, with --epochs."
    from sparse_attention_repro.train import PAPER_SIZES
    datasets = _split(args.datasets) if args.datasets else ["fashion_mnist", "twenty_news"]
    for d in datasets:
        _check_dataset(d)
    if args.epochs < 1: raise UsageError(f"--epochs must be >= 1, got {args.epochs}")
    return datasets

def _bench_fast(args, bench):
    "bench fast: --fast's lever combinations timed here, as its calibration does, and the choice cached."
    import time, pandas as pd
    from sparse_attention_repro.data import has_bf16_units
    from sparse_attention_repro.study import PAPER_METHODS
    t0 = time.perf_counter()
    cal = bench.calibrate_fast(_bench_datasets(args), list(PAPER_METHODS), threads=args.threads, bf16=has_bf16_units("cpu"),
                               fused=bench.fused_ok(PAPER_METHODS), remeasure=True, search="full")
    print(f"milliseconds per training step of the {len(PAPER_METHODS)} paper methods in lock-step, per lever combination "
          f"({cal['steps']} steps, median of {cal['repeats']} interleaved rounds; measured in {time.perf_counter() - t0:.0f} s, "
          f"load average {cal['load_1min']}{', busy' if cal['busy'] else ''}):")
    print(pd.DataFrame(cal["ms_per_step"]).round(2).to_string())
    print(f"chosen for --fast on these datasets: {cal['label']}")

def _stack_device(args):
    "Check --stack-seeds and --device for the stacked benchmarks."
    from sparse_attention_repro.data import resolve_device
    if min(args.stack_seeds) < 1: raise UsageError(f"--stack-seeds must be >= 1, got {min(args.stack_seeds)}")
    try: resolve_device(args.device)
    except ValueError as e: raise UsageError(str(e)) from None

def _bench_stack(args, bench):
    "bench stack: all methods on several seeds, seed by seed in lock-step against one stacked model."
    datasets = _bench_datasets(args); _stack_device(args)
    t = bench.bench_stack(datasets, num_seeds=args.stack_seeds, epochs=args.epochs, repeats=args.repeats,
                          train_limit=args.train_limit or None, device=args.device)
    print(f"\nall methods on several seeds, {args.epochs} epoch(s): seed by seed in lock-step vs one stacked model (wall seconds, evaluation included)")
    print(t.round(2).to_string(index=False))

def _bench_profile(args, bench):
    "bench profile: a whole profile on the stacked path, every dataset timed end to end beside one lock-step seed."
    from sparse_attention_repro.train import PROFILES, PAPER_SIZES
    _stack_device(args)
    if args.profile not in PROFILES: raise UsageError(f"unknown profile {args.profile!r}; choose one of {', '.join(PROFILES)}")
    datasets = _split(args.datasets) if args.datasets else list(PAPER_SIZES)
    for d in datasets:
        _check_dataset(d)
    rows, t, anchor = bench.bench_profile(args.profile, datasets, args.stack_seeds[0], args.device)
    if args.out:
        from sparse_attention_repro.files import atomic_write
        for name, df in (("runs.csv", rows), ("times.csv", t), ("lockstep_runs.csv", anchor)):
            atomic_write(Path(args.out) / name, lambda f, df=df: df.to_csv(f, index=False))
    print(f"\nthe {args.profile} profile on the stacked path ({args.stack_seeds[0]} seeds per stack), wall seconds per dataset, "
          f"beside the lock-step path's seed 0 projected to every seed")
    print(t.round(2).to_string(index=False))
    print(f"total: stacked {t.seconds_stacked.sum() / 60:.2f} min, lock-step projected {t.seconds_lockstep_projected.sum() / 60:.2f} min")

def _bench_grid(args, bench):
    "bench grid: training epochs of every method on each path, with a projection of the paper profile."
    datasets = _bench_datasets(args)
    med, summary = bench.bench_grid(datasets, epochs=args.epochs, repeats=args.repeats, train_limit=args.train_limit or None)
    print("\ntrain time of each method relative to softmax (per path)")
    print(bench.method_ratios(med).to_string())
    print(f"\nwall seconds for the {med.method.nunique()} methods of one seed, {args.epochs} epoch(s)")
    print(summary.round(2).to_string())
    limits = {d: args.train_limit for d in datasets} if args.train_limit else None
    proj = bench.project_paper(summary, args.epochs, jobs=args.jobs, train_limits=limits)
    print(f"\npaper profile, projected from these epochs, {args.jobs} parallel job(s) (a projection, not a measurement)")
    print(proj.round(1).to_string(index=False))

BENCHES = {"steps": _bench_steps, "fair-cost": _bench_fair_cost, "floor": _bench_floor, "compare": _bench_compare, "normalizers": _bench_normalizers,
           "fast": _bench_fast, "stack": _bench_stack, "profile": _bench_profile, "grid": _bench_grid, "long": _bench_long}
TIMED_BENCHES = ("normalizers", "fast", "stack", "profile", "grid", "steps", "long")      # these print their thread count and repeats first

def cmd_bench(args):
    "Print the table of the benchmark `args.what` (see `BENCHES`)."
    import torch
    from sparse_attention_repro import bench
    if args.repeats is None: args.repeats = {"normalizers": 20, "steps": 60, "long": 3}.get(args.what, 1)
    if args.threads < 1: raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if args.repeats < 1: raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    torch.set_num_threads(args.threads)
    if args.what in TIMED_BENCHES: print(f"{args.what} benchmark, {args.threads} thread(s), median of {args.repeats} interleaved repeat(s)")
    BENCHES[args.what](args, bench)
    return {}

# %%
_choices = next(a.choices for a in _bench_args(argparse.ArgumentParser().add_subparsers())._actions if a.dest == "what")
test_eq(set(_choices), set(BENCHES)); assert set(TIMED_BENCHES) <= set(BENCHES)          # every choice has its benchmark

# %% [markdown]
# ## The entry point
#
# `main` turns every refused argument into one line on stderr and status 2, failed notebooks into status 1.

# %%
#| export
def cmd_length(args):
    "Run the length study's grid (or, with --dry-run, print what it still needs); returns the failures."
    _check_executor(args)
    from sparse_attention_repro.length_study import (LENGTH, PROFILES, check_request, plan_runs, notebook_task, stage_runs, estimate_core_hours,
                                                     read_recipes, freeze_recipes, RECIPES)
    import pandas as pd
    from sparse_attention_repro.length_train import LengthRunConfig
    if args.tables:
        if not LENGTH.results_path(args.out).exists(): raise UsageError(f"{args.out} holds no {LENGTH.results}; run `sparse-repro length --out {args.out}` first")
        from sparse_attention_repro.length_analysis import length_tables
        from sparse_attention_repro.length_study import read_recipes
        for name, df in length_tables(args.out, read_recipes(args.out)).items(): print(f"{args.out}/tables/{name}: {len(df)} rows")
        return {}
    if args.profile not in PROFILES: raise UsageError(f"unknown profile {args.profile!r}; choose one of {', '.join(PROFILES)}")
    prof = PROFILES[args.profile]
    run = config_from_options(LengthRunConfig, {k: getattr(args, k) for k in option_defaults(LengthRunConfig)})
    tasks, specs = check_request(prof, args.tasks or prof.tasks, args.normalizers or prof.normalizers,
                                 args.positions or prof.positions, args.test_lengths or prof.test_lengths)
    names, positions = ([t.name for t in tasks], [s.name for s in specs]), args.positions or prof.positions
    if args.stage:
        runs, notes = stage_runs(args.stage, args.out, prof, *names, positions, read_recipes(args.out), args.rates, **run)
        for note in notes: print(note, file=sys.stderr)
    else:
        runs = plan_runs(args.out, prof, *names, positions, args.rates or prof.rates, _seeds(args.seeds) if args.seeds else prof.seeds,
                         args.test_lengths, **run)
    if not runs: return {}
    todo = [r for r in runs if not r.rows.exists()]
    if args.dry_run:
        results = LENGTH.results_path(args.out)
        hours, unmeasured = estimate_core_hours(todo, pd.read_csv(results) if results.exists() else None)
        print(f"length grid in {args.out}: {len(runs)} runs, {len(todo)} still to run; about {hours:.1f} core-hours for the "
              f"{len(todo) - unmeasured} priced from this folder's runs" + (f", {unmeasured} not priced yet (nothing of their task "
              "and normalizer measured here)" if unmeasured else ""))
        for r in todo: print(f"  {r.key}: {r.cfg.steps} steps, " + (f"tested at step {r.test_step} at {', '.join(map(str, r.test_lengths))} tokens"
                                                                   if r.test_step else "validation only"))
        return {}
    threads, note = grid_threads(args.out, LENGTH.name, args.jobs)
    if note: print(note, file=sys.stderr)
    options = dict(profile=args.profile, **{k: v for k, v in asdict(runs[0].cfg).items() if k in option_defaults(LengthRunConfig)},
                   test_examples=prof.test_examples)
    fails = run_study(LENGTH, args, [notebook_task(r, threads) for r in runs], options)
    if args.stage == "select" and not fails:
        print(f"{args.out}/{RECIPES}: {len(freeze_recipes(args.out))} arms' recipes, chosen on the selection seeds' validation curves")
    return fails

COMMANDS = {"grid": cmd_grid, "crisp": cmd_crisp, "length": cmd_length, "report": cmd_report, "readme": cmd_readme, "index": cmd_index, "leaderboard": cmd_leaderboard, "card": cmd_card, "site": cmd_site, "reproduce": cmd_reproduce,
            "ablations": cmd_ablations, "follow-ups": cmd_follow_ups, "tuned": cmd_tuned,
            "attention-maps": cmd_attention_maps, "bench": cmd_bench}

def main(argv=None):
    "Entry point of `sparse-repro`; returns the exit status."
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(next((a for a in argv if not a.startswith("-")), None)).parse_args(argv)
        fails = COMMANDS[args.command](args)
    except UsageError as e:
        print(f"sparse-repro: error: {e}", file=sys.stderr); return 2
    except (ValueError, FileNotFoundError) as e:       # e.g. a results folder of another profile
        print(f"sparse-repro: error: {str(e).splitlines()[0]}", file=sys.stderr); return 2
    if fails:
        print(f"sparse-repro: {len(fails)} notebook(s) failed: " + "; ".join(f"{k}: {v}" for k, v in fails.items()), file=sys.stderr)
        return 1
    return 0

# %% [markdown]
# Bad arguments are refused before anything runs, with one line on stderr and status 2:

# %%
def run_cli(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err): code = main(list(argv))
    return code, err.getvalue()

tmp = tempfile.mkdtemp()
for argv, msg in [(("grid", "--out", tmp, "--methods", "softmaxx"), "unknown normalizer"),
                  (("grid", "--out", tmp, "--methods", "topk_softmax_2"), "must be in (0, 1]"),
                  (("grid", "--out", tmp, "--datasets", "mnist"), "unknown dataset"),
                  (("grid", "--out", tmp, "--profile", "fast"), "unknown profile"),
                  (("grid", "--out", tmp, "--seeds", "-1"), "seeds must be >= 0"),
                  (("grid", "--out", tmp, "--seeds", "one"), "seeds must be integers"),
                  (("grid",), "required: --out"),
                  (("grid", "--out", tmp, "--executor", "ray"), "unknown executor"),
                  (("grid", "--out", tmp, "--jobs", "0"), "--jobs must be >= 1"),
                  (("report", "--results", tmp + "/nope"), "does not exist"),
                  (("attention-maps", "--out", tmp, "--datasets", "synthetic_marker"), "drawn over image patches or 20 Newsgroups words"),
                  (("attention-maps", "--out", tmp, "--examples", "0"), "--examples >= 1"),
                  (("bench", "kernels"), "invalid choice"),
                  (("bench", "grid", "--datasets", "mnist"), "unknown dataset"),
                  (("bench", "normalizers", "--threads", "0"), "--threads must be >= 1"),
                  (("bench", "compare", "--results", tmp), "needs two results folders"),
                  (("bench", "compare", "--results", tmp, tmp), "runs.csv does not exist"),
                  (("bench", "profile", "--profile", "huge"), "unknown profile 'huge'"),
                  (("bench", "profile", "--datasets", "mnist"), "unknown dataset 'mnist'"),
                  (("bench", "stack", "--stack-seeds", "0"), "--stack-seeds must be >= 1")]:
    code, err = run_cli(*argv)
    test_eq(code, 2)
    assert msg in err and err.count("\n") == 1, (argv, err)
test_eq(os.listdir(tmp), [])                            # nothing was written
malformed = Path(tempfile.mkdtemp())
(malformed / "runs.csv").write_text("dataset,method,seed,accuracy\ncifar10,softmax,0,n/a!\n")
code, err = run_cli("report", "--results", str(malformed))
test_eq(code, 2); assert "runs.csv: accuracy in data row 1 is not a number" in err and err.count("\n") == 1, err
test_eq(sorted(os.listdir(malformed)), ["runs.csv"])                          # no half-written report

# %% [markdown]
# Missing SST-2 is found before any Crisp notebook starts (one line, naming where it looked and how to get it), and a
# results folder that another command is writing into is refused:

# %%
from sparse_attention_repro.runner import results_lock
empty = tempfile.mkdtemp()
_env = {k: os.environ.get(k) for k in ("SPARSE_REPRO_DATA", "SPARSE_REPRO_CACHE")}
os.environ.update(SPARSE_REPRO_DATA=empty, SPARSE_REPRO_CACHE=empty)
try:
    code, err = run_cli("crisp", "--out", tmp)
    test_eq(code, 2); assert "SST-2 train not found" in err and "--download" in err and err.count("\n") == 1, err
finally:
    for k, v in _env.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
test_eq(os.listdir(tmp), [])
busy = tempfile.mkdtemp()
with results_lock(busy):
    code, err = run_cli("grid", "--out", busy, "--datasets", "synthetic_marker", "--seeds", "0")
test_eq(code, 2); assert f"is in use by pid {os.getpid()}" in err and err.count("\n") == 1, err
