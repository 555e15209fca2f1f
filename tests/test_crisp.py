"""Study B end to end: the papermill experiment notebook on the smoke profile, and repeatability of `run_crisp`."""
import json, math, os
from pathlib import Path

import pandas as pd
import papermill as pm
import pytest

from sparse_attention_repro.crisp import ROW_COLUMNS, run_crisp

NB = Path(__file__).resolve().parent.parent / "nbs" / "experiments" / "crisp.ipynb"

@pytest.fixture(scope="module")
def sst2_root():
    root = os.environ.get("SPARSE_REPRO_DATA")
    if not root or not (Path(root) / "sst2" / "train.tsv").is_file():
        pytest.skip("SPARSE_REPRO_DATA does not point at a folder with sst2/{train,validation,test}.tsv")
    return root

def test_experiment_notebook_smoke(tmp_path, sst2_root):
    rows_path = tmp_path / "rows.csv"
    pm.execute_notebook(str(NB), str(tmp_path / "crisp_out.ipynb"), cwd=str(tmp_path), progress_bar=False,
                        parameters=dict(config="fixed_080", seed=0, profile="smoke", threads=1, rows_path=str(rows_path)))
    df = pd.read_csv(rows_path)
    assert tuple(df.columns) == ROW_COLUMNS
    assert df.split.tolist() == ["validation", "test"]
    assert (df.status == "ok").all() and (df.config == "fixed_080").all()
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
