# %% [markdown]
# # The catalogue of experiments
# > Every experiment of the project as one typed declaration: its question, its design, where its runs live, and how it is judged.

# %%
#| default_exp catalogue

# %% [markdown]
# An experiment here is data, not code: a question, a **design** (the study, its datasets, methods, run options and
# seeds), the **folder** its runs live in (relative to a results root such as `outputs/paper`), and its **analysis**
# (what kind of comparison it is, its Holm family and its equivalence margin). The command line runs the grid
# entries by name (`sparse-repro ablations --only patch4`, `sparse-repro follow-ups --only alpha_start`), the report
# reads them, and `outputs_index` writes the index of the committed folders (`outputs/README.md`) from them, each with
# its verdict line read from the committed tables. A new ablation or follow-up is one entry here.
#
# Run options are the `TrainConfig` / `FinetuneConfig` options by name (`mask_padding=True`, `patch_size=4`); an
# entry's grid arguments are built from them, never written as a command-line string and parsed back.

# %%
#| export
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from sparse_attention_repro.study import BASELINE, PAPER_METHODS, CRISP_CONFIGS, STUDIES, EQUIVALENCE_MARGINS

# %%
from fastcore.test import test_eq, test_fail

# %%
#| export
@dataclass(frozen=True)
class Design:
    "What runs: the study, its datasets and methods (empty: the study's own), run options by name, seeds (None: the profile's)."
    study: str = "study_a"
    datasets: tuple = ()
    methods: tuple = ()
    options: dict = field(default_factory=dict)
    seeds: tuple | None = None
    rename: dict = field(default_factory=dict)      # a method that stands in for a paper method in the analysis
    profile: str = ""               # the profile its committed runs used ("": its study's, `STUDY_PROFILES`)
    baseline: str | None = None     # a results root whose main grid it is paired with, seed by seed (`grid --baseline`)

STUDY_PROFILES = {"study_a": "paper", "crisp": "quick", "length": "protocol"}   # the profiles of the committed runs

@dataclass(frozen=True)
class Analysis:
    "How it is judged: the kind of comparison, its Holm family (None: its own) and its equivalence margin (a fraction)."
    kind: str
    family: str | None = None
    margin: float | None = None
    reading: str | None = None      # the name its rows carry in the report's tables (`source`), where it differs from its own

@dataclass(frozen=True)
class Experiment:
    "One experiment: its question, design, folder (relative to a results root), analysis, and the runner that makes it."
    name: str
    question: str
    folder: str
    design: Design
    analysis: Analysis
    runner: str = "grid"            # the `sparse-repro` command that makes it: grid, ablations, follow-ups, tuned, crisp, …
    root: str = "paper"             # the committed results root under `outputs/` that holds this project's runs of it

    def expected_tests(self) -> set:
        "The (dataset, method) comparisons with the baseline this experiment contributes when complete (methods renamed)."
        methods = self.design.methods or PAPER_METHODS
        return {(ds, self.design.rename.get(m, m)) for ds in self.design.datasets for m in methods if m != BASELINE}

# %% [markdown]
# ## The entries
#
# The main grid and its re-run with a validation split; the confound ablations (each one change on the main runs'
# subsets, training the methods its question is about); the follow-ups; the recipe grids; Crisp and its checks; the
# outside normalizers against the committed baselines; and the paired checks of the speed paths. Their margins are
# those fixed in the protocol notebook before the runs (`stats.EQUIVALENCE_MARGINS`).

# %%
#| export
_SPARSE = tuple(m for m in PAPER_METHODS if m != BASELINE)

