"""What the Flower server keeps of a run, shared by the simulation and the deployment: where Flower
results live (``<results>/flower/<runtime>/``, apart from the engine's and from each other's: the
runtime is part of a result's identity, so neither runtime returns the other's cached result), the
peak memory of the process tree, and :class:`ResultWriter`, which turns the strategy's rounds into a
fedlib result file (its ``meta.flower.mode`` names the runtime)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from fedlib.config import Config
from fedlib.results import Result, results_dir

#: Sub-folder of the results folder that holds Flower runs, one folder per runtime below it.
FLOWER_DIR = "flower"
#: The entry of a round's record (as the strategy's ``on_round`` receives it) that counts the round's
#: messages and ClientApp processes; :class:`ResultWriter` keeps it in the result's metadata.
TRANSPORT = "flower_transport"
#: Flower's runtimes (Simulation and Deployment Runtime): each keeps its results apart.
RUNTIMES = ("simulation", "deployment")


def flower_results_dir(root: Path | None = None, runtime: str = "simulation") -> Path:
    """Where ``runtime``'s results live under the results folder ``root``."""
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown Flower runtime {runtime!r}; choose from {RUNTIMES}")
    return Path(root or results_dir()) / FLOWER_DIR / runtime


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
    """The server's bookkeeping: a fedlib :class:`~fedlib.run.Trainee` (experiment, history) fed
    one round at a time by the strategy; writes the result after the last round."""

    def __init__(self, root: Path, progress: bool = True, extra: dict | None = None,
                 memory: MemorySampler | None = None):
        self.root, self.progress, self.extra, self.memory = root, progress, extra or {}, memory
        self.results: list[Result] = []
        self.launched_at: float | None = None  # when the simulation was started (start-up time)
        self.first_round_at: float | None = None

    @classmethod
    def for_deployment(cls) -> ResultWriter:
        return cls(flower_results_dir(runtime="deployment"), progress=False,
                   extra={"flower": {"mode": "deployment"}})

    def start(self, config: Config):
        from fedlib.run import Trainee

        self.config = config
        self.first_round_at = None
        self.transport: list[dict[str, int]] = []
        self.trainee = Trainee(config, torch.device("cpu"), self.root, force=True)
        self.trainee.personal = False  # the personal models stay on the clients
        self.t_start = time.time()
        self.bar: tqdm | None = None
        return self.trainee.exp

    def on_round(self, t: int, rec: dict, wall_s: float) -> None:
        rec = dict(rec)
        if TRANSPORT in rec:
            self.transport.append(rec.pop(TRANSPORT))
        if self.first_round_at is None:  # the clock of the progress bar starts with round 1
            self.first_round_at = time.time() - wall_s
            self.bar = tqdm(total=self.config.rounds_run, desc=f"{self.config.algorithm} (flower)",
                            unit="round",
                            disable=not self.progress)
        done = self.trainee.after_round(t, rec, wall_s, checkpoint_every=10**9)
        self.bar.update(1)
        if done.get("test_acc") is not None:
            self.bar.set_postfix(acc=f"{done['test_acc']:.4f}", loss=f"{done['test_loss']:.3f}")
        if t + 1 == self.config.rounds_run:
            self.bar.close()
            flower = dict(self.extra.get("flower", {}))
            if self.memory is not None:
                flower["peak_rss_mb"] = round(self.memory.sample(), 1)
            if self.transport:  # what one round cost in messages and ClientApp processes
                flower["messages_per_round"] = [r["messages"] for r in self.transport]
                flower["clientapp_processes_per_round"] = [r["processes"] for r in self.transport]
                if any("phases" in r for r in self.transport):  # seconds per phase of a message, per round
                    flower["message_phases_per_round"] = [r.get("phases", {}) for r in self.transport]
                flower["max_clientapp_processes_per_node"] = max(r["max_processes_per_node"]
                                                                 for r in self.transport)
            if self.launched_at is not None:
                flower["startup_s"] = round(self.first_round_at - self.launched_at, 2)
            extra = {**self.extra, "flower": flower}
            result = self.trainee.save(torch.device("cpu"), "flower", self.t_start, self.root, extra)
            self.results.append(result)
            self.launched_at = None  # only the first run of a simulation pays its start-up
