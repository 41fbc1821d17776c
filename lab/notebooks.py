"""Execute the parameterized notebooks with papermill.

``python -m lab.notebooks --into-book --profile auto`` (what ``make book`` runs) executes
every ``notebooks/*.ipynb`` (the cell tagged ``parameters`` receives ``profile`` and any
``-p NAME VALUE``) into ``book/chapters/``, where Jupyter Book renders them; the pages then write
their results, verdicts and audits where the book reads them (``data/``), and each page's cost is
recorded under ``data/timings/``. The cell papermill injects is tagged ``remove-cell``.

Without ``--into-book`` (a curious rerun) the executed notebooks go to ``data/scratch/chapters/``
and the pages write to ``data/scratch/``: committed results are still reused, and no tracked file
changes. One notebook by hand does the same::

    .venv/bin/papermill notebooks/fedavg.ipynb /tmp/out.ipynb -p profile quick -p seed 1

``--profile auto`` renders each page at the largest profile whose results are complete: a page that
trains at ``paper`` when every configuration it needs there has a result (the campaign trained
them), a study's other pages at ``paper`` when all of that study's training pages are, everything
else at ``quick``. A page rendered at ``paper`` on a machine without a GPU is built from committed
results only (``FEDLIB_FORBID_TRAINING=1``): a missing result is an error, never a paper-scale run
on a CPU. ``--profile quick`` (or any other) renders every page at that profile.

``--list-parameters`` prints every notebook's parameters with their defaults and comments.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import time
from pathlib import Path

from fedlib.results import REPO_ROOT, git_commit, write_json_unless_stamps_only

NOTEBOOKS = REPO_ROOT / "notebooks"
CHAPTERS = REPO_ROOT / "book" / "chapters"
#: Pages that summarise the others (they read the verdicts every other page records): executed last,
#: in this order, after every other page has finished (the smoke book runs the others two at a time).
SUMMARY_PAGES = ("summary", "rerun", "ledger")
#: Pages that show fedlib at work rather than a paper's runs: the book executes them at ``smoke``
#: whatever the profile of the rest (they train for real, in seconds, so their code cannot go stale).
SMOKE_PAGES = ("fedlib_own_code",)


def ordered(sources: list[Path]) -> list[Path]:
    """Chapter notebooks in name order, then the summary pages (which read what the others
    recorded)."""
    rest = sorted(s for s in sources if s.stem not in SUMMARY_PAGES)
    last = [s for name in SUMMARY_PAGES for s in sources if s.stem == name]
    return rest + last


def paper_complete_pages(root: Path | None = None) -> set[str]:
    """The training pages (``studies.pages()``) whose every ``paper`` configuration has a result."""
    from fedlib.results import result_path
    from studies import configs

    return {page for page, cs in configs("paper").items()
            if all(result_path(c, root).exists() for c in cs)}


def auto_profiles(stems: list[str], root: Path | None = None) -> dict[str, str]:
    """The profile ``--profile auto`` renders each notebook at (see the module's docstring)."""
    from studies import STUDIES, page_study, pages

    training = set(pages())
    complete = paper_complete_pages(root)
    studies_done = {s for s in STUDIES
                    if all(p in complete for p in training if page_study(p) == s)}
    out = {}
    for stem in stems:
        study = next((s for s in STUDIES if stem.startswith(s + "_")), None)
        if stem in SMOKE_PAGES:
            out[stem] = "smoke"
        elif stem in training:
            out[stem] = "paper" if stem in complete else "quick"
        elif study is not None and study in studies_done:
            out[stem] = "paper"
        else:
            out[stem] = "quick"
    return out


def timings_dir() -> Path:
    """``data/timings/`` beside the results store (``$FEDLIB_RESULTS_DIR/../timings`` when set)."""
    from fedlib.results import results_dir

    return results_dir().parent / "timings"


def scratch_chapters() -> Path:
    from studies.common import scratch_dir

    return scratch_dir() / "chapters"


def parameters_of(src: Path) -> list[dict]:
    """The notebook's parameters: name, default (source text) and the comment beside it."""
    nb = json.loads(src.read_text())
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    out = []
    for line in "".join(cell["source"]).splitlines():
        if "=" not in line or line.lstrip().startswith("#"):
            continue
        name, rest = line.split("=", 1)
        value, _, comment = rest.partition("#")
        out.append({"name": name.strip(), "default": value.strip(), "meaning": comment.strip()})
    return out


def record_timing(stem: str, wall_s: float, profile: str, run_log: Path) -> tuple[int, int]:
    """``data/timings/<stem>.json``: the notebook's wall time now, and the compute time of the
    runs behind it (their recorded durations, whether computed now or loaded from the cache),
    i.e. what the page costs from scratch on the device that computed its runs."""
    import torch

    runs = {}
    if run_log.exists():
        for line in run_log.read_text().splitlines():
            r = json.loads(line)
            runs[r["key"]] = r
    payload = {"notebook": stem, "profile": profile, "wall_s": round(wall_s, 1), "runs": len(runs),
               "computed_now": sum(not r["cached"] for r in runs.values()),
               "runs_compute_s": round(sum(r["duration_s"] or 0.0 for r in runs.values()), 1),
               "devices": sorted({str(r["device"]) for r in runs.values()}),
               "cpus": os.cpu_count(), "cuda": torch.cuda.is_available(), "commit": git_commit(),
               "run_seconds": {k: r["duration_s"] for k, r in runs.items()}}
    # what the page costs is its runs; the wall time of this build, its commit and machine are
    # stamps: a rebuild whose runs are the same leaves the tracked file (and git) as it was, even when
    # it trains some of them again (a page's small uncached runs): their seconds are timing noise
    write_json_unless_stamps_only(timings_dir() / f"{stem}.json", payload,
                                  stamps=("wall_s", "computed_now", "cpus", "cuda", "commit",
                                          "runs_compute_s"),
                                  compare={"run_seconds": sorted})
    run_log.unlink(missing_ok=True)
    return payload["computed_now"], len(runs) - payload["computed_now"]


def kernel_manager_class() -> type:
    """The kernel manager papermill starts each page's kernel with: jupyter_client's own, asking for
    CurveZMQ encryption of the kernel's sockets where the kernel declares support and pyzmq has it
    (``transport_encryption="auto"``; ipykernel >= 7.3 otherwise warns on every start that its TCP
    sockets are unencrypted, one line per page of ``make book``). Where pyzmq lacks Curve, the
    default (unencrypted, with the warning)."""
    import zmq
    from jupyter_client.manager import AsyncKernelManager

    if not zmq.has("curve") or not AsyncKernelManager.class_traits().get("transport_encryption"):
        return AsyncKernelManager

    class EncryptedKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.transport_encryption = "auto"

    return EncryptedKernelManager


def execute(src: Path, dst: Path, parameters: dict, kernel: str = "python3") -> None:
    """Run ``src`` with ``parameters``; write ``dst`` atomically (only if it succeeds)."""
    import nbformat
    import papermill as pm

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.stem}.tmp.ipynb")
    try:
        pm.execute_notebook(str(src), str(tmp), parameters=parameters, kernel_name=kernel,
                            cwd=str(src.parent), progress_bar=False,
                            kernel_manager_class=kernel_manager_class())
        nb = nbformat.read(tmp, as_version=4)
        for cell in nb.cells:
            tags = cell.metadata.setdefault("tags", [])
            if "injected-parameters" in tags and "remove-cell" not in tags:
                tags.append("remove-cell")
        nbformat.write(nb, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def execute_timed(src: Path, dst: Path, parameters: dict, into_book: bool = True
                  ) -> tuple[float, tuple[int, int] | None]:
    """:func:`execute`, with the pages writing into the book (``into_book``) or to scratch; in
    the book, what the page cost is recorded (:func:`record_timing`). Returns seconds and, in the
    book, (runs and audits computed now, reused from the store). At ``paper`` without a GPU, the
    page may only read results (``FEDLIB_FORBID_TRAINING``)."""
    import torch

    env = {"FEDLIB_INTO_BOOK": "1" if into_book else "0",
           "FEDLIB_FORBID_TRAINING": "1" if parameters.get("profile") == "paper"
           and not torch.cuda.is_available() else "0"}
    log = None
    if into_book:
        timings_dir().mkdir(parents=True, exist_ok=True)
        log = timings_dir() / f".{src.stem}.runs.jsonl"
        log.unlink(missing_ok=True)
        env["FEDLIB_RUN_LOG"] = str(log)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    t0 = time.time()
    try:
        execute(src, dst, parameters)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    wall = time.time() - t0
    if log is not None:
        return wall, record_timing(src.stem, wall, str(parameters.get("profile", "?")), log)
    return wall, None


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> int:
    from fedlib.__main__ import OneLineParser

    p = OneLineParser(prog="python -m lab.notebooks",
                      description="execute the study's notebooks (papermill)")
    p.add_argument("--profile", default="quick", choices=["auto", "smoke", "quick", "paper"],
                   help="auto: each page at the largest profile whose results are complete")
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    p.add_argument("--only", nargs="*", help="notebook stems to run (default: all)")
    p.add_argument("--into-book", action="store_true",
                   help="write into book/chapters and data/ (the book build); default: data/scratch/")
    p.add_argument("--out", type=Path, default=None, help="folder of the executed notebooks")
    p.add_argument("--list-parameters", action="store_true", help="print each notebook's parameters and exit")
    args = p.parse_args(argv)
    sources = ordered(list(NOTEBOOKS.glob("*.ipynb")))
    if args.only:
        unknown = set(args.only) - {s.stem for s in sources}
        if unknown:
            p.error(f"no such notebook(s): {sorted(unknown)}")
        sources = [s for s in sources if s.stem in args.only]
    if args.list_parameters:
        for src in sources:
            print(src.stem)
            for prm in parameters_of(src):
                print(f"  {prm['name']} = {prm['default']}    # {prm['meaning']}")
        return 0
    extra = {k: _value(v) for k, v in args.parameter}
    known = {s.stem: {prm["name"] for prm in parameters_of(s)} for s in sources}
    unknown = sorted(k for k in extra if not any(k in names for names in known.values()))
    if unknown:
        p.error(f"no notebook run here has the parameter(s) {unknown}")
    from studies.common import ParameterError, check_parameters

    try:  # every value against its rule, before any notebook runs
        check_parameters(**extra)
    except ParameterError as e:
        p.error(str(e))
    profiles = (auto_profiles([s.stem for s in sources]) if args.profile == "auto"
                else {s.stem: args.profile for s in sources})
    out = args.out or (CHAPTERS if args.into_book else scratch_chapters())
    computed = reused = 0
    for src in sources:
        params = {"profile": profiles[src.stem], **extra}
        params = {k: v for k, v in params.items() if k == "profile" or k in known[src.stem]}
        print(f"executing {src.name} ({params}) -> {out} ...", flush=True)
        wall, counts = execute_timed(src, out / src.name, params, into_book=args.into_book)
        if counts is None:
            print(f"  done in {wall:.0f} s", flush=True)
            continue
        computed, reused = computed + counts[0], reused + counts[1]
        print(f"  done in {wall:.0f} s ({counts[0]} runs or audits computed now, {counts[1]} read back)",
              flush=True)
    if args.into_book:
        print(computed_line(computed, reused), flush=True)
    return 0


def computed_line(computed: int, reused: int) -> str:
    """The build's last line: whether it trained or attacked anything (issue 66)."""
    if computed == 0:
        return (f"notebooks: computed nothing new (every one of the {reused} runs and audits the pages "
                "read was already in data/results)")
    return f"notebooks: computed {computed} runs and audits now, read {reused} back from data/results"


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.notebooks"))