CATALOGUE = {e.name: e for e in [
    Experiment("main", "Do the sparse normalizers beat softmax under the paper's recipe (AdamW 1e-3, 6–8 epochs), per dataset?",
               ".", Design(), Analysis("paired_vs_softmax", family="main and kmnist (the paper's)")),
    Experiment("validation_rerun", "Does choosing the top-k ratio on a validation split, not on test, change the choice or the gain?",
               "validation_rerun", Design(options=dict(val_fraction=0.25, epoch_eval=True)), Analysis("selection")),
    Experiment("masked_padding", "Does the 20 Newsgroups gain of the sparse methods survive when padding is masked?",
               "ablations/masked_padding", Design(datasets=("twenty_news",), methods=PAPER_METHODS, options=dict(mask_padding=True)),
               Analysis("ablation", family="ablations", margin=EQUIVALENCE_MARGINS["ablation"]), runner="ablations"),
    Experiment("original_gradient", "Do the entmax-1.5 and adaptive-entmax results depend on the original's approximate gradient?",
               "ablations/original_gradient", Design(datasets=("twenty_news", "fashion_mnist"),
                                                      methods=("entmax15_bisect", "headwise_adaptive_entmax_bisect"),
                                                      rename={"entmax15_bisect": "entmax15",
                                                              "headwise_adaptive_entmax_bisect": "headwise_adaptive_entmax"},
                                                      seeds=tuple(range(6))),
               Analysis("ablation", family="ablations", margin=EQUIVALENCE_MARGINS["ablation"]), runner="ablations"),
    Experiment("patch4", "Does top-k's image gain survive with 4×4 patches (T = 50), where top-k is no longer a 3-of-17 gate?",
               "ablations/patch4", Design(datasets=("fashion_mnist",), methods=(BASELINE, "topk_softmax_0125", "topk_softmax_025", "topk_softmax_05"),
                                          options=dict(patch_size=4)), Analysis("ablation", family="ablations", margin=EQUIVALENCE_MARGINS["ablation"]), runner="ablations"),
    Experiment("learnable_marker", "Does any normalizer find the marker when the task can be learned?",
               "ablations/learnable_marker", Design(datasets=("synthetic_marker",), options=dict(marker_vocab=12), seeds=tuple(range(6))),
               Analysis("ablation", family="ablations", margin=EQUIVALENCE_MARGINS["ablation"]), runner="ablations"),
    Experiment("jpeg_control", "Does lossy input (JPEG quality 75, as the offline CIFAR-10 copy) change the top-k gains on Fashion-MNIST?",
               "ablations/jpeg_control", Design(datasets=("fashion_mnist",), options=dict(jpeg_quality=75)),
               Analysis("ablation", family="ablations", margin=EQUIVALENCE_MARGINS["ablation"]), runner="ablations"),
    Experiment("learned_pad_row", "How much does a learned padding embedding change the 20 Newsgroups results?",
               "ablations/learned_pad_row", Design(datasets=("twenty_news",), methods=(BASELINE, "sparsemax", "entmax15", "headwise_adaptive_entmax"),
                                                   options=dict(learned_pad_row=True)),
               Analysis("ablation", family="ablations", margin=EQUIVALENCE_MARGINS["ablation"]), runner="ablations"),
    Experiment("alpha_start", "Does the learned α settle near 1.51 from any start, or stay where it starts?",
               "follow_ups/alpha_start", Design(datasets=("fashion_mnist", "twenty_news"),
                                                methods=("headwise_adaptive_entmax_start12", "headwise_adaptive_entmax_start18")),
               Analysis("alpha_start", margin=EQUIVALENCE_MARGINS["alpha_start"]), runner="follow-ups"),
    Experiment("selection_marker", "On a marker task whose one informative token must be picked out of 97, does any normalizer find "
               "it faster or better?", "follow_ups/selection_marker",
               Design(datasets=("synthetic_marker",), options=dict(marker_design="label_once", epochs=3, epoch_eval=True, val_fraction=0.25)),
               Analysis("paired_vs_softmax"), runner="follow-ups"),
    Experiment("selection_marker_budget", "How many epochs does softmax need on the balanced marker task (one seed, the budget check)?",
               "follow_ups/selection_marker_budget", Design(datasets=("synthetic_marker",), methods=(BASELINE,), seeds=(0,),
                                                            options=dict(marker_design="balanced", epochs=30, epoch_eval=True, val_fraction=0.25)),
               Analysis("budget_probe")),
    Experiment("label_once_probe", "Can softmax learn the label-once marker task in 6 epochs (one seed, the budget check)?",
               "follow_ups/label_once_probe", Design(datasets=("synthetic_marker",), methods=(BASELINE,), seeds=(0,),
                                                     options=dict(marker_design="label_once", epochs=6, epoch_eval=True, val_fraction=0.25)),
               Analysis("budget_probe")),
    Experiment("recipes", "First round of fair recipes: do entmax-1.5's and one top-k ratio's gains survive when every arm trains longer "
               "at its own learning rate?", "recipes", Design(datasets=("cifar10", "fashion_mnist", "twenty_news"),
                                                               methods=(BASELINE, "entmax15", "topk_softmax_0125", "topk_softmax_025")),
               Analysis("tuned", family="main and kmnist (the paper's)", margin=EQUIVALENCE_MARGINS["recipe"], reading="first round"), runner="grid"),
    Experiment("tuned", "With every arm at its own learning rate and length chosen on validation, does any sparse gain over softmax persist?",
               "tuned", Design(datasets=("cifar10", "fashion_mnist", "twenty_news", "kmnist")),
               Analysis("tuned", family="main and kmnist (the paper's)", margin=EQUIVALENCE_MARGINS["recipe"]), runner="tuned"),
    Experiment("attention_maps", "Where does the CLS token look, per method (one seed, a few test items)?", "attention_maps",
               Design(datasets=("fashion_mnist", "cifar10", "twenty_news"), seeds=(0,)), Analysis("record"), runner="attention-maps"),
    Experiment("crisp", "Does percentile masking before the softmax beat dense fine-tuning on SST-2, over seeds, on validation and test?",
               ".", Design(study="crisp", methods=CRISP_CONFIGS, seeds=tuple(range(5))), Analysis("crisp", family="crisp", margin=EQUIVALENCE_MARGINS["crisp"]), runner="crisp"),
    Experiment("crisp_normalizers", "Does any of study A's normalizers, in every layer of the pretrained encoder, beat dense on SST-2?",
               "crisp_normalizers", Design(study="crisp", methods=(
                   "sparsemax", "entmax15", "headwise_adaptive_entmax", "topk_softmax_0125", "topk_softmax_025", "topk_softmax_05",
                   "sigmoid_attention", "scalable_softmax", "softpick", "relu_attention", "softmax_sink", "stick_breaking", "normmax",
                   "learned_temperature_softmax"), seeds=tuple(range(5))), Analysis("crisp", family="crisp normalizers", margin=EQUIVALENCE_MARGINS["crisp"]), runner="crisp"),
    Experiment("crisp_lr_check", "Does Crisp's verdict hold at another learning rate (2e-5)?", "crisp_lr_check",
               Design(study="crisp", methods=("dense", "adaptive_080"), options=dict(lr=2e-5), seeds=tuple(range(5))), Analysis("crisp", margin=EQUIVALENCE_MARGINS["crisp"]), runner="crisp"),
    Experiment("literature", "Do three normalizers from recent papers (sigmoid attention, Scalable-Softmax, softpick) beat the seven paper "
               "methods, paired by seed with the committed runs under the paper's recipe?", ".",
               Design(datasets=("cifar10", "fashion_mnist", "twenty_news", "synthetic_marker", "kmnist"),
                      methods=("sigmoid_attention", "scalable_softmax", "softpick"), baseline="paper"),
               Analysis("versus_baseline", family="each new method's own"), root="literature"),
    Experiment("literature_later", "Do four later normalizers of the example package (ReLU attention, softmax with a sink, stick-breaking, "
               "normmax) beat the seven paper methods under the paper's recipe, trained in the same folder as the first three?", ".",
               Design(datasets=("cifar10", "fashion_mnist", "twenty_news", "kmnist"),
                      methods=("relu_attention", "softmax_sink", "stick_breaking", "normmax"), baseline="paper"),
               Analysis("versus_baseline", family="each new method's own"), root="literature"),
    Experiment("learned_temperature", "Is Scalable-Softmax's 20 Newsgroups gain length scaling? At a fixed length s·log n is a learned "
               "per-head temperature: the learned-temperature softmax control, trained beside Scalable-Softmax and paired with it and "
               "with the committed runs under the paper's recipe",
               "learned_temperature", Design(datasets=("twenty_news",), methods=("learned_temperature_softmax", "scalable_softmax"), baseline="paper"),
               Analysis("versus_baseline", family="each new method's own"), root="literature"),
    Experiment("literature_masked_padding", "With 20 Newsgroups' padding masked (n = the real length), do the literature normalizers and "
               "the learned-temperature control still beat softmax? Paired with the masked-padding ablation's runs",
               "masked_padding", Design(datasets=("twenty_news",), methods=("scalable_softmax", "learned_temperature_softmax",
                                                                            "sigmoid_attention", "softpick", "relu_attention",
                                                                            "softmax_sink", "stick_breaking", "normmax"),
                                        options=dict(mask_padding=True), baseline="paper/ablations/masked_padding"),
               Analysis("versus_baseline", family="each new method's own"), root="literature"),
    *[Experiment(f"fair_{name}", f"At its own learning rate and length, chosen on validation (the tuned-recipe protocol, with "
                 f"halving), does {label} beat softmax and the other paper methods at theirs?", f"fair/{name}",
                 Design(datasets=("cifar10", "fashion_mnist", "twenty_news", "kmnist"), methods=(name,)),
                 Analysis("fair_verdict", family="each new method's own", margin=EQUIVALENCE_MARGINS["recipe"]), runner="tuned", root="literature")
      for name, label in (("scalable_softmax", "Scalable-Softmax"), ("sigmoid_attention", "sigmoid attention"), ("softpick", "softpick"),
                          ("relu_attention", "ReLU attention"), ("softmax_sink", "softmax with a sink"),
                          ("stick_breaking", "stick-breaking attention"), ("normmax", "normmax"),
                          ("learned_temperature_softmax", "the learned-temperature softmax (Scalable-Softmax's control)"))],
    Experiment("fashion_mnist_fast", "Does `--fast` (Philox masks, bf16, fused attention) change any Fashion-MNIST gain over softmax, paired "
               "by seed with the default path?", "fashion_mnist_fast", Design(datasets=("fashion_mnist",), options=dict(fast=True)),
               Analysis("speed_check", margin=EQUIVALENCE_MARGINS["fast_path"]), root="speed"),
    Experiment("twenty_news_fast", "Does `--fast` change any 20 Newsgroups gain over softmax, paired by seed with the default path?",
               "twenty_news_fast", Design(datasets=("twenty_news",), options=dict(fast=True)), Analysis("speed_check", margin=EQUIVALENCE_MARGINS["fast_path"]), root="speed"),
    Experiment("fashion_mnist_fused_block", "Does the fused block (C kernels for the residual LayerNorms and GELU beside fused attention) "
               "change any Fashion-MNIST gain over softmax, paired by seed with Philox + bf16 + fused attention?", "fashion_mnist_fused_block",
               Design(datasets=("fashion_mnist",), options=dict(attention="fused_block", dropout_rng="philox", precision="bf16")),
               Analysis("speed_check", margin=EQUIVALENCE_MARGINS["fast_path"]), root="speed"),
    Experiment("fashion_mnist_philox_bf16", "Philox masks with bf16 autocast alone, on Fashion-MNIST: the reference the fused path is paired with",
               "fashion_mnist_philox_bf16", Design(datasets=("fashion_mnist",), options=dict(dropout_rng="philox", precision="bf16")),
               Analysis("speed_check", margin=EQUIVALENCE_MARGINS["fast_path"]), root="speed"),
    Experiment("twenty_news_philox_bf16", "Philox masks with bf16 autocast alone, on 20 Newsgroups: the reference the fused path is paired with",
               "twenty_news_philox_bf16", Design(datasets=("twenty_news",), options=dict(dropout_rng="philox", precision="bf16")),
               Analysis("speed_check", margin=EQUIVALENCE_MARGINS["fast_path"]), root="speed"),
    Experiment("fashion_mnist_philox", "Philox masks alone, on Fashion-MNIST: does the dropout stream move the gains?",
               "fashion_mnist_philox", Design(datasets=("fashion_mnist",), options=dict(dropout_rng="philox")),
               Analysis("speed_check", margin=EQUIVALENCE_MARGINS["fast_path"]), root="speed"),
    Experiment("hae_lanes", "Does the adaptive entmax's lanes kernel give the committed results (Fashion-MNIST and KMNIST, seeds 0–9)?",
               "hae_lanes", Design(datasets=("fashion_mnist", "kmnist"), methods=(BASELINE, "headwise_adaptive_entmax")),
               Analysis("speed_check"), root="speed"),
    Experiment("floor_seed0", "How far is one seed's training from the machine's arithmetic floor (`bench floor`)?", "floor_seed0",
               Design(datasets=("fashion_mnist", "twenty_news"), seeds=(0,)), Analysis("speed_check"), root="speed"),
    Experiment("gpu_stacked_paper", "On a GPU, how long does the whole paper profile take on the stacked path (all seeds and methods of a "
               "dataset as one model), and does it reach the committed conclusions?", "gpu_stacked_paper",
               Design(datasets=("cifar10", "fashion_mnist", "twenty_news", "synthetic_marker", "kmnist")), Analysis("speed_check"),
               runner="bench", root="speed"),
    Experiment("quick", "The `quick` profile end to end (3 seeds of study A, 3 of Crisp, the report): what `sparse-repro reproduce` makes",
               "quick", Design(), Analysis("record"), runner="reproduce", root="example"),
    Experiment("crisp_learning_curve", "How many SST-2 training sentences does dense need before more stop paying (the budget check)?",
               "crisp_learning_curve", Design(study="crisp", methods=("dense",), seeds=(0,)), Analysis("budget_probe"), runner="crisp"),
    Experiment("length", "Trained at 32–64 tokens with every arm's rate and steps chosen on validation at those lengths, does any "
               "normalizer keep more exact match than softmax at 2–64 times the length, over seeds?", ".",
               Design(study="length", datasets=("flip_flop",)),
               Analysis("length", family="each task and position scheme", margin=EQUIVALENCE_MARGINS["length"]), runner="length", root="length"),
]}

