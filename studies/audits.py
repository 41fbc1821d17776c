"""Audits a page computes (attacks on models, not training runs), stored like training results.

An audit is a function of its configuration (a plain dict: what is attacked, how, with which
seeds) and of the code that computes it (``version``, bumped when that code changes what it
returns). Its rows are written once, as one JSON file per configuration under
``<results>/audits/<kind>/<key>.json`` with the configuration, the rows, the provenance of the
machine that computed them and a SHA-256 of the content, and every later build reads them back
instead of attacking again (issue 66: the book's gradient-inversion sweep took 381 s of every build
and its numbers moved with the host). A file that does not verify is set aside and recomputed. As
for results, the hash catches accidental damage, not a deliberate edit with the hash recomputed
(``python -m lab.reproduce`` reruns committed results against such edits).

Floats are written as JSON numbers; a non-finite one (a PSNR of a perfect reconstruction) as the
string ``"inf"``, ``"-inf"`` or ``"nan"``, so that every file is valid JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fedlib.results import atomic_write_bytes, provenance, set_aside
from studies.common import read_roots, write_root


def audit_key(kind: str, version: int, config: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of the audit's kind, code version and configuration (canonical JSON)."""
    payload = json.dumps({"kind": kind, "version": version, "config": config}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def audit_path(kind: str, version: int, config: dict[str, Any], root: Path) -> Path:
    return Path(root) / "audits" / kind / f"{audit_key(kind, version, config)}.json"


def _encode(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _decode(v):
    return float(v) if v in ("inf", "-inf", "nan") else v


def _digest(d: dict[str, Any]) -> str:
    body = {k: v for k, v in d.items() if k != "content_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _log(name: str, kind: str, cached: bool, seconds: float | None) -> None:
    """One line in ``$FEDLIB_RUN_LOG`` (the book build's record of what each page computed)."""
    path = os.environ.get("FEDLIB_RUN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"key": name, "algorithm": f"audit:{kind}", "cached": cached,
                                "duration_s": seconds, "device": "cpu", "engine": None}) + "\n")


def read(kind: str, version: int, config: dict[str, Any], roots: list[Path],
         with_meta: bool = False) -> list[dict] | tuple[list[dict], dict] | None:
    """The rows of a committed audit of ``config`` (and its provenance, ``with_meta``), or None (a
    damaged file is set aside)."""
    for root in roots:
        path = audit_path(kind, version, config, root)
        if not path.exists():
            continue
        try:
            d = json.loads(path.read_text())
            ok = (isinstance(d, dict) and d.get("content_sha256") == _digest(d) and d.get("kind") == kind
                  and d.get("version") == version and d.get("config") == json.loads(json.dumps(config)))
        except (OSError, ValueError):
            ok = False
        if not ok:
            set_aside(path, "audit file does not verify (content hash, kind, version or configuration)")
            continue
        rows = [{k: _decode(v) for k, v in row.items()} for row in d["rows"]]
        return (rows, d.get("meta", {})) if with_meta else rows
    return None


def cached(kind: str, version: int, config: dict[str, Any], compute: Callable[[], list[dict]],
           with_meta: bool = False) -> list[dict] | tuple[list[dict], dict]:
    """The audit's rows (and, ``with_meta``, the provenance of the machine that computed them): read
    back from the results store (or scratch) when this configuration was audited before with this
    ``version`` of the code; otherwise ``compute()`` them and write them where new results go
    (:func:`studies.common.write_root`: the store during a book build)."""
    root = write_root()
    roots = [*read_roots(), root]
    name = f"{kind}-{audit_key(kind, version, config)}"
    found = read(kind, version, config, roots, with_meta=True)
    if found is not None:  # what it cost when it was computed, as a cached run reports its own
        _log(name, kind, True, found[1].get("duration_s"))
        return found if with_meta else found[0]
    t0 = time.time()
    rows = compute()
    seconds = round(time.time() - t0, 1)
    d = {"kind": kind, "version": version, "config": config,
         "rows": [{k: _encode(v) for k, v in row.items()} for row in rows],
         "meta": {**provenance(torch.device("cpu"), "audit"), "duration_s": seconds}}
    d["content_sha256"] = _digest(d)
    atomic_write_bytes(audit_path(kind, version, config, root),
                       json.dumps(d, indent=1, allow_nan=False).encode())
    _log(name, kind, False, seconds)
    return (rows, d["meta"]) if with_meta else rows
