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
from sparse_attention_repro.run_request import *
from sparse_attention_repro.run_request import _check_dataset
from sparse_attention_repro.argv import *
from sparse_attention_repro.tuned_command import tuned_parser, tuned_grids, cmd_tuned
from sparse_attention_repro.bench_command import bench_parser, cmd_bench
from sparse_attention_repro.targets import targets_parser, cmd_targets

# %% [markdown]
# ## The parser
#
# Every command is a sub-command with its own options; an unknown option or a missing required one raises
# `UsageError` (reported as one line, status 2) instead of argparse's usage dump and exit. The commands that run notebooks
# share the options of `add_executor_arguments`.

# %%
#| export
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
    add_executor_arguments(g)
    return g

def _crisp_args(sub):
    "`crisp`: the Crisp grid."
    c = sub.add_parser("crisp", help="study B: Crisp configurations x seeds")
    c.add_argument("--profile", default="smoke"); c.add_argument("--out", required=True)
    c.add_argument("--configs", nargs="+", help="dense fixed_080 adaptive_060 adaptive_080 (the paper's), or any registered normalizer, e.g. entmax15"); c.add_argument("--seeds", nargs="+"); c.add_argument("--model", default="")
    from sparse_attention_repro.crisp import FinetuneConfig
    add_option_arguments(c, FinetuneConfig)                                    # the run options are FinetuneConfig's own fields
    add_executor_arguments(c)
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
    add_executor_arguments(a)
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
    else: x.set_defaults(fast=False)
    add_executor_arguments(x)
    return x

def _ablations_args(sub):
    "`ablations`: the confound ablations, each a grid into `<out>/ablations/<name>`."
    return _named_grids_args(sub, "ablations", "the ablations of the paper's confounds, paired with a main grid's seeds", "ablation",
                             "seeds trained as one stacked model per task (the GPU path)", fast=True)

def _follow_ups_args(sub):
    "`follow-ups`: the named grids of `catalogue.FOLLOW_UPS` into `<out>/follow_ups/<name>`."
    return _named_grids_args(sub, "follow-ups", "the follow-up experiments of the catalogue (e.g. alpha_start), paired with a "
                             "main grid's seeds", "follow-up", "seeds trained as one stacked model per task")

def _maps_args(sub):
    "`attention-maps`: one seed's methods trained, the CLS attention of a few test items saved for the report."
    a = sub.add_parser("attention-maps", help="train one seed's methods and save where the CLS token looks on a few test items")
    a.add_argument("--out", required=True, help="results folder: maps go to <out>/attention_maps/<dataset>.npz")
    a.add_argument("--datasets", nargs="+", help="image datasets or twenty_news (default: fashion_mnist cifar10)"); a.add_argument("--seed", type=int, default=0)
    a.add_argument("--examples", type=int, default=4, help="test items per dataset"); a.add_argument("--profile", default="paper")
    a.add_argument("--download", action="store_true", help="fetch missing datasets from their official online sources")
    a.add_argument("--device", default="auto", choices=DEVICES)
    a.add_argument("--threads", type=int, default=1, help="torch CPU threads; results are bit-identical only at the thread count of the runs compared with (a grid job per core: 1)")
    return a

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
                                                 "complete (every seed at each arm's chosen recipe, tested; then budgets' notebooks), budgets (the selection seeds "
                                                 "tested at fractions of the run); "
                                                 "none: the plain grid, each run tested at its last step")
    l.add_argument("--dry-run", action="store_true", help="print the runs the grid still needs and run nothing")
    l.add_argument("--tables", action="store_true", help="write the analysis of --out (recipes, accuracy against length, gains "
                                                       "over softmax, the figure) from its rows, and run nothing")
    add_executor_arguments(l)
    return l