# %% [markdown]
# Every entry's folder is unique, every grid entry's methods are registered paper methods (or named variants of them),
# and the ablations declare what the command line used to spell out: `patch4` trains softmax and the three top-k
# ratios on Fashion-MNIST with `--patch-size 4`.

# %%
test_eq(len({e.folder for e in CATALOGUE.values() if e.folder != "."}), len([e for e in CATALOGUE.values() if e.folder != "."]))
test_eq(CATALOGUE["patch4"].expected_tests(), {("fashion_mnist", m) for m in _SPARSE if m.startswith("topk")})
test_eq(CATALOGUE["original_gradient"].expected_tests(),
        {(d, m) for d in ("twenty_news", "fashion_mnist") for m in ("entmax15", "headwise_adaptive_entmax")})
test_eq([len(CATALOGUE[n].expected_tests()) for n in ("learnable_marker", "masked_padding")], [6, 6])

# %% [markdown]
# The command line's `ablations` and `follow-ups` run the entries of their runner; `entries` lists them in order.

# %%
#| export
def entries(runner=None, kind=None) -> dict:
    "The catalogue's entries (name -> Experiment) made by `runner` and/or judged as `kind`, in declaration order."
    return {n: e for n, e in CATALOGUE.items() if (runner is None or e.runner == runner) and (kind is None or e.analysis.kind == kind)}

