"""A normalizer defined outside the library runs end to end — grid, pairing with a committed baseline, report — with no
edit to the library: by `package.module:name` and by entry point, each from a fresh process (the command line)."""
import json
import pandas as pd
import pytest
from conftest import cli
from sparse_attention_repro.study import PAPER_METHODS

OUTSIDE = '''
import torch
from sparse_attention_repro.normalizers import register_normalizer

@register_normalizer("relu_attention_test", sums_to_one=False, stackable=True)
def relu_attention(scores, key_mask=None):
    "ReLU of the scores over n keys (a test normalizer whose rows do not sum to one)."
    p = torch.relu(scores) / scores.shape[-1]
    return p if key_mask is None else p.masked_fill(~key_mask.to(torch.bool), 0.)

@register_normalizer("leaky_mask_test")
def leaky_mask(scores, key_mask=None):
    "Softmax that ignores the key mask: must be refused by the conformance suite."
    return torch.softmax(scores, -1)
'''

@pytest.fixture(scope="module")
def baseline(smoke_results):
    "A committed-style baseline: the seven paper methods of `reproduce --profile smoke` (conftest), seeds 0 and 1."
    return smoke_results

def _outside_module(tmp_path):
    (tmp_path / "my_norms.py").write_text(OUTSIDE)
    return {"PYTHONPATH": str(tmp_path)}

@pytest.mark.slow                  # an end-to-end grid; the tutorial notebook runs the same --baseline pairing through the command line
def test_outside_methods_run_against_the_baseline(baseline, tmp_path, monkeypatch):
    """One fresh process: a normalizer by `package.module:name` and one by entry point (`sparse_attention_examples`,
    installed as the README says) train on the baseline's seeds and options, pair with its runs and get their report."""
    for k, v in _outside_module(tmp_path).items(): monkeypatch.setenv(k, v)
    out = tmp_path / "new"
    res = cli("grid", "--profile", "smoke", "--out", out, "--methods", "my_norms:relu_attention", "softpick", "--baseline", baseline,
              "--datasets", "synthetic_marker", "--val-fraction", "0.1", "--jobs", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv")
    new = [(m, s) for m in ("relu_attention_test", "softpick") for s in (0, 1)]
    assert sorted(zip(runs.method, runs.seed)) == sorted(new + [("softmax", 0)]) and (runs.status == "ok").all()
    assert (runs.val_n > 0).all()                                   # the baseline's options: its validation split too
    vs = pd.read_csv(out / "versus_baseline.csv")
    assert set(vs.baseline) == set(PAPER_METHODS) and set(vs.method) == {"relu_attention_test", "softpick"} and (vs.n == 2).all()
    text = (out / "versus_baseline.md").read_text()
    assert "1 of 1 test accuracies equal the committed ones bit for bit" in text, text       # the pairing is exact

def test_nonconforming_normalizer_is_refused(tmp_path, monkeypatch, data_root, capsys):
    "Refused by the script, then by `card` in process (`cli.main`, the script's entry point): one line, exit 2, nothing written."
    from sparse_attention_repro.cli import main
    for k, v in _outside_module(tmp_path).items(): monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(tmp_path))
    res = cli("grid", "--profile", "smoke", "--out", tmp_path / "x", "--methods", "my_norms:leaky_mask", "--datasets", "synthetic_marker")
    assert res.returncode == 2 and "fails the conformance suite" in res.stderr and "key mask:" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr                # refused in one line
    assert not (tmp_path / "x").exists()
    assert main(["card", "my_norms:leaky_mask", "--outputs", str(tmp_path / "o"), "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "key mask:" in err, err
    assert not (tmp_path / "o").exists()

def test_baseline_made_with_other_options_is_refused(baseline, tmp_path, capsys):
    "In process through `cli.main` (the code behind the script): status 2, one line, nothing written."
    from sparse_attention_repro.cli import main
    assert main(["grid", "--profile", "smoke", "--out", str(tmp_path / "x"), "--methods", "softpick", "--baseline", str(baseline), "--lr", "0.003"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "was made with lr=" in err, err
    assert not (tmp_path / "x").exists()

def test_outside_dataset_by_entry_point(tmp_path, capsys):
    """A dataset from outside the library (the example package's `digits`, an entry point of `sparse_attention_repro.datasets`)
    runs through `grid` by its bare name, in the notebooks' own processes; a `module:name` dataset is refused in one line."""
    out = tmp_path / "digits"
    res = cli("grid", "--profile", "smoke", "--datasets", "digits", "--methods", "softmax", "sparsemax", "--seeds", "0", "--out", out, "--jobs", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs.dataset) == {"digits"} and (runs.status == "ok").all() and len(runs) == 2
    assert set(runs.dataset_source) == {"sklearn:load_digits"}                          # read from the copy inside scikit-learn
    from sparse_attention_repro.cli import main                                     # in process, through the script's entry point
    capsys.readouterr()
    assert main(["grid", "--profile", "smoke", "--datasets", "sparse_attention_examples.digits:digits", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "named by its entry point" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()