SUBCOMMANDS = {"grid": _grid_args, "crisp": _crisp_args, "length": _length_args, "report": _report_args, "readme": _readme_args, "index": _index_args, "leaderboard": _leaderboard_args, "card": _card_args, "site": _site_args,
               "reproduce": _reproduce_args,
               "ablations": _ablations_args, "follow-ups": _follow_ups_args, "tuned": tuned_parser,
               "attention-maps": _maps_args, "bench": bench_parser, "targets": targets_parser}

def build_parser(command=None):
    "The `sparse-repro` argument parser: one sub-command per task (only `command`'s, when it names one: its options may import the library)."
    p = Parser(prog="sparse-repro", description="Reproduce Canay (2026) and Crisp Attention with papermill-executed notebooks.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
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
test_eq([_all.parse_args(a).command for a in (["grid", "--out", "x"], ["tuned", "--out", "x"], ["bench", "floor"], ["targets"])], ["grid", "tuned", "bench", "targets"])
test_eq(vars(build_parser("targets").parse_args(["targets"])), dict(command="targets", outputs="outputs", benchmarks="BENCHMARKS.md"))

# %% [markdown]
# ## From the command line to a request
#
# The one place where argv becomes values: each command that runs a grid turns its parsed arguments into the typed
# request of `run_request` (`GridRequest`, `CrispRequest`, and the `Execution` they share), which is then all that
# flows on. A run option is in the request only when it differs from its default, so the request prints as the
# shortest command that makes it.

# %%
#| export
def grid_request(args) -> GridRequest:
    "The `grid` command line as a `GridRequest`."
    from sparse_attention_repro.train import TrainConfig
    return GridRequest(args.out, args.profile, tuple(split_values(args.datasets or [])), tuple(split_values(args.methods or [])),
                       tuple(parse_seeds(args.seeds)) if args.seeds else (), changed_options(TrainConfig, args), args.plain, args.stack_seeds,
                       args.fast, args.baseline, args.keep_state, args.continue_from, execution_of(args))

def crisp_request(args) -> CrispRequest:
    "The `crisp` command line as a `CrispRequest`."
    from sparse_attention_repro.crisp import FinetuneConfig
    return CrispRequest(args.out, args.profile, tuple(split_values(args.configs or [])), tuple(parse_seeds(args.seeds)) if args.seeds else (),
                        args.model or "", changed_options(FinetuneConfig, args), execution_of(args))

# %%
_gr = grid_request(build_parser().parse_args(["grid", "--out", "x", "--datasets", "kmnist,cifar10", "--seeds", "0,2", "--lr", "3e-3",
                                              "--epoch-eval", "--keep-state", "--jobs", "1"]))
test_eq((_gr.datasets, _gr.seeds, _gr.options, _gr.keep_state, _gr.execution), (("kmnist", "cifar10"), (0, 2), dict(lr=3e-3, epoch_eval=True), True, Execution(jobs=1)))
test_eq(grid_request(build_parser().parse_args(_gr.command_line().split()[1:] + ["--jobs", "1"])), _gr)   # the printed command makes the same request
test_fail(lambda: grid_request(build_parser().parse_args(["grid", "--out", "x", "--executor", "slurm"])), exc=UsageError, contains="unknown executor")
_cr = crisp_request(build_parser().parse_args(["crisp", "--out", "x", "--configs", "dense", "fixed_080", "--lr", "2e-5", "--jobs", "2"]))
test_eq((_cr.configs, _cr.options, _cr.execution.jobs), (("dense", "fixed_080"), dict(lr=2e-5), 2))

# %% [markdown]
# `grid` and `crisp` run their request; with `--baseline`, the grid then writes its comparison with the committed runs.

# %%
#| export
def run_grid(planned: Planned) -> dict:
    "Run a planned study A grid (and, with a baseline, write the comparison with its runs); returns the failures."
    req = planned.request
    def versus():
        if req.baseline and STUDY_A.results_path(req.out).exists():
            from sparse_attention_repro.report import versus_report
            print(f"versus baseline: {versus_report(req.out, req.baseline)}")
    return run_planned(planned, then=versus)

def cmd_grid(args): return run_grid(plan_request(grid_request(args)))

def cmd_crisp(args):
    "Run the Crisp grid; returns the failures."
    return execute(crisp_request(args))

# %% [markdown]
# ## Report, site, and the whole study
#
# `report` runs the report notebook on a results folder, `site` renders the notebooks, `reproduce` validates both grids
# before running either, then runs them and the report into one folder.

# %%
#| export
def cmd_report(args): return write_report(args.results, args.readme)

def write_report(results, readme=None) -> dict:
    "The report of the results folder `results` (and, given `readme`, that README's generated blocks); returns no failures."
    from sparse_attention_repro.report import make_report
    if not Path(results).is_dir(): raise UsageError(f"results folder {results} does not exist; run `sparse-repro grid --out {results}` first")
    from sparse_attention_repro.stats import check_results_file, RESULT_COLUMNS
    for name in RESULT_COLUMNS:                                       # a malformed file: one line, before the notebook runs
        if (Path(results) / name).exists():
            try: check_results_file(Path(results) / name)
            except ValueError as e: raise UsageError(str(e)) from None
    if readme and not Path(readme).is_file(): raise UsageError(f"--readme {readme} is not a file; give the README to update")
    print(f"report: {make_report(results)}")
    if readme:
        from sparse_attention_repro.tuned_reading import sync_readme
        from sparse_attention_repro.report import write_readme
        source = Path(readme).parent / "nbs" / "index.ipynb"            # the README's source, where it has one
        if not source.is_file(): print(f"readme: {readme} {'updated' if sync_readme(readme, results) else 'already current'}")
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
    for n in split_values(args.names):
        try: resolve_normalizer(n)
        except (KeyError, ValueError, ImportError) as e: raise UsageError(str(e).splitlines()[0]) from None
    if args.repeats is not None and args.repeats < 1: raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    repeats = {} if args.repeats is None else {"cost_repeats": args.repeats}
    for n in split_values(args.names): print(f"card: {normalizer_card(args.outputs, n, args.main, measure=args.measure, **repeats)}")   # as given: the card's command reruns
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
    out, execution = args.out or f"outputs/{args.profile}", execution_of(args)
    grid = GridRequest(out, args.profile, options=dict(val_fraction=args.val_fraction), stack_seeds=args.stack_seeds, fast=args.fast,
                       execution=execution)
    crisp = CrispRequest(out, args.profile, model=args.model or "", execution=execution)
    grid, crisp = plan_request(grid), plan_request(crisp)   # everything checked before anything runs, each planned once
    fails = {**run_grid(grid), **run_planned(crisp)}
    write_report(out)
    return fails

# %% [markdown]
# ## One catalogue entry, from its declaration
#
# `sparse-repro run ENTRY` makes one entry of the catalogue (`catalogue.CATALOGUE`) from its declaration alone: its
# design (study, datasets, methods, options, seeds, profile, and the folder it is paired with) becomes one typed request
# into `<outputs>/<root>/<folder>`, and the study's planner checks it and runs what is not done yet — so rerunning a
# committed entry finds nothing to do, and a stopped one resumes. The entries made in stages that read their own results
# as they go (the tuned-recipe searches, the length study) and the records (attention maps, benchmarks, `reproduce`)
# name the command that makes them instead.

# %%
#| export
RUN_BY_REQUEST = ("grid", "ablations", "follow-ups", "crisp")     # the runners whose entries are one request

def _run_args(sub):
    "`run`: one catalogue entry, from its declaration."
    r = sub.add_parser("run", help="make one entry of the catalogue of experiments (outputs/README.md) from its declaration")
    r.add_argument("entry", help="the entry's name (the catalogue's; outputs/README.md lists them)")
    r.add_argument("--outputs", default="outputs", help="the folder of results roots: the entry runs into <outputs>/<root>/<folder>")
    r.add_argument("--seeds", nargs="+", help="only these seeds (default: the entry's, else its profile's)")
    r.add_argument("--dry-run", action="store_true", help="print the entry's command and how many notebooks it still needs; run nothing")
    add_executor_arguments(r)
    return r

SUBCOMMANDS["run"] = _run_args

def entry_request(e, outputs, seeds=(), execution=Execution()):
    "The typed request that makes catalogue entry `e` under `outputs`, or a one-line `UsageError` naming the command that makes it."
    if e.runner not in RUN_BY_REQUEST:
        raise UsageError(f"{e.name} is made by `sparse-repro {e.runner}` (in stages, or as a record), not from one request; "
                         f"its line in {Path(outputs) / 'README.md'} says where its results are")
    return design_request(e, Path(outputs) / e.root / e.folder, seeds=seeds, execution=execution, baseline_root=outputs)

def cmd_run(args):
    "Make the catalogue entry `args.entry` (or, with --dry-run, say what it still needs); returns the failures."
    from sparse_attention_repro.catalogue import CATALOGUE
    if args.entry not in CATALOGUE: raise UsageError(f"unknown entry {args.entry!r}; choose one of {', '.join(CATALOGUE)}")
    req = entry_request(CATALOGUE[args.entry], args.outputs, tuple(parse_seeds(args.seeds)) if args.seeds else (), execution_of(args))
    if args.dry_run:
        tasks, _ = STUDIES[req.study].plan(req)
        todo = [t for t in tasks if not all(Path(p).exists() for p in t.produces)]
        print(f"{args.entry}: {len(todo)} of {len(tasks)} notebooks still to run into {req.out}")
        return {}
    return run_grid(plan_request(req)) if isinstance(req, GridRequest) else execute(req)

# %%
from sparse_attention_repro.catalogue import CATALOGUE
_root = Path(sparse_attention_repro.__file__).parent.parent / "outputs"
_pr = entry_request(CATALOGUE["patch4"], "out")
test_eq((_pr.out, _pr.profile, _pr.datasets, _pr.options), ("out/paper/ablations/patch4", "paper", ("fashion_mnist",), dict(patch_size=4)))
test_eq(entry_request(CATALOGUE["literature_masked_padding"], "out").baseline, "out/paper/ablations/masked_padding")
test_eq(entry_request(CATALOGUE["fashion_mnist_fast"], "out").fast, True)
test_eq((entry_request(CATALOGUE["crisp_lr_check"], "out").options, entry_request(CATALOGUE["crisp_lr_check"], "out").profile), (dict(lr=2e-5), "quick"))
test_fail(lambda: entry_request(CATALOGUE["tuned"], "out"), exc=UsageError, contains="made by `sparse-repro tuned`")
# every committed entry made by one request is complete: its own declaration plans nothing left to run in its committed folder
# (the --fast entries apart: their folders predate the recorded calibration, so planning them would time the levers here)
for _n, _e in CATALOGUE.items():
    if (_e.runner in ("grid", "ablations", "follow-ups") and not _e.design.options.get("fast")
            and (_root / _e.root / _e.folder / "runs.csv").is_file()):
        _tasks, _ = grid_tasks(entry_request(_e, _root))
        assert all(Path(p).exists() for t in _tasks for p in t.produces), f"{_n}: its declaration asks for runs its folder lacks"
from sparse_attention_repro.data import resolve_data_root
if resolve_data_root() and (resolve_data_root() / "sst2" / "train.tsv").is_file():
    for _n, _e in CATALOGUE.items():
        if _e.runner == "crisp" and (_root / _e.root / _e.folder / "crisp_runs.csv").is_file():
            _tasks, _ = crisp_tasks(entry_request(_e, _root))
            test_eq(len(_tasks), len(_e.design.methods) * len(_e.design.seeds or ()) or len(_tasks))
            assert all(Path(p).exists() for t in _tasks for p in t.produces), f"{_n}: its declaration asks for runs its folder lacks"

# %% [markdown]
# ## Ablations
#
# `ablations` runs each ablation of the catalogue (`catalogue.ABLATIONS`) — masked padding, the original's gradient, 4×4 patches, a learnable
# marker task, a learned padding embedding — as a grid with its options into `<out>/ablations/<name>`, on the profile's
# seeds (the main runs' seeds), one after the other; every grid resumes like any other, and the report of `<out>` picks
# them up. All are validated before the first one starts.

# %%
#| export
def ablation_grids(args, table=None, kind="ablation") -> list:
    "(name, `Planned` grid) of every requested catalogue entry of `table` (default `catalogue.ABLATIONS`), each planned once, in order."
    from sparse_attention_repro.catalogue import ABLATIONS
    table = ABLATIONS if table is None else table
    names = split_values(args.only) if args.only else list(table)
    for n in names:
        if n not in table: raise UsageError(f"unknown {kind} {n!r}; choose from {', '.join(table)}")
    grids, execution = [], execution_of(args)
    for n in names:
        g = design_request(table[n], Path(args.out) / table[n].folder, args.profile, tuple(parse_seeds(args.seeds)) if args.seeds else (),
                           execution, stack_seeds=args.stack_seeds, fast=args.fast)
        grids.append((n, plan_request(g)))
    return grids

def _run_named_grids(args, table=None, kind="ablation"):
    "Run the requested named grids of `table` one after the other; returns the failures."
    fails = {}
    for name, g in ablation_grids(args, table, kind):
        print(f"{kind} {name}: {g.request.out}")
        fails.update({f"{name}:{k}": v for k, v in run_grid(g).items()})
    return fails

def cmd_ablations(args):
    "Run the requested ablation grids (`catalogue.ABLATIONS`) one after the other; returns the failures."
    return _run_named_grids(args)

def cmd_follow_ups(args):
    "Run the follow-up grids (`catalogue.FOLLOW_UPS`) one after the other; returns the failures."
    from sparse_attention_repro.catalogue import FOLLOW_UPS
    return _run_named_grids(args, FOLLOW_UPS, "follow-up")

# %%
_out = Path(tempfile.mkdtemp()) / "res"
_ab = ablation_grids(build_parser().parse_args(["ablations", "--profile", "smoke", "--out", str(_out), "--only", "learnable_marker,patch4", "--seeds", "0"]))
test_eq([n for n, _ in _ab], ["learnable_marker", "patch4"])
test_eq(ablation_grids(build_parser().parse_args(["ablations", "--profile", "smoke", "--out", str(_out), "--only", "patch4", "--fast"]))[0][1].request.fast, True)
test_eq((_ab[0][1].request.options["marker_vocab"], _ab[0][1].request.datasets, _ab[1][1].request.options["patch_size"], _ab[1][1].request.out),
        (12, ("synthetic_marker",), 4, str(_out / "ablations" / "patch4")))
test_fail(lambda: ablation_grids(build_parser().parse_args(["ablations", "--out", "x", "--only", "dropout"])), exc=UsageError, contains="unknown ablation")
from sparse_attention_repro.catalogue import FOLLOW_UPS
_fu = ablation_grids(build_parser().parse_args(["follow-ups", "--profile", "smoke", "--out", str(_out), "--seeds", "0"]), FOLLOW_UPS, "follow-up")
test_eq([(n, g.request.methods, g.request.out) for n, g in _fu],
        [("alpha_start", ("headwise_adaptive_entmax_start12", "headwise_adaptive_entmax_start18"), str(_out / "follow_ups" / "alpha_start")),
         ("selection_marker", (), str(_out / "follow_ups" / "selection_marker"))])          # (): every paper method
test_eq(_fu[1][1].request.options, dict(marker_design="label_once", epochs=3, epoch_eval=True, val_fraction=0.25))
assert not _out.exists()

# %% [markdown]
# ## Attention maps
#
# `attention-maps` trains one seed of each dataset with every paper method and saves where the CLS token looks.

# %%
#| export
def cmd_attention_maps(args):
    "Train seed `--seed` of each dataset (all the paper's methods) and save the CLS attention maps; a finished dataset is skipped."
    from sparse_attention_repro.train import PROFILES, PAPER_SIZES, profile_config, attention_maps
    from sparse_attention_repro.study import PAPER_METHODS, BASELINE
    if args.profile not in PROFILES: raise UsageError(f"unknown profile {args.profile!r}; choose one of {', '.join(PROFILES)}")
    datasets = split_values(args.datasets) if args.datasets else ["fashion_mnist", "cifar10"]
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

# %% [markdown]
# ## The entry point
#
# `main` turns every refused argument into one line on stderr and status 2, failed notebooks into status 1.

# %%
#| export
def length_request(args) -> LengthRequest:
    "The `length` command line as a `LengthRequest`."
    from sparse_attention_repro.length_train import LengthRunConfig
    return LengthRequest(args.out, args.profile, tuple(args.tasks or ()), tuple(args.normalizers or ()), tuple(args.positions or ()),
                         tuple(args.rates or ()), tuple(parse_seeds(args.seeds)) if args.seeds else (), tuple(args.test_lengths or ()),
                         args.stage, changed_options(LengthRunConfig, args), execution_of(args))

def cmd_length(args):
    "Run the length study's grid (or, with --dry-run, print what it still needs); returns the failures."
    from sparse_attention_repro.length_study import LENGTH, length_runs, estimate_core_hours, freeze_recipes, RECIPES
    if args.tables:
        if not LENGTH.results_path(args.out).exists(): raise UsageError(f"{args.out} holds no {LENGTH.results}; run `sparse-repro length --out {args.out}` first")
        from sparse_attention_repro.length_analysis import length_tables
        from sparse_attention_repro.length_study import read_recipes
        for name, df in length_tables(args.out, read_recipes(args.out)).items(): print(f"{args.out}/tables/{name}: {len(df)} rows")
        return {}
    req = length_request(args)
    runs, notes = length_runs(req)
    for note in notes: print(note, file=sys.stderr)
    if not runs: return {}
    todo = [r for r in runs if not r.rows.exists()]
    if args.dry_run:
        hours, unmeasured = estimate_core_hours(todo, LENGTH.load(args.out))
        print(f"length grid in {args.out}: {len(runs)} runs, {len(todo)} still to run; about {hours:.1f} core-hours for the "
              f"{len(todo) - unmeasured} priced from this folder's runs" + (f", {unmeasured} not priced yet (nothing of their task "
              "and normalizer measured here)" if unmeasured else ""))
        for r in todo: print(f"  {r.key}: {r.cfg.steps} steps, " + (f"tested at step {r.test_step} at {', '.join(map(str, r.test_lengths))} tokens"
                                                                   if r.test_step else "validation only"))
        return {}
    fails = execute(req)
    if req.stage == "select" and not fails:
        print(f"{args.out}/{RECIPES}: {len(freeze_recipes(args.out))} arms' recipes, chosen on the selection seeds' validation curves")
    return fails

COMMANDS = {"grid": cmd_grid, "crisp": cmd_crisp, "length": cmd_length, "report": cmd_report, "readme": cmd_readme, "index": cmd_index, "leaderboard": cmd_leaderboard, "card": cmd_card, "site": cmd_site, "reproduce": cmd_reproduce,
            "ablations": cmd_ablations, "follow-ups": cmd_follow_ups, "tuned": cmd_tuned,
            "attention-maps": cmd_attention_maps, "bench": cmd_bench, "targets": cmd_targets, "run": cmd_run}

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
                  (("bench", "stack", "--stack-seeds", "0"), "--stack-seeds must be >= 1"),
                  (("targets", "--outputs", tmp), "targets_measured.csv does not exist")]:
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
