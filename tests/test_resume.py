"""Every study of `study.STUDIES` survives being killed: its grid, SIGKILLed (whole process group) at five random moments
and restarted each time, then finished, holds every row exactly once, equal to an uninterrupted run's, with every
executed notebook kept and no temporary file left behind."""
import pandas as pd
import pytest
from conftest import cli, kill_at_random_moments
from sparse_attention_repro.study import STUDIES

# The smallest real grid of each study: its command line, the rows it makes, the columns compared, the longest wait
# between kills (seconds), and the executed notebooks it must keep (relative to the results folder).
GRIDS = {
    "study_a": (["grid", "--profile", "smoke", "--datasets", "fashion_mnist", "synthetic_marker",
                 "--methods", "softmax", "sparsemax", "topk_softmax_025", "--seeds", "0", "1", "--jobs", "2"],
                12, ["accuracy", "test_loss", "status"], 12.0,
                [f"notebooks/{d}/seed{s}.ipynb" for d in ("fashion_mnist", "synthetic_marker") for s in (0, 1)]),
    "crisp": (["crisp", "--profile", "smoke", "--configs", "dense", "fixed_080", "--seeds", "0", "1", "--jobs", "2"],
              8, ["accuracy", "sparsity_mean", "status"], 10.0,
              [f"notebooks/crisp/{c}/seed{s}.ipynb" for c in ("dense", "fixed_080") for s in (0, 1)]),
    "length": (["length", "--profile", "smoke", "--normalizers", "softmax", "entmax15", "--seeds", "0", "1", "--steps", "60", "--jobs", "2"],
               2 * 2 * (6 + 2), ["accuracy", "n", "status"], 10.0,
               [f"notebooks/length/flip_flop/{n}/nape/lr0.001/seed{s}/steps60_test60.ipynb" for n in ("softmax", "entmax15") for s in (0, 1)]),
}

def test_every_study_has_a_kill_test():
    assert set(GRIDS) == set(STUDIES)

@pytest.mark.slow
@pytest.mark.parametrize("name", list(GRIDS))
def test_killed_grid_resumes_to_the_uninterrupted_rows(name, tmp_path, data_root):
    study, (args, n_rows, cols, max_wait, notebooks) = STUDIES[name], GRIDS[name]
    res, waits = kill_at_random_moments(args + ["--out", tmp_path / "killed"], tmp_path / "killed", max_wait=max_wait)
    assert res.returncode == 0, res.stderr[-2000:]
    ref = cli(*args, "--out", tmp_path / "clean")
    assert ref.returncode == 0, ref.stderr[-2000:]
    killed = pd.read_csv(study.results_path(tmp_path / "killed"))
    assert len(killed) == n_rows and not killed.duplicated(list(study.keys)).any()
    cols = list(study.keys) + cols
    pd.testing.assert_frame_equal(killed[cols], pd.read_csv(study.results_path(tmp_path / "clean"))[cols])   # none lost, none changed
    for nb in notebooks: assert (tmp_path / "killed" / nb).exists(), nb        # every executed notebook is kept as the record
    print(name, "killed after", waits, "seconds")
