"""Execute the parameterized notebooks with papermill into the book.

``python -m fedlib.notebooks --profile quick`` runs every ``notebooks/*.ipynb`` (their
cell tagged ``parameters`` receives ``profile`` and any ``-p NAME VALUE``) and writes the
executed copies to ``book/chapters/``, where Jupyter Book renders them. The cell papermill
injects is tagged ``remove-cell`` so the book does not show it.

Rerun one notebook with other parameters, e.g.::

    .venv/bin/papermill notebooks/fedavg.ipynb /tmp/out.ipynb -p profile quick -p seed 1
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO_ROOT / "notebooks"
CHAPTERS = REPO_ROOT / "book" / "chapters"
#: Pages that summarise the others: executed last, in this order.
SUMMARY_PAGES = ("rerun", "ledger")


def ordered(sources: list[Path]) -> list[Path]:
    """Chapter notebooks in name order, then the summary pages (which read what the others
    recorded)."""
    rest = sorted(s for s in sources if s.stem not in SUMMARY_PAGES)
    last = [s for name in SUMMARY_PAGES for s in sources if s.stem == name]
    return rest + last


def timings_dir() -> Path:
    from fedlib.results import results_dir

    return results_dir().parent / "timings"


def record_timing(stem: str, wall_s: float, profile: str, run_log: Path) -> None:
    """``data/timings/<stem>.json``: the notebook's wall time now, and the compute time of the
    runs behind it (their recorded durations, whether computed now or loaded from the cache),
    i.e. what the page costs from scratch on the device that computed its runs."""
    import json

    import torch

    from fedlib.results import atomic_write_bytes, git_commit

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
    atomic_write_bytes(timings_dir() / f"{stem}.json", json.dumps(payload, indent=1).encode())
    run_log.unlink(missing_ok=True)


def execute(src: Path, dst: Path, parameters: dict, kernel: str = "python3") -> None:
    """Run ``src`` with ``parameters``; write ``dst`` atomically (only if it succeeds)."""
    import nbformat
    import papermill as pm

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.stem}.tmp.ipynb")
    try:
        pm.execute_notebook(str(src), str(tmp), parameters=parameters, kernel_name=kernel,
                            cwd=str(src.parent), progress_bar=False)
        nb = nbformat.read(tmp, as_version=4)
        for cell in nb.cells:
            tags = cell.metadata.setdefault("tags", [])
            if "injected-parameters" in tags and "remove-cell" not in tags:
                tags.append("remove-cell")
        nbformat.write(nb, tmp)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def execute_timed(src: Path, dst: Path, parameters: dict) -> float:
    """:func:`execute` and record what the page cost (:func:`record_timing`); returns seconds."""
    timings_dir().mkdir(parents=True, exist_ok=True)
    log = timings_dir() / f".{src.stem}.runs.jsonl"
    log.unlink(missing_ok=True)
    t0 = time.time()
    os.environ["FEDLIB_RUN_LOG"] = str(log)
    try:
        execute(src, dst, parameters)
    finally:
        os.environ.pop("FEDLIB_RUN_LOG", None)
    wall = time.time() - t0
    record_timing(src.stem, wall, str(parameters.get("profile", "?")), log)
    return wall


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="execute the study's notebooks into book/chapters")
    p.add_argument("--profile", default="quick", choices=["smoke", "quick", "paper"])
    p.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    p.add_argument("--only", nargs="*", help="notebook stems to run (default: all)")
    p.add_argument("--out", type=Path, default=CHAPTERS)
    args = p.parse_args(argv)
    params = {"profile": args.profile, **{k: _value(v) for k, v in args.parameter}}
    sources = ordered(list(NOTEBOOKS.glob("*.ipynb")))
    if args.only:
        unknown = set(args.only) - {s.stem for s in sources}
        if unknown:
            p.error(f"no such notebook(s): {sorted(unknown)}")
        sources = [s for s in sources if s.stem in args.only]
    for src in sources:
        print(f"executing {src.name} ({params}) ...", flush=True)
        wall = execute_timed(src, args.out / src.name, params)
        print(f"  done in {wall:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