ABLATIONS = entries(runner="ablations")
FOLLOW_UPS = entries(runner="follow-ups")

# %%
test_eq(list(ABLATIONS), ["masked_padding", "original_gradient", "patch4", "learnable_marker", "jpeg_control", "learned_pad_row"])
test_eq(list(FOLLOW_UPS), ["alpha_start", "selection_marker"])

# %% [markdown]
# ## The index of a results folder
#
# `outputs_index` lists each entry whose folder holds runs under a results root: its folder, its question and its
# verdict line, read from the committed tables the report wrote (`tables/*.csv`). The line counts verdict words; it
# types no number that is not in a table. An entry without a table of its own says where it is read.

# %%
#| export
def _count(words) -> str:
    "How many of each word: `3 undecided, 1 gone`."
    return ", ".join(f"{v} {k}" for k, v in pd.Series(list(words)).value_counts().items())

def _own_rows(t, e: Experiment):
    "The rows of `e`'s own methods (one folder may hold several entries' methods: `literature/` holds two)."
    return t[t.method.isin(e.design.methods)] if e.design.methods else t

def verdict_line(e: Experiment, root) -> str:
    "One line: what the committed tables of `root` say about `e` (counts of verdicts; nothing typed by hand)."
    tab, k = Path(root) / "tables", e.analysis.kind
    read = lambda name: pd.read_csv(tab / name) if (tab / name).exists() else None
    if k == "ablation" and (t := read("ablation_family.csv")) is not None and len(t := t[t.ablation == e.name]):
        return f"{len(t)} changes of a gain over softmax: {_count(t.change_word)} (Holm over all ablations, ±1 pt)"
    if k == "tuned" and (t := read("tuned_tests.csv")) is not None:
        t = t[(t.source == (e.analysis.reading or e.name)) & (t.baseline == BASELINE)]
        if len(t): return (f"{len(t)} tuned comparisons with softmax" + (" (read where the protocol's grid has not run yet)" if e.analysis.reading else "")
                           + f": {_count(t.word)}"
                           + (f" ({int((~t.complete).sum())} provisional: not every seed has run)" if (~t.complete).any() else ""))
    if k == "paired_vs_softmax" and e.name == "main" and (t := read("claims.csv")) is not None:
        t = t[t.study == "A"]
        return f"{len(t)} claims of the paper read under its recipe: {_count(t.verdict)} (the fair reading: `paper/tuned`)"
    if k == "crisp" and e.name == "crisp" and (t := read("claims.csv")) is not None and len(t := t[t.study == "B"]):
        return f"{len(t)} claims of Crisp Attention read: {_count(t.verdict)}"
    if k == "crisp" and e.name == "crisp_normalizers" and (t := read("crisp_normalizer_tests.csv")) is not None:
        return "against dense: " + "; ".join(f"{r.method} {100 * r.mean_delta:+.1f} pt on {r.family.rsplit('_', 1)[-1]} (Holm p {r.p_holm:.2g})"
                                             for r in t.itertuples())
    if k == "alpha_start" and (t := read("alpha_start.csv")) is not None:
        return f"{len(t)} (dataset, start, layer) readings: {_count(t.verdict)}"
    if (k == "versus_baseline" and (v := Path(root) / e.folder / "versus_baseline.csv").exists()
            and len(t := _own_rows(pd.read_csv(v).query("baseline == @BASELINE"), e))):
        recipe = "the paper's recipe" + "".join(f", {k}={v}" for k, v in e.design.options.items())
        def listed(sig, what):
            return f"{len(sig)} significant {what}" + (" (" + ", ".join(f"{r.method} on {r.dataset}" for r in sig.itertuples()) + ")" if len(sig) else "")
        return (f"{len(t)} comparison{'s' * (len(t) != 1)} with softmax at {recipe}, after Holm: "
                f"{listed(t[(t.p_holm < 0.05) & (t.mean_delta > 0)], 'gains')}; {listed(t[(t.p_holm < 0.05) & (t.mean_delta < 0)], 'losses')}")
    if k == "versus_baseline": return "runs in progress: the comparison is written when its grid finishes (rerun its command to resume)"
    if k == "fair_verdict" and (v := Path(root) / e.folder / "fair_verdict.csv").exists() and len(t := pd.read_csv(v).query("baseline == @BASELINE")):
        return (f"{len(t)} tuned comparison{'s' * (len(t) != 1)} with tuned softmax ({', '.join(t.dataset)}): {_count(t.word)}"
                + (f" ({int((~t.complete.astype(bool)).sum())} provisional: not every seed has run)" if (~t.complete.astype(bool)).any() else ""))
    if k == "fair_verdict": return "search in progress: the verdict is written as each dataset's grids finish (rerun its command to resume)"
    if k == "speed_check": return "paired checks in BENCHMARKS.md"
    if k == "length":
        gains, recipes = read("length_gains.csv"), Path(root) / "length_recipes.csv"
        if gains is not None and len(gains):
            return f"{len(gains)} (task, length, normalizer) gains over softmax: {_count(gains.verdict)} (Holm per task, ±5 pt)"
        if recipes.exists():
            return (f"select stage: {len(pd.read_csv(recipes))} arms' recipes chosen on validation; no test yet, so no verdict "
                    "(the complete stage tests them; rerun its command to resume)")
        return "select stage in progress (rerun its command to resume)"
    if k == "selection" and (t := read("selection.csv")) is not None:
        return f"validation chose the test-chosen top-k ratio on {int(t.same_choice.sum())} of {len(t)} datasets"
    return "read in the report"

