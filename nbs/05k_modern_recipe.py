# %% [markdown]
# # The modern-recipe check
# > The four headline comparisons tuned again under a linear warm-up and a cosine decay: do their labels hold?

# %%
#| default_exp modern_recipe

# %% [markdown]
# The tuned-recipe protocol trains every arm at a constant learning rate, as the paper does. Today's recipes warm the
# rate up and decay it, and a sparse normalizer could need that more (or less) than softmax. This check, declared before
# its runs, tunes the four headline comparisons again under **linear warm-up over the first 5 % of the steps and cosine
# decay to zero at the run's end** (`train.lr_at`, the schedule of `transformers.get_cosine_schedule_with_warmup`):
#
# * CIFAR-10 top-k 0.25, Fashion-MNIST top-k 0.125, KMNIST top-k 0.25 and 20 Newsgroups entmax-1.5, each against
#   softmax (`MODERN_HEADLINES`);
# * the same search as the protocol's (the same rates, the next rate beyond an edge, the selection seeds 0–2, then
#   seeds 3–9 at each arm's chosen rate) and the same epoch choice on validation, **at the declared length only**: a
#   cosine schedule ends with its run, so a longer run is another schedule, not a continuation, and the edge rule's
#   longer run does not apply (`RecipeSearch.extend`);
# * the runs go to `<folder>/modern/tuned/`, apart from the protocol's;
# * each comparison is read with the protocol's paired test and words, Holm over the four, and set beside the committed
#   label: the label **holds** when the modern recipe gives the same word.
#
# `sparse-repro tuned --out outputs/paper --modern` runs it, stage by stage (`--stage select`, then `--stage complete`).

# %%
#| export
from dataclasses import replace
from pathlib import Path
import pandas as pd
from sparse_attention_repro.study import BASELINE
from sparse_attention_repro.stats import holm
from sparse_attention_repro.tuning import (TUNED_SEARCH, TUNED_MARGIN, choose_recipes, diverged, tuned_comparison, tuned_curves,
                                           tuned_runs, with_verdicts)

# %%
from fastcore.test import test_eq, test_close
import numpy as np, tempfile

# %%
#| export
MODERN_SCHEDULE = "warmup_cosine"      # train.SCHEDULES: the modern recipe's
MODERN_FOLDER = "modern"               # <folder>/modern/tuned/<dataset>_lr<rate>
MODERN_HEADLINES = {"cifar10": "topk_softmax_025", "fashion_mnist": "topk_softmax_0125", "kmnist": "topk_softmax_025",
                    "twenty_news": "entmax15"}   # the headline comparison of each dataset, each against softmax

def modern_search() -> dict:
    "The protocol's search (`tuning.TUNED_SEARCH`) for softmax and each dataset's headline arm, at the declared length only."
    return {ds: replace(TUNED_SEARCH[ds], methods=(BASELINE, m), extend=False) for ds, m in MODERN_HEADLINES.items()}

# %%
_ms = modern_search()
test_eq({ds: s.methods for ds, s in _ms.items()}["twenty_news"], ("softmax", "entmax15"))
test_eq([(s.lrs, s.epochs) for s in _ms.values()], [(TUNED_SEARCH[ds].lrs, TUNED_SEARCH[ds].epochs) for ds in _ms])   # the same search
assert not any(s.extend for s in _ms.values()) and all(s.extend for s in TUNED_SEARCH.values())

# %% [markdown]
# ## The reading
#
# `modern_check` chooses each arm's recipe from the modern runs by the protocol's rule, compares each headline arm with
# softmax paired by seed, Holm over the comparisons read, and joins the committed label (`committed`: the protocol's
# tuned tests).

# %%
#| export
MODERN_COLS = ["dataset", "method", "committed_word", "committed_gain", "recipe", "baseline_recipe", "complete", "n", "gain",
               "ci_low", "ci_high", "p", "p_holm", "p_tost", "word", "holds"]

def modern_check(curves, failed, committed) -> pd.DataFrame:
    """Each headline comparison under the modern recipe (`curves`, `failed`: its tuned grids), beside its committed label
    (`committed`, a `tuned_tests` table): the gain, Holm over the comparisons read, the word, and whether the label holds."""
    if not len(curves): return pd.DataFrame(columns=MODERN_COLS)
    rec = choose_recipes(curves, failed, modern_search())
    have = set(zip(rec.dataset, rec.method))
    r = rec.set_index(["dataset", "method"])
    rows = [tuned_comparison(curves, r, ds, m, BASELINE, "modern", TUNED_MARGIN) for ds, m in MODERN_HEADLINES.items()
            if {(ds, m), (ds, BASELINE)} <= have]
    if not rows: return pd.DataFrame(columns=MODERN_COLS)
    out = with_verdicts(holm(pd.DataFrame(rows)))
    c = committed[committed.baseline == BASELINE].set_index(["dataset", "method"])
    key = list(zip(out.dataset, out.method))
    out["committed_word"] = [c.word.get(k, "not read") for k in key]
    out["committed_gain"] = [c.gain.get(k, np.nan) for k in key]
    out["holds"] = out.word == out.committed_word
    return out[MODERN_COLS]

def modern_reading(results_dir, committed) -> pd.DataFrame:
    "`modern_check` of the modern grids under `results_dir/modern/` against `committed`, or None where none has run."
    runs = tuned_runs(Path(results_dir) / MODERN_FOLDER)
    return modern_check(tuned_curves(runs), diverged(runs), committed) if len(runs) else None

# %% [markdown]
# Hand-made modern curves on CIFAR-10 (every rate of the search on seeds 0–9, validation peaking at 10⁻³): top-k 0.25
# test 1 pt below softmax on every seed, with a little spread. Its committed label *undecided* does not hold: the modern
# recipe reads it *reversed*. The gain is the mean of the paired differences at the chosen epochs, by hand.

# %%
_rng = np.random.default_rng(1)
_noise = {(m, s): 0.002 * _rng.standard_normal() for m in ("softmax", "topk_softmax_025") for s in range(10)}
_curves = pd.DataFrame([dict(dataset="cifar10", method=m, seed=s, lr=lr, epoch=e, val_accuracy=0.5 - abs(np.log10(lr) + 3) * 0.1 - 0.001 * abs(e - 30),
                             val_loss=1.0, test_accuracy=0.47 - (0.01 if m != "softmax" else 0) + _noise[m, s] - 0.001 * abs(e - 30), test_loss=1.0)
                        for m in ("softmax", "topk_softmax_025") for s in range(10) for lr in TUNED_SEARCH["cifar10"].lrs for e in range(1, 37)])
_committed = pd.DataFrame(dict(dataset="cifar10", method=["topk_softmax_025"], baseline="softmax", word="undecided", gain=-0.0079))
_mc = modern_check(_curves, diverged(None), _committed)
test_eq(_mc[["dataset", "method", "recipe", "baseline_recipe", "n", "complete", "committed_word", "word", "holds"]].values.tolist(),
        [["cifar10", "topk_softmax_025", "lr 0.001, 30 ep", "lr 0.001, 30 ep", 10, True, "undecided", "reversed", False]])
test_close(_mc.gain.item(), np.mean([-0.01 + _noise["topk_softmax_025", s] - _noise["softmax", s] for s in range(10)]), eps=1e-12)
test_eq(len(modern_check(_curves[_curves.method == "softmax"], diverged(None), _committed)), 0)   # no headline arm yet: nothing read
test_eq(modern_reading(tempfile.mkdtemp(), _committed), None)
