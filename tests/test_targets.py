"""BENCHMARKS.md's targets table is what the committed measurement tables give: regenerated into a copy, it is the committed file."""
from conftest import ROOT, cli

def test_benchmarks_targets_table_is_the_committed_tables(tmp_path):
    """`sparse-repro targets` on a copy of BENCHMARKS.md, from the committed tables, leaves it byte for byte the committed
    file: no number or state in the table is typed by hand, and the table cannot drift from its tables."""
    from sparse_attention_repro.targets import TARGETS_MARKERS
    committed = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    copy = tmp_path / "BENCHMARKS.md"
    a, b = TARGETS_MARKERS
    copy.write_text(committed.replace(committed[committed.index(a) + len(a):committed.index(b)], "\nstale\n"), encoding="utf-8")
    res = cli("targets", "--outputs", ROOT / "outputs", "--benchmarks", copy)
    assert res.returncode == 0 and "updated; 10 targets" in res.stdout, res.stderr
    assert copy.read_text(encoding="utf-8") == committed, "BENCHMARKS.md's targets table is stale: run `sparse-repro targets`"
    import pandas as pd
    long = pd.read_csv(ROOT / "outputs" / "speed" / "long_attention.csv").query("normalizer == 'entmax15' and T == 4096 and `pass` == 'forward'")
    ratio = float(long.ratio_to_sdpa.iloc[0])                                     # entmax-1.5 at 4,096 tokens against <= 3x SDPA
    state = "met" if ratio <= 3 else f"missed by {round((ratio / 3 - 1) * 100)} %"
    row = next(line for line in committed.splitlines() if line.startswith("| entmax-1.5 forward at T = 4,096"))
    assert f"(median of per-round ratios) — entmax-1.5: {ratio:.2f}×" in row and row.endswith(f"| {state} |"), (ratio, row[-80:])
