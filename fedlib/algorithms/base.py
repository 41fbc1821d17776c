"""The interface every federated algorithm implements, once, for both engine paths.

Following fedjax's ``for_each_client(client_init, client_step, client_final)`` split, a
client's local training is three *pure* functions of tensors (no Python branching on
tensor values, no in-place updates), so the engine can run them one client at a time
(the reference path) or over a stacked client dimension with ``torch.func.vmap``:

* ``client_init(cstate, ctx) -> sstate``: the local training state at the start of a round;
* ``client_step(sstate, batch, cstate, ctx) -> sstate``: one SGD step on one minibatch;
* ``client_final(sstate, cstate, ctx) -> (upload, new_cstate, metrics)``.

The server side is ``server_update(gparams, server_state, uploads, weights, ctx)``,
where ``uploads`` are stacked over the round's clients. ``ctx`` carries the round number,
the global parameters and this round's hyperparameters (from ``hyper(t)``).

A minibatch is a dict ``x, y, w`` (and ``drop`` when dropout is on): padded to the batch
size, ``w`` is 1 for real samples and 0 for padding, so the loss is the mean over the
real samples and clients of unequal size are exact.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value

from fedlib.config import Config
from fedlib.privacy.guarantee import GaussianEvent, Guarantee, PureEvent
from fedlib.privacy.noise import StepNoise
from fedlib.streams import Stream
from fedlib.tree import Tree, index, numel, stack, tmap

Params = dict[str, torch.Tensor]


@dataclass
class RoundContext:
    """What every client (and the server) sees in round ``t``; not batched over clients."""

    t: int
    gparams: Params
    hyper: dict[str, float]
    shared: Tree = None  # what the server broadcasts besides the model (``broadcast``)
    #: True when the engine runs the client functions under ``torch.func.vmap`` (the
    #: vectorized path): gradients must then come from ``torch.func``, not autograd.
    vectorized: bool = False
    #: True when the caller hands each client state to ``client_step`` and keeps only what it returns
    #: (the engine's sequential and parallel loops): the step may then update the state in place, the
    #: same values without an allocation per step. False for any other caller: the step is pure.
    owns_state: bool = False


#: Prefix of the release statistics that travel with a client's metrics (see :meth:`Algorithm.release`).
RELEASE_PREFIX = "release."


def mean_stats(stats: list[dict[str, float]]) -> dict[str, float]:
    """Each statistic's mean over the clients that reported it (release statistics of a round)."""
    keys = dict.fromkeys(k for st in stats for k in st)
    return {k: sum(st[k] for st in stats if k in st) / sum(k in st for st in stats) for k in keys}


