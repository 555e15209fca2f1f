"`sparse-repro bench`: the benchmark commands run end to end on real data and print their ratio tables."
import pytest
from conftest import cli

pytestmark = pytest.mark.slow                   # benchmarks run in CI's slow step

def test_bench_grid_prints_ratios_and_projection(data_root):
    r = cli("bench", "grid", "--datasets", "fashion_mnist", "--train-limit", "192")
    assert r.returncode == 0, r.stderr
    for text in ("relative to softmax", "headwise_adaptive_entmax", "speedup", "projected"):
        assert text in r.stdout, (text, r.stdout)

def test_bench_normalizers_prints_every_normalizer():
    r = cli("bench", "normalizers", "--repeats", "1")
    assert r.returncode == 0, r.stderr
    for text in ("sparsemax", "entmax15", "topk_softmax_05", "entmax_pkg", "kernels", "torch"):
        assert text in r.stdout, (text, r.stdout)

def test_bench_steps_prints_each_attention_path(data_root):
    "`bench steps`: a table per precision with the torch path at 1 and a ratio for each fused path, every paper method."
    r = cli("bench", "steps", "--datasets", "fashion_mnist", "--repeats", "2")
    assert r.returncode == 0, r.stderr
    assert "fashion_mnist, fp32" in r.stdout and "fused_block" in r.stdout and "torch_ms" in r.stdout, r.stdout
    rows = [l.split() for l in r.stdout.splitlines() if l.startswith("softmax")]
    assert rows and all(l[1] == "1.0" for l in rows), r.stdout                     # the torch path against itself

def test_bench_stack_prints_speedup_and_identical_results(data_root):
    r = cli("bench", "stack", "--datasets", "fashion_mnist", "--train-limit", "192", "--stack-seeds", "2", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if l.startswith("fashion_mnist")][0].split()
    assert line[1:4] == ["2", "14", "cpu"] and line[-1] == "14.0", r.stdout       # every accuracy identical on the CPU
    bad = cli("bench", "stack", "--stack-seeds", "0")
    assert bad.returncode == 2 and "--stack-seeds must be >= 1" in bad.stderr, bad.stderr

def test_bench_profile_writes_rows_and_times(data_root, tmp_path):
    r = cli("bench", "profile", "--profile", "smoke", "--datasets", "synthetic_marker", "--stack-seeds", "2", "--device", "cpu",
            "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    import pandas as pd
    rows, times = pd.read_csv(tmp_path / "runs.csv"), pd.read_csv(tmp_path / "times.csv")
    assert len(rows) == 2 * 7 and (rows.status == "ok").all() and set(rows.seed) == {0, 1}
    assert times.dataset.tolist() == ["synthetic_marker"] and (times.seconds_stacked > 0).all(), times
    anchor = pd.read_csv(tmp_path / "lockstep_runs.csv")                  # seed 0 on the lock-step path: each method timed
    assert len(anchor) == 7 and set(anchor.seed) == {0} and (anchor.train_seconds > 0).all()
    assert "lock-step projected" in r.stdout, r.stdout

def test_bench_fair_cost_reads_the_committed_grids_and_projects_halving():
    "`bench fair-cost` on the committed tuned grids: core-hours per arm, the cheaper rules checked, and the halving projection below the cost as run."
    from conftest import ROOT
    import re
    r = cli("bench", "fair-cost", "--results", ROOT / "outputs" / "paper")
    assert r.returncode == 0, r.stderr
    assert "halving: all rates a third, best two to the end" in r.stdout and "core-hours per arm" in r.stdout
    run, projected = map(float, re.search(r"sum over datasets: ([\d.]+) as run, ([\d.]+) projected", r.stdout).groups())
    assert 0 < projected < run, r.stdout
    bad = cli("bench", "fair-cost", "--results", ROOT / "outputs" / "literature")
    assert bad.returncode == 2 and "needs one results folder with tuned grids" in bad.stderr, bad.stderr
    halved = cli("bench", "fair-cost", "--results", ROOT / "outputs" / "literature" / "fair" / "scalable_softmax")
    assert halved.returncode == 0 and "searched by halving" in halved.stdout and "core-hours per arm" in halved.stdout, halved.stderr
