# %% [markdown]
# # Speed targets
# > Every speed target declared once; its measured cell and its state computed from the committed measurement tables, and `BENCHMARKS.md`'s table written from them.

# %%
#| default_exp targets

# %% [markdown]
# `BENCHMARKS.md` opens with the state of every speed target. That table is generated: each target is declared here
# once (its words, its anchor, a threshold and a direction, and the measurement rows that decide it), the numbers come
# from `outputs/speed/targets_measured.csv` — one row per dated measurement, transcribed from the log below the table —
# and, where a committed table already holds a number (`long_attention.csv`, the GPU run's `times.csv`, the Xeon's
# calibration printout), from that table itself. The state (met, missed, or met on some cases and missed on others) is
# computed from the threshold, never typed. `sparse-repro targets` rewrites the block between two markers in
# `BENCHMARKS.md` and nothing else.

# %%
#| export
import math, operator
from dataclasses import dataclass
from itertools import takewhile
from pathlib import Path

import pandas as pd
from sparse_attention_repro.files import sync_block

# %%
from fastcore.test import test_eq, test_fail
import shutil, tempfile
import sparse_attention_repro
_root = Path(sparse_attention_repro.__file__).parent.parent

# %% [markdown]
# ## A target
#
# A target compares one number per measurement row — its *reading* — with a threshold: the row's value itself (a time
# ratio measured as such, core-hours, minutes), the value over its anchor's (a time ratio), or the anchor's over the
# value (a speed-up). A row's `case` (or the column `case_by` names) groups the readings the state speaks of: a case is
# met when every reading of it meets the threshold. The threshold is written into the target's words from its fields,
# so the number is declared once.

# %%
#| export
OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
SYMBOLS = {">=": "≥", "<=": "≤", ">": ">", "<": "<"}
READINGS = ("value", "value/anchor", "anchor/value")

@dataclass(frozen=True)
class Target:
    "One speed target: what it asks, what it is measured beside, the threshold its readings must meet, and the rows deciding it."
    id: str
    words: str                  # the target; `{}` is where its threshold goes (e.g. "≥ 4×")
    anchor: str                 # what it is measured side by side with
    threshold: float
    direction: str              # ">=", "<=", ">" or "<": how a reading must stand to the threshold
    unit: str                   # written after the threshold: "×", " %", " core-hour", " minutes"
    decides: tuple              # ids of its measurement rows that decide its state; its other rows are cited beside them
    reading: str = "value"      # what a row puts to the threshold: "value", "value/anchor" (a time ratio), "anchor/value" (a speed-up)
    case_by: str = "case"       # the row column whose values are the cases the state names
    total: str = ""             # when set, one more case of this name: the sum over the cases of each one's lowest reading
    note: str = ""              # words with no numbers, after the measured cell

    def __post_init__(self):
        if self.direction not in OPS: raise ValueError(f"target {self.id}: direction must be one of {', '.join(OPS)}, got {self.direction!r}")
        if self.reading not in READINGS: raise ValueError(f"target {self.id}: reading must be one of {', '.join(READINGS)}, got {self.reading!r}")

    def threshold_text(self) -> str: return f"{SYMBOLS[self.direction]} {self.threshold:g}{self.unit}"
    def text(self) -> str: return self.words.format(self.threshold_text())
    def meets(self, x) -> bool: return OPS[self.direction](x, self.threshold)

# %%
_t = Target("x", "top-k {} softmax", "softmax", 2, "<=", "×", ("a",))
test_eq((_t.text(), _t.meets(1.9), _t.meets(2.0), _t.meets(2.1)), ("top-k ≤ 2× softmax", True, True, False))
test_eq(Target("y", "speed-up {}", "", 0, ">", " %", ()).meets(0), False)
test_fail(lambda: Target("z", "", "", 1, "=>", "×", ()), contains="direction must be one of")
test_fail(lambda: Target("z", "", "", 1, ">=", "×", (), reading="ratio"), contains="reading must be one of")

# %% [markdown]
# ## The targets
#
# The speed targets of the project, in the order `BENCHMARKS.md` lists them. Words and anchors are the table's; each
# threshold is the one its words state. `decides` names the rows of `targets_measured.csv` whose readings decide the
# state: the newest ones of the current code, or the ones the target is about; the target's other rows (older readings,
# the anchor's parts, a paired check) are cited in its measured cell.

