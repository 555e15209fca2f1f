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

def test_readme_answer_is_generated_from_the_committed_tables():
    """The README's answer block is exactly what the committed tables give — no number in it is typed by hand — the
    committed README is what the home notebook and the tables give, and the notebook itself holds no numbers there."""
    from pathlib import Path
    from sparse_attention_repro.tuned_reading import answer_markdown, README_MARKERS
    from sparse_attention_repro.report import readme_markdown
    root = Path(__file__).resolve().parent.parent
    index = root / "nbs" / "index.ipynb"
    readme = (root / "README.md").read_text(encoding="utf-8")
    a, b = README_MARKERS
    block = readme[readme.index(a) + len(a):readme.index(b)].strip()
    assert block == answer_markdown(root / "outputs" / "paper", relative_to=root).strip()
    assert readme == readme_markdown(index), "README.md is stale: run `sparse-repro readme`"
    assert "](outputs/paper/figures/gain_vs_epochs.png)" in readme                       # rebased to the root
    source = index.read_text(encoding="utf-8")
    assert "**With every arm" not in source and "Beats tuned softmax" not in source      # filled when built, not stored
    import pandas as pd
    from sparse_attention_repro.length_analysis import LENGTH_MARKERS, length_answer
    tables = root / "outputs" / "length" / "tables"
    a, b = LENGTH_MARKERS
    assert readme[readme.index(a) + len(a):readme.index(b)].strip() == length_answer(
        *(pd.read_csv(tables / f) for f in ("length_accuracy.csv", "length_gains.csv", "length_learned.csv")),
        recipes=pd.read_csv(tables / "length_recipes.csv")).strip()

def test_tuned_tests_recomputed_with_scipy():
    "Each committed tuned comparison: its paired t-test recomputed with scipy from the committed learning curves."
    from pathlib import Path
    from sparse_attention_repro import tuning as T
    root = Path(__file__).resolve().parent.parent / "outputs" / "paper"
    tests = pd.read_csv(root / "tables" / "tuned_tests.csv")
    curves = pd.concat([T.tuned_curves(T.tuned_runs(root, folder)).assign(source=s) for s, (folder, _) in T.SOURCES.items()])
    assert len(tests) >= 6
    for r in tests.itertuples():
        c = curves[(curves.source == r.source) & (curves.dataset == r.dataset)]
        lr, ep = float(r.recipe.split()[1].rstrip(",")), int(r.recipe.split()[2])            # "lr 0.001, 22 ep"
        blr, bep = float(r.baseline_recipe.split()[1].rstrip(",")), int(r.baseline_recipe.split()[2])
        a = c[(c.method == r.method) & np.isclose(c.lr, lr) & (c.epoch == ep)].set_index("seed").test_accuracy
        b = c[(c.method == r.baseline) & np.isclose(c.lr, blr) & (c.epoch == bep)].set_index("seed").test_accuracy
        j = pd.concat(dict(a=a, b=b), axis=1).dropna()
        assert len(j) == r.n
        np.testing.assert_allclose(r.gain, (j.a - j.b).mean(), rtol=1e-9)
        np.testing.assert_allclose(r.p, stats.ttest_rel(j.a, j.b).pvalue, rtol=1e-6)

def test_readme_command_writes_the_readme_from_the_home_notebook(tmp_path, capsys):
    """`sparse-repro readme`: the README of the home notebook, written where asked; a missing notebook is one line, exit 2
    (the script once, then its entry point `cli.main` in process)."""
    from conftest import ROOT, cli
    from sparse_attention_repro.cli import main
    from sparse_attention_repro.report import readme_markdown
    res = cli("readme", "--out", tmp_path / "README.md")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == readme_markdown(ROOT / "nbs" / "index.ipynb")
    capsys.readouterr()
    assert main(["readme", "--index", str(tmp_path / "none.ipynb"), "--out", str(tmp_path / "R.md")]) == 2
    err = capsys.readouterr().err
    assert "is not a notebook" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "R.md").exists()

def test_outputs_index_is_generated_from_the_catalogue(tmp_path, capsys):
    "The committed outputs/README.md is what the catalogue and the committed tables give; `sparse-repro index` writes it."
    from conftest import ROOT
    from sparse_attention_repro.cli import main
    from sparse_attention_repro.catalogue import outputs_index, CATALOGUE
    text = (ROOT / "outputs" / "README.md").read_text(encoding="utf-8")
    assert text == outputs_index(ROOT / "outputs"), "outputs/README.md is stale: run `sparse-repro index`"
    for e in CATALOGUE.values():                               # every committed experiment folder of the catalogue is listed
        f = ROOT / "outputs" / e.root / e.folder
        if (f / "runs.csv").exists() and e.folder != ".": assert f"`{e.root}/{e.folder}`" in text, e.name
    assert main(["index", "--outputs", str(tmp_path / "none")]) == 2                    # in process, through the script's entry point
    err = capsys.readouterr().err
    assert "is not a folder" in err, err

