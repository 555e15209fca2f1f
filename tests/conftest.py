"""Shared helpers for the command-line tests: run `sparse-repro` as a user would, in a subprocess."""
import os, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent

def cli(*args, timeout=900, **kw):
    "Run `sparse-repro ARGS` and return the CompletedProcess (text output)."
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["sparse-repro", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT, **kw)

@pytest.fixture(scope="session")
def data_root():
    root = os.environ.get("SPARSE_REPRO_DATA")
    if not root or not Path(root).is_dir():
        pytest.skip("SPARSE_REPRO_DATA is not set to the offline data folder")
    return root

@pytest.fixture(scope="session")
def smoke_results(tmp_path_factory, data_root):
    "`sparse-repro reproduce --profile smoke` once per test session: study A grid, Crisp grid and report in one folder."
    import time
    out = tmp_path_factory.mktemp("reproduce") / "smoke"
    t0 = time.time()
    res = cli("reproduce", "--profile", "smoke", "--out", out, "--jobs", "2")
    print(f"reproduce --profile smoke: {time.time() - t0:.0f} s")
    assert res.returncode == 0, res.stderr[-4000:]
    return out
