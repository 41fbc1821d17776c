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
import threading
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from fedlib.config import Config
from fedlib.flower import check_supported, require_flower
from fedlib.results import Result, load_cached, result_path, results_dir

#: Sub-folder of the results folder that holds Flower runs.
FLOWER_DIR = "flower"


def flower_results_dir(root: Path | None = None) -> Path:
    return Path(root or results_dir()) / FLOWER_DIR


class MemorySampler:
    """Peak resident memory (MiB) of this process and all its descendants (Ray's workers), sampled
    every ``every_s`` seconds in a background thread (psutil). In a simulation of several runs,
    each result records the peak up to its end."""

    def __init__(self, every_s: float = 0.25):
        import psutil

        self._psutil, self.every_s = psutil, every_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> float:
        me = self._psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                pass
        self.peak_mb = max(self.peak_mb, total / 2**20)
        return self.peak_mb

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


class ResultWriter:
    """The server's bookkeeping: a fedlib :class:`~fedlib.run._Trainee` (experiment, history) fed
    one round at a time by the strategy; writes the result after the last round."""

    def __init__(self, root: Path, progress: bool = True, extra: dict | None = None,
                 memory: MemorySampler | None = None):
        self.root, self.progress, self.extra, self.memory = root, progress, extra or {}, memory
        self.results: list[Result] = []
        self.launched_at: float | None = None  # when the simulation was started (start-up time)
        self.first_round_at: float | None = None

    @classmethod
    def for_deployment(cls) -> ResultWriter:
        return cls(flower_results_dir(), progress=False, extra={"flower": {"mode": "deployment"}})

    def start(self, config: Config):
        from fedlib.run import _Trainee

        self.config = config
        self.first_round_at = None
        self.trainee = _Trainee(config, torch.device("cpu"), self.root, force=True)
        self.trainee.personal = False  # the personal models stay on the clients
        self.t_start = time.time()
        self.bar: tqdm | None = None
        return self.trainee.exp

    def on_round(self, t: int, rec: dict, wall_s: float) -> None:
        if self.first_round_at is None:  # the clock of the progress bar starts with round 1
            self.first_round_at = time.time() - wall_s
            self.bar = tqdm(total=self.config.rounds, desc=f"{self.config.algorithm} (flower)", unit="round",
                            disable=not self.progress)
        done = self.trainee.after_round(t, rec, wall_s, checkpoint_every=10**9)
        self.bar.update(1)
        if done.get("test_acc") is not None:
            self.bar.set_postfix(acc=f"{done['test_acc']:.4f}", loss=f"{done['test_loss']:.3f}")
        if t + 1 == self.config.rounds:
            self.bar.close()
            flower = dict(self.extra.get("flower", {}))
            if self.memory is not None:
                flower["peak_rss_mb"] = round(self.memory.sample(), 1)
            if self.launched_at is not None:
                flower["startup_s"] = round(self.first_round_at - self.launched_at, 2)
            extra = {**self.extra, "flower": flower}
            result = self.trainee.save(torch.device("cpu"), "flower", self.t_start, self.root, extra)
            self.results.append(result)
            self.launched_at = None  # only the first run of a simulation pays its start-up


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
