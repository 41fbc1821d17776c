"""Run one round of local training for a set of clients, on one of three paths.

* ``sequential`` (reference): one client after another, each step a plain call of the
  algorithm's pure ``client_step``. Simple and readable.
* ``parallel``: the sequential path split over worker processes with one thread each
  (the CPU default when there are at least two cores). Clients are independent, so
  workers need no synchronisation within a round; ``make bench`` measures what it gains.
* ``vectorized``: ``torch.func.vmap`` over a stacked dimension of *lanes*; the default on a
  GPU, where a loop over small clients is launch-bound. A lane runs one or more clients one
  after another: clients of unequal size are packed into lanes balanced by step count
  (longest first to the least loaded lane), and a per-lane mask keeps the state of a lane
  whose work is done (as fedjax's padded client blocks do). With one lane per client
  (``lanes="clients"``) every client runs as many steps as the largest one; the default
  (``lanes="auto"``) uses the fewest lanes that keep the round as short as its longest
  client, so little of the stacked work is padding.

Several runs of the same shape (seeds of one experiment, or configs that differ only in
data, schedules and server-side settings) can be trained together: :meth:`Executor.run_many`
takes one :class:`Work` per run and, on the vectorized path, stacks all their clients in one
group (a *run batch*); each run keeps its own global model, broadcast state and
hyperparameters, gathered per lane.

Every path consumes the same :class:`RoundPlan` (minibatch indices, padding weights and
dropout masks drawn on the host from per-(seed, round, client) generators; for record-level
DP-SGD, Poisson-sampled batches and a noise source keyed by (client, step), see
:func:`make_poisson_plan`), so they compute the same function; tests check that they agree
(exactly up to rounding in float64). A client's local randomiser (local DP,
:meth:`~fedlib.algorithms.base.Algorithm.release`) is the last step of its computation on every
path, with generators keyed on (config, round, client), so it draws the same noise everywhere.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from torch.func import vmap
from torch.overrides import TorchFunctionMode

from fedlib.algorithms.base import RELEASE_PREFIX, Algorithm, RoundContext
from fedlib.graphs import CaptureBackend, CapturedStep, capture_backend
from fedlib.kernels import capture_failure, note_capture_failure, prepare_host_memory
from fedlib.privacy.discrete import rng_for
from fedlib.privacy.noise import StepNoise, generator_for
from fedlib.privacy.record import Release, client_summary, draws_noted, note, note_draw, note_key, recording
from fedlib.streams import Stream
from fedlib.tree import Tree, index, stack, tmap, where

PATHS = ("sequential", "parallel", "vectorized")


class HostSync(RuntimeError):
    """A tensor's value read back to Python inside a round's steps (see :func:`no_host_sync`)."""


class _NoHostSync(TorchFunctionMode):
    """Refuses every call that reads a tensor's value into Python: on a GPU each waits for the device
    to finish all it was given, so one inside the step loop serialises the host and the device."""

    REFUSED = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
               torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.REFUSED:
            raise HostSync(f"Tensor.{func.__name__} inside a round's steps: it reads a value back to the "
                           "host (read diagnostics once per round, after the last step)")
        return func(*args, **(kwargs or {}))


#: What the vectorized path enters around its steps: nothing, unless :func:`no_host_sync` is active.
step_guard: Callable[[], AbstractContextManager] = contextlib.nullcontext


@contextlib.contextmanager
def no_host_sync():
    """While active, the vectorized path's step loop (from a round's first step to its last, lane
    switches included) refuses any read of a tensor's value into Python (:class:`HostSync`): the
    tests run every algorithm family under it (issue 37, item 2)."""
    global step_guard
    before, step_guard = step_guard, _NoHostSync
    try:
        yield
    finally:
        step_guard = before
LANES = ("auto", "clients")

Outputs = tuple[Tree, Tree, Tree]  # uploads, new client states, metrics (stacked over clients)


@dataclass
class RoundPlan:
    """The minibatches of one round for ``C`` clients, padded to ``S`` steps of size ``B``."""

    idx: torch.Tensor  # (C, S, B) int64 sample indices (0 where padded)
    weight: torch.Tensor  # (C, S, B) float32, 1 for real samples, 0 for padding
    steps: list[int]  # K_i, the real number of steps of each client
    drop: torch.Tensor | None = None  # (C, S, B, H) dropout keep-masks, or None
    clients: list[int] | None = None  # the client id of each row (needed by ``noise``)
    noise: StepNoise | None = None  # record-level DP-SGD: the noise of each (client, step)
    #: (C, S) real samples of each step, on the host, when batches vary in size (Poisson sampling):
    #: the sequential and parallel paths then compute each step on its real samples only
    #: (:func:`_client_batch`); None: every step is computed at the plan's width.
    sizes: np.ndarray | None = None

    def step_noise(self, i: int, s: int) -> dict[str, torch.Tensor]:
        """The noise of step ``s`` of row ``i`` (zeros on a padded step)."""
        assert self.noise is not None and self.clients is not None
        return self.noise.draw(self.clients[i], s) if s < self.steps[i] else self.noise.zeros()

    @property
    def active(self) -> torch.Tensor:
        """(C, S) bool: step s of client i is real."""
        s = torch.arange(self.idx.shape[1], device=self.idx.device)
        return s[None, :] < torch.tensor(self.steps, device=self.idx.device)[:, None]

    def offset(self, start: int) -> RoundPlan:
        """The same plan with sample indices shifted by ``start`` (for runs whose data are
        concatenated into one tensor, see :class:`Work`)."""
        return replace(self, idx=self.idx + start) if start else self


@dataclass
class Work:
    """One run's share of a round: its clients' plan, their states, and the round context."""

    plan: RoundPlan
    cstates: Tree  # stacked over the round's clients
    ctx: RoundContext
    #: The run's own algorithm, whose :meth:`~fedlib.algorithms.base.Algorithm.release` each client
    #: applies to its upload (runs of a run batch differ in budgets and noise keys); None: the
    #: executor's.
    algo: Algorithm | None = None


def make_plan(client_indices: list[np.ndarray], client_ids: list[int], *, batch_size: int,
              epochs: int, seed: int, round_: int, device: torch.device,
              dropout: float = 0.0, repr_dim: int = 0) -> RoundPlan:
    """Draw each client's minibatches for this round (an epoch = each sample once)."""
    batches: list[list[np.ndarray]] = []
    for cid, idx in zip(client_ids, client_indices, strict=True):
        rng = np.random.default_rng([seed, Stream.BATCHES, round_, cid])
        b = []
        for _ in range(epochs):
            perm = rng.permutation(idx)
            b.extend(perm[i:i + batch_size] for i in range(0, len(perm), batch_size))
        batches.append(b)
    return _padded_plan(batches, batch_size, client_ids, dropout=dropout, repr_dim=repr_dim, seed=seed,
                        round_=round_, device=device)


