# %% [markdown]
# # Run options
# > One schema per kind of run: a configuration dataclass whose option fields are also the command line, the manifest and the notebook parameters.

# %%
#| default_exp options

# %% [markdown]
# A run's settings live in one dataclass — `train.TrainConfig` for study A, `crisp.FinetuneConfig` for Crisp. A field
# declared with `option(...)` is also a command-line option (`val_fraction` is `--val-fraction`), an entry of the results
# folder's manifest, and part of the `options` an experiment notebook passes back to the library. So a new option is one
# field with its help text and, where needed, its check; its one-line error and exit 2 come with it. `unset` is the
# command-line value meaning "the profile's" (e.g. `--lr 0`).

# %%
#| export
from dataclasses import field, fields

# %%
from dataclasses import dataclass
import argparse
from fastcore.test import test_eq, test_fail

# %%
#| export
def option(default, help: str, check=None, choices=None, unset=None):
    "A configuration field that is also a command-line option: its help, a check `v -> error text or None`, its choices, its 'unset' value."
    return field(default=default, metadata=dict(help=help, check=check, choices=choices, unset=unset))

def run_options(schema) -> list:
    "The fields of the dataclass `schema` that are command-line options, in declaration order."
    return [f for f in fields(schema) if "help" in f.metadata]

def option_defaults(schema) -> dict:
    "Each option's command-line default (its 'unset' value where it has one)."
    return {f.name: f.default if f.metadata["unset"] is None else f.metadata["unset"] for f in run_options(schema)}

def check_options(schema, options: dict):
    "Raise ValueError with one line for the first bad value of `options` (option names of `schema`)."
    known = {f.name: f for f in run_options(schema)}
    for k, v in options.items():
        if k not in known: raise ValueError(f"unknown option {k!r}; choose from {', '.join(known)}")
        m, flag = known[k].metadata, "--" + k.replace("_", "-")
        if m["choices"] and v not in m["choices"]: raise ValueError(f"unknown {flag} {v!r}; choose one of {', '.join(m['choices'])}")
        if m["check"] and (msg := m["check"](v)): raise ValueError(f"{flag} {msg}, got {v}")

def config_from_options(schema, options: dict) -> dict:
    "`options` as overrides of `schema`'s fields: an option at its 'unset' value is left to the profile."
    check_options(schema, options)
    unset = {f.name: f.metadata["unset"] for f in run_options(schema)}
    return {k: v for k, v in options.items() if unset[k] is None or v != unset[k]}

def add_option_arguments(parser, schema):
    "Add each option of `schema` to the argparse `parser`: a flag for a bool, a typed value otherwise."
    defaults = option_defaults(schema)
    for f in run_options(schema):
        default, flag = defaults[f.name], "--" + f.name.replace("_", "-")
        if isinstance(default, bool): parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        else: parser.add_argument(flag, type=type(default), default=default, help=f.metadata["help"])

def option_flags(options: dict) -> list:
    "`options` written as the command-line flags that give them (to print a command; nothing parses it back)."
    out = []
    for k, v in options.items():
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else [] if v is False else [flag, f"{v:g}" if isinstance(v, float) else str(v)]
    return out

# %% [markdown]
# A toy schema shows the contract: options in declaration order, "unset" values left to the profile, one line per bad
# value naming the flag, and the command line built from the fields.

# %%
@dataclass
class _Toy:
    lr: float = option(1e-3, "learning rate (0 = the profile's)", lambda v: None if 0 <= v < 1 else "must be in (0, 1)", unset=0.0)
    mode: str = option("a", "a | b", choices=("a", "b"))
    flag: bool = option(False, "a switch")
    hidden: int = 3

test_eq([f.name for f in run_options(_Toy)], ["lr", "mode", "flag"])
test_eq(option_defaults(_Toy), dict(lr=0.0, mode="a", flag=False))
test_eq(config_from_options(_Toy, dict(lr=0.0, mode="b", flag=True)), dict(mode="b", flag=True))
for bad, msg in [(dict(lr=2.0), "--lr must be in (0, 1), got 2.0"), (dict(mode="c"), "unknown --mode 'c'; choose one of a, b"),
                 (dict(hidden=1), "unknown option 'hidden'; choose from lr, mode, flag")]:
    test_fail(lambda: check_options(_Toy, bad), contains=msg)
parser = argparse.ArgumentParser(); add_option_arguments(parser, _Toy)
test_eq(vars(parser.parse_args(["--lr", "0.01", "--flag"])), dict(lr=0.01, mode="a", flag=True))
test_eq(option_flags(dict(lr=3e-3, mode="b", flag=True, other=False)), ["--lr", "0.003", "--mode", "b", "--flag"])
test_eq(vars(parser.parse_args(option_flags(dict(lr=0.01, flag=True)))), dict(lr=0.01, mode="a", flag=True))   # what the parser reads back
