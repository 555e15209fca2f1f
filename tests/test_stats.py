"""Tests of `sparse_attention_repro.stats` and `.report` on the fixture CSVs (tests/fixtures/make_fixtures.py)."""
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

os.environ.setdefault("MPLBACKEND", "Agg")
from sparse_attention_repro import stats as S  # noqa: E402
from sparse_attention_repro.report import make_report, render_site  # noqa: E402

FIX = Path(__file__).parent / "fixtures"


def manual_holm(p):
    "Holm from its definition, independent of pingouin."
    p = np.asarray(p, float); m = len(p); order = np.argsort(p)
    adj = np.maximum.accumulate([min(1.0, (m - i) * p[j]) for i, j in enumerate(order)])
    out = np.empty(m); out[order] = adj
    return out


def test_holm_p_matches_scipy_and_manual_holm():
    raw = pd.read_csv(FIX / "runs.csv")
    ok = raw[raw.status == "ok"]
    pvals, deltas = {}, {}
    for ds in S.MAIN_DATASETS:
        g = ok[ok.dataset == ds].pivot(index="seed", columns="method", values="accuracy")
        for m in S.SPARSE_METHODS:
            pair = g[[m, "softmax"]].dropna()
            pvals[(ds, m)] = sps.ttest_rel(pair[m], pair["softmax"]).pvalue
            deltas[(ds, m)] = (pair[m] - pair["softmax"]).mean()
    keys = list(pvals); holm = dict(zip(keys, manual_holm([pvals[k] for k in keys])))
    pt = S.paired_tests(S.load_runs(FIX / "runs.csv"))
    for col in ["family", "dataset", "method", "baseline", "metric", "n", "mean_delta", "ci_low", "ci_high", "t", "p",
                "cohen_dz", "p_holm", "mean_delta_f1"]:
        assert col in pt.columns
    row = pt[(pt.family == "main") & (pt.dataset == "cifar10") & (pt.method == "topk_softmax_025")].iloc[0]
    assert row.baseline == "softmax" and row.n == 3
    assert row.p == pytest.approx(pvals[("cifar10", "topk_softmax_025")], rel=1e-9)
    assert row.p_holm == pytest.approx(holm[("cifar10", "topk_softmax_025")], rel=1e-9)
    assert row.mean_delta == pytest.approx(deltas[("cifar10", "topk_softmax_025")])
    main = pt[pt.family == "main"].set_index(["dataset", "method"])
    assert len(main) == 24
    np.testing.assert_allclose(main.loc[keys, "p_holm"].to_numpy(), [holm[k] for k in keys], rtol=1e-9)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    shutil.copy(FIX / "runs.csv", d); shutil.copy(FIX / "crisp_runs.csv", d)
    make_report(d)
    return d


def test_make_report_writes_html_tables_figures(report_dir):
    html = (report_dir / "report.html").read_text()
    assert "data:image/png;base64" in html                    # figures embedded: self-contained
    assert "paired_tests" in html and "Claims" in html and "reproduced" in html
    assert "crisp_validation" in html
    for t in ["paired_tests", "claims", "crisp_tests", "single_seed", "power", "selection"]:
        assert (report_dir / "tables" / f"{t}.csv").exists(), t
    figs = {p.stem for p in (report_dir / "figures").glob("*.png")}
    assert {"accuracy_per_method", "density_vs_accuracy", "train_time_ratio", "learned_alpha", "crisp_accuracy",
            "crisp_layer_sparsity"} <= figs
    pt = pd.read_csv(report_dir / "tables" / "paired_tests.csv")
    assert {"family", "baseline", "p_holm", "cohen_dz", "mean_delta_f1"} <= set(pt.columns)
    cl = pd.read_csv(report_dir / "tables" / "claims.csv")
    assert set(cl.verdict) <= {"reproduced", "not reproduced", "inconclusive", "not run", "not comparable"}
    assert cl.set_index("claim_id").loc["A7", "verdict"] == "not comparable"      # the fixture's timings are not on a GPU


@pytest.mark.slow                  # a second full report render; the first is the shared fixture above
def test_make_report_without_crisp_still_renders(tmp_path):
    shutil.copy(FIX / "runs.csv", tmp_path)
    out = make_report(tmp_path, tmp_path / "rep")
    html = out.read_text()
    assert out == tmp_path / "rep" / "report.html"
    assert "crisp_runs.csv" in html and "Missing" in html
    assert (tmp_path / "rep" / "figures" / "accuracy_per_method.png").exists()
    cl = pd.read_csv(tmp_path / "rep" / "tables" / "claims.csv")
    assert set(cl[cl.study == "B"].verdict) == {"not run"}


def test_make_report_missing_dir():
    with pytest.raises(ValueError, match="does not exist"):
        make_report("/no/such/results/dir")


def test_render_site(tmp_path):
    nb = Path(S.__file__).parent.parent / "nbs" / "00c_entmax.ipynb"
    idx = render_site(tmp_path, notebooks=[nb])
    assert 'href="00c_entmax.html"' in idx.read_text()
    assert "relative error of the bisection gradient" in (tmp_path / "00c_entmax.html").read_text()   # an executed output
