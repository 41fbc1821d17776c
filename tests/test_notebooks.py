"""Every notebook executes end to end under the smoke profile (papermill), and the book built
from those executions passes ``jupyter-book build -W`` and a check in headless Chromium."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from fedlib.browser_check import check_book, find_chromium
from fedlib.notebooks import CHAPTERS, NOTEBOOKS, execute_timed, ordered

SOURCES = ordered(list(NOTEBOOKS.glob("*.ipynb")))
BOOK = CHAPTERS.parent


def test_there_are_notebooks_and_each_has_one_parameters_cell():
    assert SOURCES, "no notebooks found"
    for src in SOURCES:
        nb = nbformat.read(src, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "profile" in tagged[0].source, src.name


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """A copy of ``book/`` whose chapters are every notebook executed under the smoke profile
    (results in a temporary folder). Returns (book dir, {stem: error message or None})."""
    root = tmp_path_factory.mktemp("smoke")
    book = root / "book"
    shutil.copytree(BOOK, book, ignore=shutil.ignore_patterns("_build", "*.ipynb"))
    saved = os.environ.get("FEDLIB_RESULTS_DIR")
    os.environ["FEDLIB_RESULTS_DIR"] = str(root / "data" / "results")
    errors = {}
    try:
        for src in SOURCES:
            try:
                execute_timed(src, book / "chapters" / src.name, {"profile": "smoke"})
                errors[src.stem] = None
            except Exception as e:  # noqa: BLE001 - reported by the per-notebook test
                errors[src.stem] = f"{type(e).__name__}: {str(e)[-2000:]}"
    finally:
        if saved is None:
            os.environ.pop("FEDLIB_RESULTS_DIR", None)
        else:
            os.environ["FEDLIB_RESULTS_DIR"] = saved
    return book, errors


@pytest.mark.slow
@pytest.mark.parametrize("src", SOURCES, ids=[s.stem for s in SOURCES])
def test_notebook_runs_under_smoke(src: Path, smoke_book):
    book, errors = smoke_book
    assert errors[src.stem] is None, errors[src.stem]
    done = nbformat.read(book / "chapters" / src.name, as_version=4)
    assert not [o for c in done.cells if c.cell_type == "code" for o in c.get("outputs", [])
                if o.output_type == "error"]
    injected = [c for c in done.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and all("remove-cell" in c.metadata["tags"] for c in injected)


@pytest.mark.slow
def test_smoke_book_builds_and_renders_in_a_browser(smoke_book):
    """``jupyter-book build -W -n`` of the smoke-executed book, then every page in headless
    Chromium: no missing image, no broken internal link, no raw math; screenshots saved."""
    book, errors = smoke_book
    assert not any(errors.values()), "some notebooks failed; see test_notebook_runs_under_smoke"
    jb = Path(sys.executable).with_name("jupyter-book")
    build = subprocess.run([str(jb), "build", "-W", "-n", "--keep-going", str(book)], capture_output=True,
                           text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    if find_chromium() is None:
        pytest.skip("Chromium not installed (apt-get install chromium); .ci/run installs it")
    reports = check_book(book / "_build" / "html", book / "_build" / "screenshots")
    assert len(reports) >= len(SOURCES)
    problems = {r.page: r.problems for r in reports if r.problems}
    assert not problems, problems
    assert all(r.screenshot is not None for r in reports)
