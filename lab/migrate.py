"""Carry committed results over a :data:`fedlib.config.RESULTS_VERSION` bump without recomputing.

``python -m lab.migrate [--root data/results] [--dry-run]``

A version bump changes every cache key. For each result file written under an earlier version,
the rule of each later version says whether the code change left that result as it was: if so,
the file (and its model, audit and checkpoint files) is renamed to the new key and its
``meta.config_key`` rewritten (``meta.migrated_from`` keeps the old key); if not, it is removed,
and the next ``make book`` recomputes it. Files already at the current version are untouched, except
that one written before results carried a content hash gets it (``meta.content_sha256``, which
:meth:`fedlib.results.Result.load` checks): a format change, never a retraining. A file whose hash
is there but does not match its content is reported (``unknown``), not blessed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from fedlib.cli import OneLineParser
from fedlib.config import NOISE_KEY_VERSION, RESULTS_VERSION, Config
from fedlib.privacy.guarantee import classify_meta
from fedlib.results import atomic_write_bytes, content_hash, encode_nonfinite, non_finite, results_dir

#: Fields that a version removed, with their default before it (to recompute old keys).
REMOVED_FIELDS: dict[int, dict] = {3: {"dp_epsilon": 1.0, "ldp_epsilon": 0.5}}


def _get(d: dict, name: str):
    return d.get(name, Config.__dataclass_fields__[name].default)


def _draws_privacy_noise(d: dict) -> bool:
    alg = d["algorithm"]
    return (alg in ("ldp_fl", "signds_fl", "fdl") or (alg == "moon_dpap" and _get(d, "dp") != "none")
            or (alg == "dp_fedavg" and (_get(d, "dp_noise_multiplier") > 0 or _get(d, "adaptive_clip"))))


def _v2_keep_noise_free(d: dict, result: dict, written: int) -> dict | None:
    """Version 2 changed the privacy noise (floating-point-safe, keyed on the config; MOON-DPAP's
    central noise at replace-one sensitivity) and nothing else: results that draw none are kept."""
    return None if _draws_privacy_noise(d) else d


def _v3_rename_budgets(d: dict, result: dict, written: int) -> dict:
    """Version 3 renamed the privacy budgets so that each name has one meaning (results unchanged):
    ``dp_epsilon`` -> ``dp_epsilon_per_round`` (schedule paper) or ``dp_epsilon_total``
    (constant); ``ldp_epsilon`` -> the local-DP algorithm's own ``*_epsilon_per_*``."""
    d = dict(d)
    eps = d.pop("dp_epsilon", REMOVED_FIELDS[3]["dp_epsilon"])
    d["dp_epsilon_total" if d.get("dp_schedule", "paper") == "constant" else "dp_epsilon_per_round"] = eps
    ldp = d.pop("ldp_epsilon", REMOVED_FIELDS[3]["ldp_epsilon"])
    target = {
        "ldp_fl": "ldp_fl_epsilon_per_coordinate",
        "signds_fl": "signds_epsilon_per_round",
        "fdl": ("fdl_epsilon_per_round" if d.get("fdl_mode") == "corrected" else "fdl_epsilon_per_draw"),
    }
    if d["algorithm"] in target:
        d[target[d["algorithm"]]] = ldp
    return d


def _v4_keep_unchanged_draws(d: dict, result: dict, written: int) -> dict | None:
    """Version 4 moved the local randomisers into the clients, each with its own generator keyed on
    (config, round, client): LDP-FL, SignDS-FL and FDL draw anew (MOON-DPAP's local noise was
    already keyed per client: unchanged). It keyed DP-FedAvg's Poisson client sample on the whole
    config: every DP-FedAvg run that samples (client_fraction < 1) draws anew. And it froze the key
    of the noise streams (:data:`fedlib.config.NOISE_KEY_VERSION` = 3): a result with privacy noise
    that was not trained under version 3 (written earlier, or carried over to 3 by a bump,
    ``migrated_from``) drew its noise from a key its config no longer gives, so it could not be
    reproduced from its config: it is recomputed."""
    if d["algorithm"] in ("ldp_fl", "signds_fl", "fdl"):
        return None
    if d["algorithm"] == "dp_fedavg" and _get(d, "client_fraction") < 1:
        return None
    if _draws_privacy_noise(d) and (written < NOISE_KEY_VERSION or "migrated_from" in result["meta"]):
        return None
    return d


def _v5_keep_finite_private_runs(d: dict, result: dict, written: int) -> dict | None:
    """Version 5 zeroes a non-finite update (or per-sample gradient) before it is clipped or
    randomised: runs that clip or randomise (DP-FedAvg even without noise) and never produced one
    are unchanged. A run whose
    losses went non-finite may have (its uploads were garbage before), so it is recomputed."""
    clips = d["algorithm"] in ("dp_fedavg", "ldp_fl", "signds_fl", "fdl") or (
        d["algorithm"] == "moon_dpap" and _get(d, "dp") != "none")
    if clips and non_finite(result["history"]):
        return None
    return d


