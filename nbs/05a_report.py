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
# ## HTML export, offline
#
# `embed_images=True` inlines the PNGs as data URIs — that is what makes the report self-contained; `exclude_input`
# hides the code (the report is for readers of results; the `.ipynb` beside it keeps the code). A raw front-matter cell
# (`skip_exec: true`, which keeps `nbdev_test` off the experiment notebooks) is instructions for tools, not for readers,
# so it is left out of the HTML.
#
# nbconvert's own pages load MathJax and require.js from a CDN, so offline every formula shows as raw
# `$\mathrm{softmax}(s)_i = …$`. Ours are built to need no network: each formula of a markdown cell is converted to
# MathML when the page is built (by `latex2mathml`, a small pure-Python converter; every current browser renders
# MathML natively), and the template drops the CDN scripts. A formula the converter cannot read stops the build with
# the formula and its page named, instead of showing up as raw TeX.

# %%
#| export
import re
import jinja2
from latex2mathml.converter import convert as latex_to_mathml
from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

def github_slug(heading: str) -> str:
    "The anchor GitHub gives a heading: its text without markup, lower-cased, punctuation dropped, spaces as hyphens."
    text = html.unescape(re.sub(r"<[^>]+>", "", heading)).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")

class MathMLRenderer(IPythonRenderer):
    "nbconvert's markdown renderer with every `$…$` and `$$…$$` turned into MathML at build time."
    def _math(self, tex, display):
        try: out = latex_to_mathml(tex.strip(), display=display)
        except Exception as e: out, why = None, f"{type(e).__name__}: {e}"
        else: why = "unknown command " + m.group(1) if (m := re.search(r">[^<]*?(\\[A-Za-z]+)", out)) else None   # passed through raw
        if why: raise ValueError(f"{self.path or 'a notebook'}: formula ${tex}$ cannot be converted to MathML ({why}); "
                                 "rewrite it in plainer TeX")
        return out
    def _src_to_base64(self, src):
        "An image embedded as a data URI when it lies under `image_root` (nbconvert's own rule: under the notebook's folder)."
        import base64, mimetypes
        f = (Path(self.path) / src).resolve()
        if not f.is_file() or not f.is_relative_to(Path(getattr(self, "image_root", None) or self.path).resolve()): return None
        return f"data:{mimetypes.guess_type(f.name)[0]};base64,{base64.b64encode(f.read_bytes()).decode('ascii')}"
    def heading(self, text, level, **attrs):
        "A heading whose anchor is GitHub's slug of its text, so a notebook's `[…](#the-answer)` links work here too."
        out = super().heading(text, level, **attrs)
        if m := re.search(r'id="([^"]*)"', out):
            out = out.replace(f'id="{m.group(1)}"', f'id="{github_slug(text)}"').replace(f'href="#{m.group(1)}"', f'href="#{github_slug(text)}"')
        return out
    def inline_math(self, body): return self._math(body, "inline")
    def block_math(self, body): return self._math(body, "block")
    def latex_environment(self, name, body): return self._math(f"\\begin{{{name}}}{body}\\end{{{name}}}", "block")

# %% [markdown]
# Every page shares one template: nbconvert's `lab` page without its CDN scripts, plus the site's style and a
# navigation bar listing every page in reading order (the current one marked), in the manner of an nbdev site.

# %%
#| export
SITE_CSS = """
body { margin: 0; }
nav.site-nav { position: fixed; top: 0; left: 0; bottom: 0; width: 15rem; overflow-y: auto; padding: 1rem 0.8rem;
  box-sizing: border-box; background: #f6f8fa; border-right: 1px solid #d0d7de; font: 14px/1.4 system-ui, sans-serif; }
nav.site-nav .site-title { display: block; font-weight: 600; font-size: 15px; margin-bottom: 0.8rem; color: #1f2328; text-decoration: none; }
nav.site-nav ol { list-style: none; padding: 0; margin: 0; }
nav.site-nav li a { display: block; padding: 0.25rem 0.5rem; border-radius: 6px; color: #0969da; text-decoration: none; }
nav.site-nav li a:hover { background: #eaeef2; }
nav.site-nav li a[aria-current="page"] { background: #ddf4ff; color: #1f2328; font-weight: 600; }
body > main { margin-left: 15rem; padding: 1rem 2rem; max-width: 70rem; }
math[display="block"] { margin: 0.6em 0; }
.jp-RenderedHTMLCommon table { display: block; max-width: 100%; overflow-x: auto; }   /* a wide table scrolls inside the page */
@media (max-width: 50rem) { nav.site-nav { position: static; width: auto; border-right: none; } body > main { margin-left: 0; } }
"""

