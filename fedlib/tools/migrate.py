"""Carry committed results over a :data:`fedlib.config.RESULTS_VERSION` bump without recomputing.

``python -m fedlib.tools.migrate [--root data/results] [--dry-run]``

A version bump changes every cache key. For each result file written under an earlier version,
the rule of each later version says whether the code change left that result as it was: if so,
the file (and its model, audit and checkpoint files) is renamed to the new key and its
``meta.config_key`` rewritten (``meta.migrated_from`` keeps the old key); if not, it is removed,
and the next ``make book`` recomputes it. Files already at the current version are untouched.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from fedlib.config import RESULTS_VERSION, Config
from fedlib.results import atomic_write_bytes, results_dir


def _free_of_privacy_noise(c: Config) -> bool:
    """Version 2 changed the privacy noise (floating-point-safe, keyed on the config; MOON-DPAP's
    central noise at replace-one sensitivity) and nothing else: results that draw none are kept."""
    if c.algorithm in ("ldp_fl", "signds_fl", "fdl"):
        return False
    if c.algorithm == "moon_dpap" and c.dp != "none":
        return False
    if c.algorithm == "dp_fedavg" and (c.dp_noise_multiplier > 0 or c.adaptive_clip):
        return False
    return True


#: version -> rule: does a result of the previous version stay valid under this one?
RULES: dict[int, Callable[[Config], bool]] = {2: _free_of_privacy_noise}


def written_under(config: Config, key: str) -> int | None:
    """The results version whose key of ``config`` is ``key`` (None if none matches)."""
    for v in range(RESULTS_VERSION, 0, -1):
        if config.key(v) == key:
            return v
    return None


def _companions(root: Path, config: Config, key: str) -> list[tuple[Path, Path]]:
    new = config.key()
    return [
        (root / "models" / f"{key}.pt", root / "models" / f"{new}.pt"),
        (root / "checkpoints" / f"{key}.pt", root / "checkpoints" / f"{new}.pt"),
        (
            root / "audits" / f"{config.algorithm}-{key}.json",
            root / "audits" / f"{config.algorithm}-{new}.json",
        ),
    ]


def migrate(root: Path | None = None, dry_run: bool = False) -> dict[str, list[str]]:
    """Migrate every result under ``root``; returns the file names kept, removed and unknown."""
    root = Path(root or results_dir())
    report: dict[str, list[str]] = {"kept": [], "removed": [], "current": [], "unknown": []}
    for path in sorted(root.glob("*.json")):
        d = json.loads(path.read_text())
        config = Config.from_dict(d["config"])
        old = d["meta"].get("config_key") or path.stem.split("-")[-1]
        version = written_under(config, old)
        if version == RESULTS_VERSION:
            report["current"].append(path.name)
            continue
        if version is None:
            report["unknown"].append(path.name)
            continue
        keep = all(RULES[v](config) for v in range(version + 1, RESULTS_VERSION + 1))
        companions = _companions(root, config, old)
        if dry_run:
            report["kept" if keep else "removed"].append(path.name)
            continue
        if keep:
            d["meta"]["config_key"] = config.key()
            d["meta"]["migrated_from"] = old
            target = root / f"{config.algorithm}-{config.key()}.json"
            atomic_write_bytes(target, json.dumps(d, indent=1).encode())
            if target != path:
                path.unlink()
            for src, dst in companions:
                if src.exists():
                    src.replace(dst)
            report["kept"].append(path.name)
        else:
            path.unlink()
            for src, _ in companions:
                src.unlink(missing_ok=True)
            report["removed"].append(path.name)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fedlib.tools.migrate", description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=None, help="results folder (default: data/results)")
    p.add_argument("--dry-run", action="store_true", help="only report what would happen")
    args = p.parse_args(argv)
    report = migrate(args.root, args.dry_run)
    for what, names in report.items():
        print(f"{what}: {len(names)}")
    return 1 if report["unknown"] else 0


if __name__ == "__main__":
    sys.exit(main())
