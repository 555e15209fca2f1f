# %% [markdown]
# # The `bench` command
# > `sparse-repro bench …`: the benchmarks of `08_bench` from the command line, each printing its table of ratios measured side by side in one process.

# %%
#| default_exp bench_command

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

# %% [markdown]
# `bench` prints ratio tables measured side by side in one process (see `08_bench`): the normalizers, a training epoch of
# every method, or two results folders compared per method.

# %%
#| export
def bench_parser(sub):
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
    b.add_argument("--device", default="auto", choices=DEVICES, help="stack, profile: where to train (auto = CUDA when available)")
    b.add_argument("--profile", default="paper", help="profile: the profile to run (its seeds, sizes and epochs)")
    b.add_argument("--out", default=None, help="profile: a folder for its runs.csv (stacked), lockstep_runs.csv (the anchor's seeds) and times.csv; "
                                               "long: a folder for long_attention.csv")
    return b

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
    datasets = split_values(args.datasets) if args.datasets else ["fashion_mnist", "twenty_news"]
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
    datasets = split_values(args.datasets) if args.datasets else list(PAPER_SIZES)
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
_choices = next(a.choices for a in bench_parser(argparse.ArgumentParser().add_subparsers())._actions if a.dest == "what")
test_eq(set(_choices), set(BENCHES)); assert set(TIMED_BENCHES) <= set(BENCHES)          # every choice has its benchmark