def _padded_plan(batches: list[list[np.ndarray]], width: int, client_ids: list[int], *, dropout: float,
                 repr_dim: int, seed: int, round_: int, device: torch.device) -> RoundPlan:
    """Each client's minibatches (index arrays) padded to the round's most steps and to ``width``
    samples (weight 0 where padded), with their dropout masks."""
    steps = [len(b) for b in batches]
    c, s = len(batches), max(steps)
    idx_arr = np.zeros((c, s, width), dtype=np.int64)
    w_arr = np.zeros((c, s, width), dtype=np.float32)
    for i, b in enumerate(batches):
        for j, chunk in enumerate(b):
            idx_arr[i, j, :len(chunk)] = chunk
            w_arr[i, j, :len(chunk)] = 1.0
    drop = _dropout_masks(client_ids, steps=s, width=width, dropout=dropout, repr_dim=repr_dim,
                          seed=seed, round_=round_, device=device)
    return RoundPlan(torch.from_numpy(idx_arr).to(device), torch.from_numpy(w_arr).to(device),
                     steps, drop, list(client_ids))


def _dropout_masks(client_ids: list[int], *, steps: int, width: int, dropout: float, repr_dim: int,
                   seed: int, round_: int, device: torch.device) -> torch.Tensor | None:
    """(C, S, B, H) keep-masks, or None without dropout. torch.rand fills row-major, so a
    client's first K_i steps of masks do not depend on the other clients' step counts (the
    lane packing relies on this)."""
    if dropout <= 0:
        return None
    masks = []
    for cid in client_ids:
        g = generator_for(seed, Stream.DROPOUT, round_, cid)
        masks.append(torch.rand((steps, width, repr_dim), generator=g) >= dropout)
    return torch.stack(masks).to(device=device, dtype=torch.float32)


