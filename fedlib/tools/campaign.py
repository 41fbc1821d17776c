"""The campaign: train every configuration the book's pages need at a profile, in slices.

``python -m fedlib.tools.campaign plan --profile paper``
    lists, per page, the configurations its notebook needs (collected from the studies' ``PAGES``,
    not retyped), how many are already in ``data/results/``, and the estimated time of the rest
    (from the committed benchmark of the device kind, ``data/bench/``).

``python -m fedlib.tools.campaign run --profile paper --budget-min 25``
    trains the missing ones, longest first, configurations of one shape together as run batches
    (``fedlib.run.run_many``), and stops cleanly before the budget ends: a run batch that would not
    finish in time is not started, and one that runs past the deadline checkpoints and stops
    (no result is ever written partially). Rerun it until nothing is missing.

``python -m fedlib.tools.campaign pack --out DIR`` / ``unpack ARCHIVE...``
    put the result files that git does not track yet into archives of at most 16 MiB each (a GPU
    machine returns at most 8 files per command), and add them to ``data/results/`` after checking
    each one: its file name is its config's key, its metrics are finite, its provenance is present.

``make paper`` runs one slice (``run --profile paper``).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tarfile
import time
from collections import defaultdict
from pathlib import Path

from fedlib.config import Config
from fedlib.results import REPO_ROOT, Result, result_path, results_dir
from fedlib.run import batch_key, run_many

#: Relative cost of one round per training sample, by model and by algorithm (forward/backward
#: passes per step: MOON and MOON-DPAP run the global and previous models too, Ditto trains two
#: models). Anchored on the benchmark's FedAvg round of the MOON-DPAP CNN.
MODEL_COST = {"cnn": 1.0, "mcmahan_cnn": 3.0, "mlp": 0.15}
ALGORITHM_COST = {"moon": 2.2, "moon_dpap": 2.2, "ditto": 2.0, "scaffold": 1.1, "feddyn": 1.1}
PACK_LIMIT = 16 * 2**20


# ---- what is needed, what is there ----------------------------------------------------------------
def needed(profile: str) -> dict[str, list[Config]]:
    from studies import configs

    return configs(profile)


def missing(per_page: dict[str, list[Config]], root: Path | None = None) -> list[Config]:
    """Distinct configurations without a result under ``root``."""
    out, seen = [], set()
    for cs in per_page.values():
        for c in cs:
            if c.key() not in seen and not result_path(c, root).exists():
                seen.add(c.key())
                out.append(c)
    return out


def bench_seconds_per_sample(kind: str) -> tuple[float | None, str]:
    """Seconds per training sample of one FedAvg round of the CNN on the latest committed benchmark
    of ``kind`` ("cuda" or "cpu"), and the file it comes from."""
    files = sorted((REPO_ROOT / "data" / "bench").glob(f"{kind}-*.json"))
    if not files:
        return None, ""
    r = json.loads(files[-1].read_text())["results"]
    return r["default_s"] / r["samples"], files[-1].name


def estimate_s(config: Config, per_sample: float | None) -> float:
    """Estimated seconds to train ``config`` (rounds x one epoch over its data x cost factors)."""
    if per_sample is None:
        return math.nan
    model = MODEL_COST.get(config.model, 1.0)
    algo = ALGORITHM_COST.get(config.algorithm, 1.0)
    epoch = config.n_train * config.client_fraction * config.local_epochs
    return config.rounds * epoch * per_sample * model * algo


def device_kind() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def plan(profile: str, root: Path | None = None, kind: str | None = None) -> list[dict]:
    kind = kind or device_kind()
    per_sample, source = bench_seconds_per_sample(kind)
    per_page = needed(profile)
    rows = []
    for page, cs in per_page.items():
        todo = missing({page: cs}, root)
        rows.append({"page": page, "needed": len(cs), "present": len(cs) - len(todo), "missing": len(todo),
                     "estimate_min": sum(estimate_s(c, per_sample) for c in todo) / 60})
    rows.append({"page": f"(estimates from {source or f'no {kind} benchmark committed'})", "needed": 0,
                 "present": 0, "missing": len(missing(per_page, root)), "estimate_min": math.nan})
    return rows


# ---- training in slices -----------------------------------------------------------------------------
def groups(configs: list[Config], per_sample: float | None) -> list[list[Config]]:
    """Configurations of one shape together (a run batch), longest group first."""
    by_key: dict[str, list[Config]] = defaultdict(list)
    for c in configs:
        by_key[batch_key(c)].append(c)
    out = [sorted(g, key=lambda c: c.key()) for g in by_key.values()]
    return sorted(out, key=lambda g: -sum(estimate_s(c, per_sample) or 0 for c in g))


def run(profile: str, budget_min: float, root: Path | None = None, engine: str = "auto",
        max_batch: int = 8, progress: bool = True) -> dict:
    """Train missing configurations until done or until the budget would be exceeded."""
    start = time.time()
    deadline = start + 60 * budget_min
    kind = device_kind()
    per_sample, _ = bench_seconds_per_sample(kind)
    todo = missing(needed(profile), root)
    done, skipped = 0, 0
    for group in groups(todo, per_sample):
        for i in range(0, len(group), max_batch):
            chunk = group[i:i + max_batch]
            est = sum(estimate_s(c, per_sample) for c in chunk)
            if math.isfinite(est) and time.time() + est > deadline:
                skipped += len(chunk)
                continue
            if time.time() >= deadline:
                skipped += len(chunk)
                continue
            finished = run_many(chunk, engine=engine, root=root, progress=progress, deadline=deadline)
            done += sum(r is not None for r in finished)
            skipped += sum(r is None for r in finished)
    left = len(missing(needed(profile), root))
    return {"trained": done, "not started or stopped": skipped, "still missing": left,
            "minutes": (time.time() - start) / 60}


# ---- moving results between machines ----------------------------------------------------------------
def untracked_results(root: Path | None = None) -> list[Path]:
    """Result files under ``root`` that git does not track yet (what a slice produced)."""
    root = Path(root or results_dir())
    try:
        out = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "--", str(root)],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
        files = [REPO_ROOT / p for p in out]
    except (OSError, subprocess.CalledProcessError):
        files = list(root.glob("*.json"))
    return sorted(p for p in files if p.suffix == ".json" and p.parent == root)


def pack(files: list[Path], out_dir: Path, limit: int = PACK_LIMIT) -> list[Path]:
    """Tar-gzip ``files`` into archives of at most ``limit`` bytes each (result JSON compresses ~10x)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    archives, part, size = [], [], 0
    for f in files:
        n = f.stat().st_size // 8 + 1024  # compressed size, conservatively
        if part and size + n > limit:
            archives.append(_write(part, out_dir, len(archives)))
            part, size = [], 0
        part.append(f)
        size += n
    if part:
        archives.append(_write(part, out_dir, len(archives)))
    return archives