SITE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">{{ resources.site_css }}</style>{%- endblock extra_css -%}
{%- block body_header -%}
<body class="jp-Notebook" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">{{ resources.site_nav }}<main>
{%- endblock body_header -%}
"""

class OfflineHTMLExporter(HTMLExporter):
    """nbconvert's HTML exporter with build-time MathML, no CDN scripts, the site's style and an optional navigation bar;
    images are embedded from anywhere under `image_root` (default: the notebook's folder)."""
    def __init__(self, image_root=None, **kw):
        super().__init__(template_name="lab", template_file="site.html.j2", embed_images=True,
                         extra_loaders=[jinja2.DictLoader({"site.html.j2": SITE_TEMPLATE})], **kw)
        self.image_root = image_root

    @jinja2.pass_context
    def markdown2html(self, context, source):
        cell = context.get("cell", {})
        renderer = MathMLRenderer(escape=False, attachments=cell.get("attachments", {}), embed_images=self.embed_images,
                                  path=context.get("resources", {}).get("metadata", {}).get("path", ""),
                                  anchor_link_text=self.anchor_link_text, exclude_anchor_links=self.exclude_anchor_links,
                                  **self.lexer_options)
        renderer.image_root = self.image_root
        return MarkdownWithMath(renderer=renderer).render(source)

def site_nav(pages, current=None) -> str:
    "The navigation bar: `pages` as (href, title) in reading order, `current` (an href) marked as this page."
    items = "".join(f'<li><a href="{html.escape(h)}"' + (' aria-current="page"' if h == current else "") + f">{html.escape(t)}</a></li>"
                    for h, t in pages)
    return f'<nav class="site-nav"><a class="site-title" href="index.html">sparse_attention_repro</a><ol>{items}</ol></nav>'

def to_html(nb_path, html_path=None, exclude_input=False, nav="", src_dir=None, image_root=None):
    """Convert a notebook to one self-contained HTML file (images embedded, maths as MathML, no network); returns its path.
    Relative image links resolve from `src_dir` (default: the notebook's folder) and are embedded when they lie under
    `image_root` (default: that folder)."""
    nb_path = Path(nb_path); html_path = Path(html_path or nb_path.with_suffix(".html"))
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "raw" and c.source.lstrip().startswith("---"))]
    body, _ = OfflineHTMLExporter(exclude_input=exclude_input, image_root=image_root).from_notebook_node(
        nb, resources={"metadata": {"path": str(src_dir or nb_path.parent), "name": nb_path.stem}, "site_css": SITE_CSS, "site_nav": nav})
    html_path.write_text(body, encoding="utf-8")
    return html_path

# %% [markdown]
# A page with a formula gets MathML and no script or stylesheet from elsewhere; a formula the converter cannot read
# is named:

