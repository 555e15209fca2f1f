# %% [markdown]
# # The `tuned` command
# > The tuned-recipe protocol stage by stage from the command line: each grid a stage still needs, as a typed request.

# %%
#| default_exp tuned_command

# %%
#| export
import argparse, sys
from pathlib import Path
from sparse_attention_repro.argv import split_values, parse_seeds, add_executor_arguments, execution_of
from sparse_attention_repro.run_request import *
from sparse_attention_repro.run_request import _check_dataset
from sparse_attention_repro.runner import run_task_groups, results_lock

# %%
from fastcore.test import test_eq, test_fail
import tempfile

# %%
#| export
def tuned_parser(sub):
    "`tuned`: the tuned-recipe protocol of `tuning.TUNED_SEARCH`, stage by stage, into `<out>/tuned/<dataset>_lr<rate>`."
    x = sub.add_parser("tuned", help="every arm at its own learning rate and length, chosen on validation (the tuned-recipe protocol)")
    x.add_argument("--out", required=True, help="the main results folder: the grids go to <out>/tuned/<dataset>_lr<rate>")
    x.add_argument("--stage", default="select", choices=["select", "complete", "power", "symmetric", "finer", "fresh"],
                   help="select: every candidate learning rate on the selection seeds; complete: the other seeds at each arm's chosen "
                        "rate; power: more seeds for the headline comparisons, at their chosen recipes, until TOST at ±1 pt has 80%% power; "
                        "symmetric: every arm of a dataset to the same run length, extended together while any arm's best epoch is on its "
                        "edge, up to tuning.SYMMETRIC_CAP; finer: 2e-3 and 5e-3 on the selection seeds where an arm chose 3e-3 "
                        "(tuning.FINER_RATES); fresh: once the recipes are final, seeds 30-39 at the chosen recipes of every label that reads "
                        "persists or reversed, and of softmax (fresh_seeds.FRESH_SEEDS), into <out>/fresh/")
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
    x.add_argument("--modern", action="store_true", help="the modern-recipe check: the four headline comparisons (modern_recipe."
                   "MODERN_HEADLINES) tuned again under linear warm-up + cosine decay, the same search and seeds at the declared "
                   "length, into <out>/modern/tuned/ (stages select and complete)")
    add_executor_arguments(x)

# %% [markdown]
# `tuned` runs the tuned-recipe protocol (`05b_tuning`): it reads what has run under `<out>/tuned/`, asks `tuned_plan`
# for the grids the stage still needs, and runs each as a `grid` into its (dataset, learning rate) folder. The *select*
# stage repeats until its plan is empty, because a learning rate chosen on the edge of its axis adds the next rate of
# the ladder; *complete* then runs the other seeds at each arm's chosen rate. `--dry-run` prints the grid commands.

