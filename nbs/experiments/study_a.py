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
val_fraction = 0.0  # > 0 carves a validation split off the train subset
mask_padding = False  # variant: mask padding tokens (twenty_news)
patch_size = 0  # variant: 4 for 4x4 patches; 0 keeps the paper patches (7x7, 8x8)
marker_vocab = 20000  # variant: small vocabulary makes the marker task learnable
jpeg_quality = 0  # variant: pass image datasets through a JPEG codec at this quality; 0 turns it off
marker_design = "random"  # random (the paper's ids) | balanced (label tokens only, balanced counts: tests selection)
learned_pad_row = False  # variant: learn the padding embedding (the original keeps it zero and frozen)
dropout_rng = "torch"  # torch (nn.Dropout's masks) | philox (faster counter-based masks)
precision = "fp32"  # fp32 | bf16 (autocast)
lr = 0.0  # AdamW learning rate; 0 keeps the protocol's 1e-3
epochs = 0  # training epochs; 0 keeps the dataset's paper epochs
epoch_eval = False  # evaluate validation and test after every epoch (learning curves; training unchanged)
threads = 0  # torch CPU threads; 0 keeps the torch default
lockstep = True  # train the methods together, sharing batch order and dropout masks (same results as one by one)
stack = False  # train all seeds and methods as one stacked model (the GPU path; on the CPU the same results bit for bit)
rows_dir = "rows"  # one CSV per run is written to rows_dir/seed<k>/<method>.csv, atomically, as soon as it ends
download = False  # fetch the dataset from its official online source when no offline copy is found
device = "auto"  # auto (CUDA when available, else CPU) | cpu | cuda

# %%
import pandas as pd
from sparse_attention_repro.train import run_study_a

# %%
rows = run_study_a(dataset, seeds, methods, profile, threads=threads, lockstep=lockstep, stack=stack, val_fraction=val_fraction, mask_padding=mask_padding,
                   patch_size=patch_size or None, marker_vocab=marker_vocab, marker_design=marker_design, jpeg_quality=jpeg_quality, learned_pad_row=learned_pad_row, dropout_rng=dropout_rng, precision=precision, lr=lr, epochs=epochs, epoch_eval=epoch_eval, download=download, device=device, rows_dir=rows_dir)

# %%
pd.DataFrame(rows)[["seed", "method", "accuracy", "macro_f1", "test_loss", "nonzero_ratio", "learned_alpha_mean", "train_seconds", "status"]]
