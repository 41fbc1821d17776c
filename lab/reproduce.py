"""Re-run committed results with today's code on this machine and say whether they come back.

``python -m lab.reproduce 'fdl-*.json' --where model=mlp fdl_mode=as_published [--retrain]``

A result records the commit that trained it; later commits may change how its arithmetic rounds
(a fused operation, another summation order) without changing what it computes. For each selected
result (file-name globs under ``--root``, filtered by config fields) the config is trained again on
the engine the result records, together with the other selected runs of its original run batch
(``meta.run_batch``), into a scratch folder, and its per-round test accuracy, test loss and
training loss are compared with the committed history:

* ``identical``: every compared value is equal;
* ``rounding``: test accuracies within 3 test samples and losses within 1e-4 relative, what another
  CPU's float32 summation order gives (the tolerance of ``tests/test_local_dp.py``);
* ``drifted``: further apart. A chaotic run (FDL as published, whose filter and draw count depend
  on the update's last bits) turns a rounding change into a different sample of its mechanism.

``--retrain`` replaces each drifted result by its rerun (``meta.replaces`` keeps the old commit and
final accuracy, so the change is on record); identical and rounding-level results stay as they are.
Only results trained on a CPU are compared (a GPU's rounding differs by design), and a result with
an audit file beside it is compared but never replaced (its page retrains the two together).
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.config import Config
from fedlib.results import REPO_ROOT, Result, atomic_write_bytes, model_path, result_path
from fedlib.run import run_many

#: Test accuracies may differ by this many test samples at the rounding level.
ROUNDING_SAMPLES = 3
#: ... and losses by this much, relative.
ROUNDING_LOSS = 1e-4
COMPARED = ("test_acc", "test_loss", "train_loss")
#: A result file's name: ``<algorithm>-<config key>.json``.
RESULT_NAME = re.compile(r"[a-z0-9_]+-[0-9a-f]{16}\.json")


@dataclass
class Comparison:
    """One committed result against its rerun."""

    name: str
    verdict: str  # identical | rounding | drifted | skipped
    rounds: int = 0
    first_difference: int | None = None  # the first round where any compared value differs
    acc_gap: float = 0.0  # largest |accuracy difference|, in percentage points
    loss_gap: float = 0.0  # largest relative difference of a test or training loss
    committed_acc: float | None = None  # final accuracies, %
    rerun_acc: float | None = None
    note: str = ""


def _same(x, y) -> bool:
    """Equal values, NaN included (a diverged run's NaN loss is reproduced by another NaN)."""
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def compare(committed: list[dict], rerun: list[dict], test_samples: int) -> Comparison:
    """How far ``rerun``'s history is from ``committed``'s (rounds compared pairwise; a different
    number of rounds is drift)."""
    out = Comparison("", "identical", rounds=len(committed))
    if len(committed) != len(rerun):
        out.verdict, out.note = "drifted", f"{len(rerun)} rounds against {len(committed)}"
        return out
    for a, b in zip(committed, rerun, strict=True):
        if out.first_difference is None and not all(_same(a.get(k), b.get(k)) for k in COMPARED):
            out.first_difference = a.get("round")
        if a.get("test_acc") is not None and b.get("test_acc") is not None:
            out.acc_gap = max(out.acc_gap, 100 * abs(a["test_acc"] - b["test_acc"]))
        for k in ("test_loss", "train_loss"):
            x, y = a.get(k), b.get(k)
            if x is not None and y is not None and not _same(x, y):
                finite = x != 0 and math.isfinite(x) and math.isfinite(y)
                out.loss_gap = max(out.loss_gap, abs(y / x - 1) if finite else math.inf)
    if out.first_difference is not None:
        within = out.acc_gap <= 100 * ROUNDING_SAMPLES / max(1, test_samples) + 1e-9
        out.verdict = "rounding" if within and out.loss_gap <= ROUNDING_LOSS else "drifted"
    return out


def select(root: Path, patterns: list[str], where: dict[str, str]) -> list[Result]:
    """The results under ``root`` whose file name matches one of ``patterns`` and whose config
    field ``f`` reads as ``where[f]`` (compared as text)."""
    names = sorted({p.name for p in root.glob("*.json") if RESULT_NAME.fullmatch(p.name)
                    for pat in patterns if fnmatch.fnmatch(p.name, pat)})
    out = []
    for name in names:
        r = Result.load(root / name)
        fields = r.config.to_dict()
        if all(str(fields.get(f)) == v for f, v in where.items()):
            out.append(r)
    return out


def batches(results: list[Result]) -> list[list[Result]]:
    """The selected results grouped by their original run batch (a subset of one trains as one)."""
    groups: dict[tuple, list[Result]] = {}
    for r in results:
        key = tuple(r.meta.get("run_batch") or (r.config.key(),))
        groups.setdefault((r.meta.get("engine"), key), []).append(r)
    return list(groups.values())


def _has_audit(r: Result, root: Path) -> bool:
    return (root / "audits" / r.path.name).exists()


def _replace(old: Result, new: Result, root: Path, scratch: Path, first_difference) -> None:
    """Write ``new`` (trained into ``scratch``) over ``old`` in ``root``, with its model file."""
    new.meta["replaces"] = {"git_commit": old.meta.get("git_commit"),
                            "final_test_acc": old.final.get("test_acc"),
                            "why": f"drifted from round {first_difference} under today's code on a CPU "
                                   "(lab.reproduce)"}
    model = model_path(new.config, scratch)
    if model.exists():
        target = model_path(new.config, root)
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, model.read_bytes())
    new.save(result_path(old.config, root))


