"""Run one round of local training for a set of clients, on either of two paths.

* ``sequential`` (reference): one client after another, each step a plain call of the
  algorithm's pure ``client_step``. Simple and readable; the default on a CPU.
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

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import vmap

from fedlib.algorithms.base import Algorithm, RoundContext
from fedlib.tree import Tree, index, stack, where

PATHS = ("sequential", "vectorized")


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
            g = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 29, round_, cid])
                                                  .generate_state(1)[0]))
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
    s = init(ids, cstates)
    active = plan.active
    shortest = min(plan.steps)
    for j in range(max(plan.steps)):
        new = step(ids, s, _batch(x, y, plan, slice(None), j), cstates)
        s = new if j < shortest else where(active[:, j], new, s)
    return final(ids, s, cstates)


def run_clients(path: str, algo: Algorithm, x: torch.Tensor, y: torch.Tensor, plan: RoundPlan,
                cstates: Tree, ctx: RoundContext) -> tuple[Tree, Tree, Tree]:
    if path == "sequential":
        return run_sequential(algo, x, y, plan, cstates, ctx)
    if path == "vectorized":
        return run_vectorized(algo, x, y, plan, cstates, ctx)
    raise ValueError(f"unknown engine path {path!r}; choose from {PATHS}")


def default_path(device: torch.device) -> str:
    """Vectorized on a GPU; on a CPU the sequential path (vmap does not pay there)."""
    return "vectorized" if device.type == "cuda" else "sequential"