# %%
with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Maths\n\nInline $\\alpha = 1.5$ and\n\n"
                                                                          "$$\\mathrm{softmax}(s)_i = \\frac{e^{s_i}}{\\sum_j e^{s_j}}$$")])
    nbformat.write(nb, d / "m.ipynb")
    page = to_html(d / "m.ipynb", nav=site_nav([("m.html", "Maths"), ("x.html", "Other")], "m.html")).read_text()
    assert page.count("<math") == 2 and "<mfrac>" in page and "$" not in page.split("<main>")[1]
    assert not re.search(r'<(script|link)[^>]+(src|href)="https?://', page)          # nothing loaded from a network
    test_eq(re.findall(r'<a ([^>]*)>(Maths|Other)</a>', page), [('aria-current="page" href="m.html"', "Maths"), ('href="x.html"', "Other")])
    assert 'id="maths"' in page                                             # GitHub's anchor, as notebooks link to it
    test_eq(github_slug("Study A: accuracy per dataset and method, every seed shown"), "study-a-accuracy-per-dataset-and-method-every-seed-shown")
    test_eq(github_slug("The <code>tuned</code> grid — 24 tests"), "the-tuned-grid--24-tests")
    for bad, why in [("x^", "MissingSuperScriptOrSubscriptError"), (r"\arg\min_p f", r"unknown command \arg")]:
        nb.cells[0].source = f"# Bad\n\n${bad}$"; nbformat.write(nb, d / "bad.ipynb")
        test_fail(lambda: to_html(d / "bad.ipynb"), contains=why)


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
# (`stats.versus_baseline`). It goes to `versus_baseline.md` and `versus_baseline.csv` in the new method's folder. Where
# the folder holds several new methods, their comparisons with each other follow (`stats.between_new_methods`, also in
# `between_methods.csv`).

