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
    sources = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.only:
        sources = [s for s in sources if s.stem in args.only]
    for src in sources:
        t0 = time.time()
        print(f"executing {src.name} ({params}) ...", flush=True)
        execute(src, args.out / src.name, params)
        print(f"  done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