# %%
#| export
def tuned_grids(args) -> list:
    "(command line, `Planned` grid) of each grid the requested stage of the tuned-recipe protocol still needs, each planned once."
    from sparse_attention_repro import tuning as T, tuned_reading as TR
    datasets = split_values(args.datasets) if args.datasets else list(T.TUNED_SEARCH)
    for d in datasets:
        if d not in T.TUNED_SEARCH: raise UsageError(f"dataset {d!r} has no declared recipe search; choose from {', '.join(T.TUNED_SEARCH)}")
    methods = split_values(args.methods) if args.methods else None
    if methods:
        from sparse_attention_repro.normalizers import resolve_normalizer
        for m in methods:
            try: resolve_normalizer(m)
            except (KeyError, ValueError, ImportError) as e: raise UsageError(str(e).splitlines()[0]) from None
        if args.stage == "power": raise UsageError("--stage power adds seeds to the paper's headline comparisons; drop --methods")
    base = args.baseline
    if base and not list(Path(base, "tuned").glob("*/runs.csv")):
        raise UsageError(f"--baseline {base} holds no tuned grids ({Path(base) / 'tuned'}/*/runs.csv); run `sparse-repro tuned --out {base}` first")
    search, root, extra = TR.search_for(methods) if methods else None, Path(args.out), {}
    if args.modern:
        from sparse_attention_repro import modern_recipe as M
        if methods or base or args.halving:
            raise UsageError("--modern tunes its declared comparisons (modern_recipe.MODERN_HEADLINES) with the full select stage: drop --methods, --baseline and --halving")
        if args.stage not in ("select", "complete"): raise UsageError(f"--modern has the stages select and complete, not {args.stage}")
        search, root, extra = M.modern_search(), Path(args.out) / M.MODERN_FOLDER, dict(schedule=M.MODERN_SCHEDULE)
    runs = T.tuned_runs(root)
    rule = tuned_rule(args, runs, root)
    curves, failed = T.tuned_curves(runs), T.diverged(runs)
    if args.stage == "power":
        rec = T.choose_recipes(curves, failed, rule=rule)
        plan = T.power_plan(curves, rec, T.tuned_tests(curves, rec)) if len(rec) else []
    elif args.stage == "symmetric": plan = T.symmetric_plan(curves, failed, search, datasets=datasets, rule=rule)
    elif args.stage == "finer":
        plan = T.finer_plan(curves, failed, search, datasets=datasets, rule=rule)
        if not plan and (waiting := T.symmetric_plan(curves, failed, search, datasets=datasets, rule=rule)):
            raise UsageError(f"the finer stage runs after the symmetric one, which still needs {len(waiting)} grid(s): "
                             f"run `sparse-repro tuned --out {args.out} --stage symmetric` first")
    elif args.stage == "fresh": plan = fresh_stage_plan(args, search, methods)
    else: plan = T.tuned_plan(curves, failed, search, stage=args.stage, datasets=datasets, rule=rule)
    plan = [p for p in plan if p["dataset"] in datasets]
    grids, execution = [], execution_of(args)
    for p in plan:
        shorter = root / "tuned" / p["continue_from"] if p.get("continue_from") else None
        g = GridRequest(str(Path(p.get("root", root)) / p.get("under", "tuned") / p["folder"]), args.profile, (p["dataset"],),
                        tuple(p["methods"]), tuple(p["seeds"]),
                        dict(lr=p["lr"], epochs=p["epochs"], epoch_eval=True, val_fraction=T.TUNED_VAL_FRACTION, **extra),
                        stack_seeds=args.stack_seeds, keep_state=bool(p.get("keep_state")),
                        continue_from=str(shorter) if shorter and (shorter / "manifest.json").is_file() else None,   # the shorter run's kept states
                        execution=execution)
        grids.append((g.command_line(), plan_request(g)))         # planned once: checked here, run from this plan
    return grids

def fresh_stage_plan(args, search, methods) -> list:
    """The fresh stage's grids (`fresh_seeds.fresh_plan`), each with the folder it runs under (`root`, `under`): a new
    normalizer's under `--out`, softmax's under `--baseline`, where every comparison with it reads them."""
    from sparse_attention_repro import fresh_seeds as F
    from sparse_attention_repro.stats import load_runs
    folders = [(args.out, search)] + ([(args.baseline, None)] if args.baseline else [])
    for folder, s in folders:
        if waiting := F.waiting_stages(folder, s):
            raise UsageError(f"the fresh stage runs once the recipes are final, and {Path(folder) / 'tuned'} still needs "
                             + ", ".join(f"{n} {k} grid(s)" for k, n in waiting.items()) + ": run those stages first")
    if args.baseline and not methods: raise UsageError("--stage fresh with --baseline confirms new normalizers' verdicts: give them with --methods")
    try: recipes, tests = F.labels_to_confirm(args.out, None if args.baseline else load_runs(Path(args.out) / "runs.csv"), args.baseline, methods or ())
    except ValueError as e: raise UsageError(str(e).splitlines()[0]) from None
    have = F.fresh_curves(*[f for f, _ in folders])
    if not args.baseline: return [p | dict(under=F.FRESH_FOLDER) for p in F.fresh_plan(recipes, tests, have)]
    return ([p | dict(root=args.out, under=F.FRESH_FOLDER) for p in F.fresh_plan(recipes, tests, have, sides=("compared",))]
            + [p | dict(root=args.baseline, under=F.FRESH_FOLDER) for p in F.fresh_plan(recipes, tests, have, sides=("baseline",))])