def reproduce(results: list[Result], root: Path, retrain: bool = False,
              scratch: Path | None = None, progress: bool = True) -> list[Comparison]:
    """Train every result of ``results`` again and compare (see the module docstring); with
    ``retrain``, write each drifted result's rerun over it in ``root``."""
    comparisons = []
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        for group in batches(results):
            on_cpu = [r for r in group if r.meta.get("device") == "cpu"]
            for r in group:
                if r not in on_cpu:
                    comparisons.append(Comparison(r.path.name, "skipped",
                                                  note=f"trained on {r.meta.get('device')}"))
            if not on_cpu:
                continue
            engine = on_cpu[0].meta.get("engine") or "auto"
            reruns = run_many([r.config for r in on_cpu], engine=engine, device="cpu", root=Path(tmp),
                              progress=progress)
            for old, new in zip(on_cpu, reruns, strict=True):
                c = compare(old.history, new.history, int(old.meta.get("test_samples") or 0))
                c.name = old.path.name
                c.committed_acc = round(100 * old.final.get("test_acc", math.nan), 2)
                c.rerun_acc = round(100 * new.final.get("test_acc", math.nan), 2)
                if retrain and c.verdict == "drifted":
                    if _has_audit(old, root):
                        c.note = "not replaced: it has an audit file (retrain it through its page)"
                    else:
                        _replace(old, new, root, Path(tmp), c.first_difference)
                        c.note = "replaced by its rerun"
                comparisons.append(c)
    return comparisons


def table(comparisons: list[Comparison]) -> str:
    lines = [f"{'result':34} {'verdict':9} {'from round':>10} {'acc gap':>8} {'loss gap':>9} "
             f"{'committed':>9} {'rerun':>7}  note"]
    for c in comparisons:
        first = "-" if c.first_difference is None else str(c.first_difference)
        lines.append(f"{c.name:34} {c.verdict:9} {first:>10} {c.acc_gap:8.2f} {c.loss_gap:9.1e} "
                     f"{c.committed_acc if c.committed_acc is not None else '-':>9} "
                     f"{c.rerun_acc if c.rerun_acc is not None else '-':>7}  {c.note}")
    counts = {v: sum(c.verdict == v for c in comparisons) for v in ("identical", "rounding", "drifted",
                                                                      "skipped")}
    lines.append(", ".join(f"{n} {v}" for v, n in counts.items() if n))
    return "\n".join(lines)


def _where(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        field, sep, value = item.partition("=")
        if not sep or field not in Config.__dataclass_fields__:
            raise SystemExit(f"--where takes FIELD=VALUE with a config field, got {item!r}")
        out[field] = value
    return out


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("patterns", nargs="+", help="file-name globs under --root, e.g. 'fdl-*.json'")
    ap.add_argument("--root", type=Path, default=REPO_ROOT / "data" / "results")
    ap.add_argument("--where", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="only results whose config field reads VALUE")
    ap.add_argument("--retrain", action="store_true", help="replace each drifted result by its rerun")
    ap.add_argument("--report", type=Path, help="also write the comparisons here as JSON")
    args = ap.parse_args(argv)
    where = _where(args.where)
    results = select(args.root, args.patterns, where)
    if not results:
        print(f"no result under {args.root} matches {args.patterns} {where or ''}", file=sys.stderr)
        return 2
    print(f"reproducing {len(results)} results in {len(batches(results))} run batches")
    comparisons = reproduce(results, args.root, retrain=args.retrain)
    print(table(comparisons))
    if args.report:
        atomic_write_bytes(args.report, json.dumps([c.__dict__ for c in comparisons], indent=1).encode())
    return 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.reproduce"))
