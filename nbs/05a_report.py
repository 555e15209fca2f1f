# %% [markdown]
# # Report and site
# > Execute the report notebook on a results folder into a self-contained HTML report, and render the library notebooks as a site.

# %%
#| default_exp report

# %% [markdown]
# The report is a notebook (`nbs/experiments/report.ipynb`) so that its record — code, tables, figures — is the executed
# copy itself, as papermill intends. `make_report` runs it with `results_dir` injected, then exports one HTML file
# with the images embedded, so the report can be mailed or archived without its folder. The figures and tables are also
# written as files (`figures/*.png`, `tables/*.csv`) for anyone who wants to reuse them.
#
# Quarto is not available here, so the documentation "site" is plain nbconvert HTML with an index in reading order.

# %%
#| export
import html, os, shutil
from pathlib import Path

import nbformat
import papermill as pm
from nbconvert import HTMLExporter

import sparse_attention_repro
from sparse_attention_repro.runner import scrub_record, experiments_dir, save_rows
from sparse_attention_repro.files import atomic_write

# %%
from fastcore.test import test_eq, test_fail
import tempfile


# %%
#| export
def _repo_root():
    "The repository root of an editable install (the folder holding `nbs/`)."
    return Path(sparse_attention_repro.__file__).resolve().parent.parent

def report_notebook():
    "Path of the report notebook (`report.ipynb` of `experiments_dir()`)."
    return experiments_dir() / "report.ipynb"


# %%
assert report_notebook().name == "report.ipynb"


# %% [markdown]
# ## HTML export
#
# `embed_images=True` inlines the PNGs as data URIs — that is what makes the report self-contained; `exclude_input`
# hides the code (the report is for readers of results; the `.ipynb` beside it keeps the code). A raw front-matter cell
# (`skip_exec: true`, which keeps `nbdev_test` off the experiment notebooks) is instructions for tools, not for readers,
# so it is left out of the HTML.

# %%
#| export
def to_html(nb_path, html_path=None, exclude_input=False):
    "Convert a notebook to one self-contained HTML file (images embedded); returns the HTML path."
    nb_path = Path(nb_path); html_path = Path(html_path or nb_path.with_suffix(".html"))
    ex = HTMLExporter(template_name="lab", embed_images=True, exclude_input=exclude_input)
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "raw" and c.source.lstrip().startswith("---"))]
    body, _ = ex.from_notebook_node(nb, resources={"metadata": {"path": str(nb_path.parent)}})
    html_path.write_text(body, encoding="utf-8")
    return html_path


# %% [markdown]
# ## `make_report`

# %%
#| export
def make_report(results_dir, # folder holding runs.csv and/or crisp_runs.csv
                out_dir=None, # where report.ipynb/.html, figures/ and tables/ go; default: `results_dir`
                exclude_input=True, # hide code cells in the HTML
                kernel_name=None, # Jupyter kernel for papermill; None = the notebook's own
               ):
    "Execute the report notebook on `results_dir`; write report.ipynb, report.html, figures/*.png, tables/*.csv."
    res = Path(results_dir)
    if not res.is_dir(): raise ValueError(f"results_dir does not exist or is not a folder: {res}")
    out = Path(out_dir) if out_dir else res
    out.mkdir(parents=True, exist_ok=True)
    nb_out = out / "report.ipynb"
    # paths relative to the report's own folder (its working directory): the executed record names no machine path
    rel = os.path.relpath(res.resolve(), out.resolve())
    shown = os.path.relpath(res.resolve())
    shown = shown if not shown.startswith("..") else res.resolve().name
    pm.execute_notebook(str(report_notebook()), str(nb_out), cwd=str(out), kernel_name=kernel_name, progress_bar=False,
                        parameters=dict(results_dir=rel, out_dir=".", results_label=shown),
                        extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
    scrub_record(nb_out, out)
    return to_html(nb_out, out / "report.html", exclude_input=exclude_input)


# %%
test_fail(lambda: make_report("/no/such/folder"), contains="results_dir does not exist")

# %% [markdown]
# Running it executes a notebook in a fresh kernel (a few tens of seconds), so the full run on the fixtures is a `slow`
# test here and a regular one in `tests/test_stats.py`.

# %%
#| slow
with tempfile.TemporaryDirectory() as d:
    fx = _repo_root() / "tests" / "fixtures"
    shutil.copy(fx / "runs.csv", d); shutil.copy(fx / "crisp_runs.csv", d)
    p = make_report(d)
    assert (Path(d) / "tables" / "paired_tests.csv").exists()
    page, record = p.read_text(), (Path(d) / "report.ipynb").read_text()
    assert p.parent == Path(d) and "Claims" in page and "data:image/png;base64" in page     # the claims, figures embedded
    assert str(Path(d).resolve()) not in page + record and "skip_exec" not in page       # no machine path, no front matter


# %% [markdown]
# ## A new method against the committed baselines
#
# `versus_report` writes what a researcher with a new normalizer reads: the pairing check (softmax re-run on the first
# seed of each dataset against the committed run), the answer per dataset (does the method beat softmax and entmax-1.5
# after Holm within its own family?) and every comparison with the seven committed methods
# (`stats.versus_baseline`). It goes to `versus_baseline.md` and `versus_baseline.csv` in the new method's folder.

# %%
#| export
def versus_report(results_dir, baseline_dir) -> Path:
    "Pair the new methods of `results_dir` with the committed runs of `baseline_dir`; write versus_baseline.md/.csv there."
    from sparse_attention_repro import stats as S
    res, base = Path(results_dir), Path(baseline_dir)
    new, old = S.load_runs(res / "runs.csv"), S.load_runs(base / "runs.csv")
    t, pc = S.versus_baseline(new, old), S.pairing_check(new, old)
    shown = os.path.relpath(base.resolve(), res.resolve())
    lines = [f"# New methods against the committed baselines", "",
             f"Runs in this folder, paired by seed with the committed runs of `{shown}` (same subsets, initial weights, batches "
             f"and dropout masks). Holm within each new method's own family (all its comparisons); the paper's tests are unchanged.", ""]
    same = int(pc.identical.sum())
    lines += [f"**Pairing check:** softmax re-run on {len(pc)} (dataset, seed) pair(s); {same} of {len(pc)} test accuracies equal "
              f"the committed ones bit for bit." + ("" if same == len(pc) else " The pairing is **not** exact: read the comparisons as unpaired."), ""]
    for m in sorted(set(t.method)):
        lines += [f"## {m}", "", S.versus_answer(t, m).to_markdown(index=False, disable_numparse=True), "",
                  S.readable_versus(t[t.method == m]).to_markdown(index=False, disable_numparse=True), ""]
    if not len(t): lines += ["No new method found in this folder (only the baselines' methods)."]
    atomic_write(res / "versus_baseline.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8"))
    save_rows(t, res / "versus_baseline.csv")
    return res / "versus_baseline.md"


