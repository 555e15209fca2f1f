"""Study A grid through the real command line: smoke grid end to end, resume after SIGKILL, bad arguments, repeatability."""
from pathlib import Path
import json
import numpy as np
import pandas as pd
import pytest
from conftest import cli
from sparse_attention_repro.study import PAPER_METHODS
from sparse_attention_repro.train import PAPER_SIZES

@pytest.fixture(scope="module")
def smoke(smoke_results):
    "The study A part of `reproduce --profile smoke` (conftest)."
    return smoke_results

def test_smoke_grid_has_every_run_once(smoke):
    runs = pd.read_csv(smoke / "runs.csv")
    expected = {(d, m, s) for d in PAPER_SIZES for m in PAPER_METHODS for s in (0, 1)}
    got = list(zip(runs.dataset, runs.method, runs.seed))
    assert set(got) == expected and len(got) == len(expected)
    assert (runs.status == "ok").all() and (runs.profile == "smoke").all()
    assert (runs.train_n == 256).all() and runs.val_accuracy.between(0, 1).all()      # validation drawn next to train
    assert runs.accuracy.between(0, 1).all() and runs.nonzero_ratio.between(0, 1).all()
    topk = runs[runs.method == "topk_softmax_025"]
    assert (topk[topk.dataset == "fashion_mnist"].nonzero_ratio.round(6) == round(5 / 17, 6)).all()
    hae = runs[runs.method == "headwise_adaptive_entmax"]
    assert hae.learned_alpha_mean.between(1.05, 1.95).all() and hae.learned_history.str.startswith("[").all()
    assert set(runs[runs.dataset == "cifar10"].dataset_source) == {"local:jpeg-q75"}
    for d in PAPER_SIZES:
        assert (smoke / "notebooks" / d / "seed0.ipynb").exists()