def _write(files: list[Path], out_dir: Path, i: int) -> Path:
    path = out_dir / f"results-{i:02d}.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for f in files:
            tar.add(f, arcname=f.name)
    return path


class InvalidResult(ValueError):
    pass


def check_result(name: str, data: bytes) -> Result:
    """A result file as received: parse it and check its name, metrics and provenance."""
    d = json.loads(data)
    config = Config.from_dict(d["config"])
    expected = f"{config.algorithm}-{config.key()}.json"
    if name != expected or d["meta"].get("config_key") != config.key():
        raise InvalidResult(f"{name}: its config's key says {expected}")
    for h in d["history"]:
        for k in ("test_acc", "test_loss"):
            v = h.get(k)
            if v is not None and not math.isfinite(v) and k == "test_acc":
                raise InvalidResult(f"{name}: {k} is not finite in round {h.get('round')}")
    if len(d["history"]) != config.rounds:
        raise InvalidResult(f"{name}: {len(d['history'])} rounds recorded, the config has {config.rounds}")
    for k in ("device", "git_commit", "torch", "seed", "duration_s"):
        if k not in d["meta"]:
            raise InvalidResult(f"{name}: provenance lacks {k!r}")
    return Result(config, d["history"], d["meta"])


def unpack(archives: list[Path], root: Path | None = None) -> dict[str, list[str]]:
    """Add the result files of ``archives`` to ``root`` after checking each (see :func:`check_result`);
    every file is checked before any is written."""
    root = Path(root or results_dir())
    accepted: list[tuple[str, Result]] = []
    for a in archives:
        with tarfile.open(a, "r:gz") as tar:
            for m in tar.getmembers():
                if not m.isfile() or "/" in m.name or not m.name.endswith(".json"):
                    raise InvalidResult(f"{a.name}: unexpected member {m.name!r}")
                accepted.append((m.name, check_result(m.name, tar.extractfile(m).read())))
    added, present = [], []
    for name, result in accepted:
        target = root / name
        if target.exists():
            present.append(name)
            continue
        result.save(target)
        added.append(name)
    return {"added": added, "already present": present}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedlib.tools.campaign",
                                description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="what each page needs at a profile, what is missing, its estimated time")
    pl.add_argument("--profile", default="paper", choices=["smoke", "quick", "paper"])
    pl.add_argument("--device-kind", choices=["cpu", "cuda"], default=None)
    r = sub.add_parser("run", help="train what is missing within a time budget")
    r.add_argument("--profile", default="paper", choices=["smoke", "quick", "paper"])
    r.add_argument("--budget-min", type=float, required=True)
    r.add_argument("--engine", default="auto")
    r.add_argument("--max-batch", type=int, default=8, help="runs trained together at most")
    pk = sub.add_parser("pack", help="archive the result files git does not track yet")
    pk.add_argument("--out", type=Path, required=True)
    up = sub.add_parser("unpack", help="check and add result archives to data/results")
    up.add_argument("archives", nargs="+", type=Path)
    args = p.parse_args(argv)

    if args.command == "plan":
        rows = plan(args.profile, kind=args.device_kind)
        width = max(len(r["page"]) for r in rows)
        print(f"{'page':<{width}}  needed  present  missing  estimate (min)")
        for row in rows:
            est = "-" if math.isnan(row["estimate_min"]) else f"{row['estimate_min']:.1f}"
            counts = f"{row['needed']:6d}  {row['present']:7d}  {row['missing']:7d}"
            print(f"{row['page']:<{width}}  {counts}  {est}")
        distinct = missing(needed(args.profile))
        print(f"missing configurations (distinct, all pages): {len(distinct)}")
        return 0
    if args.command == "run":
        if args.budget_min <= 0:
            p.error("--budget-min must be > 0")
        print(json.dumps(run(args.profile, args.budget_min, engine=args.engine, max_batch=args.max_batch)))
        return 0
    if args.command == "pack":
        files = untracked_results()
        archives = pack(files, args.out)
        print(json.dumps({"files": len(files), "archives": [str(a) for a in archives]}))
        return 0
    try:
        report = unpack(args.archives)
    except (InvalidResult, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e} (nothing was added)", file=sys.stderr)
        return 1
    print(json.dumps({k: len(v) for k, v in report.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["check_result", "groups", "missing", "needed", "pack", "plan", "run", "unpack"]
