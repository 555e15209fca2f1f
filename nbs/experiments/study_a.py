# ---
# skip_exec: true
# ---

# %% [markdown]
# # Study A — one dataset, every method, one seed or a few
# > Executed by `sparse-repro grid` with papermill, once per (dataset, seed) — or per (dataset, group of seeds) trained as
# > one stacked model with `--stack-seeds`; the executed copy is the runs' record.
#
# All methods run on the same train/test subsets and from the same initial weights (paired design). The logic lives in
# `sparse_attention_repro.train`; this notebook holds parameters and calls.

# %% tags=["parameters"]
dataset = "fashion_mnist"  # cifar10 | fashion_mnist | kmnist | twenty_news | synthetic_marker
seeds = [0]  # seeds of the subsets, the initial weights and the data order (each seed's runs are paired)
methods = ["softmax", "sparsemax", "entmax15", "headwise_adaptive_entmax", "topk_softmax_0125", "topk_softmax_025", "topk_softmax_05"]  # registered normalizer names, or package.module:name of an outside one
profile = "smoke"  # smoke | quick | paper
options = {}  # TrainConfig options by field name (learning rate, epochs, variants); sparse-repro grid passes its command-line options here
threads = 0  # torch CPU threads; 0 keeps the torch default
lockstep = True  # train the methods together, sharing batch order and dropout masks (same results as one by one)
stack = False  # train all seeds and methods as one stacked model (the GPU path; on the CPU the same results bit for bit)
rows_dir = "rows"  # one CSV per run is written to rows_dir/seed<k>/<method>.csv, atomically, as soon as it ends
download = False  # fetch the dataset from its official online source when no offline copy is found
device = "auto"  # auto (CUDA when available, else CPU) | cpu | cuda
keep_state = False  # keep each group's final training state (state-<group>.pt beside its rows) for a longer run to continue
continue_from = ""  # the rows folder of a shorter run made with keep_state: each group continues from its final state there

# %%
import pandas as pd
from sparse_attention_repro.train import run_study_a

# %%
rows = run_study_a(dataset, seeds, methods, profile, threads=threads, lockstep=lockstep, stack=stack, rows_dir=rows_dir,
                   keep_state=keep_state, continue_from=continue_from or None, download=download, device=device, **options)

# %%
pd.DataFrame(rows)[["seed", "method", "accuracy", "macro_f1", "test_loss", "nonzero_ratio", "learned_alpha_mean", "train_seconds", "status"]]