# %% [markdown]
# ## The documentation site
#
# `render_site` converts the library notebooks (`nbs/*.ipynb`: the protocol page, then the numbered notebooks in
# file-name order = reading order) plus, optionally, a
# report (an executed `.ipynb`, or an `.html` that is copied), and writes an `index.html` linking them. Each entry is
# titled by the notebook's first `# heading`. The notebooks are stored without outputs (they are source code), so by
# default each one is **executed** first, in its own folder, and rendered with what every cell produced — the tables,
# plots and printed measurements a reader wants to see next to the code; `execute=False` renders them as stored.
# A notebook that fails to execute stops the site with its name and the error.

# %%
#| export
def _title(nb_path):
    "First markdown `# ` heading of a notebook, else its file stem."
    for c in nbformat.read(nb_path, as_version=4).cells:
        if c.cell_type == "markdown":
            for line in c.source.splitlines():
                if line.startswith("# "): return line[2:].strip()
    return Path(nb_path).stem

def executed_copy(nb_path, out_path, timeout=3600):
    "Execute the notebook `nb_path` in its own folder and save the executed copy as `out_path`."
    from nbclient import NotebookClient
    nb = nbformat.read(nb_path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(Path(nb_path).parent)}},
                            extra_arguments=["--IPKernelApp.log_level=CRITICAL"])
    try: client.execute()
    except Exception as e: raise RuntimeError(f"{Path(nb_path).name} failed to execute: {type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}") from None
    nbformat.write(nb, out_path)
    return Path(out_path)

def render_site(out="outputs/site", # output folder
                report=None, # an executed report .ipynb or a report .html to include
                notebooks=None, # notebooks to render; default: nbs/*.ipynb of the repository
                execute=True, # execute each notebook first, so the pages show every cell's output
               ):
    "Render the library notebooks (and a report) to HTML in `out` with an index.html in reading order; returns index."
    out = Path(out); out.mkdir(parents=True, exist_ok=True)
    nbs = sorted((Path(p) for p in notebooks) if notebooks else (_repo_root() / "nbs").glob("*.ipynb"),
                 key=lambda q: (q.stem[:1].isdigit(), q.name))                   # unnumbered pages (the protocol) first
    entries = []
    for nb in nbs:
        src = executed_copy(nb, out / f"{nb.stem}.ipynb") if execute else nb
        entries.append((to_html(src, out / f"{nb.stem}.html").name, _title(nb)))
    if report:
        report = Path(report)
        if report.suffix == ".html": shutil.copy(report, out / "report.html")
        else: to_html(report, out / "report.html", exclude_input=True)
        entries.append(("report.html", "Reproduction report"))
    items = "\n".join(f'<li><a href="{html.escape(h)}">{html.escape(t)}</a> <small>({html.escape(h)})</small></li>'
                      for h, t in entries)
    idx = out / "index.html"
    idx.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>sparse_attention_repro</title></head>"
                   f"<body><h1>sparse_attention_repro</h1><p>Notebooks in reading order.</p><ol>\n{items}\n</ol>"
                   f"</body></html>", encoding="utf-8")
    return idx


# %%
with tempfile.TemporaryDirectory() as d:
    idx = render_site(d, notebooks=[_repo_root() / "nbs" / "00_normalizers.ipynb"], execute=False)
    s = idx.read_text()
    assert 'href="00_normalizers.html"' in s and "Attention normalizers" in s
    assert "<html" in (Path(d) / "00_normalizers.html").read_text()[:2000].lower()

# %% [markdown]
# Executed, a page shows what its cells computed — here a two-cell notebook whose output exists only after execution —
# and a failing notebook is named:

# %%
with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A tiny page"),
                                         nbformat.v4.new_code_cell("print(sum(range(101)))")])
    nbformat.write(nb, d / "tiny.ipynb")
    render_site(d / "site", notebooks=[d / "tiny.ipynb"])
    assert "5050" in (d / "site" / "tiny.html").read_text() and "5050" not in (d / "tiny.ipynb").read_text()
    nb.cells[1].source = "1 / 0"; nbformat.write(nb, d / "bad.ipynb")
    test_fail(lambda: render_site(d / "site", notebooks=[d / "bad.ipynb"]), contains="bad.ipynb failed to execute")