# %%
#| export
def versus_report(results_dir, baseline_dir) -> Path:
    "Pair the new methods of `results_dir` with the committed runs of `baseline_dir`; write versus_baseline.md/.csv there."
    from sparse_attention_repro import stats as S, verdicts as V
    res, base = Path(results_dir), Path(baseline_dir)
    new, old = S.load_runs(res / "runs.csv"), S.load_runs(base / "runs.csv")
    t, pc = S.versus_baseline(new, old), S.pairing_check(new, old)
    shown = os.path.relpath(base.resolve(), res.resolve())
    lines = [f"# New methods against the committed baselines", "",
             f"Runs in this folder, paired by seed with the committed runs of `{shown}` (same subsets, initial weights, batches "
             f"and dropout masks). Holm within each new method's own family (all its comparisons); the paper's tests are unchanged.", ""]
    same = int(pc.identical.sum())
    lines += [f"**Pairing check:** softmax re-run on {len(pc)} (dataset, seed) pair(s); {same} of {len(pc)} test accuracies equal "
              f"the committed ones bit for bit." + ("" if same == len(pc) else " The pairing is **not** exact: read the comparisons as unpaired."), "",
              "**Cost:** not read from these runs, which ran on another day than the baselines; `sparse-repro card NAME` measures "
              "a normalizer's forward + backward beside softmax's in one process.", ""]
    for m in sorted(set(t.method)):
        lines += [f"## {m}", "", V.versus_answer(t, m).to_markdown(index=False, disable_numparse=True), "",
                  V.readable_versus(t[t.method == m]).to_markdown(index=False, disable_numparse=True), ""]
    if not len(t): lines += ["No new method found in this folder (only the baselines' methods)."]
    if len(between := S.between_new_methods(new)):
        lines += ["## The new methods against each other", "",
                  "Trained on the same seeds, subsets, initial weights and batches, so paired by seed; Holm over these pairs alone (`between_methods.csv`).", "",
                  V.readable_versus(between).to_markdown(index=False, disable_numparse=True), ""]
    atomic_write(res / "versus_baseline.md", lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n", encoding="utf-8"))
    save_rows(t, res / "versus_baseline.csv")
    if len(between): save_rows(between, res / "between_methods.csv")
    return res / "versus_baseline.md"


# %% [markdown]
# ## The documentation site
#
# `render_site` converts the library notebooks — `nbs/index.ipynb` as the home page (`index.html`, the same text as
# the README), the protocol page, then the numbered notebooks in file-name order = reading order — plus, optionally, a
# report (an executed `.ipynb`, or an `.html` that is copied). Each page is titled by the notebook's first `# heading`
# and carries the navigation bar of all pages. The notebooks are stored without outputs (they are source code), so by
# default each one is **executed** first, in its own folder, and rendered with what every cell produced — the tables,
# plots and printed measurements a reader wants to see next to the code; `execute=False` renders them as stored.
# A notebook that fails to execute stops the site with its name and the error.
#
# Links between notebooks are written as they work in Jupyter (`protocol.ipynb`, `../outputs/paper/report.html`);
# `rebase_links` rewrites them for where a page is read: on the site a notebook link goes to its page and any other
# file is reached from the site's folder; in the README (`readme_markdown`) every link is taken from `nbs/` to the
# repository root.

# %%
#| export
_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")

def rebase_links(markdown, rebase, images=True) -> str:
    "Apply `rebase(target)` to each relative link (and image, if `images`) target of `markdown`; URLs and anchors are kept."
    def sub(m):
        bang, text, target = m.groups()
        if re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", target) or (bang and not images): return m.group(0)
        return f"{bang}[{text}]({rebase(target)})"
    return _LINK.sub(sub, markdown)

# %%
test_eq(rebase_links("[a](protocol.ipynb), ![f](../x.png), [u](https://e.org/a.ipynb), [s](#top)", lambda t: "R/" + t),
        "[a](R/protocol.ipynb), ![f](R/../x.png), [u](https://e.org/a.ipynb), [s](#top)")
test_eq(rebase_links("![f](../x.png) [a](b.md)", str.upper, images=False), "![f](../x.png) [a](B.MD)")

# %%
#| export
def readme_blocks(index_nb) -> dict:
    """The home notebook's generated blocks, each from the committed tables under the repository's `outputs/`:
    {markers: markdown}, links relative to the notebook's folder. A block whose tables are absent is not filled."""
    from sparse_attention_repro.tuned_reading import README_MARKERS, answer_markdown
    from sparse_attention_repro.leaderboard import LEADERBOARD_MARKERS, leaderboard_parts, leaderboard_short
    here = Path(index_nb).resolve().parent; out = here.parent / "outputs"
    blocks = {}
    if (out / "paper" / "tables" / "tuned_tests.csv").is_file(): blocks[README_MARKERS] = answer_markdown(out / "paper", relative_to=here)
    if (out / "paper" / "tables").is_dir():
        rows, vs_entmax, table = leaderboard_parts(out)
        blocks[LEADERBOARD_MARKERS] = leaderboard_short(rows, vs_entmax, table.normalizer, Path(os.path.relpath(out / "leaderboard.md", here)).as_posix())
    from sparse_attention_repro.leaderboard import LENGTH_ROOT
    from sparse_attention_repro.length_analysis import LENGTH_MARKERS, length_answer
    if (lt := out / LENGTH_ROOT / "tables").is_dir() and all((lt / f).is_file() for f in ("length_accuracy.csv", "length_gains.csv", "length_learned.csv")):
        import pandas as pd
        blocks[LENGTH_MARKERS] = length_answer(*(pd.read_csv(lt / f) for f in ("length_accuracy.csv", "length_gains.csv", "length_learned.csv")),
                                               recipes=pd.read_csv(lt / "length_recipes.csv") if (lt / "length_recipes.csv").is_file() else None)
    return blocks

def fill_blocks(nb, blocks, where):
    "Fill each generated block of `blocks` in the markdown cells of the notebook node `nb` that hold its markers (in place)."
    from sparse_attention_repro.files import replace_block
    for markers, block in blocks.items():
        for c in nb.cells:
            if c.cell_type == "markdown" and markers[0] in c.source: c.source = replace_block(c.source, block, markers, where)

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

def site_pages(nbs) -> list:
    "The notebooks in reading order: `index` first, then the unnumbered pages (the protocol), then the numbered ones."
    return sorted(nbs, key=lambda q: (q.stem != "index", q.stem[:1].isdigit(), q.name))

def _page(nb) -> str: return "index.html" if Path(nb).stem == "index" else f"{Path(nb).stem}.html"

def render_site(out="outputs/site", # output folder
                report=None, # an executed report .ipynb or a report .html to include
                notebooks=None, # notebooks to render; default: nbs/*.ipynb of the repository
                execute=True, # execute each notebook first, so the pages show every cell's output
               ):
    "Render the library notebooks (and a report) to HTML in `out`, every page with the navigation bar; returns index.html."
    out = Path(out).resolve(); out.mkdir(parents=True, exist_ok=True)
    nbs = site_pages([Path(p).resolve() for p in notebooks] if notebooks else list((_repo_root() / "nbs").glob("*.ipynb")))
    pages = [(_page(nb), "Home" if nb.stem == "index" else _title(nb)) for nb in nbs] + ([("report.html", "Reproduction report")] if report else [])
    by_file = {nb.resolve(): _page(nb) for nb in nbs}
    report_file = Path(report).resolve() if report else None
    for nb in nbs:
        def rebase(target, src=nb.parent):
            path, _, anchor = target.partition("#")
            f = (src / path).resolve()
            if f in by_file: page = by_file[f]
            elif report_file is not None and f in (report_file, report_file.with_suffix(".html")): page = "report.html"
            else: page = os.path.relpath(f, out)
            return page + (f"#{anchor}" if anchor else "")
        src = executed_copy(nb, out / f"{nb.stem}.ipynb") if execute else nb
        page_nb = nbformat.read(src, as_version=4)
        if nb.stem == "index": fill_blocks(page_nb, readme_blocks(nb), nb)    # the home page's numbers, as the README's
        for c in page_nb.cells:
            if c.cell_type == "markdown": c.source = rebase_links(c.source, rebase, images=False)   # images are embedded from nbs/
            if c.cell_type == "code":                                         # nbdev's `#|` directives are for tools
                c.source = "\n".join(l for l in c.source.splitlines() if not l.lstrip().startswith("#|")).strip("\n")
        page_nb.cells = [c for c in page_nb.cells if c.cell_type != "code" or c.source or c.get("outputs")]
        nbformat.write(page_nb, staged := out / f".{nb.stem}.page.ipynb")
        try: to_html(staged, out / _page(nb), nav=site_nav(pages, _page(nb)), src_dir=nb.parent, image_root=nb.parent.parent)
        finally: staged.unlink()
    if report:
        if report_file.suffix == ".html": shutil.copy(report_file, out / "report.html")
        else: to_html(report_file, out / "report.html", exclude_input=True, nav=site_nav(pages, "report.html"))
    if not any(nb.stem == "index" for nb in nbs):           # a partial site still gets a home page listing its pages
        to_html(_index_stub(out, pages), out / "index.html", nav=site_nav(pages, "index.html"))
        (out / ".index.ipynb").unlink()
    return out / "index.html"

def _index_stub(out, pages) -> Path:
    "A one-cell notebook listing `pages`, for a site rendered without `nbs/index.ipynb`."
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# sparse_attention_repro\n\nNotebooks in reading order:\n\n" + "\n".join(f"1. [{t}]({h})" for h, t in pages))])
    nbformat.write(nb, out / ".index.ipynb")
    return out / ".index.ipynb"


# %%
with tempfile.TemporaryDirectory() as d:
    idx = render_site(d, notebooks=[_repo_root() / "nbs" / "00c_entmax.ipynb"], execute=False)   # the page of formulas
    s = idx.read_text()                                   # no index.ipynb among the pages: a stub home page lists them
    assert 'href="00c_entmax.html"' in s and "Entmax" in s
    page = (Path(d) / "00c_entmax.html").read_text()
    assert '<a aria-current="page" href="00c_entmax.html">' in page and page.count("<math") > 20

# %% [markdown]
# A home page's links go to the pages they name, and to other files from the site's folder:

# %%
with tempfile.TemporaryDirectory() as d:
    d = Path(d); (d / "nbs").mkdir(); (d / "outputs").mkdir(); (d / "outputs" / "r.csv").write_text("a\n")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# Home\n\nSee [the page](01_page.ipynb#part) and [the runs](../outputs/r.csv).\n\n![a figure](../outputs/f.png)")]),
        d / "nbs" / "index.ipynb")
    (d / "outputs" / "f.png").write_bytes(b"\x89PNG not really")
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A page\n\n[home](index.ipynb)"),
        nbformat.v4.new_code_cell("#| export"), nbformat.v4.new_code_cell("#| export\nx = 41 + 1")]), d / "nbs" / "01_page.ipynb")
    render_site(d / "site", notebooks=sorted((d / "nbs").glob("*.ipynb")), execute=False)
    home, other = (d / "site" / "index.html").read_text(), (d / "site" / "01_page.html").read_text()
    assert 'href="01_page.html#part"' in home and 'href="../outputs/r.csv"' in home and 'href="index.html"' in other
    assert 'src="data:image/png;base64,iVBORyBub3QgcmVhbGx5"' in home        # an image of the repository, embedded
    assert "export" not in other and other.count('class="jp-Cell jp-CodeCell') == 1          # directives dropped, and a cell of nothing else
    assert '<a href="01_page.html">A page</a>' in home and '<a aria-current="page" href="index.html">Home</a>' in home   # the nav
    test_eq(sorted(p.name for p in (d / "site").iterdir()), ["01_page.html", "index.html"])      # nothing staged is left

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