OUTPUTS_HEADER = """# Committed results

Run results land here and are git-ignored, except the project's findings, which are committed: `paper/` (study A at
the paper's size, its ablations, follow-ups and recipe grids, the Crisp runs and the report), `literature/`
(normalizers from recent papers against the baselines of `paper/`), `length/` (the length study: train short, test
long; its weights are not committed), `speed/` (the paired checks of the opt-in fast
paths against the default one) and `example/` (the `quick` profile). `leaderboard.md` (with its `.csv` and `.png`)
lists every normalizer with committed runs, per dataset, under both recipes (`sparse-repro leaderboard`), and `cards/`
holds one page per normalizer (`sparse-repro card NAME`). The rendered notebooks are built into `site/` by
`sparse-repro site` (not committed).

This index is generated from the catalogue of experiments (`nbs/05c_catalogue.ipynb`) by `sparse-repro index`: every experiment whose
runs are committed here, its folder, its question, and its verdict line read from the committed tables (`tables/*.csv`
of its results root, written by `sparse-repro report`). A grid's folder holds `runs.csv` (or `crisp_runs.csv`), the
`manifest.json` of the options it was made with, one executed notebook per (dataset, seed) under `notebooks/`, and its
rows under `rows/`; a folder of several grids (`tuned/`, `recipes/`) holds one such folder per grid, and a record
(`attention_maps/`, the GPU timing) holds only its own files. The full reading of every experiment is the report, `paper/report.html`.
"""