# %%
#| export
TARGETS = {t.id: t for t in [
    Target("fast_never_slower", "`--fast` {} the default path's speed on every CPU kind reached (never slower)",
           "the default path, in the same calibration run", 1, ">=", "×",
           ("fast_amd_fmnist", "fast_amd_20news", "fast_xeon_fmnist", "fast_first_run"), reading="anchor/value", case_by="cpu",
           note="`--fast` now times the default path and the lever sets the CPU's features predict, and keeps the default unless "
                "a set is clearly faster in every round; the first run is not yet measured on the Intel Xeon with AMX, where "
                "the old twelve-way calibration made it slower than the default."),
    Target("fast_vs_original", "`--fast` {} the original's script on Fashion-MNIST, KMNIST, 20 Newsgroups",
           "the original's `benchmark.py`, one core each", 4, ">=", "×",
           ("orig_fmnist", "orig_kmnist", "orig_20news", "orig_20news_again"), reading="anchor/value"),
    Target("fast_floor", "`--fast` {} its precision's arithmetic floor (Fashion-MNIST, 20 Newsgroups)", "`bench floor`", 2, "<=", "×",
           ("floor_fmnist_fp32", "floor_20news_fp32", "floor_fmnist_bf16", "floor_20news_bf16"), reading="value/anchor",
           note="`--fast` runs its linear layers in bf16 and its attention core in float32, so its own floor lies between the two."),
    Target("fused_block", "the fused block on the opt-in fast path, kept only where it pays: its gain over fused attention alone {}",
           "the torch path and fused attention, in the same `sparse-repro bench steps` run, step by step", 0, ">", " %",
           ("block_gain_20news_fp32", "block_gain_elsewhere"),
           note="Built: the block's elementwise layers in C, its matrix products torch's; `--fast`'s calibration times it and "
                "keeps it only where it measures fastest, and the paired check found the study's verdicts unchanged."),
    Target("fair_verdict_cost", "a fair (tuned) verdict for one new normalizer {}",
           "the executed tuned-grid notebooks' wall time × core share (`sparse-repro bench fair-cost --results outputs/literature/fair/<name>`)",
           1, "<=", " core-hour", ("fair_sigmoid_cifar10", "fair_relu_cifar10", "fair_ss_20news", "fair_base_fmnist", "fair_base_kmnist"),
           total="the four datasets together",
           note="The completion seeds at each chosen recipe are most of the cost, and the default path trains well above its fp32 "
                "arithmetic floor (`bench floor`): the target needs bf16 arithmetic near its floor, or a GPU. The 20 Newsgroups "
                "search ran before the curves' evaluation pass was made cheaper (log below)."),
    Target("long_time", "entmax-1.5 forward at T = 4,096 {} softmax's time through torch's SDPA (the length study's tests)",
           "softmax through `scaled_dot_product_attention` (`is_causal=True`) on the same queries, keys and values, interleaved in "
           "one process (`sparse-repro bench long`)", 3, "<=", "×", ("long_entmax15_fwd",)),
    Target("long_memory", "every paper normalizer in bounded memory at T = 4,096: its peak {} its peak at T = 1,024 (growing with T, not T²)",
           "the same normalizer at T = 1,024 in the same run (`sparse-repro bench long`), torch's SDPA beside it", 4, "<=", "×",
           ("long_peak_fwd", "long_peak_fwd_bwd"), reading="value/anchor",
           note="The decoder attends in blocks of queries, so its largest tensor grows with the block size times T."),
    Target("topk_t97", "top-k at T = 97 {} softmax (forward + backward)", "softmax in the same run", 2, "<=", "×",
           ("topk_bench_0125", "topk_bench_025", "topk_bench_05", "topk_build_against_build")),
    Target("learned_alpha", "learned-α entmax {} softmax (forward + backward)", "softmax in the same `bench normalizers` run", 3, "<=", "×",
           ("alpha_bench_t17", "alpha_bench_t97"),
           note="The newest readings were taken under load, which inflates the slower normalizers most (log below): upper bounds."),
    Target("gpu_profile", "GPU: the stacked path for the whole paper profile {}",
           "the default lock-step path on the same GPU, seed 0 of each dataset projected to ten seeds, in the same run", 5, "<=", " minutes",
           ("gpu_profile",)),
]}

# %%
test_eq(len(TARGETS), 10)
test_eq(TARGETS["fast_vs_original"].text(), "`--fast` ≥ 4× the original's script on Fashion-MNIST, KMNIST, 20 Newsgroups")
test_eq(TARGETS["gpu_profile"].text(), "GPU: the stacked path for the whole paper profile ≤ 5 minutes")
import re
for _x in TARGETS.values():                                  # numbers come from tables: a note holds none (names apart)
    assert "{}" in _x.words and not re.search(r"(?<!\w)\d", _x.note.replace("20 Newsgroups", "")), _x.id

# %% [markdown]
# ## The measurement table
#
# `outputs/speed/targets_measured.csv` holds one row per dated measurement a target reads: the target, the case, the
# date, the CPU (or GPU) as the log names it, what was measured, the value (a range as `value` to `value_high` where
# the log gives only a range), the anchor's value, the unit, the conditions (idle or under load, threads), the command
# that reproduces it, and its source — the dated section of `BENCHMARKS.md` it is transcribed from, or the committed
# table that holds it. A figure kept from the earlier hand-written table with no dated section behind it says so
# (`NOT_LOGGED`) and is marked in the generated table.