def make_poisson_plan(client_indices: list[np.ndarray], client_ids: list[int], keys: list[tuple[int, ...]],
                      *, batch_size: int, epochs: int, seed: int, round_: int, device: torch.device,
                      dropout: float = 0.0, repr_dim: int = 0) -> RoundPlan:
    """Poisson-sampled minibatches, the sampling that DP-SGD's accounting assumes (Abadi et al.
    2016; Mironov, Talwar, Zhang 2019): at each of a client's ``K_i = ceil(E n_i / B)`` steps
    every one of its ``n_i`` samples is taken independently with probability ``q_i = B / n_i``
    (``E`` epochs and a batch of ``B`` in expectation). Batches are padded (weight 0) to the
    round's largest one. ``keys[i]`` seeds client i's sampling: it is part of the mechanism, so
    it is keyed like privacy noise, not by the run's seed alone."""
    batches: list[list[np.ndarray]] = []
    for idx, key in zip(client_indices, keys, strict=True):
        n = len(idx)
        rng = rng_for(*key)  # the same stream as default_rng(list(key)); its key is recorded
        q, k = min(1.0, batch_size / n), math.ceil(epochs * n / batch_size)
        batches.append([idx[rng.random(n) < q] for _ in range(k)])
    width = max(1, max(len(chunk) for b in batches for chunk in b))
    plan = _padded_plan(batches, width, client_ids, dropout=dropout, repr_dim=repr_dim, seed=seed,
                        round_=round_, device=device)
    sizes = np.zeros((len(batches), plan.idx.shape[1]), dtype=np.int64)
    for i, b in enumerate(batches):
        sizes[i, :len(b)] = [len(chunk) for chunk in b]
    return replace(plan, sizes=sizes)


def _batch(x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, weight: torch.Tensor,
           drop: torch.Tensor | None, noise: dict[str, torch.Tensor] | None = None) -> dict:
    b = {"x": x[idx], "y": y[idx], "w": weight}
    if drop is not None:
        b["drop"] = drop
    if noise is not None:
        b["noise"] = noise
    return b


def _selection(lp: LanePlan, j: int, active: torch.Tensor) -> dict:
    """What the lanes' step ``j`` reads besides their state (for :class:`fedlib.graphs.CapturedStep`):
    the minibatch selection of :func:`_batch` and which lanes are still active (``active``: (L, S)).
    DP-SGD noise: drawn here, or with ``counter`` noise only its keys, streams and stds, so that the
    captured step draws it itself (:func:`_selected_batch`) and no noise is copied in."""
    sel = {"idx": lp.idx[:, j], "weight": lp.weight[:, j], "active": active[:, j]}
    if lp.drop is not None:
        sel["drop"] = lp.drop[:, j]
    if lp.has_noise:
        if lp.sources[0][0].noise.counter:
            sel["noise_key"], sel["noise_stream"], sel["noise_scale"] = (v[:, j] for v in lp.counter_inputs())
        else:
            sel["noise"] = lp.step_noise(j)
    return sel


def _selected_batch(x: torch.Tensor, y: torch.Tensor, sel: dict, noise: StepNoise | None = None) -> dict:
    """The batch of :func:`_batch` from a selection; ``counter`` noise drawn from the selection's keys
    (``noise``: the round's :class:`StepNoise`, for its shapes and dtype)."""
    drawn = sel.get("noise")
    if "noise_key" in sel:
        drawn = StepNoise.lanes(sel["noise_key"], sel["noise_stream"], sel["noise_scale"], noise)
    return _batch(x, y, sel["idx"], sel["weight"], sel.get("drop"), drawn)


def _client_batch(x, y, plan: RoundPlan, i: int, s: int) -> dict:
    """Minibatch ``s`` of client ``i`` (with the step's DP-SGD noise when the plan has some). When the
    plan records its steps' sizes (Poisson sampling), the step keeps its real samples only (at least
    one, so that an empty draw still has a batch: a padded sample of weight 0): a padded sample adds
    an exact zero, so this is the same function at a fraction of the work (the round's widest batch
    is ~1.7 times the mean at the papers' scale); the sums may round in another order."""
    n = plan.idx.shape[2] if plan.sizes is None else max(1, int(plan.sizes[i, s]))
    return _batch(x, y, plan.idx[i, s, :n], plan.weight[i, s, :n],
                  None if plan.drop is None else plan.drop[i, s, :n],
                  None if plan.noise is None else plan.step_noise(i, s))