def _has_runs(f: Path, nested: bool) -> bool:
    return any(s.results_path(f).exists() for s in STUDIES.values()) or (nested and f.is_dir() and any(f.iterdir()))

def outputs_index(outputs) -> str:
    "The markdown index of the catalogue's experiments with runs under `outputs` (one section per results root)."
    outputs, parts = Path(outputs), [OUTPUTS_HEADER]
    for root in dict.fromkeys(e.root for e in CATALOGUE.values()):
        rows = [f"| `{(Path(root) / e.folder).as_posix()}` | {e.name} | {e.question} | {verdict_line(e, outputs / root)} |"
                for e in CATALOGUE.values() if e.root == root and _has_runs(outputs / root / e.folder, e.folder != ".")]
        if rows: parts += [f"## `{root}/`", "", "| folder | experiment | question | verdict (from the tables) |", "|---|---|---|---|", *rows, ""]
    return "\n".join(parts)

# %% [markdown]
# On a folder made here: an ablation with its table is counted, an entry without runs is left out.

# %%
import tempfile
_o = Path(tempfile.mkdtemp()); _r = _o / "paper"; (_r / "tables").mkdir(parents=True); (_r / "ablations" / "patch4").mkdir(parents=True)
(_r / "ablations" / "patch4" / "runs.csv").write_text("dataset\n")
pd.DataFrame(dict(ablation=["patch4"] * 3, change_word=["equivalent", "undecided", "undecided"])).to_csv(
    _r / "tables" / "ablation_family.csv", index=False)
