"""The dask executor: the smoke grid on a 2-worker LocalCluster gives the same rows as the local executor."""
import pandas as pd
import pytest
from conftest import cli

ARGS = ["--profile", "smoke", "--datasets", "fashion_mnist", "synthetic_marker", "--methods", "softmax", "entmax15",
        "--seeds", "0", "1", "--jobs", "2"]
COLS = ["dataset", "method", "seed", "accuracy", "macro_f1", "nonzero_ratio", "train_n", "test_n", "status"]

@pytest.mark.slow
def test_dask_matches_local(tmp_path, data_root):
    local = cli("grid", "--out", tmp_path / "local", *ARGS)
    dask = cli("grid", "--out", tmp_path / "dask", "--executor", "dask", *ARGS)
    assert local.returncode == 0, local.stderr[-2000:]
    assert dask.returncode == 0, dask.stderr[-2000:]
    a = pd.read_csv(tmp_path / "local" / "runs.csv")[COLS]
    b = pd.read_csv(tmp_path / "dask" / "runs.csv")[COLS]
    assert len(a) == 8
    pd.testing.assert_frame_equal(a, b)
    for d in ("fashion_mnist", "synthetic_marker"):
        assert (tmp_path / "dask" / "notebooks" / d / "seed1.ipynb").exists()     # executed notebooks came back too
