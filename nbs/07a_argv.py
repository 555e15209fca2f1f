# %% [markdown]
# # The command line's vocabulary
# > The parsing helpers every `sparse-repro` command shares: lists given either way, seeds, the executor options, and the options a command line changed.

# %%
#| default_exp argv

# %% [markdown]
# The one layer that reads argv. A command turns its parsed arguments into a typed request (`run_request`) with these
# helpers, and nothing past that point sees an argument list: `split_values` accepts both `--x a b` and `--x a,b`,
# `parse_seeds` refuses what is not a seed in one line, `add_executor_arguments` gives every command that runs notebooks
# the same options, `execution_of` reads them back as a checked `Execution`, and `changed_options` keeps the run options a
# command line set to something other than their default.

# %%
#| export
import argparse
from sparse_attention_repro.run_request import DEVICES, Execution, UsageError, checked_seeds, usable_cores
from sparse_attention_repro.options import option_defaults

# %%
from fastcore.test import test_eq, test_fail

# %%
#| export
def split_values(values):
    "Accept both `--x a b` and `--x a,b`."
    return [v for item in values for v in str(item).split(",") if v]

def parse_seeds(values):
    "Seeds given on the command line, as integers (`checked_seeds`), or a one-line `UsageError`."
    try: return checked_seeds(split_values(values))
    except ValueError as e:
        if isinstance(e, UsageError): raise
        raise UsageError(f"seeds must be integers, got {' '.join(map(str, values))}") from None

class Parser(argparse.ArgumentParser):
    "An argument parser whose refusals are `UsageError`s: one line on stderr and status 2, not a usage dump."
    def error(self, message): raise UsageError(message)

def add_executor_arguments(sp):
    "Options shared by the commands that run notebooks: parallelism, executor, data download, device."
    jobs = dict(type=int, default=min(4, usable_cores()), help="notebooks run in parallel (local) / LocalCluster workers (dask)")
    sp.add_argument("--jobs", **jobs)
    sp.add_argument("--executor", default="local", help="local (threads driving kernels) or dask (dask.distributed)")
    sp.add_argument("--scheduler", default=None, help="dask scheduler address (tcp://host:8786); none = a LocalCluster")
    sp.add_argument("--download", action="store_true", help="fetch missing datasets from their official online sources")
    sp.add_argument("--device", default="auto", choices=DEVICES, help="auto = CUDA when available, else CPU")

def execution_of(args) -> Execution:
    "The parsed executor options (`add_executor_arguments`) as a checked `Execution`."
    return Execution(args.jobs, args.executor, args.scheduler, args.device, args.download).check()

def changed_options(schema, args) -> dict:
    "The options of `schema` given on the command line with a value other than their default."
    given = vars(args)
    return {k: given[k] for k, v in option_defaults(schema).items() if given[k] != v}

# %%
test_eq(split_values(["a,b", "c"]), ["a", "b", "c"]); test_eq(parse_seeds(["0,2", 5]), [0, 2, 5])
test_fail(lambda: parse_seeds(["-1"]), exc=UsageError, contains=">= 0"); test_fail(lambda: parse_seeds(["x"]), exc=UsageError, contains="integers")
_p = Parser(); add_executor_arguments(_p)
test_eq(execution_of(_p.parse_args(["--jobs", "2", "--device", "cpu"])), Execution(jobs=2, device="cpu"))
test_fail(lambda: execution_of(_p.parse_args(["--jobs", "0"])), exc=UsageError, contains="--jobs must be >= 1")
test_fail(lambda: _p.parse_args(["--jobs", "x"]), exc=UsageError, contains="invalid int value")
