"""Every notebook and its jupytext `py:percent` twin hold the same cells: editing one side without syncing fails here."""
import jupytext
import pytest
from conftest import ROOT

NOTEBOOKS = sorted(p.relative_to(ROOT) for p in (ROOT / "nbs").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)

def cells(path):
    return [(c.cell_type, c.source.strip(), tuple(c.metadata.get("tags", ()))) for c in jupytext.read(path).cells]

@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=str)
def test_notebook_and_its_twin_hold_the_same_cells(notebook):
    twin = (ROOT / notebook).with_suffix(".py")
    assert twin.exists(), f"{notebook} has no py:percent twin; run jupytext --sync {notebook}"
    assert cells(ROOT / notebook) == cells(twin), f"{notebook} and {twin.name} differ; run jupytext --sync {notebook}"
