"""Every notebook executes end to end under the smoke profile (papermill)."""

from pathlib import Path

import nbformat
import pytest

from fedlib.notebooks import NOTEBOOKS, execute

SOURCES = sorted(NOTEBOOKS.glob("*.ipynb"))


def test_there_are_notebooks():
    assert SOURCES, "no notebooks found"


@pytest.mark.slow
@pytest.mark.parametrize("src", SOURCES, ids=[s.stem for s in SOURCES])
def test_notebook_runs_under_smoke(src: Path, tmp_path):
    nb = nbformat.read(src, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert "profile" in tagged[0].source
    out = tmp_path / src.name
    execute(src, out, {"profile": "smoke"})
    done = nbformat.read(out, as_version=4)
    errors = [o for c in done.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors
    injected = [c for c in done.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and all("remove-cell" in c.metadata["tags"] for c in injected)
