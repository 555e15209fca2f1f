"""The report of `reproduce --profile smoke` exists and holds the tables; one Holm p-value recomputed with scipy."""
import numpy as np, pandas as pd
from scipy import stats

def test_report_files(smoke_results):
    html = (smoke_results / "report.html").read_text()
    for table in ("paired_tests", "claims", "crisp_tests", "power", "selection", "single_seed"):
        assert (smoke_results / "tables" / f"{table}.csv").exists(), table
    assert len(list((smoke_results / "figures").glob("*.png"))) >= 4
    assert "data:image/png;base64" in html                    # figures embedded: the HTML stands alone
    claims = pd.read_csv(smoke_results / "tables" / "claims.csv")
    assert len(claims) >= 8 and claims["verdict"].notna().all()

def test_holm_recomputed_with_scipy(smoke_results):
    runs = pd.read_csv(smoke_results / "runs.csv")
    tests = pd.read_csv(smoke_results / "tables" / "paired_tests.csv")
    main = tests[(tests.family == "main") & (tests.metric == "accuracy")]
    assert len(main) == 24
    acc = runs.pivot_table(index=["dataset", "seed"], columns="method", values="accuracy")
    raw, constant = [], []
    for _, r in main.iterrows():
        a = acc.loc[r.dataset]
        d = (a[r.method] - a["softmax"]).to_numpy()
        constant.append(np.allclose(d, d[0]))
        raw.append(stats.ttest_rel(a[r.method], a["softmax"]).pvalue)
    raw, constant = np.array(raw), np.array(constant)
    # zero-variance differences have no t-test: the table says NaN (scipy says 0 or NaN); they stay out of the family
    assert np.array_equal(main.p.isna().to_numpy(), constant)
    ok = ~constant
    np.testing.assert_allclose(main.p.to_numpy()[ok], raw[ok], rtol=1e-6)
    order = np.argsort(raw[ok])                             # Holm by hand: step-down, monotone, capped at 1
    m = ok.sum()
    adj = np.minimum(1, np.maximum.accumulate((m - np.arange(m)) * raw[ok][order]))
    holm = np.empty(m); holm[order] = adj
    np.testing.assert_allclose(main.p_holm.to_numpy()[ok], holm, rtol=1e-6)

def test_experiment_notebooks_name_their_kernel_and_parameters():
    "papermill needs a kernelspec and a `parameters` cell in every experiment notebook (a jupytext round trip can drop them)."
    import json
    from conftest import ROOT
    for nb in sorted((ROOT / "nbs" / "experiments").glob("*.ipynb")):
        meta = json.loads(nb.read_text())
        assert meta["metadata"].get("kernelspec", {}).get("name") == "python3", nb.name
        assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in meta["cells"]), nb.name