def test_rerun_skips_finished_work(smoke):
    before = {p: p.stat().st_mtime for p in (smoke / "rows").rglob("*.csv")}
    res = cli("grid", "--profile", "smoke", "--out", smoke, "--val-fraction", "0.1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "already done" in res.stdout
    assert {p: p.stat().st_mtime for p in (smoke / "rows").rglob("*.csv")} == before

@pytest.mark.slow                  # the same equality is tested in process in nbs/03_train; here through the command line
def test_same_seed_same_accuracy_plain_or_lockstep(smoke, tmp_path):
    """The same seed gives the same results, whether a method trains alone (`--plain`) or in lock-step with all seven."""
    res = cli("grid", "--profile", "smoke", "--out", tmp_path, "--datasets", "fashion_mnist", "--methods", "softmax", "entmax15",
              "headwise_adaptive_entmax", "--seeds", "1", "--val-fraction", "0.1", "--plain")
    assert res.returncode == 0, res.stderr[-2000:]
    again = pd.read_csv(tmp_path / "runs.csv").set_index("method")
    first = pd.read_csv(smoke / "runs.csv").query("dataset == 'fashion_mnist' and seed == 1").set_index("method")
    assert (again.lockstep_size == 1).all() and (first.lockstep_size == len(PAPER_METHODS)).all()
    for m in ("softmax", "entmax15", "headwise_adaptive_entmax"):
        for col in ("accuracy", "test_loss", "learned_alpha_mean"):
            assert again.loc[m, col] == pytest.approx(first.loc[m, col], abs=1e-12, nan_ok=True), (m, col)

@pytest.mark.slow                  # the same equality is tested in process in nbs/03_train; here through the command line
def test_longer_run_continued_from_a_shorter_one_is_the_longer_run(tmp_path, data_root):
    """`--keep-state`, then `--continue-from` with more epochs: the rows equal those of the longer run made at once."""
    common = ["--profile", "smoke", "--datasets", "fashion_mnist", "--methods", "softmax", "entmax15", "--seeds", "1", "--val-fraction", "0.1", "--epoch-eval"]
    short, cont, once = tmp_path / "short", tmp_path / "continued", tmp_path / "once"
    for out, more in [(short, ["--epochs", "1", "--keep-state"]), (cont, ["--epochs", "2", "--continue-from", short]), (once, ["--epochs", "2"])]:
        res = cli("grid", "--out", out, *common, *more)
        assert res.returncode == 0, res.stderr[-2000:]
    assert len(list((short / "rows").rglob("state-*.pt"))) == 1 and not list((cont / "rows").rglob("*.pt"))
    assert "continuing the shorter run's final state" in (cont / "notebooks" / "fashion_mnist" / "seed1.ipynb").read_text()
    assert "continuing" not in (once / "notebooks" / "fashion_mnist" / "seed1.ipynb").read_text()
    a, b = (pd.read_csv(d / "runs.csv").set_index("method").sort_index() for d in (cont, once))
    for col in ("accuracy", "test_loss", "val_accuracy", "epoch_metrics"):
        assert a[col].tolist() == b[col].tolist(), col
    assert (a.epochs == 2).all()
    res = cli("grid", "--out", tmp_path / "bad", *common, "--epochs", "1", "--continue-from", short)
    assert res.returncode == 2 and "give this grid more" in res.stderr, res.stderr

@pytest.mark.slow                  # the same equality is tested in process in nbs/03_train; here through the command line
def test_stacked_seeds_give_the_lockstep_results(smoke, tmp_path):
    """`--stack-seeds 2`: two seeds of three methods trained as one stacked model, through papermill, give the grid's rows."""
    res = cli("grid", "--profile", "smoke", "--out", tmp_path, "--datasets", "fashion_mnist", "--methods", "softmax", "entmax15",
              "headwise_adaptive_entmax", "--seeds", "0", "1", "--val-fraction", "0.1", "--stack-seeds", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "notebooks" / "fashion_mnist" / "seeds0-1.ipynb").exists()
    stacked = pd.read_csv(tmp_path / "runs.csv").set_index(["seed", "method"]).sort_index()
    first = pd.read_csv(smoke / "runs.csv").query("dataset == 'fashion_mnist'").set_index(["seed", "method"]).loc[stacked.index]
    assert len(stacked) == 6 and (stacked.lockstep_size == 6).all() and (stacked.status == "ok").all()
    for col in ("accuracy", "test_loss", "val_accuracy", "learned_alpha_mean"):
        assert np.array_equal(stacked[col].to_numpy(), first[col].to_numpy(), equal_nan=True), col

def test_profile_or_option_mismatch_is_refused(smoke, capsys):
    "In process through `cli.main`, like the bad arguments below: status 2, one line, the folder untouched."
    from sparse_attention_repro.cli import main
    before = (smoke / "runs.csv").read_bytes()
    for args, msg in [(["--profile", "quick"], "profile 'smoke'"), (["--profile", "smoke"], "val_fraction=0.1 (now 0.0)")]:
        assert main(["grid", "--out", str(smoke), *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, err
    assert (smoke / "runs.csv").read_bytes() == before

@pytest.mark.slow                  # a real calibration and grid; the bench notebook tests the calibration's choice in process
def test_fast_options_are_recorded_and_kept(smoke, tmp_path):
    """`--fast`: a real grid that times its levers here first (a fresh calibration cache), runs every arm with the chosen
    ones, records the choice and its timings, learns, and leaves a folder that refuses the default path."""
    fast = ["--profile", "smoke", "--out", tmp_path / "out", "--datasets", "fashion_mnist", "--methods", "softmax", "entmax15",
            "headwise_adaptive_entmax", "--seeds", "1", "--val-fraction", "0.1"]
    res = cli("grid", *fast, "--fast", env_extra={"SPARSE_REPRO_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stderr[-2000:]
    cal = json.loads((tmp_path / "out" / "manifest.json").read_text())["study_a"]["fast_calibration"]
    ms = cal["ms_per_step"]["fashion_mnist"]
    from sparse_attention_repro.bench import CLEAR_WIN
    assert {"default", "fused"} <= set(ms) and "philox" not in ms                               # the feature-predicted sets only
    assert cal["label"] == "default" or ms[cal["label"]] <= (1 - CLEAR_WIN) * ms["default"]     # a clear win, or the default
    assert list(tmp_path.joinpath("cache", "calibration").glob("fast-*.json"))                  # cached for the next grid
    runs = pd.read_csv(tmp_path / "out" / "runs.csv").set_index("method")
    default = pd.read_csv(smoke / "runs.csv").query("dataset == 'fashion_mnist' and seed == 1").set_index("method")
    assert (runs.status == "ok").all() and runs.accuracy.between(0, 1).all()
    for k, v in cal["levers"].items(): assert (runs[k] == v).all(), k                           # every arm on the chosen path
    same = (runs.test_loss == default.loc[runs.index, "test_loss"])
    if cal["label"] == "default": assert same.all()                           # the default path again, bit for bit
    elif {"philox", "bf16"} & set(cal["label"].split("+")): assert not same.any()   # other masks or arithmetic: every arm moves
    else: assert not same.all()          # the fused kernel alone (same masks, fp32): an arm may match bit for bit, not every one
    res = cli("grid", *fast)
    assert res.returncode == 2 and "use another --out folder" in res.stderr, res.stderr

@pytest.mark.parametrize("args, message", [
    (["--methods", "softmax", "sparsemaxx"], "unknown normalizer 'sparsemaxx'"),
    (["--datasets", "mnist"], "unknown dataset 'mnist'"),
    (["--profile", "huge"], "unknown profile 'huge'"),
    (["--seeds", "-3"], "seeds must be >= 0"),
    (["--methods", "topk_softmax_0"], "must be in (0, 1]"),
])
def test_bad_arguments(tmp_path, args, message, capsys):
    """In process through `cli.main` (the code behind the `sparse-repro` script; the script itself is run by the tests
    around): status 2, one line on stderr, nothing written."""
    from sparse_attention_repro.cli import main
    assert main(["grid", "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()

def test_missing_data_is_one_line(tmp_path, monkeypatch, capsys):
    "No data under the root: one line, exit 2, nothing written (in process, through the script's entry point `cli.main`)."
    from sparse_attention_repro.cli import main
    monkeypatch.setenv("SPARSE_REPRO_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("SPARSE_REPRO_CACHE", str(tmp_path / "cache"))
    assert main(["grid", "--out", str(tmp_path / "out"), "--datasets", "kmnist"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kmnist" in err, err
    assert not (tmp_path / "out").exists()

def test_truncated_data_file_is_one_line(tmp_path, monkeypatch, data_root, capsys):
    """A truncated KMNIST archive: one clear line, exit 2, nothing written, nothing cached (in process, through `cli.main`)."""
    from sparse_attention_repro.cli import main
    import gzip, shutil
    raw = tmp_path / "root" / "KMNIST" / "raw"; raw.mkdir(parents=True)
    for f in (Path(data_root) / "KMNIST" / "raw").glob("*.gz"): shutil.copy(f, raw / f.name)
    images = raw / "t10k-images-idx3-ubyte.gz"
    images.write_bytes(gzip.compress(gzip.decompress(images.read_bytes())[:-1000]))     # valid gzip, short payload
    monkeypatch.setenv("SPARSE_REPRO_DATA", str(tmp_path / "root"))
    monkeypatch.setenv("SPARSE_REPRO_CACHE", str(tmp_path / "cache"))
    assert main(["grid", "--out", str(tmp_path / "out"), "--datasets", "kmnist"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kmnist" in err, err
    assert not (tmp_path / "out").exists()

@pytest.mark.slow
def test_tuned_select_stage_runs_its_plan_to_the_end(tmp_path, data_root, monkeypatch):
    "`sparse-repro tuned` on a small declared search: every grid of the select stage (edge extensions included) runs from one pool, and nothing is left."
    from sparse_attention_repro import tuning as T
    from sparse_attention_repro.cli import main, tuned_grids, build_parser
    monkeypatch.setattr(T, "TUNED_SEARCH", {"fashion_mnist": T.RecipeSearch(lrs=(1e-3, 3e-3, 1e-2), epochs=2, methods=("softmax", "sparsemax"))})
    args = ["tuned", "--out", str(tmp_path), "--profile", "smoke", "--jobs", "2"]
    assert main(args) == 0
    assert tuned_grids(build_parser().parse_args(args)) == []                       # the select stage has nothing left
    runs = T.tuned_runs(tmp_path)
    assert (runs.status == "ok").all() and set(runs.seed) == set(T.SELECTION_SEEDS)
    assert {1e-3, 3e-3, 1e-2} <= set(runs.lr.round(6))
    rec = T.choose_recipes(T.tuned_curves(runs), T.diverged(runs), T.TUNED_SEARCH)
    extended = ~np.isclose(rec.lr.to_numpy()[:, None], [1e-3, 3e-3, 1e-2]).any(1)
    assert set(rec.method) == {"softmax", "sparsemax"} and (rec.lr_bracketed | extended).all()   # an edge choice: extended once
    plan = tuned_grids(build_parser().parse_args(args[:3] + ["--profile", "smoke", "--stage", "complete"]))
    assert {tuple(p.request.seeds) for _, p in plan} == {tuple(range(3, 10))}                  # the other seeds, at the chosen rates

@pytest.mark.slow
def test_tuned_halving_runs_short_then_continues_the_best_two(tmp_path, data_root, monkeypatch):
    "`sparse-repro tuned --halving`: every rate for a third of the length, the best two continued from their kept states to the end."
    import json
    from sparse_attention_repro import tuning as T
    from sparse_attention_repro.cli import main, tuned_grids, build_parser
    monkeypatch.setattr(T, "TUNED_SEARCH", {"fashion_mnist": T.RecipeSearch(lrs=(1e-3, 3e-3, 1e-2), epochs=3, methods=("softmax", "sparsemax"))})
    args = ["tuned", "--out", str(tmp_path), "--profile", "smoke", "--jobs", "2", "--halving"]
    assert main(args) == 0
    assert json.loads((tmp_path / "tuned" / "search.json").read_text())["selection"] == "halving"
    assert tuned_grids(build_parser().parse_args(args[:-1])) == []                 # the folder's rule is read back: nothing left
    runs = T.tuned_runs(tmp_path)
    short = runs[runs.epochs == 1]
    assert set(short.lr.round(6)) == {1e-3, 3e-3, 1e-2} and set(short.seed) == set(T.SELECTION_SEEDS)
    for m in ("softmax", "sparsemax"):                                              # two rates of three go on, per method
        assert len(set(runs[(runs.epochs == 3) & (runs.method == m)].lr.round(6))) == 2
    kept = set(runs[runs.epochs == 3].lr.round(6))
    lrs = T.choose_lr(T.tuned_curves(runs), T.diverged(runs), T.TUNED_SEARCH, rule=T.HALVING)
    assert (lrs.status == "halved").sum() == 2 and lrs.chosen.sum() == 2
    records = list((tmp_path / "tuned").glob("*/notebooks/fashion_mnist/seed*.ipynb"))
    said = {f.name: [("continuing the shorter run's final state" in r.read_text()) for r in records if r.parent.parent.parent == f]
            for f in {r.parent.parent.parent for r in records}}
    assert all(len(v) == 3 and len(set(v)) == 1 for v in said.values())         # the three seeds of a folder alike
    said = {k: v[0] for k, v in said.items()}
    assert {k for k, v in said.items() if v} == {f"fashion_mnist_lr{lr:g}" for lr in kept} | {k for k in said if k.endswith("_ep4")}  # continued
    assert not any(v for k, v in said.items() if k.endswith("_ep1"))                                              # the short runs start afresh
    assert not any("no final state kept" in r.read_text() for r in records)        # a method's part of a larger group's state serves too
    import shutil                                                                   # a folder searched in full: --halving is refused there
    done = tmp_path / "tuned" / f"fashion_mnist_lr{min(kept):g}"
    (tmp_path / "full" / "tuned" / done.name).mkdir(parents=True)
    shutil.copy(done / "runs.csv", tmp_path / "full" / "tuned" / done.name / "runs.csv")
    assert main(["tuned", "--out", str(tmp_path / "full"), "--profile", "smoke", "--halving", "--dry-run"]) == 2

SMALL_SEARCH = '''
import sys
from sparse_attention_repro import tuning as T
from sparse_attention_repro.cli import main
if __name__ == "__main__":                 # dask's worker processes import this file again: they must not run the search
    T.TUNED_SEARCH = {"fashion_mnist": T.RecipeSearch(lrs=(1e-3, 3e-3), epochs=2, methods=("softmax",))}   # a small declared search
    sys.exit(main(sys.argv[1:]))
'''

@pytest.mark.slow
def test_tuned_search_killed_on_dask_resumes_to_the_uninterrupted_search(tmp_path, data_root):
    """`sparse-repro tuned` behaves like the grid: on the dask executor, SIGKILLed at three random moments and restarted,
    its select stage ends with the runs of an uninterrupted search on the local executor, each once."""
    import sys
    from conftest import kill_at_random_moments
    from sparse_attention_repro import tuning as T
    (script := tmp_path / "small_search.py").write_text(SMALL_SEARCH)
    args = ["tuned", "--profile", "smoke", "--jobs", "2"]
    res, waits = kill_at_random_moments(args + ["--out", tmp_path / "killed", "--executor", "dask"], tmp_path / "killed", kills=3,
                                        max_wait=25.0, program=(sys.executable, script))
    assert res.returncode == 0, res.stderr[-2000:]
    ref = cli(*args, "--out", tmp_path / "clean", program=(sys.executable, script))
    assert ref.returncode == 0, ref.stderr[-2000:]
    keys, cols = ["dataset", "method", "seed", "lr", "epochs"], ["accuracy", "val_accuracy", "status"]
    killed, clean = (T.tuned_runs(tmp_path / f).sort_values(keys).reset_index(drop=True) for f in ("killed", "clean"))
    assert len(clean) >= 6 and not killed.duplicated(keys).any() and (killed.status == "ok").all()   # 2 rates x 3 seeds, and any extension
    pd.testing.assert_frame_equal(killed[keys + cols], clean[keys + cols])
    print("tuned killed after", waits, "seconds")