def _client_release(releaser: Algorithm, upload: Tree, plan: RoundPlan, i: int,
                    ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
    """Row ``i``'s last steps as a client: its local randomiser (when the algorithm has one) and the
    record of every privacy mechanism its round ran (its DP-SGD steps' noise, its release), as
    statistics (:func:`fedlib.privacy.record.client_summary`)."""
    with recording() as log:
        if plan.noise is not None and plan.steps[i] > 0:
            note(Release("dpsgd_steps",
                         noise_multiplier=plan.noise.std_of(plan.clients[i]) / plan.noise.sensitivity))
        stats: dict[str, float] = {}
        if releaser.releases_locally():
            upload, stats = releaser.release(upload, plan.clients[i], ctx)
    return upload, {**stats, **client_summary(log)}


def release_metrics(stats: dict[str, float], device: torch.device) -> dict[str, torch.Tensor]:
    """A client's release statistics as metrics (``release.<name>``, float64 scalars)."""
    return {RELEASE_PREFIX + k: torch.tensor(float(v), dtype=torch.float64, device=device)
            for k, v in stats.items()}


def run_sequential(algo: Algorithm, x: torch.Tensor, y: torch.Tensor, plan: RoundPlan,
                   cstates: Tree, ctx: RoundContext, releaser: Algorithm | None = None) -> Outputs:
    """Reference path. ``cstates`` is stacked over the round's clients; so are the outputs. Each
    client ends with its local randomiser (``releaser.release``, default ``algo``'s) when the
    algorithm has one."""
    releaser = releaser or algo
    ctx = replace(ctx, owns_state=True)  # the loop keeps only what each step returns
    uploads, new_states, metrics = [], [], []
    for i, k in enumerate(plan.steps):
        cstate = index(cstates, i)
        s = algo.client_init(cstate, ctx)
        for step in range(k):
            s = algo.client_step(s, _client_batch(x, y, plan, i, step), cstate, ctx)
        up, cs, m = algo.client_final(s, cstate, ctx)
        up, stats = _client_release(releaser, up, plan, i, ctx)
        if stats:
            m = {**m, **release_metrics(stats, x.device)}
        uploads.append(up)
        new_states.append(cs)
        metrics.append(m)
    return stack(uploads), stack(new_states), stack(metrics)


# ---- lanes: clients packed for the vectorized path --------------------------------------------
def balance(steps: list[int], workers: int) -> list[list[int]]:
    """Assign clients to workers (or lanes), longest first to the least loaded (LPT
    scheduling); each group lists its clients in increasing order."""
    loads, groups = [0] * workers, [[] for _ in range(workers)]
    for i in sorted(range(len(steps)), key=lambda i: -steps[i]):
        w = loads.index(min(loads))
        groups[w].append(i)
        loads[w] += steps[i]
    return [sorted(g) for g in groups if g]


def lane_count(steps: list[int], lanes: str | int = "auto") -> int:
    """How many lanes the vectorized path stacks. ``"clients"``: one per client. ``"auto"``:
    ``ceil(sum K_i / max K_i)``, the fewest lanes in which the round can take no more steps
    than its longest client (LPT packing may add a few). An int: that many (at most C)."""
    if lanes == "clients":
        return len(steps)
    if lanes == "auto":
        return max(1, math.ceil(sum(steps) / max(steps)))
    if isinstance(lanes, int) and lanes >= 1:
        return min(lanes, len(steps))
    raise ValueError(f"lanes must be one of {LANES} or a positive int, got {lanes!r}")


@dataclass
class LanePlan:
    """Clients (rows of the concatenated round plans) packed into ``L`` lanes of ``S`` steps.

    Lane ``l`` runs the clients ``groups[l]`` one after another; ``row[l, s]`` is the client
    whose step lane ``l`` takes at step ``s`` (-1 where the lane has finished).
    """

    idx: torch.Tensor  # (L, S, B)
    weight: torch.Tensor  # (L, S, B)
    drop: torch.Tensor | None  # (L, S, B, H)
    row: np.ndarray  # (L, S) int
    groups: list[list[int]]
    steps: list[int]  # per row
    local_step: np.ndarray | None = None  # (L, S): the step of its client that lane l takes at s
    sources: list[tuple[RoundPlan, int]] | None = None  # per row: its plan and row in it
    _lane_keys: tuple[torch.Tensor, ...] | None = field(default=None, repr=False)  # counter noise

    def step_noise(self, j: int) -> dict[str, torch.Tensor]:
        """Every lane's DP-SGD noise at step ``j``, stacked (zeros where a lane has finished): with
        ``counter`` noise one draw for all lanes (:meth:`StepNoise.lanes`), else one per lane."""
        like = self.sources[0][0].noise
        if like.counter:
            key, stream, scale = self.counter_inputs()
            noise = StepNoise.lanes(key[:, j], stream[:, j], scale[:, j], like)
            if draws_noted():  # a test's draw log: each lane's key and values, as draw() notes them
                for lane in np.flatnonzero(self.row[:, j] >= 0):
                    plan, i = self.sources[self.row[lane, j]]
                    note_key("philox", (*plan.noise.key, plan.clients[i], int(self.local_step[lane, j])))
                    note_draw("dpsgd_step", *(v[lane] for v in noise.values()))
            return noise
        parts = []
        for lane in range(self.lanes):
            r = self.row[lane, j]
            if r < 0:
                parts.append(self.sources[0][0].noise.zeros())
            else:
                plan, i = self.sources[r]
                parts.append(plan.step_noise(i, int(self.local_step[lane, j])))
        return stack(parts)

    def counter_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per (lane, step), made once per round (``counter`` noise): the Philox key of the lane's run
        (L, S, 2), its (client, local step) stream (L, S, 2) and its noise std (L, S; 0 where the lane
        has finished)."""
        if self._lane_keys is None:
            self._lane_keys = self._counter_keys()
        return self._lane_keys

    def _counter_keys(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        like = self.sources[0][0].noise
        if any(not plan.noise.counter or plan.noise.shapes != like.shapes for plan, _ in self.sources):
            raise ValueError("runs stacked in one group must all draw counter noise of one shape")
        per_row = np.array([[*plan.noise.philox_key(), plan.clients[i], plan.noise.std_of(plan.clients[i])]
                            for plan, i in self.sources], dtype=object)
        rows = np.maximum(self.row, 0)
        key = np.stack([per_row[rows, 0], per_row[rows, 1]], axis=-1).astype(np.int64)
        stream = np.stack([per_row[rows, 2].astype(np.int64), self.local_step], axis=-1)
        scale = np.where(self.row >= 0, per_row[rows, 3].astype(np.float64), 0.0)
        dev = self.idx.device
        return (torch.from_numpy(key).to(dev), torch.from_numpy(stream).to(dev),
                torch.from_numpy(scale).to(device=dev, dtype=like.dtype))

    @property
    def has_noise(self) -> bool:
        return self.sources is not None and self.sources[0][0].noise is not None

    @property
    def lanes(self) -> int:
        return len(self.groups)

    @property
    def length(self) -> int:
        return self.row.shape[1]


def pack_lanes(plans: list[RoundPlan], lanes: str | int = "auto") -> LanePlan:
    """Pack every client of ``plans`` (rows numbered across plans, in order) into lanes."""
    steps = [k for p in plans for k in p.steps]
    per_row = [(p, i) for p in plans for i in range(len(p.steps))]
    groups = balance(steps, lane_count(steps, lanes))
    length = max(sum(steps[r] for r in g) for g in groups)
    first = plans[0]
    # the widest batch (Poisson-sampled plans differ in width; narrower ones pad with weight 0)
    dev, b = first.idx.device, max(p.idx.shape[2] for p in plans)
    if len({p.drop is None for p in plans}) > 1:
        raise ValueError("runs stacked in one group must all use dropout, or none of them")
    if len({p.noise is None for p in plans}) > 1:
        raise ValueError("runs stacked in one group must all use DP-SGD noise, or none of them")
    L = len(groups)
    idx = torch.zeros((L, length, b), dtype=torch.long, device=dev)
    weight = torch.zeros((L, length, b), dtype=first.weight.dtype, device=dev)
    drop = None if first.drop is None else first.drop.new_zeros((L, length, b, first.drop.shape[3]))
    row = np.full((L, length), -1, dtype=np.int64)
    local_step = np.zeros((L, length), dtype=np.int64)
    for lane, g in enumerate(groups):
        at = 0
        for r in g:
            p, i = per_row[r]
            k, w = steps[r], p.idx.shape[2]
            idx[lane, at:at + k, :w] = p.idx[i, :k]
            weight[lane, at:at + k, :w] = p.weight[i, :k]
            if drop is not None:
                drop[lane, at:at + k, :w] = p.drop[i, :k]
            row[lane, at:at + k] = r
            local_step[lane, at:at + k] = np.arange(k)
            at += k
    return LanePlan(idx, weight, drop, row, groups, steps, local_step, per_row)


# ---- the vectorized path --------------------------------------------------------------------------
def _as_tensor_tree(tree: Tree, device: torch.device) -> Tree:
    """Python numbers in a (broadcast) tree as 0-dim float64 tensors, so they can be stacked."""
    return tmap(lambda v: v if isinstance(v, torch.Tensor) else torch.tensor(float(v), dtype=torch.float64,
                                                                              device=device), tree)


class _RunContexts:
    """What each client needs from its run (global model, broadcast, hyperparameters), as the
    arguments of the vmapped functions. One run: shared by every lane (``in_dims`` None). A run
    batch: stacked over runs and gathered per lane whenever a lane starts a client."""

    def __init__(self, works: list[Work], device: torch.device):
        self.t = works[0].ctx.t
        if any(w.ctx.t != self.t for w in works):
            raise ValueError("runs stacked in one group must be at the same round")
        hypers = [w.ctx.hyper for w in works]
        keys = set(hypers[0])
        if any(set(h) != keys for h in hypers):
            raise ValueError("runs stacked in one group must have the same hyperparameter names")
        self.static = {k: v for k, v in hypers[0].items() if all(h[k] == v for h in hypers)}
        varying = sorted(keys - set(self.static))
        self.batched = len(works) > 1
        if not self.batched:
            ctx = works[0].ctx
            self.args = (ctx.gparams, ctx.shared if ctx.shared is not None else {}, {})
            return
        per_run = [(w.ctx.gparams, _as_tensor_tree(w.ctx.shared or {}, device),
                    {k: torch.tensor(float(w.ctx.hyper[k]), dtype=torch.float64, device=device)
                     for k in varying})
                   for w in works]
        self.stacked = stack(per_run)

    def gather(self, runs: torch.Tensor):
        """The arguments for lanes whose current clients belong to ``runs`` (L,)."""
        return index(self.stacked, runs)

    def context(self, gparams, shared, hyper_b) -> RoundContext:
        return RoundContext(self.t, gparams, {**self.static, **hyper_b}, shared, vectorized=True)


def run_vectorized(algo: Algorithm, x: torch.Tensor, y: torch.Tensor, works: list[Work],
                   lanes: str | int = "auto", capture: CaptureBackend | None = None) -> list[Outputs]:
    """Every client of every work at once: ``vmap`` over lanes, padded steps masked.

    At a step where a lane moves on to its next client, that lane's finished client is
    closed (``client_final``) and the next one opened (``client_init``) with its own client
    state and run context; lanes that do not switch keep their state (``where``).
    ``capture`` (a :mod:`fedlib.graphs` backend, e.g. CUDA graphs): record the step once for the
    round and replay it (:class:`fedlib.graphs.CapturedStep`); the same operations, fewer launches.
    """
    device = x.device
    lp = pack_lanes([w.plan for w in works], lanes)
    rows_per_work = [len(w.plan.steps) for w in works]
    run_of_row = torch.tensor([r for r, n in enumerate(rows_per_work) for _ in range(n)], device=device)
    cstates = tmap(lambda *xs: torch.cat(xs), *[w.cstates for w in works]) if len(works) > 1 \
        else works[0].cstates
    runs = _RunContexts(works, device)
    cx_dims = 0 if runs.batched else None

    init = vmap(lambda _, c, cx: algo.client_init(c, runs.context(*cx)),
                in_dims=(0, 0, cx_dims), randomness="error")
    step = vmap(lambda _, s, b, c, cx: algo.client_step(s, b, c, runs.context(*cx)),
                in_dims=(0, 0, 0, 0, cx_dims), randomness="error")
    final = vmap(lambda _, s, c, cx: algo.client_final(s, c, runs.context(*cx)),
                 in_dims=(0, 0, 0, cx_dims), randomness="error")

    L, S = lp.lanes, lp.length
    ids = torch.arange(L, device=device)
    row = lp.row
    # the client each lane is on; a finished lane keeps pointing at its last client
    current = torch.tensor(row[:, 0], device=device)
    lane_cstate = index(cstates, current)
    lane_cx = runs.gather(run_of_row[current]) if runs.batched else runs.args
    s = init(ids, lane_cstate, lane_cx)
    captured = None
    if capture is not None and capture_failure() is None:  # after a failed capture: eager
        active_steps = torch.from_numpy(row >= 0).to(device)  # (L, S), once: no copy per step
        try:
            round_noise = lp.sources[0][0].noise if lp.has_noise else None
            captured = CapturedStep(lambda sel: _selected_batch(x, y, sel, round_noise),
                                    lambda st, b, c, cx: step(ids, st, b, c, cx),
                                    s, _selection(lp, 0, active_steps), lane_cstate, lane_cx, capture,
                                    tag=(type(algo).__name__, algo.config.key()))
        except Exception as e:  # noqa: BLE001 - never fatal: the eager step computes the same function
            reason = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            if note_capture_failure(reason):
                print(f"warning: capturing the vectorized step failed ({reason}); it runs eagerly from "
                      "now on (results record cuda_graphs_fell_back)", file=sys.stderr)
            captured = None
    done_rows: list[torch.Tensor] = []
    done_out: list[Outputs] = []
    with step_guard():  # nothing in the steps reads a tensor back to Python (tests: no_host_sync)
        for j in range(S):
            if j > 0:
                switch = (row[:, j] != row[:, j - 1]) & (row[:, j] >= 0)
                if switch.any():  # close the clients these lanes finished, open the next ones
                    if captured is not None:
                        s = captured.state
                    lanes_sw = torch.from_numpy(np.flatnonzero(switch)).to(device)
                    out = final(ids, s, lane_cstate, lane_cx)
                    done_rows.append(torch.tensor(row[switch, j - 1], device=device))
                    done_out.append(index(out, lanes_sw))
                    mask = torch.from_numpy(switch).to(device)
                    current = torch.where(mask, torch.tensor(row[:, j], device=device), current)
                    lane_cstate = where(mask, index(cstates, current), lane_cstate)
                    if runs.batched:
                        lane_cx = where(mask, runs.gather(run_of_row[current]), lane_cx)
                    s = where(mask, init(ids, lane_cstate, lane_cx), s)
                    if captured is not None:
                        captured.set_state(s)
                        captured.load(cstate=lane_cstate, context=lane_cx)
            if captured is not None:
                if j > 0:  # step 0's selection is in the buffers since the capture
                    captured.load(selection=_selection(lp, j, active_steps))
                captured.replay()
                continue
            batch = _batch(x, y, lp.idx[:, j], lp.weight[:, j], None if lp.drop is None else lp.drop[:, j],
                           lp.step_noise(j) if lp.has_noise else None)
            new = step(ids, s, batch, lane_cstate, lane_cx)
            active = row[:, j] >= 0
            s = new if active.all() else where(torch.from_numpy(active).to(device), new, s)
    if captured is not None:
        s = captured.state
    out = final(ids, s, lane_cstate, lane_cx)  # every lane's last client
    done_rows.append(current)
    done_out.append(out)
    order = torch.cat(done_rows)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(len(order), device=device)
    merged = tuple(tmap(lambda *vs: torch.cat(vs)[inverse], *[o[k] for o in done_out]) for k in range(3))
    results, start = [], 0
    for w, n in zip(works, rows_per_work, strict=True):
        part = tuple(tmap(lambda v, a=start, b=start + n: v[a:b], p) for p in merged)
        results.append(release_clients(w.algo or algo, *part, w.plan, w.ctx))
        start += n
    return results  # type: ignore[return-value]


def release_clients(algo: Algorithm, uploads: Tree, cstates: Tree, metrics: Tree, plan: RoundPlan,
                    ctx: RoundContext) -> Outputs:
    """Each client's local randomiser on its own row of the stacked outputs (the vectorized path
    runs it after the vmapped steps: its generators cannot run under ``vmap``)."""
    if not algo.releases_locally() and plan.noise is None:
        return uploads, cstates, metrics
    rows, extra = [], []
    for i in range(len(plan.steps)):
        up, stats = _client_release(algo, index(uploads, i), plan, i, ctx)
        rows.append(up)
        extra.append(release_metrics(stats, ctx_device(ctx)))
    return stack(rows), cstates, {**metrics, **stack(extra)}


def ctx_device(ctx: RoundContext) -> torch.device:
    return next(iter(ctx.gparams.values())).device


# ---- the parallel path (CPU worker processes) -----------------------------------------------------
def subplan(plan: RoundPlan, rows: list[int]) -> RoundPlan:
    """The plan of some of the round's clients (trimmed to their longest client)."""
    steps = [plan.steps[i] for i in rows]
    s, r = max(steps), torch.tensor(rows, device=plan.idx.device)
    drop = None if plan.drop is None else plan.drop[r, :s]
    clients = None if plan.clients is None else [plan.clients[i] for i in rows]
    sizes = None if plan.sizes is None else plan.sizes[rows, :s]
    return RoundPlan(plan.idx[r, :s], plan.weight[r, :s], steps, drop, clients, plan.noise, sizes)


