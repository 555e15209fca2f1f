# ---
# skip_exec: true
# ---

# %% [markdown]
# # Study B — one Crisp configuration, one seed
# > Executed with papermill once per (config, seed); the executed copy is the run's record.
#
# Fine-tunes the profile's model on SST-2 with the chosen Crisp configuration and evaluates on validation (872) and the
# labelled test split (1821). The logic lives in `sparse_attention_repro.crisp`; this notebook holds parameters and calls.

# %% tags=["parameters"]
config: str = "dense"  # dense | fixed_080 | adaptive_060 | adaptive_080
seed: int = 0  # seed of the training subset, the classifier head, dropout and the data order
profile: str = "smoke"  # smoke | quick | paper
model: str = ""  # empty: the profile model; else minilm | tiny-distilbert | distilbert-base-uncased | a local folder
threads: int = 0  # torch CPU threads, 0 keeps the torch default
rows_path: str = "crisp_rows.csv"  # the result rows (one per eval split) are written here as CSV
download: bool = False  # fetch SST-2 from the Hugging Face hub when no offline copy is found
device: str = "auto"  # auto (CUDA when available, else CPU) | cpu | cuda
options: dict = {}  # FinetuneConfig options by field name (learning rate, training sentences, precision, scope); sparse-repro crisp passes its command-line options here

# %%
import pandas as pd
from sparse_attention_repro.crisp import run_crisp
from sparse_attention_repro.runner import save_rows

# %%
rows = run_crisp(config, seed, profile, model=model or None, threads=threads, download=download, device=device, **options)

# %%
pd.DataFrame(rows)[["config", "split", "n_eval", "accuracy", "sparsity_mean", "attention_entropy", "train_seconds", "status"]]

# %%
save_rows(rows, rows_path)
