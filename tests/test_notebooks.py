"""Every notebook executes end to end under the smoke profile (papermill), and the book built
from those executions passes ``jupyter-book build -W`` and a check in headless Chromium."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from lab.browser_check import check_book, find_chromium
from lab.notebooks import CHAPTERS, NOTEBOOKS, execute, execute_timed, ordered, parameters_of
from studies.claims import Verdict

SOURCES = ordered(list(NOTEBOOKS.glob("*.ipynb")))
BOOK = CHAPTERS.parent


def test_there_are_notebooks_and_each_has_one_parameters_cell():
    assert SOURCES, "no notebooks found"
    for src in SOURCES:
        nb = nbformat.read(src, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1 and "profile" in tagged[0].source, src.name
        assert all(p["meaning"] for p in parameters_of(src)), f"{src.name}: a parameter without a comment"


#: Pages that only read the ledger (filter its rows by class); every other page computes findings.
LEDGER_READERS = {"ledger", "summary"}


def test_no_notebook_holds_a_verdict_rule():
    """Verdicts come from the studies' claims modules: no notebook builds a Finding or a Verdict,
    compares against a verdict class, or writes a verdict as a literal string."""
    import ast

    classes = {v.value for v in Verdict}
    for src in SOURCES:
        nb = nbformat.read(src, as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            tree = ast.parse(cell.source)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value.strip().lower()
                    assert not any(text == v or text.startswith(v + ":") for v in classes), (
                        f"{src.name}: literal verdict {node.value!r}"
                    )
                if isinstance(node, ast.Name) and node.id in ("Finding", "Verdict"):
                    assert src.stem in LEDGER_READERS, (
                        f"{src.name}: uses {node.id} (a rule belongs in claims.py)"
                    )


def test_a_page_kernel_starts_without_the_unencrypted_transport_warning(tmp_path, capfd):
    """ipykernel >= 7.3 warns at every start that its TCP sockets are unencrypted (25 lines of
    ``make book``); lab.notebooks asks for CurveZMQ where the kernel supports it. The notebook still
    runs and its parameters arrive."""
    import zmq

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell("print('x is', x)")]
    src = tmp_path / "tiny.ipynb"
    nbformat.write(nb, src)
    execute(src, tmp_path / "out.ipynb", {"x": 7})
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    assert "x is 7" in out.cells[-1].outputs[0]["text"]
    if zmq.has("curve"):  # the wheels this project pins have it; without it the warning is expected
        assert "without encryption" not in capfd.readouterr().err


def test_a_rebuild_that_trains_a_pages_small_runs_again_leaves_its_timing_as_it_was(tmp_path):
    """A page whose small runs are not cached trains them at every build (units of privacy, the
    teaching page): their seconds differ each time, and a rebuild must still leave git clean (issue
    41); a page whose set of runs changes is recorded anew."""
    import json

    from lab.notebooks import record_timing, timings_dir

    def build(runs: dict[str, float]) -> dict:
        log = tmp_path / "runs.jsonl"
        log.write_text("".join(json.dumps({"key": k, "cached": False, "duration_s": s,
                                           "device": "cpu"}) + "\n" for k, s in runs.items()))
        record_timing("page", 9.0, "quick", log)
        return json.loads((timings_dir() / "page.json").read_text())

    first = build({"a": 2.8, "b": 60.0})
    assert build({"a": 4.4, "b": 61.3}) == first  # the same runs, timed again: the file is kept
    changed = build({"a": 4.4, "c": 70.0})
    assert changed["run_seconds"] == {"a": 4.4, "c": 70.0} and changed["runs_compute_s"] == 74.4


@pytest.mark.e2e  # executes a page (~12 s): make test-full
def test_a_rerun_outside_the_book_changes_no_tracked_file(tmp_path, monkeypatch):
    """A rerun with other parameters, as the rerun page says, writes to the scratch folder."""
    monkeypatch.delenv("FEDLIB_RESULTS_DIR", raising=False)
    monkeypatch.setenv("FEDLIB_SCRATCH_DIR", str(tmp_path / "scratch"))
    root = Path(__file__).resolve().parents[1]

    def status() -> str:
        return subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all", "--", "data", "book"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout

    before = status()
    for stem in ("fdl_privacy", "dpfl_setting"):
        execute_timed(
            NOTEBOOKS / f"{stem}.ipynb", tmp_path / f"{stem}.ipynb", {"profile": "smoke"}, into_book=False
        )
    assert status() == before
    assert (tmp_path / "scratch" / "verdicts" / "fdl_privacy.json").exists()
    assert list((tmp_path / "scratch" / "results").glob("dp_fedavg-*.json"))


def _execute_smoke(job: tuple[Path, Path]) -> str | None:
    """Execute one notebook at the smoke profile; its error message, or None."""
    src, dst = job
    try:
        execute_timed(src, dst, {"profile": "smoke"})
        return None
    except Exception as e:  # noqa: BLE001 - reported by the per-notebook test
        return f"{type(e).__name__}: {str(e)[-2000:]}"


@pytest.fixture(scope="session")
def smoke_book(tmp_path_factory):
    """A copy of ``book/`` whose chapters are every notebook executed under the smoke profile
    (results in a temporary folder). Returns (book dir, {stem: error message or None}).

    The chapters run two at a time in forked worker processes (each notebook is a kernel of its
    own, and starting one costs seconds of imports that a second core absorbs); the summary
    pages, which read what the others recorded, run last, one after the other."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from lab.notebooks import SUMMARY_PAGES

    root = tmp_path_factory.mktemp("smoke")
    book = root / "book"
    shutil.copytree(BOOK, book, ignore=shutil.ignore_patterns("_build", "*.ipynb"))
    saved = os.environ.get("FEDLIB_RESULTS_DIR")
    os.environ["FEDLIB_RESULTS_DIR"] = str(root / "data" / "results")
    chapters = [s for s in SOURCES if s.stem not in SUMMARY_PAGES]
    summaries = [s for s in SOURCES if s.stem in SUMMARY_PAGES]
    try:
        with ProcessPoolExecutor(max_workers=2, mp_context=mp.get_context("fork")) as pool:
            jobs = [(src, book / "chapters" / src.name) for src in chapters]
            errors = dict(zip([s.stem for s in chapters], pool.map(_execute_smoke, jobs), strict=True))
        for src in summaries:
            errors[src.stem] = _execute_smoke((src, book / "chapters" / src.name))
    finally:
        if saved is None:
            os.environ.pop("FEDLIB_RESULTS_DIR", None)
        else:
            os.environ["FEDLIB_RESULTS_DIR"] = saved
    return book, errors


