# %% [markdown]
# # The two studies' designs
# > Which methods each paper compared, against what, in which order: the study design, kept apart from the registry of normalizers.

# %%
#| default_exp study

# %% [markdown]
# The registry (`normalizers`) says which attention normalizers *exist*; this module says which ones each *paper*
# compared. Keeping the two apart is what lets anyone register a new normalizer without touching the papers' results:
# the paper's Holm families, its claims and its "6 of 6" verdicts are built from `PAPER_METHODS` alone, so adding a
# method to a results folder never changes them.
#
# * **Study A** (Canay 2026) compares six sparse normalizers against softmax: sparsemax, entmax-1.5, head-wise adaptive
#   entmax and top-k softmax keeping 12.5 %, 25 % and 50 % of the keys. The original code also has an approximate
#   (bisection) gradient for entmax, which our ablations use as a variant.
# * **Study B** (Crisp Attention, Gandhi & Gandhi 2025) compares dense fine-tuning with three percentile-masking
#   configurations.
#
# Names are the registry's canonical names (a top-k ratio without its dot).

# %%
#| export
BASELINE = "softmax"
PAPER_METHODS = ("softmax", "sparsemax", "entmax15", "headwise_adaptive_entmax",
                 "topk_softmax_0125", "topk_softmax_025", "topk_softmax_05")          # study A's seven arms, in the paper's order
ORIGINAL_GRADIENT_VARIANTS = ("entmax15_bisect", "headwise_adaptive_entmax_bisect")  # the original's approximate gradient
CRISP_BASELINE = "dense"
CRISP_CONFIGS = ("dense", "fixed_080", "adaptive_060", "adaptive_080")                # study B's four arms

def method_order(methods) -> list:
    "`methods` in table order: the paper's arms in the paper's order, then its variants, then any other method by name."
    known = PAPER_METHODS + ORIGINAL_GRADIENT_VARIANTS
    methods = list(dict.fromkeys(methods))
    return [m for m in known if m in methods] + sorted(m for m in methods if m not in known)

# %%
from fastcore.test import test_eq
test_eq(method_order(["sigmoid_attention", "topk_softmax_05", "softmax", "entmax15_bisect", "relu_attention"]),
        ["softmax", "topk_softmax_05", "entmax15_bisect", "relu_attention", "sigmoid_attention"])
test_eq(len(PAPER_METHODS), 7); assert BASELINE in PAPER_METHODS and CRISP_BASELINE in CRISP_CONFIGS
