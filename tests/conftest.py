"""Shared helpers for the command-line tests: run `sparse-repro` as a user would, in a subprocess."""
import os, subprocess
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parent.parent

def cli(*args, timeout=900, env_extra=None, program=("sparse-repro",), **kw):
    """Run `PROGRAM ARGS` (the command line by default; with `env_extra` added to the environment) and return the
    CompletedProcess (text output)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.run([*map(str, program), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT, **kw)

@pytest.fixture(scope="session")
def data_root():
    root = os.environ.get("SPARSE_REPRO_DATA")
    if not root or not Path(root).is_dir():
        if os.environ.get("CI"): pytest.fail("SPARSE_REPRO_DATA is not set to the offline data folder (missing data fails under CI)")
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


def kill_at_random_moments(args, out, kills=5, seed=0, max_wait=12.0, program=("sparse-repro",)):
    """Start `PROGRAM ARGS` (the command line by default) and SIGKILL its whole process group (as Ctrl-C / a dying node
    would) at `kills` random moments, restarting it each time; then let it finish. Returns the final CompletedProcess and
    the kill times."""
    import random, signal
    rng = random.Random(seed)
    waits = []
    for _ in range(kills):
        proc = subprocess.Popen([*map(str, program), *map(str, args)], cwd=ROOT, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait = rng.uniform(1.0, max_wait)
        try: proc.wait(timeout=wait)
        except subprocess.TimeoutExpired: os.killpg(proc.pid, signal.SIGKILL); proc.wait()
        waits.append(round(wait, 1))
        assert not list(Path(out).rglob("*.tmp")), "a temporary file survived a kill"
    return cli(*args, program=program), waits
