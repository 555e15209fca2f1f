"""Study B end to end: the papermill experiment notebook of the smoke reproduce run, and repeatability of `run_crisp`."""
import json, math, os
from pathlib import Path

import pandas as pd
import pytest

from sparse_attention_repro.crisp import ROW_COLUMNS, run_crisp

@pytest.fixture(scope="module")
def sst2_root():
    root = os.environ.get("SPARSE_REPRO_DATA")
    if not root or not (Path(root) / "sst2" / "train.tsv").is_file():
        msg = "SPARSE_REPRO_DATA does not point at a folder with sst2/{train,validation,test}.tsv"
        if os.environ.get("CI"): pytest.fail(msg + " (missing data fails under CI)")
        pytest.skip(msg)
    return root

def test_experiment_notebook_smoke(smoke_results, sst2_root):
    "The Crisp experiment notebook as papermill ran it in `reproduce --profile smoke` (conftest): fixed 80 %, seed 0."
    assert (smoke_results / "notebooks" / "crisp" / "fixed_080" / "seed0.ipynb").exists()
    all_rows = pd.read_csv(smoke_results / "crisp_runs.csv")
    assert tuple(all_rows.columns) == ROW_COLUMNS
    df = all_rows[(all_rows.config == "fixed_080") & (all_rows.seed == 0)]
    assert sorted(df.split) == ["test", "validation"]
    assert (df.status == "ok").all() and (df.profile == "smoke").all()
    assert df.accuracy.between(0, 1).all() and df.accuracy.map(math.isfinite).all()
    assert (df.model_name == "tiny-distilbert(random)").all()
    assert all(len(json.loads(s)) == 2 for s in df.sparsity_per_layer)
    assert df.sparsity_mean.between(0.7, 0.8).all()      # nominal 80 %, ceil rounding keeps a little more

def test_same_seed_same_result(sst2_root):
    kw = dict(config="adaptive_060", seed=3, profile="smoke", threads=1, progress=False)
    a, b = run_crisp(**kw), run_crisp(**kw)
    for ra, rb in zip(a, b):
        assert ra["accuracy"] == rb["accuracy"] and ra["sparsity_per_layer"] == rb["sparsity_per_layer"]
        assert ra["attention_entropy"] == rb["attention_entropy"]

def test_crisp_cli_bad_input(tmp_path, capsys):
    "The `sparse-repro` script once, then the same entry point (`cli.main`) in process: status 2, one line, nothing written."
    from conftest import cli
    from sparse_attention_repro.cli import main
    res = cli("crisp", "--out", tmp_path / "out", "--scope", "matrix")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "unknown --scope 'matrix'; choose one of row, head" in res.stderr, res.stderr
    for args, msg in [(["--configs", "sparse_090"], "unknown Crisp config"), (["--profile", "huge"], "unknown profile"),
                      (["--seeds", "-1"], "seeds must be >= 0"), (["--lr", "2"], "--lr must be in (0, 1)"), (["--train-n", "-5"], "--train-n must be >= 0")]:
        assert main(["crisp", "--out", str(tmp_path / "out"), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, err
    assert not (tmp_path / "out").exists()