def _die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to kill this worker when its parent dies (Linux ``PR_SET_PDEATHSIG``), and
    exit at once if the parent is already gone (it may have died before the request)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe below still ends the worker
        pass
    if os.getppid() != parent_pid:
        os._exit(0)


def _worker_loop(conn, algo: Algorithm, x: torch.Tensor, y: torch.Tensor, parent_pid: int,
                 inherited: list) -> None:
    """A worker's life: serve rounds until told to stop or until the parent is gone. It closes the
    parent's ends of every pipe it inherited at fork, so that the parent's death (whatever signal
    ended it) closes them and ``recv`` ends with EOF instead of waiting forever."""
    for c in inherited:
        c.close()
    # Ctrl-C reaches the whole process group: the parent stops the workers (fedlib.cli), which must
    # not print a traceback each
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    torch.set_num_threads(1)
    releasers = {algo.config.key(): algo}  # a run batch's runs, built once each in this worker
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if msg is None:
            break
        plan, cstates, ctx, config = msg
        try:
            if config is not None and config.key() not in releasers:
                releasers[config.key()] = type(algo)(config, algo.model)
            releaser = algo if config is None else releasers[config.key()]
            reply = ("ok", run_sequential(algo, x, y, plan, cstates, ctx, releaser))
        except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
            reply = ("error", repr(e))
        try:
            conn.send(reply)
        except OSError:  # the parent stopped (Ctrl-C) while this round ran: end quietly, no traceback
            break