# %%
#| export
MEASURED = Path("speed") / "targets_measured.csv"          # under the outputs folder
COLUMNS = ("id", "target", "case", "date", "cpu", "quantity", "value", "value_high", "anchor_value", "unit", "conditions", "command", "source")
NOT_LOGGED = "targets table only"                           # the source of a figure with no dated section behind it
TARGETS_MARKERS = ("<!-- targets:start (generated by `sparse-repro targets` from outputs/speed/targets_measured.csv; do not edit) -->",
                   "<!-- targets:end -->")

# %% [markdown]
# Where a committed table holds a row's numbers, the row's `source` names the table, its value cells stay empty, and a
# `FromTable` says which of the table's rows and columns it reads — so the number exists once, in the table the
# benchmark wrote.

# %%
#| export
@dataclass(frozen=True)
class FromTable:
    "Where a committed table holds a measurement row's numbers: the rows chosen (a pandas query) and the column read, for the value and its anchor."
    where: str                  # the value's row(s) ("": every row)
    column: str
    anchor_where: str = ""      # the anchor's row(s), matched to the value's by `by` ("" with `anchor_column`: the value's rows)
    anchor_column: str = ""     # default: `column`
    by: str = ""                # a column naming each chosen row's case, when several rows are chosen
    total: bool = False         # the chosen rows' sum
    scale: float = 1.0          # e.g. 1/60: seconds to minutes
    digits: int | None = None   # decimals shown (None: three significant figures)

    def _pick(self, table, where, column) -> dict:
        rows = table.query(where) if where else table
        if rows.empty: raise ValueError(f"no row where {where}")
        if self.total: return {"": rows[column].sum() * self.scale}
        if self.by: return {str(k): v * self.scale for k, v in zip(rows[self.by], rows[column])}
        if len(rows) > 1: raise ValueError(f"{len(rows)} rows where {where}, expected one")
        return {"": rows[column].iloc[0] * self.scale}

    def numbers(self, table) -> list:
        "(case, value, anchor) of each chosen row of `table` (case '' for one row or a sum; anchor NaN without one)."
        values = self._pick(table, self.where, self.column)
        anchors = self._pick(table, self.anchor_where, self.anchor_column or self.column) if self.anchor_where or self.anchor_column else {}
        return [(k, v, anchors.get(k, math.nan)) for k, v in values.items()]

_LONG = "normalizer {} 'sdpa' and T == {} and `pass` == '{}'"
TABLE_ROWS = {
    "fast_xeon_fmnist": FromTable("levers == 'bf16+fused'", "fashion_mnist", "levers == 'default'", digits=2),
    "fast_xeon_bf16": FromTable("levers == 'bf16'", "fashion_mnist", "levers == 'default'", digits=2),
    "long_entmax15_fwd": FromTable("normalizer == 'entmax15' and T == 4096 and `pass` == 'forward'", "ratio_to_sdpa"),
    "long_softmax_fwd": FromTable("normalizer == 'softmax' and T == 4096 and `pass` == 'forward'", "ratio_to_sdpa"),
    "long_entmax15_fwd_ms": FromTable("normalizer == 'entmax15' and T == 4096 and `pass` == 'forward'", "ms", _LONG.format("==", 4096, "forward")),
    "long_peak_fwd": FromTable(_LONG.format("!=", 4096, "forward"), "peak_mb", _LONG.format("!=", 1024, "forward"), by="normalizer"),
    "long_peak_fwd_bwd": FromTable(_LONG.format("!=", 4096, "forward+backward"), "peak_mb", _LONG.format("!=", 1024, "forward+backward"), by="normalizer"),
    "long_peak_sdpa": FromTable("normalizer == 'sdpa' and T == 4096", "peak_mb", by="pass"),
    "gpu_profile": FromTable("", "seconds_stacked", anchor_column="seconds_lockstep_projected", total=True, scale=1 / 60),
}

# %%
_tab = pd.DataFrame(dict(normalizer=["sdpa", "a", "b", "sdpa", "a", "b"], T=[4, 4, 4, 8, 8, 8], ms=[1.0, 2, 3, 4, 10, 12]))
test_eq(FromTable("normalizer == 'a' and T == 8", "ms", "normalizer == 'sdpa' and T == 8").numbers(_tab), [("", 10.0, 4.0)])
test_eq(FromTable("normalizer != 'sdpa' and T == 8", "ms", "normalizer != 'sdpa' and T == 4", by="normalizer").numbers(_tab),
        [("a", 10.0, 2.0), ("b", 12.0, 3.0)])
