"""Pre-registration that can be checked: every committed run of a declared stage started after the commit that declared
its protocol (the first executed notebook's papermill start time against that commit's time)."""
import subprocess
from datetime import datetime
import nbformat
import pytest
from conftest import ROOT

# results folder -> the commit that declared the protocol its runs follow
DECLARED = {
    "outputs/length": "58deb983",      # the length study's protocol, as amended after a review and before these runs
}

def commit_time(commit):
    res = subprocess.run(["git", "show", "-s", "--format=%cI", commit], cwd=ROOT, capture_output=True, text=True)
    if res.returncode: pytest.skip(f"commit {commit} is not in this checkout's history (a shallow clone?)")
    return datetime.fromisoformat(res.stdout.strip())

@pytest.mark.parametrize("folder", list(DECLARED))
def test_runs_start_after_their_protocol(folder):
    notebooks = sorted((ROOT / folder / "notebooks").rglob("*.ipynb"))
    if not notebooks: pytest.skip(f"{folder} holds no executed notebook yet")
    declared = commit_time(DECLARED[folder])
    starts = {nb: nbformat.read(nb, as_version=4).metadata.get("papermill", {}).get("start_time") for nb in notebooks}
    assert all(starts.values()), [str(nb) for nb, t in starts.items() if not t]
    first = min(starts, key=lambda nb: starts[nb])
    assert datetime.fromisoformat(starts[first]) > declared, f"{first} started {starts[first]}, before its protocol ({declared})"