# %% [markdown]
# ## The README, from the home notebook
#
# `nbs/index.ipynb` is the home page of the site and the source of the README, as `settings.ini`'s `readme_nb` says.
# nbdev's own `nbdev_readme` renders it through Quarto, which cannot be installed from the package registries this
# project builds from, so `readme_markdown` uses nbconvert's markdown exporter instead: the notebook's markdown cells
# as they are, its code cells as fenced blocks (with their outputs, if stored), every relative link taken from `nbs/`
# to the repository root. `write_readme` writes it; a test checks that the committed README is what the committed
# home notebook gives, as the CI checks the exported library against the notebooks.
#
# The README's numbers are not in the notebook: its generated blocks (the answer, the leaderboard's short form) hold
# only their markers there, and `readme_blocks` fills them from the committed tables each time the README (or the home
# page of the site) is built. So no results command writes the source notebook, and a new result reaches the README
# through `sparse-repro readme` alone.

# %%
#| export
README_HEADER = "<!-- generated from nbs/index.ipynb by `sparse-repro readme`: edit the notebook, not this file -->"

def readme_markdown(index_nb) -> str:
    """The README text of the home notebook `index_nb` (in the repository's `nbs/`), its generated blocks filled from the
    committed tables, links rebased to the repository root."""
    from nbconvert import MarkdownExporter
    index_nb = Path(index_nb).resolve(); root = index_nb.parent.parent
    nb = nbformat.read(index_nb, as_version=4)
    fill_blocks(nb, readme_blocks(index_nb), index_nb)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "raw" and c.source.lstrip().startswith("---"))]
    nb.metadata.setdefault("language_info", {"name": "python"})          # code fences say their language
    def rebase(target):
        path, hash_, anchor = target.partition("#")
        return Path(os.path.relpath((index_nb.parent / path).resolve(), root)).as_posix() + hash_ + anchor
    for c in nb.cells:
        if c.cell_type == "markdown": c.source = rebase_links(c.source, rebase)
    body, _ = MarkdownExporter().from_notebook_node(nb)
    return README_HEADER + "\n\n" + re.sub(r"\n{3,}", "\n\n", body).strip() + "\n"

def write_readme(index_nb, readme) -> bool:
    "Write `readme_markdown(index_nb)` to `readme`; True when the file changed."
    text = readme_markdown(index_nb)
    if Path(readme).exists() and Path(readme).read_text(encoding="utf-8") == text: return False
    atomic_write(readme, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))
    return True

# %%
with tempfile.TemporaryDirectory() as d:
    d = Path(d); (d / "nbs").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Home\n\nRead [the protocol](protocol.ipynb#data), ![a figure](../outputs/f.png) and [the site](https://e.org/x)."),
        nbformat.v4.new_code_cell("print(1 + 1)")]), d / "nbs" / "index.ipynb")
    assert write_readme(d / "nbs" / "index.ipynb", d / "README.md") and not write_readme(d / "nbs" / "index.ipynb", d / "README.md")
    test_eq((d / "README.md").read_text(), README_HEADER + "\n\n# Home\n\nRead [the protocol](nbs/protocol.ipynb#data), "
            "![a figure](outputs/f.png) and [the site](https://e.org/x).\n\n```python\nprint(1 + 1)\n```\n")