def weighted_mean(values: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over real samples (``w`` = 1) of a padded batch."""
    return (values * w).sum() / w.sum().clamp_min(1.0)


def sgd_update(params: Params, mom: Params, grads: Params, lr: float, momentum: float,
               weight_decay: float, in_place: bool = False) -> tuple[Params, Params]:
    """``torch.optim.SGD`` (dampening 0, no Nesterov) as a pure function.

    With zero-initialised buffers this equals PyTorch's first step (buffer = gradient).
    ``in_place``: the same operations on the same values, written into ``params``, ``mom`` and
    ``grads`` (which the caller owns and will not read again) instead of new tensors: the CPU paths
    then allocate nothing per step (an out-of-place update of the CNN's 1.6 MB ``fc1`` weight maps
    fresh pages each step, ~8 % of a step on one thread, issue 75); bit-identical results.
    """
    if in_place:
        return _sgd_update_(params, mom, grads, lr, momentum, weight_decay)
    d = tmap(lambda g, p: g + weight_decay * p, grads, params) if weight_decay else grads
    if momentum == 0:  # plain SGD: no buffer (the zero buffers pass through unchanged)
        return tmap(lambda p, g: p - lr * g, params, d), mom
    new_mom = tmap(lambda b, g: momentum * b + g, mom, d)
    new_params = tmap(lambda p, b: p - lr * b, params, new_mom)
    return new_params, new_mom


def _sgd_update_(params: Params, mom: Params, grads: Params, lr: float, momentum: float,
                 weight_decay: float) -> tuple[Params, Params]:
    """:func:`sgd_update` in place, each value computed by the same operations in the same order (a
    product rounded, then a sum rounded), so the results are the same bits."""
    for k, p in params.items():
        g = grads[k]
        if weight_decay:
            g = g + weight_decay * p
        if momentum == 0:
            p.sub_(g.mul_(lr))  # p - lr * g
            continue
        b = mom[k].mul_(momentum).add_(g)  # momentum * b + g
        p.sub_(torch.mul(b, lr, out=g))  # p - lr * b (the gradient's storage holds lr * b)
    return params, mom


def sample_clients(config: Config, t: int) -> list[int]:
    """Clients of round ``t``: all of them, or ``round(fraction * N)`` without replacement."""
    m = config.clients_per_round
    if m >= config.clients:
        return list(range(config.clients))
    rng = np.random.default_rng([config.seed, Stream.SAMPLING, t])
    return sorted(rng.choice(config.clients, size=m, replace=False).tolist())


class Algorithm:
    """Base class: FedAvg's client (local SGD) and a sample-weighted server average.

    Subclasses override the pieces that differ (a loss term, a gradient correction, the
    client state, the server step) and say in their docstring which paper and equations
    they implement.
    """

    name: ClassVar[str] = "base"
    #: Whether the model needs MOON's projection head.
    uses_projection_head: ClassVar[bool] = False
    #: The algorithm-specific config fields this algorithm reads (each marked with it as owner).
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Config, model: nn.Module):
        self.config = config
        self.model = model

    @classmethod
    def check(cls, config: Config) -> list[str]:
        """Problems with this algorithm's own fields (run by ``Config.validate``)."""
        return []

    # ---- per-round hyperparameters (host side) -------------------------------------
    def hyper(self, t: int) -> dict[str, float]:
        """The host-side hyperparameters of round ``t`` that every client of the round shares (the
        learning rate, momentum and weight decay here; a schedule's value in algorithms that have one)."""
        c = self.config
        return {"lr": c.lr, "momentum": c.momentum, "weight_decay": c.weight_decay}

    # ---- state ------------------------------------------------------------------------
    def init_server_state(self, gparams: Params) -> Tree:
        """State the server keeps across rounds besides the global model (none for FedAvg)."""
        return {}

    def init_client_state(self, gparams: Params) -> Tree:
        """State of one client kept across rounds (stacked over all clients by the engine)."""
        return {}

    def broadcast(self, server_state: Tree) -> Tree:
        """What clients receive besides the global model (e.g. SCAFFOLD's control variate)."""
        return {}

    def prefetch_server_noise(self, ctx: RoundContext) -> None:
        """Called when round ``ctx.t`` begins, where noise is drawn ahead
        (:func:`fedlib.kernels.noise_ahead`): start drawing the noise the server step will add, if
        it can be drawn before the uploads arrive (:func:`fedlib.privacy.central.prefetch_noisy_sum`).
        Nothing here."""

    def client_hyper(self, t: int) -> dict[str, float]:
        """Round ``t``'s hyperparameters as a client needs them (a Flower ClientApp builds its round
        context from these): :meth:`hyper` here; an algorithm may leave out what only its server reads."""
        return self.hyper(t)

    def bind_clients(self, sizes: list[int]) -> None:
        """Called once by the run, before training, with each client's number of training
        samples (record-level DP calibrates its noise from them). Nothing here."""

    def poisson_records(self) -> bool:
        """Whether clients draw their minibatches by Poisson sampling of their records (record-level
        DP-SGD, :func:`fedlib.engine.make_poisson_plan`) instead of shuffled epochs."""
        return False

    def step_noise(self, t: int, like: Params) -> StepNoise | None:
        """The noise of every local step in round ``t`` (record-level DP-SGD), or None."""
        return None

    def client_multipliers(self, clients: list[int]) -> list[float] | None:
        """The noise multiplier promised to each of ``clients`` where clients are promised different
        ones (record-level DP-SGD with a sigma per client), or None: one promise for all, the
        round's :meth:`privacy_event`."""
        return None

    def sample_clients(self, t: int) -> list[int]:
        """Clients of round ``t`` (default: a fixed-size sample, see ``client_fraction``)."""
        return sample_clients(self.config, t)

    def empty_uploads(self, gparams: Params) -> Tree:
        """Uploads of a round in which no client was sampled (stacked over zero clients)."""
        return {"delta": tmap(lambda p: p.new_zeros((0, *p.shape)), gparams)}

    # ---- client (pure) ----------------------------------------------------------------
    def client_init(self, cstate: Tree, ctx: RoundContext) -> Tree:
        """A client's working state at the start of its round: a copy of the global model, zero momentum
        buffers, its step count and summed loss."""
        params = tmap(torch.clone, ctx.gparams)
        zero = next(iter(params.values())).new_zeros(())  # on the run's device, in its dtype
        return {"params": params, "mom": tmap(torch.zeros_like, params),
                "steps": zero, "loss_sum": zero}

    def forward(self, params: Params, batch: dict[str, torch.Tensor], return_repr: bool = False):
        """The model on ``batch`` with ``params``. Under ``precision="bfloat16"`` the forward
        pass runs under ``torch.autocast`` (matmuls and convolutions in bfloat16, parameters,
        gradients and the optimizer in float32) and its outputs come back as float32. Autocast's
        cache of cast weights is off: each weight is used once a step, and a cache would outlive a
        CUDA graph's capture (:mod:`fedlib.graphs`), which PyTorch's notes advise against."""
        kwargs = {"return_repr": return_repr}
        if "drop" in batch:
            kwargs["dropout_mask"] = batch["drop"]
        if self.config.precision != "bfloat16":
            return functional_call(self.model, params, (batch["x"],), kwargs)
        with torch.autocast(batch["x"].device.type, dtype=torch.bfloat16, cache_enabled=False):
            out = functional_call(self.model, params, (batch["x"],), kwargs)
        return tmap(lambda t: t.float(), out)

    def loss(self, params: Params, batch: dict[str, torch.Tensor], sstate: Tree, cstate: Tree,
             ctx: RoundContext) -> torch.Tensor:
        """The client's training loss on one minibatch: cross-entropy, averaged over the batch's real
        samples (``batch["w"]`` is 0 on padding). Algorithms add their terms here (FedProx, FedDyn, MOON)."""
        logits = self.forward(params, batch)
        return weighted_mean(F.cross_entropy(logits, batch["y"], reduction="none"), batch["w"])

    def correct_grad(self, grads: Params, sstate: Tree, cstate: Tree, ctx: RoundContext) -> Params:
        """Hook for gradient corrections (SCAFFOLD); identity here."""
        return grads

    def loss_and_grad(self, params: Params, batch: dict[str, torch.Tensor], sstate: Tree, cstate: Tree,
                      ctx: RoundContext) -> tuple[Params, torch.Tensor]:
        """Gradients of :meth:`loss` w.r.t. ``params`` and the loss. Under ``vmap`` (the
        vectorized path, ``ctx.vectorized``) through ``torch.func.grad_and_value``; otherwise
        with plain autograd, which computes the same numbers without functorch's per-op
        wrapping (about 10 % of a small CNN's step on a CPU)."""
        args = (batch, sstate, cstate, ctx)
        if ctx.vectorized:
            return grad_and_value(self.loss)(params, *args)
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        with torch.enable_grad():
            loss = self.loss(leaves, *args)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
        out = {k: g if g is not None else torch.zeros_like(leaves[k])
               for k, g in zip(leaves, grads, strict=True)}
        return out, loss.detach()

    def client_step(self, sstate: Tree, batch: dict[str, torch.Tensor], cstate: Tree,
                    ctx: RoundContext) -> Tree:
        """One local SGD step: the gradient of :meth:`loss` (:meth:`loss_and_grad`), corrected by
        :meth:`correct_grad`, applied by :func:`sgd_update` with the round's hyperparameters."""
        grads, loss = self.loss_and_grad(sstate["params"], batch, sstate, cstate, ctx)
        grads = self.correct_grad(grads, sstate, cstate, ctx)
        h = ctx.hyper
        # the engine's loops own the state (client_init copied the global model): in place there
        params, mom = sgd_update(sstate["params"], sstate["mom"], grads, h["lr"], h["momentum"],
                                 h["weight_decay"], in_place=ctx.owns_state and not ctx.vectorized)
        return {**sstate, "params": params, "mom": mom, "steps": sstate["steps"] + 1,
                "loss_sum": sstate["loss_sum"] + loss.detach()}

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext) -> tuple[Tree, Tree, Tree]:
        """The end of a client's round: its upload (the model update, local model minus global), its state
        for the next round, and its metrics (mean training loss, steps taken)."""
        delta = tmap(torch.sub, sstate["params"], ctx.gparams)
        metrics = {"train_loss": sstate["loss_sum"] / sstate["steps"].clamp_min(1.0),
                   "steps": sstate["steps"]}
        return {"delta": delta}, cstate, metrics

    # ---- the client's release (local DP): its last step, outside vmap ------------------------
    def releases_locally(self) -> bool:
        """Whether clients randomise their upload before it leaves them (local DP). When true,
        every engine path calls :meth:`release` for each client right after ``client_final``."""
        return False

    def release(self, upload: Tree, client: int, ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
        """Client ``client``'s local randomiser applied to its own upload (one client, not stacked),
        and statistics of what it did. Part of the client's computation on every path: the
        sequential loop, a parallel worker, after the vmapped steps of the vectorized path (its
        generators cannot run under ``vmap``), and a Flower client. Its generators are keyed on
        (config, stream, round, client) by :meth:`~fedlib.algorithms.base.Algorithm.noise_seed`, so
        a client draws the same noise whichever path or machine runs it. Identity here."""
        return upload, {}

    def privatize(self, uploads: Tree, clients: list[int],
                  ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
        """:meth:`release` of every row of the stacked ``uploads`` (row ``i`` is client
        ``clients[i]``): what leaves the clients, stacked, and each statistic's mean over them."""
        rows, stats = [], []
        for i, cid in enumerate(clients):
            out, st = self.release(index(uploads, i), cid, ctx)
            rows.append(out)
            stats.append(st)
        return stack(rows), mean_stats(stats)

    def round_metrics(self, server_state: Tree, ctx: RoundContext) -> dict[str, float]:
        """Per-round bookkeeping to record (e.g. the clip norm, sparsity)."""
        return {}

    # ---- privacy ----------------------------------------------------------------------------
    def guarantee(self) -> Guarantee | None:
        """The privacy statement this run makes (None: no privacy mechanism)."""
        return None

    def privacy_details(self) -> dict[str, Any]:
        """What a result records about its calibration besides the guarantee (JSON-able)."""
        return {}

    def privacy_event(self, ctx: RoundContext) -> GaussianEvent | PureEvent | None:
        """What round ``ctx.t`` spent, for the run's accountant (see :mod:`fedlib.privacy.guarantee`)."""
        return None

    def noise_seed(self, stream: int, t: int, client: int | None = None) -> tuple[int, ...]:
        """The integers that key a privacy-noise stream: the whole configuration
        (:meth:`~fedlib.config.Config.noise_key`, which includes the seed), the stream, the round
        and the client. Two runs that differ in any setting (a budget, a clip norm) draw
        independent noise; one config reproduces exactly, across results-version bumps too.

        With ``randomness="secret"`` (a deployment) the first integer is 128 fresh bits of OS
        entropy at every call instead: the draws cannot be regenerated from anything written, and a
        run does not reproduce. (The generators it seeds, PCG64 and Mersenne Twister, are
        statistical, not cryptographic: an adversary who could observe raw noise values would need a
        cryptographic generator too; here only noised sums and messages leave a mechanism.)"""
        if self.config.randomness == "secret":
            parts = (secrets.randbits(128), int(stream), t)
        else:
            parts = (int(self.config.noise_key(), 16), int(stream), t)
        return parts if client is None else (*parts, client)

    def personal_models(self, client_states: Tree) -> Tree | None:
        """Each client's own model (stacked over clients) for personalised algorithms, else None;
        the run reports their personalised accuracy at the last round."""
        return None

    # ---- server -----------------------------------------------------------------------
    def server_update(self, gparams: Params, server_state: Tree, uploads: Tree,
                      weights: torch.Tensor, ctx: RoundContext) -> tuple[Params, Tree]:
        """``w <- w + server_lr * sum_i p_i delta_i`` with ``p_i = n_i / sum_j n_j``."""
        p = weights / weights.sum()
        avg = tmap(lambda d: torch.tensordot(p.to(d.dtype), d, dims=1), uploads["delta"])
        lr = self.config.server_lr
        return tmap(lambda w, d: w + lr * d, gparams, avg), server_state

    def upload_bytes(self, upload: Tree) -> int:
        """Bytes one client sends (dense float32 by default)."""
        return 4 * numel(upload)

    # ---- declared needs ---------------------------------------------------------------
    def uses_dropout(self) -> bool:
        """Whether the engine draws dropout masks for this algorithm's steps."""
        return self.config.dropout > 0

    def describe(self) -> dict[str, Any]:
        """What a result records about the algorithm (its name, and subclasses' settings)."""
        return {"name": self.name}