#: version -> step from the previous version: (config dict, the whole result file as a dict, the
#: version the file was written under) -> the new config dict, or None (result not valid).
STEPS: dict[int, Callable[[dict, dict, int], dict | None]] = {
    2: _v2_keep_noise_free, 3: _v3_rename_budgets, 4: _v4_keep_unchanged_draws,
    5: _v5_keep_finite_private_runs}


def key_under(d: dict, version: int) -> str:
    """The cache key that results version ``version`` gave the config dict ``d`` (written then)."""
    defaults = {k: f.default for k, f in Config.__dataclass_fields__.items()}
    for v, removed in REMOVED_FIELDS.items():
        if v > version:
            defaults.update(removed)
    changed = {k: val for k, val in d.items() if val != defaults[k]}
    payload = json.dumps({"v": version, **changed}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def written_under(d: dict, key: str) -> int | None:
    """The results version under which the config dict ``d`` has key ``key`` (None if none)."""
    for v in range(RESULTS_VERSION, 0, -1):
        try:
            if key_under(d, v) == key:
                return v
        except KeyError:  # a field this version did not know
            continue
    return None


def _companions(root: Path, algorithm: str, key: str, new: str | None) -> list[tuple[Path, Path | None]]:
    names = [("models", "{}.pt"), ("checkpoints", "{}.pt"), ("audits", algorithm + "-{}.json")]
    return [
        (root / folder / pattern.format(key), None if new is None else root / folder / pattern.format(new))
        for folder, pattern in names
    ]


def _upgrade_format(d: dict) -> bool:
    """Format changes that need no retraining, applied to a result of the current version in place:
    the content hash (``meta.content_sha256``), the classification of its metadata fields as
    public or diagnostic (``meta.privacy.public_meta`` / ``diagnostic_meta``), and valid JSON (a
    non-finite number written as ``NaN`` or ``Infinity`` becomes ``null``, recorded in
    ``nonfinite``: :func:`fedlib.results.encode_nonfinite`). Whether it changed."""
    changed = "content_sha256" not in d["meta"]
    privacy = d["meta"].get("privacy")
    if isinstance(privacy, dict) and "public_meta" not in privacy:
        privacy.update(classify_meta({**d["meta"], "content_sha256": ""}))
        changed = True
    encoded = encode_nonfinite(d)
    if encoded.get("nonfinite") and encoded != d:
        d.clear()
        d.update(encoded)
        changed = True
    return changed


def migrate(root: Path | None = None, dry_run: bool = False) -> dict[str, list[str]]:
    """Migrate every result under ``root``; returns the file names kept, removed, current, unknown."""
    root = Path(root or results_dir())
    report: dict[str, list[str]] = {"kept": [], "removed": [], "current": [], "hashed": [], "unknown": []}
    for path in sorted(root.glob("*.json")):
        d = json.loads(path.read_text())
        old = d["meta"].get("config_key") or path.stem.split("-")[-1]
        version = written_under(d["config"], old)
        if version == RESULTS_VERSION:
            if "content_sha256" in d["meta"] and d["meta"]["content_sha256"] != content_hash(d):
                report["unknown"].append(path.name)  # edited since it was written: not blessed
                continue
            if _upgrade_format(d):
                d["meta"]["content_sha256"] = content_hash(d)
                if not dry_run:
                    atomic_write_bytes(path, json.dumps(d, indent=1, allow_nan=False).encode())
                report["hashed"].append(path.name)
            else:
                report["current"].append(path.name)
            continue
        if version is None:
            report["unknown"].append(path.name)
            continue
        config_dict: dict | None = d["config"]
        for v in range(version + 1, RESULTS_VERSION + 1):
            config_dict = STEPS[v](config_dict, d, version) if config_dict is not None else None
        if config_dict is None:
            report["removed"].append(path.name)
            if not dry_run:
                path.unlink()
                for src, _ in _companions(root, d["config"]["algorithm"], old, None):
                    src.unlink(missing_ok=True)
            continue
        config = Config.from_dict(config_dict)
        report["kept"].append(path.name)
        if dry_run:
            continue
        d["config"] = config.to_dict()
        d["meta"]["config_key"] = config.key()
        d["meta"]["migrated_from"] = old
        target = root / f"{config.algorithm}-{config.key()}.json"
        _upgrade_format(d)
        d["meta"]["content_sha256"] = content_hash(d)
        atomic_write_bytes(target, json.dumps(d, indent=1, allow_nan=False).encode())
        if target != path:
            path.unlink()
        for src, dst in _companions(root, config.algorithm, old, config.key()):
            if src.exists():
                src.replace(dst)
    return report


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="python -m lab.migrate", description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=None,
                   help="results folder (default: data/results; its flower/ folder too)")
    p.add_argument("--dry-run", action="store_true", help="only report what would happen")
    args = p.parse_args(argv)
    root = Path(args.root or results_dir())
    unknown = 0
    for folder in (root, root / "flower" / "simulation", root / "flower" / "deployment"):
        if not folder.is_dir():
            continue
        report = migrate(folder, args.dry_run)
        print(f"{folder}: " + ", ".join(f"{what} {len(names)}" for what, names in report.items()))
        unknown += len(report["unknown"])
    return 1 if unknown else 0


if __name__ == "__main__":
    from fedlib.cli import entry

    sys.exit(entry(main, "python -m lab.migrate"))
