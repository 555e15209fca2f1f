# ---
# skip_exec: true
# ---

# %% [markdown]
# # Length study — one run: train short, test long
# > Executed with papermill once per (task, normalizer, positions, learning rate, seed) to train, and again per tested step; the executed copy is the run's record.
#
# Trains the causal decoder on the task at its training lengths, validating every `eval_every` steps at those lengths
# only and keeping the weights (resumable: a rerun continues from the last kept step). With `test_step` > 0 it then
# tests the weights kept at that step at every `test_lengths` length on the shared test inputs. The logic lives in
# `sparse_attention_repro.length_train`; this notebook holds parameters and calls.

# %% tags=["parameters"]
run: dict = {}  # LengthRunConfig fields by name (task, normalizer, positions, seed, lr, steps, eval_every, warmup, batch_size, model shape)
run_folder: str = "run"  # the run's folder: its kept weights and training state
test_step: int = 0  # 0: train and write the validation curve; > 0: test the weights kept at this step
test_lengths: list = []  # input lengths to test at (with test_step > 0)
test_examples: int = 500  # shared test inputs per length
threads: int = 1  # torch CPU threads
rows_path: str = "rows.csv"  # the result rows are written here as CSV

# %%
import pandas as pd
from sparse_attention_repro.length_train import LengthRunConfig, train_run, test_or_fail, run_rows
from sparse_attention_repro.runner import save_rows

# %%
cfg = LengthRunConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in run.items()})
record = train_run(cfg, run_folder, threads=threads)
tested = test_or_fail(cfg, run_folder, record, test_step, test_lengths, test_examples, threads=threads) if test_step else []
rows = run_rows(cfg, record, tested)

# %%
pd.DataFrame(rows).tail(12)

# %%
save_rows(rows, rows_path)