def tuned_rule(args, runs, root=None):
    "The selection rule of the tuned grids under `root` (default `args.out`): the one recorded there, or `--halving` for a folder with no tuned run yet."
    from sparse_attention_repro import tuning as T
    root = args.out if root is None else root
    stored = T.search_rule(root)
    if args.halving and stored is None and len(runs):
        raise UsageError(f"{Path(root) / 'tuned'} was searched with the full select stage; --halving starts a new search (give another --out)")
    return T.HALVING if args.halving or stored is not None else None

def tuned_groups(stack, grids) -> list:
    """One `TaskGroup` per grid of a tuned stage, each results folder held once (in `stack`, an `ExitStack`): the power
    stage sends several grids into one folder (other methods on other seeds), whose notebooks must then be distinct.
    `cmd_tuned` starts their notebooks seed by seed, so that a stopped stage leaves whole pairs of an arm and softmax,
    but for the pairs in flight."""
    groups, held = [], {}
    for _, p in grids:
        g, tasks, options = p.request, p.tasks, p.options
        if g.out not in held: stack.enter_context(results_lock(g.out)); held[g.out] = set()
        if clash := held[g.out] & {str(t.output) for t in tasks}:
            raise ValueError(f"two grids of one stage would write {sorted(clash)[0]} (a bug in the stage's plan: please report it)")
        held[g.out] |= {str(t.output) for t in tasks}
        groups.append(study_group(STUDY_A, g.out, tasks, options, name=Path(g.out).name))
    return groups

def cmd_tuned(args):
    "Run the requested stage of the tuned-recipe protocol until it needs nothing more (or a notebook fails); returns the failures."
    from contextlib import ExitStack
    execution_of(args)
    fails = {}
    ran = None
    while grids := tuned_grids(args):                     # every argument checked before anything is written
        if args.halving and not args.dry_run and ran is None:
            from sparse_attention_repro import tuning as T
            T.record_search_rule(args.out, T.HALVING)       # the folder's rule, read back by every later command
        lines = [line for line, _ in grids]
        if lines == ran:                                    # its rows should have changed the plan: never loop on a settled grid
            raise ValueError(f"tuned ({args.stage}): the plan still asks for {lines[0]} after it ran; its runs.csv rows do not settle "
                             f"the selection (a bug: please report it with {Path(args.out) / 'tuned'})")
        for line in lines: print(f"tuned ({args.stage}): {line}")
        if args.dry_run:
            from sparse_attention_repro.tuning import plan_core_hours, tuned_runs
            priced = [dict(dataset=g.datasets[0], methods=g.methods, seeds=g.seeds, epochs=g.options["epochs"]) for g in (p.request for _, p in grids)]
            print(f"tuned ({args.stage}) cost: about {plan_core_hours(priced, tuned_runs(args.out)):.1f} core-hours from scratch, "
                  "priced from this folder's tuned runs" + (" (at the constant rate's cost per epoch)" if args.modern else ""))
            return {}
        with ExitStack() as stack:                          # every grid's folder held and checked, then one pool for all their notebooks
            groups = tuned_groups(stack, grids)
            fails = run_task_groups(groups, jobs=args.jobs, executor=args.executor, scheduler=args.scheduler,
                                    desc=f"tuned ({args.stage}) notebooks", order=lambda t: min(t.parameters["seeds"]))
        if fails or args.stage not in ("select", "symmetric"): break   # these two plan again from what they ran
        ran = lines
    else: print(f"tuned ({args.stage}): nothing left to run in {Path(args.out) / 'tuned'}")
    if args.stage == "fresh" and args.baseline and args.methods and not args.dry_run and not fails:
        from sparse_attention_repro.fresh_seeds import write_fresh_confirmation
        print(f"tuned (fresh): {write_fresh_confirmation(args.out, args.baseline, split_values(args.methods))}")
    if args.baseline and args.methods and not args.dry_run:
        from sparse_attention_repro.tuned_reading import write_fair_verdict
        for m in split_values(args.methods):
            try: print(f"tuned: the fair verdict of {m}: {write_fair_verdict(args.out, args.baseline, m)}")
            except ValueError as e: print(f"tuned: no verdict for {m} yet ({e})")
    return fails