@pytest.mark.slow
@pytest.mark.parametrize("src", SOURCES, ids=[s.stem for s in SOURCES])
@pytest.mark.e2e
def test_notebook_runs_under_smoke(src: Path, smoke_book):
    book, errors = smoke_book
    assert errors[src.stem] is None, errors[src.stem]
    done = nbformat.read(book / "chapters" / src.name, as_version=4)
    assert not [
        o
        for c in done.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    injected = [c for c in done.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and all("remove-cell" in c.metadata["tags"] for c in injected)


#: Pages whose findings are analytic (accounting, proofs, the scope of the article): they hold at
#: any profile, so a smoke run may state them.
ANALYTIC_PAGES = {"dpfl_composition", "fdl_privacy", "dpfl_setting"}


@pytest.mark.slow
@pytest.mark.e2e
def test_smoke_runs_issue_no_evidential_verdict(smoke_book):
    """A page trained at the smoke profile says nothing about a paper: every finding of a training
    page is 'not evaluated' (or a sanity check, or not testable); every row has one class."""
    from studies import ledger
    from studies.claims import EVIDENCE

    book, errors = smoke_book
    table = ledger.collect(book.parent / "data" / "verdicts")
    # every row graded at smoke, besides analytic rows (computed from the settings, no runs: issue 74)
    assert len(table) > 20 and set(table["profile"]) - {"analytic"} == {"smoke"}
    trained = table[~table["page"].isin(ANALYTIC_PAGES)]
    assert not trained["verdict"].isin(EVIDENCE).any(), trained[trained["verdict"].isin(EVIDENCE)]
    assert table["verdict"].map(type).eq(Verdict).all()


@pytest.mark.slow
@pytest.mark.e2e
def test_smoke_book_builds_and_renders_in_a_browser(smoke_book):
    """``jupyter-book build -W -n`` of the smoke-executed book, then every page in headless
    Chromium: no missing image, no broken internal link, no raw math; screenshots saved."""
    book, errors = smoke_book
    assert not any(errors.values()), "some notebooks failed; see test_notebook_runs_under_smoke"
    jb = Path(sys.executable).with_name("jupyter-book")
    build = subprocess.run(
        [str(jb), "build", "-W", "-n", "--keep-going", str(book)], capture_output=True, text=True, timeout=900
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    if find_chromium() is None:
        pytest.skip("Chromium not installed (apt-get install chromium); .ci/run installs it")
    reports = check_book(book / "_build" / "html", book / "_build" / "screenshots")
    assert len(reports) >= len(SOURCES)
    problems = {r.page: r.problems for r in reports if r.problems}
    assert not problems, problems
    assert all(r.screenshot is not None for r in reports)


def _make_prerequisites(target: str) -> list[str]:
    """The prerequisites of ``target``'s rule in the Makefile (one line, as it is written there)."""
    for line in (BOOK.parent / "Makefile").read_text().splitlines():
        if line.startswith(f"{target}:"):
            return line.split(":", 1)[1].split()
    raise AssertionError(f"the Makefile has no rule for {target}")


def test_make_book_installs_what_the_notebooks_import():
    """``make book`` sets up everything on a fresh machine: a notebook that needs the optional Flower
    extra (``fedlib.flower`` imports ``flwr``) makes the notebooks' rule install it first (a fresh
    clone's ``make book`` once stopped at the Flower page with ``No module named 'flwr'``)."""
    needs_flower = [s.name for s in SOURCES if any(m in s.read_text() for m in ("fedlib.flower", "flwr"))]
    assert needs_flower, "no notebook uses Flower any more: drop $(FLOWER_STAMP) from the notebooks rule"
    assert "$(FLOWER_STAMP)" in _make_prerequisites("notebooks"), (
        f"{needs_flower} import Flower, but make book does not install it")
    assert "notebooks" in _make_prerequisites("book")


# the units page's cell takes ~35 s (it trains): make test-full runs it; the DP-FL page's in make test
@pytest.mark.parametrize("page", ["dpfl_teaching", pytest.param("units_of_privacy", marks=pytest.mark.e2e)])
def test_the_teaching_pages_laptop_cell_runs_copied_alone_into_a_fresh_interpreter(tmp_path, page):
    """Issues 77 and 79: "One minute on a laptop" holds its own imports and trains for real (never a
    stored result), so a reader can copy it alone into a fresh Python session."""
    import json

    cells = json.loads((NOTEBOOKS / f"{page}.ipynb").read_text())["cells"]
    (cell,) = [c for c in cells if "laptop" in c.get("metadata", {}).get("tags", [])]
    source = "".join(cell["source"])
    env = {**os.environ, "FEDLIB_RESULTS_DIR": str(tmp_path / "results")}
    out = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "test accuracy" in out.stdout and "trained in" in out.stdout
    assert not (tmp_path / "results").exists()  # a temporary folder, not the results store