_ix = outputs_index(_o)
assert "| `paper/ablations/patch4` | patch4 |" in _ix and "3 changes of a gain over softmax: 2 undecided, 1 equivalent" in _ix
assert "masked_padding" not in _ix and "| `paper` |" not in _ix and "## `literature/`" not in _ix
(_o / "literature" / "masked_padding").mkdir(parents=True); (_o / "literature" / "masked_padding" / "runs.csv").write_text("dataset\n")
assert "runs in progress" in outputs_index(_o)              # a grid still running is listed as such, with no verdict
pd.DataFrame(dict(dataset=["kmnist"] * 4, method=["softpick", "relu_attention", "relu_attention", "normmax"], baseline=["softmax", "softmax", "entmax15", "softmax"],
                  mean_delta=[0.01, 0.02, 0.0, -0.03], p_holm=[0.5, 0.01, 0.9, 0.02])).to_csv(_o / "literature" / "versus_baseline.csv", index=False)
_lines = {e: verdict_line(CATALOGUE[e], _o / "literature") for e in ("literature", "literature_later")}   # one folder, two entries
test_eq(_lines["literature"], "1 comparison with softmax at the paper's recipe, after Holm: 0 significant gains; 0 significant losses")
test_eq(_lines["literature_later"], "2 comparisons with softmax at the paper's recipe, after Holm: 1 significant gains (relu_attention on kmnist); "
        "1 significant losses (normmax on kmnist)")
(_o / "literature" / "fair" / "scalable_softmax" / "tuned").mkdir(parents=True)
assert "search in progress" in outputs_index(_o)
pd.DataFrame(dict(dataset=["cifar10", "cifar10"], baseline=["softmax", "entmax15"], word=["gone", "undecided"], complete=[True, True])).to_csv(
    _o / "literature" / "fair" / "scalable_softmax" / "fair_verdict.csv", index=False)
assert "| `literature/fair/scalable_softmax` | fair_scalable_softmax |" in (_ix2 := outputs_index(_o)) and "1 tuned comparison with tuned softmax (cifar10): 1 gone" in _ix2