# %%
from sparse_attention_repro.cli import build_parser
_out = Path(tempfile.mkdtemp()) / "res"
_tg = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "fashion_mnist", "--jobs", "1"]))
test_eq([(p.request.options, p.request.seeds, len(p.request.methods), p.request.out) for _, p in _tg],
        [(dict(lr=lr, epochs=36, epoch_eval=True, val_fraction=0.25), (0, 1, 2), 7, str(_out / "tuned" / f"fashion_mnist_lr{lr:g}"))
         for lr in (3e-4, 1e-3, 3e-3, 1e-2)])
assert _tg[1][0].startswith("sparse-repro grid --profile paper --out ") and "--lr 0.001 --epochs 36 --epoch-eval" in _tg[1][0]
test_eq(tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "kmnist", "--stage", "complete"])), [])
_tm = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "fashion_mnist", "--methods", "sparsemax"]))
test_eq([(p.request.methods, p.request.options["lr"], p.request.seeds) for _, p in _tm], [(("sparsemax",), lr, (0, 1, 2)) for lr in (3e-4, 1e-3, 3e-3, 1e-2)])   # its own search
_ts = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--datasets", "fashion_mnist", "--stack-seeds", "3"]))
test_eq([(p.request.stack_seeds, p.request.options["epoch_eval"]) for _, p in _ts], [(3, True)] * 4)                  # on a GPU: the selection seeds as one stack
test_eq([len(p.tasks) for _, p in _ts], [1] * 4)                                  # one notebook per rate
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--methods", "sparsemaxx"])), exc=UsageError,
          contains="unknown normalizer 'sparsemaxx'")
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--methods", "sparsemax", "--baseline", str(_out)])),
          exc=UsageError, contains="holds no tuned grids")
test_eq(tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--stage", "power"])), [])   # nothing complete yet
test_eq(tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--stage", "finer"])), [])   # nothing chosen yet: nothing waits
test_eq(tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--stage", "fresh"])), [])   # no label claims a difference yet
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--stage", "fresh", "--baseline", str(_out)])),
          exc=UsageError, contains="holds no tuned grids")
import tempfile
from contextlib import ExitStack
from sparse_attention_repro.runner import FolderBusyError
with tempfile.TemporaryDirectory() as _td:                                    # the power stage: two grids into one folder
    _pg = lambda methods, seeds: ("", plan_request(GridRequest(f"{_td}/tuned/kmnist_lr0.001", "smoke", ("kmnist",), tuple(methods), tuple(seeds))))
    with ExitStack() as _st:
        _gs = tuned_groups(_st, [_pg(["softmax", "sparsemax"], [10]), _pg(["softmax"], [11, 12])])
        test_eq([len(g.tasks) for g in _gs], [1, 2])                                # one folder, held once, notebooks by seed
        test_fail(lambda: tuned_groups(ExitStack(), [_pg(["softmax"], [10])]), exc=FolderBusyError, contains="in use by")
    with ExitStack() as _st:
        test_fail(lambda: tuned_groups(_st, [_pg(["softmax"], [10]), _pg(["sparsemax"], [10])]), exc=ValueError, contains="two grids")
_tmo = tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--modern", "--datasets", "kmnist"]))   # the modern-recipe check
test_eq([(p.request.methods, p.request.options["schedule"], p.request.options["lr"], p.request.out) for _, p in _tmo],
        [(("softmax", "topk_softmax_025"), "warmup_cosine", lr, str(_out / "modern" / "tuned" / f"kmnist_lr{lr:g}")) for lr in (3e-4, 1e-3, 3e-3, 1e-2)])
assert "--schedule warmup_cosine" in _tmo[0][0]
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--modern", "--halving"])), exc=UsageError, contains="drop --methods")
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", str(_out), "--modern", "--stage", "power"])), exc=UsageError, contains="select and complete")
test_fail(lambda: tuned_grids(build_parser().parse_args(["tuned", "--out", "x", "--datasets", "synthetic_marker"])), exc=UsageError,
          contains="no declared recipe search")
