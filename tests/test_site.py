"""The documentation site in a real browser: headless Chromium opens the built pages with no network, and every formula
is rendered (MathML), none left as raw TeX; every page has the navigation bar in reading order."""
import os, re, shutil
from pathlib import Path
import pytest

from conftest import ROOT
from sparse_attention_repro.report import render_site, site_pages, to_html

CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM:
    if os.environ.get("CI"): raise RuntimeError("Chromium is missing: .ci/run installs the Debian package chromium")
    pytest.skip("no Chromium here (apt-get install chromium); CI runs this test", allow_module_level=True)
if not os.environ.get("CI"): pytest.importorskip("playwright.sync_api")   # in CI a missing playwright fails the import below
from playwright.sync_api import sync_playwright

PAGES = ["index.ipynb", "protocol.ipynb", "00c_entmax.ipynb"]   # the home page, prose, the formulas

# Text of the rendered markdown, code left out (code may hold backslashes): raw TeX would show as `\name` or `$…$`.
PROSE = """() => Array.from(document.querySelectorAll('.jp-RenderedMarkdown')).map(e => {
  const c = e.cloneNode(true); c.querySelectorAll('code, pre').forEach(x => x.remove()); return c.innerText; }).join('\\n')"""
MATH = "() => Array.from(document.querySelectorAll('math')).map(m => [getComputedStyle(m).display, m.getBoundingClientRect().width])"
NAV = "() => Array.from(document.querySelectorAll('nav.site-nav li a')).map(a => [a.getAttribute('href'), a.getAttribute('aria-current')])"

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    render_site(out, notebooks=[ROOT / "nbs" / p for p in PAGES], execute=False)
    return out

@pytest.mark.slow                       # a browser start and four pages: in `pytest -m slow`, which CI runs too
def test_pages_render_offline_with_maths_and_navigation(site):
    order = [("index.html" if p == "index.ipynb" else p.replace(".ipynb", ".html")) for p in
             [q.name for q in site_pages([ROOT / "nbs" / p for p in PAGES])]]
    assert order[0] == "index.html" and order[1] == "protocol.html"           # home first, then reading order
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        page.on("request", lambda r: requests.append(r.url))
        for name in order:
            page.goto((site / name).as_uri(), wait_until="networkidle")
            prose = page.evaluate(PROSE)
            assert len(prose) > 500, name                                    # the page has its text
            raw = re.findall(r"\\[A-Za-z]{2,}|\$[^$\n]{1,80}\$", prose)
            assert not raw, f"{name}: raw TeX on the rendered page: {raw[:5]}"
            nav = page.evaluate(NAV)
            assert [h for h, _ in nav] == order and [h for h, cur in nav if cur == "page"] == [name], name
            if name == "00c_entmax.html":
                maths = page.evaluate(MATH)
                assert len(maths) > 20 and all(d in ("math", "block math", "inline math") and w > 0 for d, w in maths), maths[:5]
        shot = site / "normalizers.png"
        page.goto((site / "00c_entmax.html").as_uri(), wait_until="networkidle"); page.screenshot(path=str(shot))
        browser.close()
    outside = [u for u in requests if not u.startswith(("file:", "data:"))]
    assert not outside, f"network requests: {outside[:5]}"
    assert len([u for u in requests if u.startswith("file:")]) == len(order) + 1            # the pages themselves only
    assert shot.stat().st_size > 10_000

WIDE = "() => Array.from(document.querySelectorAll('table')).filter(t => t.getBoundingClientRect().right > window.innerWidth + 1).length"

@pytest.mark.slow
def test_report_tables_fit_the_page(tmp_path):
    "The committed report's wide tables (the tuned verdicts, the compute-matched reading) stay inside a 1280-pixel page: they scroll within it."
    page_file = to_html(ROOT / "outputs" / "paper" / "report.ipynb", tmp_path / "report.html", exclude_input=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(Path(page_file).as_uri(), wait_until="load")
        assert page.evaluate("() => document.querySelectorAll('table').length") > 20
        assert page.evaluate(WIDE) == 0
        browser.close()