def worker_start_method() -> str:
    """How the parallel path starts its CPU workers: ``"fork"`` on a machine without a GPU (the
    workers inherit the algorithm and the dataset copy-on-write), ``"spawn"`` where one is visible.

    On a machine with a GPU, the parent's first backward pass (on any device, CPU included) starts
    autograd's per-device threads, and PyTorch then refuses any backward pass in a forked child
    ("Unable to handle autograd's threading in combination with fork-based multiprocessing",
    https://github.com/pytorch/pytorch/wiki/Autograd-and-Fork): on the H100 every CPU-path test that
    ran after another training failed so. A spawned worker starts a fresh interpreter and receives
    the algorithm and the data pickled (in shared memory, by torch.multiprocessing's reductions);
    it draws the same numbers, since every random draw is keyed by the round's context
    (``tests/test_engine.py`` checks both start methods against each other)."""
    return "spawn" if torch.cuda.is_available() else "fork"


class ProcessPool:
    """Worker processes that hold the algorithm and the (CPU) dataset: forked (inherited
    copy-on-write) or spawned (sent once), see :func:`worker_start_method`."""

    def __init__(self, algo: Algorithm, x: torch.Tensor, y: torch.Tensor, workers: int):
        self.start_method = worker_start_method()
        ctx = mp.get_context(self.start_method)
        forked = self.start_method == "fork"
        self.conns, self.procs = [], []
        for _ in range(workers):
            parent, child = ctx.Pipe()
            # the parent's ends a forked worker inherits and must not keep open (a spawned one
            # inherits none: passing them would hand it copies)
            inherited = [*self.conns, parent] if forked else []
            p = ctx.Process(target=_worker_loop, args=(child, algo, x, y, os.getpid(), inherited),
                            daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)

    def run(self, plan: RoundPlan, cstates: Tree, ctx: RoundContext, config=None) -> Outputs:
        """The round's clients split over the workers; ``config``: the run's own config when it is
        not the pool's algorithm's (a run of a run batch: its clients release with its budgets)."""
        groups = balance(plan.steps, len(self.conns))
        for conn, rows in zip(self.conns, groups, strict=False):
            r = torch.tensor(rows)
            conn.send((subplan(plan, rows), index(cstates, r), ctx, config))
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