(_case, _v, _a), = FromTable("", "ms", total=True, scale=0.5).numbers(_tab)
test_eq((_case, _v, math.isnan(_a)), ("", 16.0, True))          # the sum, no anchor
test_fail(lambda: FromTable("T == 5", "ms").numbers(_tab), contains="no row where T == 5")
test_fail(lambda: FromTable("T == 4", "ms").numbers(_tab), contains="3 rows where T == 4, expected one")

# %% [markdown]
# A committed table is a CSV, or the table `sparse-repro bench fast` prints (kept as text where the run printed it):
# one line per lever set, milliseconds per dataset.

# %%
#| export
def read_table(path) -> pd.DataFrame:
    "A committed measurement table: a CSV, or the printout of `sparse-repro bench fast` (a `levers` column, one column per dataset)."
    path = Path(path)
    if not path.is_file(): raise FileNotFoundError(f"{path} does not exist; the speed targets read it")
    if path.suffix == ".csv": return pd.read_csv(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    head = next((i for i, l in enumerate(lines) if l.startswith(" ") and l.strip()), None)   # the printed header: dataset names
    if head is None: raise ValueError(f"{path} holds no table printed by `sparse-repro bench fast`")
    body = [l.split() for l in takewhile(lambda l: l.strip() and not l.startswith("chosen"), lines[head + 1:])]
    return pd.DataFrame([[b[0], *map(float, b[1:])] for b in body], columns=["levers", *lines[head].split()])

# %%
_xeon = read_table(_root / "outputs" / "speed" / "gpu_stacked_paper" / "xeon_fast_calibration.txt")
test_eq((list(_xeon.columns), len(_xeon), _xeon.set_index("levers").fashion_mnist["bf16+fused"]), (["levers", "fashion_mnist"], 8, 142.30))
test_fail(lambda: read_table(Path(tempfile.mkdtemp()) / "none.csv"), exc=FileNotFoundError, contains="none.csv does not exist")

# %% [markdown]
# Numbers read from a table are shown to three significant figures (or the table's own decimals); numbers transcribed
# from the log are shown as the log writes them.

# %%
#| export
def fmt_number(x, digits=None) -> str:
    "`x` with `digits` decimals (None: three significant figures), thousands separated, a minus sign as −."
    if digits is None: digits = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 0
    return f"{x:,.{digits}f}".replace("-", "−")

def _number(text) -> float:
    "A transcribed number ('1,044', '-4', '+0.5'), or NaN for an empty cell."
    return float(text.replace(",", "").replace("−", "-")) if text else math.nan

# %%
test_eq([fmt_number(x) for x in (162.69, 46.78, 3.504, 1669.5, 0.0, -1.1)], ["163", "46.8", "3.50", "1,670", "0", "−1.10"])
test_eq(fmt_number(142.3, 2), "142.30")
test_eq((_number("1,044"), _number("+0.5"), math.isnan(_number(""))), (1044.0, 0.5, True))

# %% [markdown]
# The table is checked before it is read: every column, unique ids, known targets, each deciding row present and
# belonging to its target, a number in every transcribed row, and no copied number in a row its table holds.

# %%
#| export
def check_measurements(df, targets=TARGETS, where=MEASURED):
    "Refuse, in one line, a measurement table the targets cannot be read from."
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing: raise ValueError(f"{where} lacks the column(s) {', '.join(missing)}")
    dup = df.id[df.id.duplicated()].tolist()
    if dup: raise ValueError(f"{where}: the id(s) {', '.join(dup)} appear more than once")
    unknown = sorted(set(df.target) - set(targets))
    if unknown: raise ValueError(f"{where}: unknown target(s) {', '.join(unknown)}; declare them in TARGETS")
    owner = dict(zip(df.id, df.target))
    for t in targets.values():
        for i in t.decides:
            if owner.get(i) != t.id: raise ValueError(f"target {t.id} is decided by row {i}, which {where} " + ("gives to " + owner[i] if i in owner else "lacks"))
    for r in df.itertuples():
        if r.id in TABLE_ROWS and (r.value or r.value_high or r.anchor_value):
            raise ValueError(f"{where}: row {r.id} is read from {r.source}; leave its value cells empty instead of copying them")
        if r.id not in TABLE_ROWS:
            try: _number(r.value); _number(r.value_high); _number(r.anchor_value)
            except ValueError: raise ValueError(f"{where}: row {r.id} holds a value that is not a number") from None
            if not r.value: raise ValueError(f"{where}: row {r.id} has no value and no committed table to read it from")

# %%
_committed = pd.read_csv(_root / "outputs" / MEASURED, dtype=str, keep_default_na=False)
check_measurements(_committed)                                             # the committed table passes
test_fail(lambda: check_measurements(_committed.drop(columns="unit")), contains="lacks the column(s) unit")
test_fail(lambda: check_measurements(_committed.assign(target=_committed.target.replace("topk_t97", "topk"))), contains="unknown target(s) topk")
test_fail(lambda: check_measurements(_committed[_committed.id != "orig_kmnist"]), contains="decided by row orig_kmnist, which")
_copied = _committed.copy(); _copied.loc[_copied.id == "long_entmax15_fwd", "value"] = "3.50"
test_fail(lambda: check_measurements(_copied), contains="leave its value cells empty")
assert set(TABLE_ROWS) <= set(_committed.id)                               # every table reader has its row

# %% [markdown]
# Reading the measurements: the CSV as text (so a transcribed number keeps the digits the log gave it), each row a
# committed table holds filled from that table — one row per case where the reader chooses several. A missing file is
# one line naming it.

# %%
#| export
def read_measurements(outputs="outputs") -> pd.DataFrame:
    "Every measurement row of `outputs/speed/targets_measured.csv`, with numbers (`value`, `value_high`, `anchor_value`) and their shown text."
    path = Path(outputs) / MEASURED
    if not path.is_file(): raise FileNotFoundError(f"{path} does not exist; the speed targets are generated from it")
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    check_measurements(df, where=path)
    rows = []
    for r in df.to_dict("records"):
        text = {k: r[k].replace("-", "−") for k in ("value", "value_high", "anchor_value")}
        if r["id"] not in TABLE_ROWS:
            rows.append({**r, **{k: _number(r[k]) for k in text}, **{f"{k}_text": v for k, v in text.items()}})
            continue
        spec = TABLE_ROWS[r["id"]]
        try: got = spec.numbers(read_table(Path(outputs) / r["source"]))
        except (KeyError, ValueError, pd.errors.UndefinedVariableError) as e:
            raise ValueError(f"{Path(outputs) / r['source']} (row {r['id']}): {str(e).splitlines()[0]}") from None
        for case, v, a in got:
            rows.append({**r, "case": f"{r['case']} {case}".strip(), "value": v, "value_high": math.nan, "anchor_value": a,
                         "value_text": fmt_number(v, spec.digits), "value_high_text": "",
                         "anchor_value_text": "" if math.isnan(a) else fmt_number(a, spec.digits)})
    return pd.DataFrame(rows)

# %%
_m = read_measurements(_root / "outputs")
_e = _m.set_index("id").loc["long_entmax15_fwd"]                         # read from long_attention.csv, not copied
_csv = pd.read_csv(_root / "outputs" / "speed" / "long_attention.csv").query("normalizer == 'entmax15' and T == 4096 and `pass` == 'forward'")
test_eq((_e.value, _e.value_text), (_csv.ratio_to_sdpa.iloc[0], f"{_csv.ratio_to_sdpa.iloc[0]:.2f}"))
test_eq(len(_m.query("id == 'long_peak_fwd'")), 5)                           # one row per normalizer
test_eq(_m.set_index("id").loc["gpu_profile"].value_text, "3.34")
test_eq(_m.set_index("id").loc["orig_kmnist"][["value", "anchor_value_text"]].tolist(), [119.1, "294.6"])
_empty = Path(tempfile.mkdtemp())
test_fail(lambda: read_measurements(_empty), exc=FileNotFoundError, contains="targets_measured.csv does not exist")
(_empty / "speed").mkdir(); shutil.copy(_root / "outputs" / MEASURED, _empty / MEASURED)
test_fail(lambda: read_measurements(_empty), exc=FileNotFoundError, contains="does not exist; the speed targets read it")

# %% [markdown]
# ## Readings and states
#
# A row's readings are its value (both ends of a range), or its ratio to its anchor as the target says. A miss is
# told with its margin: how far the reading is from the threshold, as a share of it.

# %%
#| export
def readings(t: Target, r) -> list:
    "The numbers row `r` puts to target `t`'s threshold: its value (both ends of a range), or its ratio to its anchor's."
    values = [r.value] + ([] if math.isnan(r.value_high) else [r.value_high])
    if t.reading == "value": return values
    if math.isnan(r.anchor_value): raise ValueError(f"row {r.id} has no anchor value, and target {t.id} reads {t.reading}")
    return [v / r.anchor_value if t.reading == "value/anchor" else r.anchor_value / v for v in values]

def margin(t: Target, xs) -> str:
    "How far readings `xs` fall from `t`'s threshold: 'by 17 %' of it (in its unit where it is 0), or a range 'by 1–17 %'."
    if t.threshold: ps, unit = sorted({math.floor(abs(x / t.threshold - 1) * 100 + 0.5) for x in xs}), " %"
    else: ps, unit = sorted({abs(x) for x in xs}), t.unit
    shown = [fmt_number(p, 0) if t.threshold else fmt_number(p) for p in (ps[0], ps[-1])]
    return f"by {shown[0]}" + (f"–{shown[1]}" if len(ps) > 1 else "") + unit

# %%
_r = pd.Series(dict(id="r", value=63.5, value_high=math.nan, anchor_value=146.4))
test_eq([round(x, 4) for x in readings(Target("s", "{}", "", 4, ">=", "×", (), reading="anchor/value"), _r)], [2.3055])
_range = pd.Series(dict(id="q", value=2.02, value_high=2.33, anchor_value=math.nan))
test_eq(readings(Target("s", "{}", "", 2, "<=", "×", ()), _range), [2.02, 2.33])
test_fail(lambda: readings(Target("s", "{}", "", 2, "<=", "×", (), reading="value/anchor"), _range), contains="row q has no anchor value")
test_eq(margin(Target("s", "{}", "", 2, "<=", "×", ()), [2.02, 2.33, 2.05]), "by 1–17 %")
test_eq(margin(Target("s", "{}", "", 4, ">=", "×", ()), [2.3055]), "by 42 %")
test_eq(margin(Target("s", "{}", "", 0, ">", " %", ()), [-4.0]), "by 4.00 %")

# %% [markdown]
# The state is computed per case: met when every reading of the case meets the threshold, missed when none does, and
# partly met otherwise; a target is *met* when every case is, *missed* (with its margin) when none is, and otherwise
# says which cases are which. With `total`, the cases' lowest readings summed are one more case.

# %%
#| export
def _join(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]

def case_readings(t: Target, rows) -> dict:
    "{case: readings} of target `t`'s deciding rows (`rows`: its measurement rows), with the total case where `t` has one."
    cases = {}
    for r in rows[rows.id.isin(t.decides)].itertuples(): cases.setdefault(getattr(r, t.case_by), []).extend(readings(t, r))
    if t.total: cases[t.total] = [sum(min(xs) for xs in cases.values())]
    return cases

def target_state(t: Target, rows) -> str:
    "met, missed (by how much), or the cases met, partly met and missed — from `t`'s threshold and its deciding rows."
    cases = case_readings(t, rows)
    if not cases: raise ValueError(f"target {t.id} has no deciding rows among its measurements")
    ok = {c: [t.meets(x) for x in xs] for c, xs in cases.items()}
    met, missed = [c for c, m in ok.items() if all(m)], [c for c, m in ok.items() if not any(m)]
    partly = [c for c in cases if c not in met and c not in missed]
    if len(met) == len(cases): return "met"
    if len(missed) == len(cases): return f"missed {margin(t, [x for xs in cases.values() for x in xs])}"
    parts = [f"met on {_join(met)}"] if met else []
    if partly: parts.append(f"partly met on {_join(partly)}")
    if missed: parts.append(f"missed on {_join(f'{c} ({margin(t, cases[c])})' for c in missed)}")
    return "; ".join(parts)

# %% [markdown]
# On hand-made rows: the same readings meet a "≥ 4×" target on one case and miss it on the other, and a target of the
# opposite direction gives the opposite state — a direction read the wrong way round fails here.

# %%
def _rows(*rs): return pd.DataFrame([dict(id=i, case=c, cpu="cpu", value=v, value_high=math.nan, anchor_value=a) for i, c, v, a in rs])
_hand = _rows(("a", "Fashion-MNIST", 63.5, 146.4), ("b", "20 Newsgroups", 232.1, 933.1), ("c", "20 Newsgroups", 227.9, 953.4))
_up = Target("up", "{}", "", 4, ">=", "×", ("a", "b", "c"), reading="anchor/value")
test_eq(target_state(_up, _hand), "met on 20 Newsgroups; missed on Fashion-MNIST (by 42 %)")
test_eq(target_state(Target("down", "{}", "", 4, "<=", "×", ("a", "b", "c"), reading="anchor/value"), _hand),
        "met on Fashion-MNIST; missed on 20 Newsgroups (by 1–5 %)")
test_eq(target_state(Target("all", "{}", "", 2, ">=", "×", ("a", "b", "c"), reading="anchor/value"), _hand), "met")
test_eq(target_state(Target("none", "{}", "", 5, ">=", "×", ("b",), reading="anchor/value"), _hand), "missed by 20 %")
test_eq(target_state(Target("cpu", "{}", "", 4, ">=", "×", ("a", "b"), reading="anchor/value", case_by="cpu"), _hand), "partly met on cpu")
_cost = _rows(("x", "CIFAR-10", 0.4, math.nan), ("y", "CIFAR-10", 0.5, math.nan), ("z", "KMNIST", 1.11, math.nan))
test_eq(case_readings(Target("c", "{}", "", 1, "<=", "", ("x", "y", "z"), total="both"), _cost)["both"], [0.4 + 1.11])
test_eq(target_state(Target("c", "{}", "", 1, "<=", "", ("x", "y", "z"), total="both"), _cost), "met on CIFAR-10; missed on KMNIST (by 11 %) and both (by 51 %)")
test_fail(lambda: target_state(Target("e", "{}", "", 1, "<=", "", ("q",)), _cost), contains="no deciding rows")

# %% [markdown]
# ## The measured cell
#
# Every row of the target, deciding or cited, in the order of the table, one sentence per (date, CPU, conditions):
# what was measured, then each case with its numbers — value (or range) against the anchor's, and the reading the threshold
# takes where it is a ratio of the two. A figure with no dated section behind it is marked †.

# %%
#| export
def _with_unit(v, unit) -> str:
    return f"{v}×" if unit == "×" else f"p = {v}" if unit == "p" else f"{v} {unit}".strip()

def row_text(t: Target, r) -> str:
    "One row's case and numbers, as the measured cell shows them: 'KMNIST: 119.1 against 294.6 s (2.47×)'."
    v = r.value_text if not r.value_high_text else r.value_text + (" to " if r.value_text[0] in "−+" else "–") + r.value_high_text
    shown = _with_unit(f"{v} against {r.anchor_value_text}" if r.anchor_value_text else v, r.unit)
    if r.anchor_value_text and t.reading != "value": shown += f" ({fmt_number(readings(t, r)[0])}×)"
    return f"{r.case}: {shown}" + (" †" if r.source == NOT_LOGGED else "")

def measured_cell(t: Target, rows) -> str:
    "Target `t`'s measured cell from its measurement rows: one sentence per (date, CPU, conditions), each number with its case."
    sentences = []
    for (date, cpu, cond), g in rows.groupby(["date", "cpu", "conditions"], sort=False):
        parts = [f"{q} — " + ", ".join(row_text(t, r) for r in gq.itertuples()) for q, gq in g.groupby("quantity", sort=False)]
        sentences.append(f"{date}, {cpu}; {cond}: " + "; ".join(parts) + ".")
    if t.total:
        sentences.append(f"{t.total[0].upper() + t.total[1:]}, each case's lowest reading summed: "
                         f"{_with_unit(fmt_number(case_readings(t, rows)[t.total][0]), rows.unit.iloc[0])}.")
    return " ".join(sentences + [t.note] * bool(t.note))

# %%
_tm = _m[_m.target == "fast_vs_original"]
test_eq(row_text(TARGETS["fast_vs_original"], next(_tm.itertuples())), "Fashion-MNIST: 63.5 against 146.4 s (2.31×)")
assert measured_cell(TARGETS["fast_vs_original"], _tm).startswith("2026-12-02, AMD EPYC (AVX-512, AVX-512 BF16), 2 cores; idle, each pinned")
_gm = _m[_m.target == "fused_block"]
test_eq(row_text(TARGETS["fused_block"], next(_gm.iloc[1:2].itertuples())), "the other three (Fashion-MNIST in fp32 and bf16, 20 Newsgroups in bf16): −4 to +4 %")
_fm = _m[_m.target == "fair_verdict_cost"]
assert "The four datasets together, each case's lowest reading summed: 4.60 core-hours." in measured_cell(TARGETS["fair_verdict_cost"], _fm)
assert "ReLU attention's search, its length extended once — CIFAR-10: 0.50 core-hours †" in measured_cell(TARGETS["fair_verdict_cost"], _fm)

# %% [markdown]
# ## The table, and its block in `BENCHMARKS.md`
#
# One row per target: its words with the threshold, its anchor, the measured cell and the state. The block also says
# where it comes from and the newest measurement's date, and explains the † where a cell uses it.

# %%
#| export
def target_cells(outputs="outputs", targets=TARGETS) -> pd.DataFrame:
    "One row per target: `target` (its words), `anchor`, `measured` and `state`, computed from the measurement tables under `outputs`."
    m = read_measurements(outputs)
    rows = [dict(id=t.id, target=t.text(), anchor=t.anchor, measured=measured_cell(t, m[m.target == t.id]),
                 state=target_state(t, m[m.target == t.id]), newest=m[m.target == t.id].date.max()) for t in targets.values()]
    return pd.DataFrame(rows)

def targets_markdown(cells) -> str:
    "The generated block: where it comes from, the table, and the † legend where a cell uses it."
    cell = lambda s: s.replace("|", "\\|")
    lines = [f"Generated by `sparse-repro targets` from `outputs/speed/targets_measured.csv` and the committed tables it names; "
             f"newest measurement {cells.newest.max()}. Each state is computed from the target's threshold.", "",
             "| target | anchor (measured side by side with) | measured | state |", "|---|---|---|---|"]
    lines += [f"| {cell(r.target)} | {cell(r.anchor)} | {cell(r.measured)} | {cell(r.state)} |" for r in cells.itertuples()]
    if cells.measured.str.contains("†").any(): lines += ["", "† Not in a dated section below: kept from the earlier hand-written table."]
    return "\n".join(lines)

def write_targets(outputs="outputs", benchmarks="BENCHMARKS.md") -> bool:
    "Rewrite the targets block of `benchmarks` from the tables under `outputs`, atomically, nothing else; True when it changed."
    block = targets_markdown(target_cells(outputs))                   # the tables are read, and checked, first
    if not Path(benchmarks).is_file(): raise FileNotFoundError(f"{benchmarks} does not exist; give the BENCHMARKS.md to update")
    return sync_block(benchmarks, block, TARGETS_MARKERS, name="targets")

# %%
_cells = target_cells(_root / "outputs")
_r = _csv.ratio_to_sdpa.iloc[0]                                            # entmax-1.5's forward at 4,096 tokens over SDPA's, against <= 3x
test_eq(dict(zip(_cells.id, _cells.state))["long_time"], "met" if _r <= 3 else f"missed by {round((_r / 3 - 1) * 100)} %")
test_eq(dict(zip(_cells.id, _cells.state))["fast_vs_original"], "met on 20 Newsgroups; missed on Fashion-MNIST (by 42 %) and KMNIST (by 38 %)")

# %% [markdown]
# Writing replaces the block and leaves every other byte of the file as it was; a second write changes nothing; a page
# without the markers is refused in one line before anything is written.

# %%
_d = Path(tempfile.mkdtemp())
_page = "# Benchmarks\n\nBefore, with trailing spaces  \n\n" + "\n".join(TARGETS_MARKERS) + "\n\n## Log\n\nafter | a | b\n"
(_d / "B.md").write_text(_page, encoding="utf-8")
assert write_targets(_root / "outputs", _d / "B.md") and not write_targets(_root / "outputs", _d / "B.md")
_new = (_d / "B.md").read_text(encoding="utf-8")
_a, _b = _new.index(TARGETS_MARKERS[0]) + len(TARGETS_MARKERS[0]), _new.index(TARGETS_MARKERS[1])
test_eq(_new[:_a] + _new[_b:], _page.replace("\n".join(TARGETS_MARKERS), TARGETS_MARKERS[0] + TARGETS_MARKERS[1]))   # the rest byte-identical
test_eq(_new[_a:_b].strip(), targets_markdown(_cells))
(_d / "bare.md").write_text("# no block\n")
test_fail(lambda: write_targets(_root / "outputs", _d / "bare.md"), contains="has no targets block")
test_eq((_d / "bare.md").read_text(), "# no block\n")
test_fail(lambda: write_targets(_d / "none", _d / "B.md"), exc=FileNotFoundError, contains="targets_measured.csv does not exist")
test_fail(lambda: write_targets(_root / "outputs", _d / "none.md"), exc=FileNotFoundError, contains="none.md does not exist; give the BENCHMARKS.md")
test_eq(sorted(p.name for p in _d.iterdir()), ["B.md", "bare.md"])                                  # no temporary file left

# %% [markdown]
# The committed `BENCHMARKS.md` holds exactly what the committed tables give:

# %%
_bench = (_root / "BENCHMARKS.md").read_text(encoding="utf-8")
test_eq(_bench[_bench.index(TARGETS_MARKERS[0]) + len(TARGETS_MARKERS[0]):_bench.index(TARGETS_MARKERS[1])].strip(), targets_markdown(_cells))

# %% [markdown]
# ## The command
#
# `sparse-repro targets [--outputs outputs] [--benchmarks BENCHMARKS.md]` rewrites the block; a missing table or a page
# without the block is one line on stderr and status 2 (the command line's `main` turns these errors into that line).

# %%
#| export
def targets_parser(sub):
    "`targets`: the speed targets' table of BENCHMARKS.md, from the committed measurement tables."
    t = sub.add_parser("targets", help="rewrite the speed targets' table in BENCHMARKS.md from outputs/speed/targets_measured.csv "
                                       "and the committed tables it names, each state computed from its target's threshold")
    t.add_argument("--outputs", default="outputs", help="the folder of results roots (speed/targets_measured.csv is read there)")
    t.add_argument("--benchmarks", default="BENCHMARKS.md", help="the page holding the targets block")
    return t

def cmd_targets(args):
    "Rewrite the targets block of `--benchmarks`; returns no failures."
    changed = write_targets(args.outputs, args.benchmarks)
    states = target_cells(args.outputs).state
    print(f"targets: {args.benchmarks} {'updated' if changed else 'already current'}; {len(states)} targets, "
          f"{(states == 'met').sum()} met, {states.str.startswith('missed').sum()} missed, the others met on some cases")
    return {}

# %%
import argparse, contextlib, io
_p = argparse.ArgumentParser().add_subparsers(dest="command"); targets_parser(_p)
_args = _p.choices["targets"].parse_args(["--outputs", str(_root / "outputs"), "--benchmarks", str(_d / "B.md")])
with contextlib.redirect_stdout(io.StringIO()) as _out: test_eq(cmd_targets(_args), {})
assert "already current; 10 targets" in _out.getvalue(), _out.getvalue()
