"""Run one fedlib configuration through Flower's simulation engine and write its result.

:func:`run_flower` starts Flower's Simulation Runtime (Ray) with one virtual SuperNode per client,
the :mod:`fedlib.flower.client` app on them and :class:`~fedlib.flower.server.FedlibStrategy` on
the server, and writes a result file like :func:`fedlib.run` (same history keys and provenance),
under ``<results>/flower/`` so that it never replaces the engine's result of the same config.
The result's meta says ``engine: flower`` and records Flower's version, the simulation's
resources, its start-up time and the peak memory of the whole process tree (server, Ray, workers).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from fedlib.config import Config
from fedlib.flower import check_supported, require_flower
from fedlib.flower.results import MemorySampler, ResultWriter, flower_results_dir
from fedlib.results import Result, load_cached, result_path


def run_flower(config: Config, **kwargs: Any) -> Result:
    """Train ``config`` through Flower's simulation engine (or load its Flower result); see
    :func:`run_flower_many` for the options."""
    return run_flower_many([config], **kwargs)[0]


def run_flower_many(configs: list[Config], *, root: Path | None = None, force: bool = False,
                    cpus: int | None = None, client_cpus: int = 1, progress: bool = True,
                    verbose: bool = False) -> list[Result]:
    """Train ``configs`` through one Flower simulation (or load their Flower results), one run
    after another over the same virtual SuperNodes (as many as the largest run has clients).

    ``cpus``: CPUs Ray may use (default: all); ``client_cpus``: CPUs (and torch threads) per
    virtual client, so ``cpus // client_cpus`` clients train at once. Every config is checked
    before the simulation starts.
    """
    for c in configs:
        c.validate()
        check_supported(c)
    if client_cpus < 1:
        raise ValueError(f"client_cpus must be >= 1, got {client_cpus}")
    require_flower()
    root = flower_results_dir(root)
    todo = [c for c in configs if force or load_cached(c, [root]) is None]
    todo = list({c.key(): c for c in todo}.values())
    if todo:
        _simulate(todo, root, cpus or os.cpu_count() or 1, client_cpus, progress, verbose)
    return [Result.load(result_path(c, root), expect=c) for c in configs]


def _simulate(configs: list[Config], root: Path, cpus: int, client_cpus: int, progress: bool,
              verbose: bool) -> None:
    import logging

    import flwr
    import ray
    from flwr.simulation import run_simulation

    from fedlib.flower import client, server

    supernodes = max(c.clients for c in configs)
    backend = {"client_resources": {"num_cpus": client_cpus, "num_gpus": 0.0},
               "init_args": {"num_cpus": cpus, "include_dashboard": False, "log_to_driver": verbose}}
    extra = {"flower": {"mode": "simulation", "flwr": flwr.__version__, "ray": ray.__version__,
                        "supernodes": supernodes, "cpus": cpus, "client_cpus": client_cpus}}
    if not verbose:  # Flower logs every round at INFO; the progress bar says enough
        logging.getLogger("flwr").setLevel(logging.WARNING)
    with MemorySampler() as memory:
        writer = ResultWriter(root, progress, extra, memory)
        writer.launched_at = time.time()
        app = server.server_app(configs, writer.start, writer.on_round, threads=client_cpus)
        run_simulation(server_app=app, client_app=client.app, num_supernodes=supernodes,
                       backend_config=backend, verbose_logging=verbose)
    if len(writer.results) != len(configs):
        raise RuntimeError(f"the Flower simulation ended with {len(writer.results)} of {len(configs)} "
                           "results (see its log above)")