def check_path(path: str, device: torch.device) -> None:
    """Raise ``ValueError`` for an engine path that cannot run on ``device``."""
    if path not in PATHS:
        raise ValueError(f"unknown engine path {path!r}; choose from {PATHS}")
    if path == "parallel" and device.type != "cpu":
        raise ValueError(f"the parallel path runs on the CPU (worker processes); on {device.type} "
                         "use vectorized (the default there) or sequential")


class Executor:
    """Runs a round's clients on one engine path; owns worker processes if any.

    ``x, y`` hold the training data of every run it serves (runs of a run batch are
    concatenated; each :class:`Work`'s plan indexes into them).
    """

    def __init__(self, path: str, algo: Algorithm, x: torch.Tensor, y: torch.Tensor,
                 workers: int | None = None, lanes: str | int = "auto"):
        check_path(path, x.device)
        lane_count([1], lanes)  # validates ``lanes``
        prepare_host_memory(x.device)  # before the workers fork: they inherit it
        self.path, self.algo, self.x, self.y, self.lanes = path, algo, x, y, lanes
        #: How the vectorized path records its step (None: eager), see :mod:`fedlib.graphs`.
        self.capture = capture_backend(x.device) if path == "vectorized" else None
        self.workers = workers or cpu_workers()
        self.pool = ProcessPool(algo, x, y, self.workers) if path == "parallel" else None

    def run(self, plan: RoundPlan, cstates: Tree, ctx: RoundContext) -> Outputs:
        return self.run_many([Work(plan, cstates, ctx)])[0]

    def run_many(self, works: list[Work]) -> list[Outputs]:
        """Train the clients of several runs' rounds. On the vectorized path they are stacked
        in one group; the other paths take them one run after another."""
        if not works:
            return []
        if self.path == "vectorized":
            return run_vectorized(self.algo, self.x, self.y, works, self.lanes, self.capture)
        if self.pool is not None:
            return [self.pool.run(w.plan, w.cstates, w.ctx,
                                  None if w.algo is None or w.algo is self.algo else w.algo.config)
                    for w in works]
        return [run_sequential(self.algo, self.x, self.y, w.plan, w.cstates, w.ctx, w.algo) for w in works]

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