def test_leaderboard_is_the_committed_tables(tmp_path):
    """The committed leaderboard is what the committed tables give; each paper-recipe gain of the seven is the one in
    paired_tests.csv (recomputed with scipy from the runs for one), and `sparse-repro leaderboard` writes it."""
    from scipy import stats as sps
    from conftest import ROOT, cli
    from sparse_attention_repro.leaderboard import leaderboard_rows
    committed = pd.read_csv(ROOT / "outputs" / "leaderboard.csv")
    fresh = leaderboard_rows(ROOT / "outputs")
    pd.testing.assert_frame_equal(committed, fresh.reset_index(drop=True), check_dtype=False)
    runs = pd.read_csv(ROOT / "outputs" / "paper" / "runs.csv").query("dataset == 'cifar10'")
    a = runs[runs.method == "topk_softmax_025"].sort_values("seed").accuracy.to_numpy()
    b = runs[runs.method == "softmax"].sort_values("seed").accuracy.to_numpy()
    row = fresh.query("normalizer == 'topk_softmax_025' and dataset == 'cifar10' and reading == 'paper recipe'").iloc[0]
    assert abs(row.gain - (a - b).mean()) < 1e-12 and row.n == len(a)
    assert sps.ttest_rel(a, b).pvalue <= row.p_holm + 1e-12                    # Holm only raises a p-value
    assert {"scalable_softmax", "sigmoid_attention", "softpick", "entmax15"} <= set(fresh.normalizer)
    res = cli("leaderboard", "--outputs", tmp_path)
    assert res.returncode == 2 and "does not exist" in res.stderr, res.stderr

def test_readme_leaderboard_block(tmp_path, capsys):
    """The README's leaderboard block is the short form of the committed leaderboard; a README without the block is refused
    in one line before any leaderboard file is written."""
    import shutil
    from conftest import ROOT
    from sparse_attention_repro.cli import main
    from sparse_attention_repro.leaderboard import leaderboard_parts, leaderboard_short, LEADERBOARD_MARKERS
    out = ROOT / "outputs"; rows, vs_entmax, table = leaderboard_parts(out)
    text = (ROOT / "README.md").read_text(encoding="utf-8"); a, b = LEADERBOARD_MARKERS
    block = text[text.index(a) + len(a):text.index(b)].strip()
    assert block == leaderboard_short(rows, vs_entmax, table.normalizer, "outputs/leaderboard.md"), \
        "the README's leaderboard block is stale: run `sparse-repro readme`"
    assert block.startswith("- **Beats tuned softmax after Holm:**")
    shutil.copytree(out / "paper" / "tables", tmp_path / "paper" / "tables")
    (tmp_path / "README.md").write_text("# A README without the block\n")
    assert main(["leaderboard", "--outputs", str(tmp_path), "--readme", str(tmp_path / "README.md")]) == 2   # in process
    err = capsys.readouterr().err
    assert "has no leaderboard block" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "leaderboard.md").exists()

def test_card_command(tmp_path, capsys):
    "`sparse-repro card`: a page per normalizer from the committed tables, with its cost measured here; a bad name is one line."
    import shutil
    from conftest import ROOT, cli
    shutil.copytree(ROOT / "outputs" / "literature", tmp_path / "literature")
    shutil.copytree(ROOT / "outputs" / "paper" / "tables", tmp_path / "paper" / "tables")
    res = cli("card", "softpick", "--outputs", tmp_path, "--repeats", "2")
    assert res.returncode == 0, res.stderr
    card = (tmp_path / "cards" / "softpick.md").read_text()
    vs = pd.read_csv(ROOT / "outputs" / "literature" / "versus_baseline.csv").query("method == 'softpick' and baseline == 'softmax'")
    for r in vs.itertuples(): assert f"| {r.dataset} " in card and f"{100 * r.mean_delta:+.2f}" in card      # every committed gain
    assert "ratio_to_softmax" in card and "96x4x97x97" in card
    from sparse_attention_repro.cli import main
    capsys.readouterr()
    assert main(["card", "softpickk", "--outputs", str(tmp_path)]) == 2                # in process, through the script's entry point
    err = capsys.readouterr().err
    assert "unknown normalizer 'softpickk'" in err, err

def test_committed_cards_are_the_committed_tables():
    "Each committed card's gain tables are what the committed tables give now (a new run or verdict means `sparse-repro card NAME`)."
    from conftest import ROOT
    from sparse_attention_repro.leaderboard import card_gain_tables, leaderboard_rows
    cards = sorted((ROOT / "outputs" / "cards").glob("*.md"))
    assert len(cards) >= 14
    rows, vs_entmax = leaderboard_rows(ROOT / "outputs"), leaderboard_rows(ROOT / "outputs", baseline="entmax15")
    for card in cards:
        tables = "\n".join(card_gain_tables(rows, vs_entmax, card.stem))
        assert tables in card.read_text(encoding="utf-8"), f"{card.name} is stale: run `sparse-repro card {card.stem}`"
