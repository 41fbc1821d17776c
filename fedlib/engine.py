"""Run one round of local training for a set of clients, on either of two paths.

* ``sequential`` (reference): one client after another, each step a plain call of the
  algorithm's pure ``client_step``. Simple and readable; the default on a CPU.
* ``parallel``: the sequential path split over worker processes with one thread each
  (the CPU default when there are at least two cores). Clients are independent, so
  workers need no synchronisation within a round; how much this gains over one process
  on all cores depends on how well the machine's convolutions scale across threads,
  which ``make bench`` measures (``thread_scaling``, ``plain_parallel_vs_floor``).
* ``vectorized``: all clients of the round at once, ``torch.func.vmap`` over a stacked
  client dimension; the default on a GPU, where a loop over small clients is
  launch-bound. Clients have unequal numbers of steps: every client runs
  ``max_i K_i`` steps, and a per-client mask keeps the state of a client whose data
  is exhausted (as fedjax's padded client blocks do).

Both paths consume the same :class:`RoundPlan` (minibatch indices, padding weights and
dropout masks drawn on the host from per-(seed, round, client) generators), so they
compute the same function; a test checks that they agree to float tolerance.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch.func import vmap

from fedlib.algorithms.base import Algorithm, RoundContext
from fedlib.privacy.noise import generator_for
from fedlib.tree import Tree, index, stack, tmap, where

PATHS = ("sequential", "parallel", "vectorized")


@dataclass
class RoundPlan:
    """The minibatches of one round for ``C`` clients, padded to ``S`` steps of size ``B``."""

    idx: torch.Tensor  # (C, S, B) int64 sample indices (0 where padded)
    weight: torch.Tensor  # (C, S, B) float32, 1 for real samples, 0 for padding
    steps: list[int]  # K_i, the real number of steps of each client
    drop: torch.Tensor | None = None  # (C, S, B, H) dropout keep-masks, or None

    @property
    def active(self) -> torch.Tensor:
        """(C, S) bool: step s of client i is real."""
        s = torch.arange(self.idx.shape[1], device=self.idx.device)
        return s[None, :] < torch.tensor(self.steps, device=self.idx.device)[:, None]


def make_plan(client_indices: list[np.ndarray], client_ids: list[int], *, batch_size: int,
              epochs: int, seed: int, round_: int, device: torch.device,
              dropout: float = 0.0, repr_dim: int = 0) -> RoundPlan:
    """Draw each client's minibatches for this round (an epoch = each sample once)."""
    batches: list[list[np.ndarray]] = []
    for cid, idx in zip(client_ids, client_indices, strict=True):
        rng = np.random.default_rng([seed, 23, round_, cid])
        b = []
        for _ in range(epochs):
            perm = rng.permutation(idx)
            b.extend(perm[i:i + batch_size] for i in range(0, len(perm), batch_size))
        batches.append(b)
    steps = [len(b) for b in batches]
    c, s = len(batches), max(steps)
    idx_arr = np.zeros((c, s, batch_size), dtype=np.int64)
    w_arr = np.zeros((c, s, batch_size), dtype=np.float32)
    for i, b in enumerate(batches):
        for j, chunk in enumerate(b):
            idx_arr[i, j, :len(chunk)] = chunk
            w_arr[i, j, :len(chunk)] = 1.0
    drop = None
    if dropout > 0:
        masks = []
        for cid in client_ids:
            g = generator_for(seed, 29, round_, cid)
            masks.append(torch.rand((s, batch_size, repr_dim), generator=g) >= dropout)
        drop = torch.stack(masks).to(device=device, dtype=torch.float32)
    return RoundPlan(torch.from_numpy(idx_arr).to(device), torch.from_numpy(w_arr).to(device),
                     steps, drop)


def _batch(x: torch.Tensor, y: torch.Tensor, plan: RoundPlan, i, s) -> dict[str, torch.Tensor]:
    """Minibatch ``s`` of client(s) ``i`` (an int, or ``slice(None)`` for all clients)."""
    ids = plan.idx[i, s]
    b = {"x": x[ids], "y": y[ids], "w": plan.weight[i, s]}
    if plan.drop is not None:
        b["drop"] = plan.drop[i, s]
    return b


def run_sequential(algo: Algorithm, x: torch.Tensor, y: torch.Tensor, plan: RoundPlan,
                   cstates: Tree, ctx: RoundContext) -> tuple[Tree, Tree, Tree]:
    """Reference path. ``cstates`` is stacked over the round's clients; so are the outputs."""
    uploads, new_states, metrics = [], [], []
    for i, k in enumerate(plan.steps):
        cstate = index(cstates, i)
        s = algo.client_init(cstate, ctx)
        for step in range(k):
            s = algo.client_step(s, _batch(x, y, plan, i, step), cstate, ctx)
        up, cs, m = algo.client_final(s, cstate, ctx)
        uploads.append(up)
        new_states.append(cs)
        metrics.append(m)
    return stack(uploads), stack(new_states), stack(metrics)


