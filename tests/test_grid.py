"""Study A grid through the real command line: smoke grid end to end, resume after SIGKILL, bad arguments, repeatability."""
import os, signal, subprocess, time
from pathlib import Path
import pandas as pd
import pytest
from conftest import cli, ROOT
from sparse_attention_repro.normalizers import NORMALIZERS
from sparse_attention_repro.train import PAPER_SIZES

@pytest.fixture(scope="module")
def smoke(smoke_results):
    "The study A part of `reproduce --profile smoke` (conftest)."
    return smoke_results

def test_smoke_grid_has_every_run_once(smoke):
    runs = pd.read_csv(smoke / "runs.csv")
    expected = {(d, m, s) for d in PAPER_SIZES for m in NORMALIZERS for s in (0, 1)}
    got = list(zip(runs.dataset, runs.method, runs.seed))
    assert set(got) == expected and len(got) == len(expected)
    assert (runs.status == "ok").all() and (runs.profile == "smoke").all()
    assert (runs.train_n == 256).all() and runs.val_accuracy.between(0, 1).all()      # validation drawn next to train
    assert runs.accuracy.between(0, 1).all() and runs.nonzero_ratio.between(0, 1).all()
    topk = runs[runs.method == "topk_softmax_025"]
    assert (topk[topk.dataset == "fashion_mnist"].nonzero_ratio.round(6) == round(5 / 17, 6)).all()
    hae = runs[runs.method == "headwise_adaptive_entmax"]
    assert hae.learned_alpha_mean.between(1.05, 1.95).all() and hae.alpha_history.str.startswith("[").all()
    assert set(runs[runs.dataset == "cifar10"].dataset_source) == {"local:jpeg-q75"}
    for d in PAPER_SIZES:
        assert (smoke / "notebooks" / d / "seed0.ipynb").exists()

def test_rerun_skips_finished_work(smoke):
    before = {p: p.stat().st_mtime for p in (smoke / "rows").rglob("*.csv")}
    res = cli("grid", "--profile", "smoke", "--out", smoke, "--val-fraction", "0.1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "already done" in res.stdout
    assert {p: p.stat().st_mtime for p in (smoke / "rows").rglob("*.csv")} == before

def test_same_seed_same_accuracy(smoke, tmp_path):
    res = cli("grid", "--profile", "smoke", "--out", tmp_path, "--datasets", "fashion_mnist", "--methods", "softmax", "entmax15",
              "--seeds", "1", "--val-fraction", "0.1")
    assert res.returncode == 0, res.stderr[-2000:]
    again = pd.read_csv(tmp_path / "runs.csv").set_index("method")
    first = pd.read_csv(smoke / "runs.csv").query("dataset == 'fashion_mnist' and seed == 1").set_index("method")
    for m in ("softmax", "entmax15"):
        assert again.loc[m, "accuracy"] == first.loc[m, "accuracy"]
        assert again.loc[m, "test_loss"] == pytest.approx(first.loc[m, "test_loss"], abs=1e-6)

def test_profile_or_option_mismatch_is_refused(smoke):
    before = (smoke / "runs.csv").read_bytes()
    for args, msg in [(["--profile", "quick"], "profile 'smoke'"), (["--profile", "smoke"], "val_fraction=0.1 (now 0.0)")]:
        res = cli("grid", "--out", smoke, *args)
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and msg in res.stderr, res.stderr
    assert (smoke / "runs.csv").read_bytes() == before

@pytest.mark.parametrize("args, message", [
    (["--methods", "softmax", "sparsemaxx"], "unknown normalizer 'sparsemaxx'"),
    (["--datasets", "mnist"], "unknown dataset 'mnist'"),
    (["--profile", "huge"], "unknown profile 'huge'"),
    (["--seeds", "-3"], "seeds must be >= 0"),
    (["--methods", "topk_softmax_0"], "must be in (0, 1]"),
])
def test_bad_arguments(tmp_path, args, message):
    res = cli("grid", "--out", tmp_path / "out", *args)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()

def test_missing_data_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARSE_REPRO_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("SPARSE_REPRO_CACHE", str(tmp_path / "cache"))
    res = cli("grid", "--out", tmp_path / "out", "--datasets", "kmnist")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "kmnist" in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()

def test_resume_after_sigkill(tmp_path, data_root):
    """Kill the grid (the whole process group, as Ctrl-C would) right after its first result, rerun, compare."""
    out = tmp_path / "out"
    args = ["grid", "--profile", "smoke", "--out", str(out), "--datasets", "fashion_mnist", "synthetic_marker",
            "--methods", "softmax", "sparsemax", "topk_softmax_025", "--seeds", "0", "1", "--jobs", "1"]
    proc = subprocess.Popen(["sparse-repro", *args], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list((out / "rows").rglob("*.csv")) and time.time() < deadline: time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL); proc.wait()
    done_before = {p: p.stat().st_mtime for p in (out / "rows").rglob("*.csv")}
    assert 1 <= len(done_before) < 12
    assert not list(out.rglob("*.tmp"))                             # no half-written file survives
    res = cli(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv")
    keys = list(zip(runs.dataset, runs.method, runs.seed))
    assert len(keys) == len(set(keys)) == 12
    assert {p: p.stat().st_mtime for p in done_before} == done_before  # finished runs were not redone
