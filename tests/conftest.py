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