def run_vectorized(algo: Algorithm, x: torch.Tensor, y: torch.Tensor, plan: RoundPlan,
                   cstates: Tree, ctx: RoundContext) -> tuple[Tree, Tree, Tree]:
    """Fast path: every client of the round in one ``vmap``-ed step, padded steps masked."""
    # ``ids`` is a batched dummy argument: it tells vmap the client count even when the
    # algorithm keeps no client state (an empty tree has no batched leaves).
    ids = torch.arange(len(plan.steps), device=plan.idx.device)
    init = vmap(lambda _, c: algo.client_init(c, ctx), randomness="error")
    step = vmap(lambda _, s, b, c: algo.client_step(s, b, c, ctx), randomness="error")
    final = vmap(lambda _, s, c: algo.client_final(s, c, ctx), randomness="error")
    algo.functional = True
    try:
        s = init(ids, cstates)
        active = plan.active
        shortest = min(plan.steps)
        for j in range(max(plan.steps)):
            new = step(ids, s, _batch(x, y, plan, slice(None), j), cstates)
            s = new if j < shortest else where(active[:, j], new, s)
        return final(ids, s, cstates)
    finally:
        algo.functional = False


def subplan(plan: RoundPlan, rows: list[int]) -> RoundPlan:
    """The plan of some of the round's clients (trimmed to their longest client)."""
    steps = [plan.steps[i] for i in rows]
    s, r = max(steps), torch.tensor(rows, device=plan.idx.device)
    drop = None if plan.drop is None else plan.drop[r, :s]
    return RoundPlan(plan.idx[r, :s], plan.weight[r, :s], steps, drop)


def balance(steps: list[int], workers: int) -> list[list[int]]:
    """Assign clients to workers, longest first to the least loaded (LPT scheduling)."""
    loads, groups = [0] * workers, [[] for _ in range(workers)]
    for i in sorted(range(len(steps)), key=lambda i: -steps[i]):
        w = loads.index(min(loads))
        groups[w].append(i)
        loads[w] += steps[i]
    return [sorted(g) for g in groups if g]


def _worker_loop(conn, algo: Algorithm, x: torch.Tensor, y: torch.Tensor) -> None:
    torch.set_num_threads(1)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        plan, cstates, ctx = msg
        try:
            conn.send(("ok", run_sequential(algo, x, y, plan, cstates, ctx)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
            conn.send(("error", repr(e)))


class ProcessPool:
    """Forked workers that inherit the algorithm and the (CPU) dataset copy-on-write."""

    def __init__(self, algo: Algorithm, x: torch.Tensor, y: torch.Tensor, workers: int):
        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        for _ in range(workers):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_loop, args=(child, algo, x, y), daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)

    def run(self, plan: RoundPlan, cstates: Tree, ctx: RoundContext) -> tuple[Tree, Tree, Tree]:
        groups = balance(plan.steps, len(self.conns))
        for conn, rows in zip(self.conns, groups, strict=False):
            r = torch.tensor(rows)
            conn.send((subplan(plan, rows), index(cstates, r), ctx))
        parts = []
        for conn, _ in zip(self.conns, groups, strict=False):
            status, payload = conn.recv()
            if status != "ok":
                raise RuntimeError(f"engine worker failed: {payload}")
            parts.append(payload)
        order = torch.tensor([i for g in groups for i in g])
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        merged = tuple(tmap(lambda *xs: torch.cat(xs)[inverse], *[p[k] for p in parts]) for k in range(3))
        return merged  # type: ignore[return-value]

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


class Executor:
    """Runs a round's clients on one engine path; owns worker processes if any."""

    def __init__(self, path: str, algo: Algorithm, x: torch.Tensor, y: torch.Tensor,
                 workers: int | None = None):
        if path not in PATHS:
            raise ValueError(f"unknown engine path {path!r}; choose from {PATHS}")
        if path == "parallel" and x.device.type != "cpu":
            raise ValueError("the parallel path runs on the CPU; use vectorized on a GPU")
        self.path, self.algo, self.x, self.y = path, algo, x, y
        self.workers = workers or cpu_workers()
        self.pool = ProcessPool(algo, x, y, self.workers) if path == "parallel" else None

    def run(self, plan: RoundPlan, cstates: Tree, ctx: RoundContext) -> tuple[Tree, Tree, Tree]:
        if self.pool is not None:
            return self.pool.run(plan, cstates, ctx)
        fn = run_vectorized if self.path == "vectorized" else run_sequential
        return fn(self.algo, self.x, self.y, plan, cstates, ctx)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cpu_workers() -> int:
    """Worker processes for the parallel path: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def default_path(device: torch.device) -> str:
    """Vectorized on a GPU; on a CPU the parallel path when there are >= 2 cores (it
    measured fastest, see ``make bench``), else the sequential path."""
    if device.type == "cuda":
        return "vectorized"
    return "parallel" if cpu_workers() >= 2 else "sequential"
