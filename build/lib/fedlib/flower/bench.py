"""Time and memory of one configuration trained by fedlib's engine and through Flower, measured
one after the other on the same idle machine (``python -m fedlib.flower bench --save``).

For each configuration: seconds per round (the median over rounds after the first, which pays
for loading and warming up), start-up (from the call to the first round), the peak resident
memory of the whole process tree (for Flower: server, Ray and its workers), sampled every 0.25 s,
each path's time as a ratio to the engine's in the same run (per round and in all), and for the
deployment the train messages and ClientApp processes of a round.
Both write their results to a temporary folder: nothing is cached or committed but the summary,
``data/bench/flower/<device>-<date>.json`` with provenance.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from fedlib.config import Config
from fedlib.results import REPO_ROOT, atomic_write_bytes, provenance


def _per_round(history: list[dict]) -> float:
    walls = [h["wall_s"] for h in history[1:]] or [h["wall_s"] for h in history]
    return statistics.median(walls)


def measure_engine(config: Config, engine: str = "auto") -> dict:
    """fedlib's engine on ``config`` (trained afresh into a temporary folder)."""
    from fedlib.flower.results import MemorySampler
    from fedlib.run import run

    with tempfile.TemporaryDirectory() as tmp, MemorySampler() as memory:
        t0 = time.time()
        result = run(config, engine=engine, root=Path(tmp), force=True, progress=False)
        total = time.time() - t0
    return {"s_per_round": _per_round(result.history), "total_s": total,
            "startup_s": total - sum(h["wall_s"] + (h.get("eval_s") or 0.0) for h in result.history),
            "peak_rss_mb": memory.peak_mb, "engine": result.meta["engine"],
            "test_acc": result.final["test_acc"]}


def measure_flower(config: Config, cpus: int | None = None) -> dict:
    """The same configuration through Flower's simulation engine (its own Ray session)."""
    from fedlib.flower.simulation import run_flower_many

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        result = run_flower_many([config], root=Path(tmp), force=True, cpus=cpus, progress=False)[0]
        total = time.time() - t0
    flower = result.meta["flower"]
    return {"s_per_round": _per_round(result.history), "total_s": total, "startup_s": flower["startup_s"],
            "peak_rss_mb": flower["peak_rss_mb"], "engine": "flower", "test_acc": result.final["test_acc"]}


def measure_deployment(config: Config, nodes: int = 3) -> dict:
    """The same configuration on Flower's Deployment Runtime: a SuperLink and ``nodes`` SuperNodes as
    local processes (:func:`fedlib.flower.deploy.deploy`). Start-up runs from the call to the
    SuperNodes' connecting; memory is the peak over all those processes."""
    from fedlib.flower.deploy import deploy

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        result = deploy([config], nodes=nodes, root=Path(tmp), progress=False)[0]
        total = time.time() - t0
    flower = result.meta["flower"]
    return {"s_per_round": _per_round(result.history), "total_s": total, "startup_s": flower["startup_s"],
            "peak_rss_mb": flower["peak_rss_mb"], "engine": f"flower deployment ({nodes} SuperNodes)",
            "test_acc": result.final["test_acc"],
            "messages_per_round": statistics.mean(flower["messages_per_round"]),
            "clientapp_processes_per_round": statistics.mean(flower["clientapp_processes_per_round"]),
            "message_phases": message_phases(flower.get("message_phases_per_round", []))}


def message_phases(per_round: list[dict[str, float]]) -> dict[str, float]:
    """Seconds of each phase of a train message (:data:`fedlib.flower.server.PHASES`, the mean over a
    round's messages), the median over the rounds after the first."""
    rounds = per_round[1:] or per_round
    if not rounds:
        return {}
    return {name: statistics.median(r.get(name, 0.0) for r in rounds) for name in rounds[0]}


def compare(configs: dict[str, Config], cpus: int | None = None, nodes: int = 0) -> list[dict]:
    """One row per (label, engine): fedlib's engine, Flower's simulation, and with ``nodes`` > 0
    Flower's deployment on that many local SuperNodes."""
    paths = [("fedlib engine", lambda c: measure_engine(c)),
             ("Flower simulation", lambda c: measure_flower(c, cpus))]
    if nodes:
        paths.append((f"Flower deployment ({nodes} SuperNodes)", lambda c: measure_deployment(c, nodes)))
    rows = []
    for label, config in configs.items():
        mine = [{"method": label, "engine_name": name, "rounds": config.rounds, "config_key": config.key(),
                 **fn(config)} for name, fn in paths]
        rows += with_ratios(mine)
    return rows


def with_ratios(rows: list[dict]) -> list[dict]:
    """``rows`` of one configuration (the engine's first) with each one's time as a multiple of the
    engine's, measured in the same run: per round and in all (start-up included)."""
    base = rows[0]
    return [{**r, "ratio_s_per_round": r["s_per_round"] / base["s_per_round"],
             "ratio_total": r["total_s"] / base["total_s"]} for r in rows]


def save(rows: list[dict], folder: Path | None = None) -> Path:
    """``data/bench/flower/<device>-<date>.json`` (atomically), with provenance."""
    folder = Path(folder or REPO_ROOT / "data" / "bench" / "flower")
    path = folder / f"cpu-{time.strftime('%Y-%m-%d')}.json"
    payload = {"rows": rows, "provenance": provenance(torch.device("cpu"), "flower"),
               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_bytes(path, json.dumps(payload, indent=1).encode())
    return path
