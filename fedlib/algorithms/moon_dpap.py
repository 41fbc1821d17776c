"""MOON-DPAP (Su, ICDSE 2025): MOON plus five components, each with its own switch.

* cosine-annealed client learning rate, eq. 1 (``cosine_lr``, ``lr`` -> ``lr_min``);
* temperature shrinking and contrastive weight growing, eq. 2-3 (``moon_tau`` -> ``tau_min``,
  ``moon_mu`` -> ``mu_max`` over the first ``schedule_ramp`` of the rounds; always on);
* dropout on the representation (``dropout``);
* magnitude pruning with a linearly growing threshold, eq. 6-7 (``prune``): the server
  computes cumulative masks from the *noised* global model (post-processing, no leak),
  clients upload masked updates, and the upload is counted in a bitmap-sparse encoding;
* client-level differential privacy (``dp``), with one stated neighbouring relation for both
  modes: *replace one client* (the server divides by the number of clients, which is public
  and fixed: every client takes part in every round, as in the paper), so a sum of updates
  clipped to L2 norm ``C`` (``dp_clip``) has sensitivity ``2C``:

  - each client clips its model update to L2 norm ``C``;
  - ``central``: the server adds ``N(0, (2 z_t C)^2)`` to the *sum* of the clipped updates and
    divides by the number of clients (:func:`fedlib.privacy.central.noisy_sum`);
  - ``local``: each client adds ``N(0, (2 z_t C)^2)`` to its own update before it leaves, as the
    paper's wording suggests (:func:`fedlib.privacy.central.noisy_one`, in the client);
  - ``z_t`` is the *analytic* Gaussian multiplier (Balle & Wang 2018) for the round's
    epsilon: the paper's eq. 4 (classic formula) is valid only for epsilon < 1;
  - schedule ``paper``: ``epsilon(t) = epsilon_0 (1 - t/T)`` (eq. 5, ``dp_epsilon_per_round`` is
    epsilon_0) with t = 0..T-1 and the stated floor; schedule ``constant``: one ``z`` calibrated so
    the whole run spends ``dp_epsilon_total``;
  - the noise is floating-point safe (discrete Gaussian on a grid, :mod:`fedlib.privacy.discrete`)
    and keyed on the whole configuration, so runs that differ in any setting draw independent
    noise; the run's accountant composes the T releases by RDP at integer orders, which holds
    for that noise (:mod:`fedlib.privacy.accounting`).

With client-level DP on, the average over clients is unweighted (the sensitivity of a
sample-weighted average would depend on the client sizes).

The paper says only that noise goes "to the gradient update process". The reading above protects
a client's whole data set; ``dp="record"`` is the other reading, *record-level* DP-SGD inside each
client (:mod:`fedlib.privacy.dpsgd`), which protects one training example against add/remove:

  - client i takes ``K_i = ceil(E n_i / B)`` local steps per round, each on a Poisson sample of
    its records with rate ``q_i = B / n_i`` (:func:`fedlib.engine.make_poisson_plan`); per-sample
    gradients of the whole MOON-DPAP loss are clipped to ``dp_clip`` and ``N(0, (sigma C)^2)`` is
    added to their sum, which is divided by ``B``; the client sizes ``n_i`` are public, as in
    Opacus;
  - a record of client i is in ``T K_i`` Poisson-subsampled Gaussian releases; one ``sigma`` for
    every client, calibrated by RDP so that the least protected client's records (the largest
    ``q_i^2 K_i``, in practice the smallest client) spend ``dp_epsilon_total`` over the run
    (schedule ``constant`` only);
  - or (``dp_sigma = "per_client"``, a labelled variant) each client's own ``sigma_i``, calibrated
    to its own ``(q_i, K_i)`` for the same ``dp_epsilon_total``: a record lives in one client only,
    and no other client's mechanism reads it, so a record of client i is protected by client i's
    ``T K_i`` releases alone (parallel composition over disjoint data; the others' updates, and the
    global model they build, are post-processing of those releases). Every client then spends the
    budget, where one sigma over-protects the larger clients (less noise for them, the same
    guarantee). ``sigma_i`` depends on ``n_i``, public here as in the one-sigma reading;
  - everything after the client's steps (the update, pruning, the server's sample-weighted
    average) is post-processing; the noise is floating-point Gaussian (``torch.randn``), the
    idealised mechanism that DP-SGD libraries implement.

``dp="formula"`` is the recipe in circulation (issue 63), run as widely copied implementations run
it, and labelled with what it guarantees (nothing composed):

  - each client trains on its usual minibatches with every per-sample gradient clipped to
    ``C`` (``dp_clip``), averaged over the batch, no noise;
  - after its local steps it adds ``N(0, sigma_t^2)`` to every coordinate of its update, with the
    paper's eq. 4 ``sigma_t = Delta_f sqrt(2 ln(1.25 / delta)) / epsilon_t``, eq. 5's
    ``epsilon_t = epsilon_0 (1 - t / T)`` and ``Delta_f = 2 lr_t C / n_i``;
  - that ``Delta_f`` bounds what one record changes in ONE full-batch gradient step of a client
    with ``n_i`` records; a round here takes ``ceil(n_i / B)`` steps on batches of ``B``, where one
    record moves one step by up to ``2 lr_t C / B`` and every later step through the model, and the
    T rounds are never composed. So the run has no valid (epsilon, delta) guarantee: it records
    none (:meth:`MoonDpap.guarantee`), and the round's nominal epsilon is kept as a diagnostic only;
  - the aggregation stays sample-weighted (no client-level sensitivity is claimed).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fedlib import pruning, schedules
from fedlib.algorithms.base import Params, RoundContext
from fedlib.algorithms.moon import Moon
from fedlib.config import Config
from fedlib.privacy.accounting import calibrate_rdp, classic_gaussian_sigma, gaussian_sigma, rdp_epsilon
from fedlib.privacy.central import ROUNDS_AHEAD, noisy_one, noisy_sum, prefetch_noisy_sum
from fedlib.privacy.clipping import clip_by_l2
from fedlib.privacy.dpsgd import private_grad
from fedlib.privacy.ghost import private_grad_ghost
from fedlib.privacy.guarantee import GaussianEvent, Guarantee, Relation
from fedlib.privacy.noise import StepNoise, generator_for
from fedlib.streams import Stream
from fedlib.tree import Tree

DP_MODES = ("none", "central", "local", "record", "formula")


def formula_sigma(lr: float, clip: float, n: int, epsilon: float, delta: float) -> float:
    """The formula in circulation: the std of the noise each client adds to its update, eq. 4 with
    ``Delta_f = 2 lr C / n`` (what one record changes in one full-batch gradient step of a client
    with ``n`` records, per-sample gradients clipped to ``C``)."""
    return 2.0 * lr * clip / n * classic_gaussian_sigma(epsilon, delta)


def record_schedule(n: int, batch_size: int, epochs: int) -> tuple[float, int]:
    """Record-level DP-SGD at a client of ``n`` records: the Poisson rate ``q`` and the number of
    steps ``K`` per round (``E`` epochs of batch ``B`` in expectation)."""
    return min(1.0, batch_size / n), math.ceil(epochs * n / batch_size)


def record_noise_multiplier(config: Config, sizes: list[int]) -> tuple[float, float, int, list[float]]:
    """Record-level DP-SGD's ``sigma`` (one for all clients) such that no client's records spend
    more than ``dp_epsilon_total`` over the run (RDP at integer orders); also the least protected
    client's ``(q, K)`` and every client's total epsilon at that sigma."""
    c = config
    schedules_ = sorted({record_schedule(n, c.batch_size, c.local_epochs) for n in sizes}, reverse=True)
    q, k = schedules_[0]  # the largest rate: the smallest client, the usual worst case
    for _ in range(len(schedules_)):
        sigma = calibrate_rdp(c.dp_epsilon_total, c.dp_delta, c.rounds * k, q)
        eps = {(qi, ki): rdp_epsilon([sigma] * (c.rounds * ki), c.dp_delta, qi) for qi, ki in schedules_}
        worst = max(eps, key=eps.get)
        if eps[worst] <= eps[(q, k)] * (1 + 1e-9):
            per_client = [eps[record_schedule(n, c.batch_size, c.local_epochs)] for n in sizes]
            return sigma, q, k, per_client
        q, k = worst
    raise RuntimeError("record-level calibration did not settle on a least protected client")


def record_noise_multipliers(config: Config, sizes: list[int]) -> tuple[list[float], list[float]]:
    """Record-level DP-SGD with ``dp_sigma = "per_client"``: each client's own ``sigma_i``, calibrated
    by RDP so that its records spend ``dp_epsilon_total`` over its ``T K_i`` steps at rate ``q_i``;
    also each client's total epsilon at its ``sigma_i`` (at most the budget: the calibration errs on
    the side of more noise). Clients with one schedule share one calibration."""
    c = config
    schedules_ = {n: record_schedule(n, c.batch_size, c.local_epochs) for n in set(sizes)}
    sigma = {qk: calibrate_rdp(c.dp_epsilon_total, c.dp_delta, c.rounds * qk[1], qk[0])
             for qk in set(schedules_.values())}
    eps = {qk: rdp_epsilon([z] * (c.rounds * qk[1]), c.dp_delta, qk[0]) for qk, z in sigma.items()}
    return [sigma[schedules_[n]] for n in sizes], [eps[schedules_[n]] for n in sizes]


def noise_multipliers(config: Config) -> list[float]:
    """``z_t`` for every round t = 0..T-1 (noise std = z_t x sensitivity), client-level modes."""
    c, total = config, config.rounds
    if c.dp in ("none", "record", "formula"):  # formula: eq. 4 on its own Delta_f (formula_sigma)
        return []
    if c.dp_schedule == "constant":
        return [calibrate_rdp(c.dp_epsilon_total, c.dp_delta, total)] * total
    eps0 = c.dp_epsilon_per_round
    return [gaussian_sigma(schedules.epsilon_schedule(t, total, eps0, c.dp_eps_floor), c.dp_delta)
            for t in range(total)]


def total_epsilon(zs: list[float], delta: float) -> float:
    """Epsilon at ``delta`` of the run so far (every client in every round: no sampling), by RDP
    at integer orders, the accounting of the run's discrete Gaussian noise."""
    return rdp_epsilon(zs, delta)


class MoonDpap(Moon):
    """MOON-DPAP: MOON with the paper's schedules (eq. 1-3), dropout, pruning (eq. 6-7) and DP in one
    of the readings this module describes (``dp``: central, local, record, formula)."""
    name = "moon_dpap"
    fields = (*Moon.fields, "cosine_lr", "lr_min", "tau_min", "mu_max", "schedule_ramp", "prune",
              "prune_t_min",
              "prune_t_max", "dp", "dp_epsilon_per_round", "dp_epsilon_total", "dp_schedule", "dp_eps_floor",
              "dp_clip", "dp_delta", "secure_noise", "randomness", "dp_grad", "dp_sigma", "dp_noise_free")

    @classmethod
    def check(cls, config: Config) -> list[str]:
        c, errs = config, super().check(config)
        # pragma: no mutate start (schedule and pruning checks: not privacy code)
        if not c.tau_min > 0:
            errs.append(f"tau_min must be > 0, got {c.tau_min}")
        if c.mu_max < 0:
            errs.append(f"mu_max must be >= 0, got {c.mu_max}")
        if not 0 < c.schedule_ramp <= 1:
            errs.append(f"schedule_ramp must be in (0, 1], got {c.schedule_ramp}")
        if not 0 <= c.lr_min <= c.lr:
            errs.append(f"lr_min must be in [0, lr = {c.lr}], got {c.lr_min}")
        if not 0 <= c.prune_t_min <= c.prune_t_max:
            errs.append("pruning thresholds need 0 <= prune_t_min <= prune_t_max")
        # pragma: no mutate end
        if c.dp_grad not in ("per_sample", "ghost"):
            errs.append(f"dp_grad must be per_sample or ghost, got {c.dp_grad!r}")
        elif c.dp_grad == "ghost" and c.dp not in ("record", "formula"):
            errs.append("dp_grad = ghost is how record-level DP-SGD computes its clipped sum: it needs "
                        "dp = record (or formula)")
        elif c.dp_grad == "ghost" and c.precision == "bfloat16":
            errs.append("dp_grad = ghost needs precision float32 or float64 (its hooks add float "
                        "perturbations to the layers' outputs)")
        if c.dp_sigma == "per_client" and c.dp != "record":
            errs.append("dp_sigma = per_client calibrates record-level DP-SGD's noise per client: it needs "
                        "dp = record")
        if c.dp_noise_free and c.dp != "formula":
            errs.append("dp_noise_free is the formula in circulation's control without noise: it needs "
                        "dp = formula")
        if c.dp not in DP_MODES:
            errs.append(f"dp must be one of {', '.join(DP_MODES)}, got {c.dp!r}")
        elif c.dp != "none":
            if not c.dp_clip > 0:
                errs.append(f"dp_clip must be > 0, got {c.dp_clip}")
            if not 0 < c.dp_delta < 1:
                errs.append(f"dp_delta must be in (0, 1), got {c.dp_delta}")
            if c.dp_schedule not in ("paper", "constant"):
                errs.append(f"dp_schedule must be paper or constant, got {c.dp_schedule!r}")
            budget = "dp_epsilon_total" if c.dp_schedule == "constant" else "dp_epsilon_per_round"
            if not getattr(c, budget) > 0:
                errs.append(f"{budget} must be > 0, got {getattr(c, budget)}")
            if c.dp_eps_floor < 0:
                errs.append(f"dp_eps_floor must be >= 0, got {c.dp_eps_floor}")
            if c.dp == "record" and c.dp_schedule != "constant":
                errs.append("record-level DP (dp = record) spends dp_epsilon_total: it needs "
                            "dp_schedule = constant")
            if c.dp == "formula" and c.dp_schedule != "paper":
                errs.append("the formula in circulation (dp = formula) follows eq. 5: it needs "
                            "dp_schedule = paper")
            if c.client_fraction < 1:
                errs.append("MOON-DPAP's DP assumes every client in every round (client_fraction = 1), as "
                            "in the paper: the number of clients is the public denominator")
        return errs

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        self._z: list[float] | None = None  # the noise schedule, computed on first use (z)
        self.record: dict | None = None  # record-level DP-SGD's calibration (bind_clients)
        # pragma: no mutate start (the tau and mu schedules: not privacy code)
        total = config.rounds
        self.tau_slope = schedules.ramp_slope(config.moon_tau, config.tau_min, total, config.schedule_ramp)
        self.mu_slope = schedules.ramp_slope(config.moon_mu, config.mu_max, total, config.schedule_ramp)
        # pragma: no mutate end

    # ---- record-level DP-SGD ----------------------------------------------------------------
    def bind_clients(self, sizes: list[int]) -> None:
        if self.config.dp != "record":
            return
        c = self.config
        if c.dp_sigma == "per_client":
            sigmas, per_client = record_noise_multipliers(c, sizes)
            worst = max(range(len(sizes)), key=lambda i: (per_client[i], -sizes[i]))
            q, k = record_schedule(sizes[worst], c.batch_size, c.local_epochs)
            self.record = {"sigma": sigmas[worst], "q": q, "steps": k, "per_client_epsilon": per_client,
                           "client_sigma": sigmas}
            return
        sigma, q, k, per_client = record_noise_multiplier(c, sizes)
        self.record = {"sigma": sigma, "q": q, "steps": k, "per_client_epsilon": per_client}

    def client_multipliers(self, clients: list[int]) -> list[float] | None:
        """The noise multiplier promised to each of ``clients`` (record-level DP-SGD with one sigma per
        client), against which each client's recorded release is checked; None: one promise for all
        (:meth:`privacy_event`)."""
        if self.record is None or "client_sigma" not in self.record:
            return None
        return [self.record["client_sigma"][i] for i in clients]

    def poisson_records(self) -> bool:
        return self.config.dp == "record"

    def step_noise(self, t: int, like: Params) -> StepNoise | None:
        if self.config.dp != "record":
            return None
        first = next(iter(like.values()))
        sigmas = self.record.get("client_sigma")  # one sigma per client (dp_sigma = per_client), or None
        stds = None if sigmas is None else tuple(z * self.config.dp_clip for z in sigmas)
        return StepNoise(self.noise_seed(Stream.RECORD_NOISE, t), self.record["sigma"] * self.config.dp_clip,
                         tuple((k, tuple(v.shape)) for k, v in like.items()), first.dtype, first.device,
                         sensitivity=self.config.dp_clip,
                         client_std=stds)

    def loss_and_grad(self, params, batch, sstate, cstate, ctx):
        """MOON's gradient, or under record-level DP-SGD (and the formula in circulation) the step's sum of
        per-sample gradients clipped to ``C`` (per-sample or ghost, ``dp_grad``) with the step's noise, over
        the expected batch size."""
        if self.config.dp not in ("record", "formula"):
            return super().loss_and_grad(params, batch, sstate, cstate, ctx)
        batch = {**batch, **self.frozen_reprs(batch, cstate, ctx)}  # once per batch, not per sample

        def loss(p, b):
            return self.loss(p, b, sstate, cstate, ctx)

        if self.config.dp == "formula":  # per-sample clipping, averaged over the real samples; no noise
            zero = {k: torch.zeros_like(v) for k, v in params.items()}
            grad = private_grad_ghost if self.config.dp_grad == "ghost" else None
            summed, mean_loss = (grad(self.model, loss, params, batch, self.config.dp_clip, 1.0, zero) if grad
                                 else private_grad(loss, params, batch, self.config.dp_clip, 1.0, zero))
            n = batch["w"].sum().clamp_min(1.0)
            return {k: v / n for k, v in summed.items()}, mean_loss

        if self.config.dp_grad == "ghost":  # the same clipped sum without per-sample fc gradients
            return private_grad_ghost(self.model, loss, params, batch, self.config.dp_clip,
                                      float(self.config.batch_size), batch["noise"])
        return private_grad(loss, params, batch, self.config.dp_clip, float(self.config.batch_size),
                            batch["noise"])

    # ---- schedules ----------------------------------------------------------------------
    @property
    def z(self) -> list[float]:
        """``z_t`` of every round (client-level modes; empty otherwise), computed on first use: the
        clients of a central run never need it (the server adds the noise), and a Flower ClientApp,
        a fresh process per message, then does not import the accountant to compute it."""
        if self._z is None:
            self._z = noise_multipliers(self.config)
        return self._z

    def client_hyper(self, t: int) -> dict[str, float]:
        """What a client needs of round ``t``'s schedule: the noise multiplier only where the client adds
        the noise itself (local mode; record-level DP-SGD's is its own calibration)."""
        return self._hyper(t, noise=self.config.dp in ("local", "record"))

    def hyper(self, t: int) -> dict[str, float]:
        """MOON's hyperparameters on MOON-DPAP's schedules: the cosine learning rate (eq. 1), the
        temperature and weight ramps (eq. 2-3), and the round's DP noise level."""
        return self._hyper(t, noise=True)

    def _hyper(self, t: int, noise: bool) -> dict[str, float]:
        c, total = self.config, self.config.rounds
        # pragma: no mutate start (the learning-rate, tau and mu schedules: not privacy code)
        lr = schedules.cosine_lr(t, total, c.lr, c.lr_min) if c.cosine_lr else c.lr
        schedule = {"lr": lr, "tau": schedules.linear_down(t, c.moon_tau, c.tau_min, self.tau_slope),
                    "mu": schedules.linear_up(t, c.moon_mu, c.mu_max, self.mu_slope)}
        # pragma: no mutate end
        if self.config.dp == "formula":  # eq. 5's nominal epsilon of the round (eq. 4 takes it)
            schedule["epsilon_nominal"] = schedules.epsilon_schedule(t, total, c.dp_epsilon_per_round,
                                                                     c.dp_eps_floor)
        if not noise:
            return {**super().hyper(t), **schedule}
        return {**super().hyper(t), **schedule,
                "noise_multiplier": self.z[t] if self.z else (self.record or {}).get("sigma", 0.0)}

    # ---- pruning masks live in the server state and are broadcast -----------------------
    # pragma: no mutate start (pruning masks: public post-processing of the noised model)
    def init_server_state(self, gparams: Params) -> Tree:
        """The pruning masks (all ones at the start) when pruning is on; no other server state."""
        if not self.config.prune:
            return {}
        return {"masks": {k: torch.ones_like(v) for k, v in gparams.items()}}

    def broadcast(self, server_state: Tree) -> Tree:
        return {"masks": server_state["masks"]} if "masks" in server_state else {}
    # pragma: no mutate end

    # ---- the formula in circulation counts the samples its client trained on (its n_i) ------
    def client_init(self, cstate: Tree, ctx: RoundContext) -> Tree:
        """MOON's working state; under the formula in circulation also the count of samples trained on."""
        s = super().client_init(cstate, ctx)
        return {**s, "samples": s["steps"]} if self.config.dp == "formula" else s

    def client_step(self, sstate: Tree, batch, cstate: Tree, ctx: RoundContext) -> Tree:
        """MOON's step; under the formula in circulation it also counts the samples trained on
        (its ``n_i``)."""
        s = super().client_step(sstate, batch, cstate, ctx)
        if self.config.dp != "formula":
            return s
        return {**s, "samples": sstate["samples"] + batch["w"].sum().to(sstate["samples"].dtype)}

    # ---- client: mask, then clip --------------------------------------------------------
    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """MOON's upload with the pruning mask applied, clipped to ``C`` under client-level DP; under the
        formula in circulation with the client's sample count."""
        upload, new_cstate, metrics = super().client_final(sstate, cstate, ctx)
        delta = upload["delta"]
        if "masks" in ctx.shared:
            delta = pruning.apply_masks(delta, ctx.shared["masks"])
        if self.config.dp in ("central", "local"):
            delta, norm = clip_by_l2(delta, self.config.dp_clip)
            metrics["update_norm"] = norm
        if self.config.dp == "formula":  # n_i for the release: E n_i samples were trained on
            n = sstate["samples"] / self.config.local_epochs
            return {"delta": delta, "samples": n}, new_cstate, metrics
        return {"delta": delta}, new_cstate, metrics

    def releases_locally(self) -> bool:
        return self.config.dp in ("local", "formula")

    def release(self, upload: Tree, client: int, ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
        """Local mode: the client adds N(0, (2 z_t C)^2) to its clipped update (on the kept
        coordinates when pruning; the mask is public) before anything leaves it. The formula in
        circulation: N(0, sigma_t^2) on every coordinate, :func:`formula_sigma` (float noise, as the
        implementations that use it draw it; kept coordinates only when pruning)."""
        if self.config.dp == "formula":
            return self.formula_release(upload, client, ctx)
        if self.config.dp != "local":
            return upload, {}
        c = self.config
        seed = self.noise_seed(Stream.LOCAL_NOISE, ctx.t, client)
        one = {k: v[None] for k, v in upload["delta"].items()}
        noised = noisy_one(one, c.dp_clip, ctx.hyper["noise_multiplier"], seed, c.secure_noise,
                           ctx.shared.get("masks"))
        return {"delta": noised}, {}

    def formula_release(self, upload: Tree, client: int, ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
        """The formula in circulation's release: Gaussian noise of eq. 4 with ``Delta_f = 2 lr C / n_i``
        (:func:`formula_sigma`) on every kept coordinate of the client's update, or none under its
        noise-off control (``dp_noise_free``). No valid guarantee either way."""
        c = self.config
        n = round(float(upload["samples"]))
        sigma = formula_sigma(ctx.hyper["lr"], c.dp_clip, n, ctx.hyper["epsilon_nominal"], c.dp_delta)
        if c.dp_noise_free:  # the control: the same clipped update, nothing added
            return upload, {"formula_sigma": 0.0}
        device = next(iter(upload["delta"].values())).device
        g = generator_for(*self.noise_seed(Stream.FORMULA_NOISE, ctx.t, client), device=device)
        masks = ctx.shared.get("masks")
        out = {}
        for k, v in upload["delta"].items():
            noise = sigma * torch.randn(v.shape, generator=g, dtype=torch.float64, device=g.device)
            noise = noise.to(v.device, v.dtype)
            out[k] = v + (noise * masks[k] if masks is not None else noise)
        return {"delta": out}, {"formula_sigma": sigma}

    # ---- server ---------------------------------------------------------------------------
    def prefetch_server_noise(self, ctx):
        """Central DP: the exact discrete Gaussian of this round's noisy sum and of the next
        :data:`~fedlib.privacy.central.ROUNDS_AHEAD` - 1 rounds' (the run's last at most), drawn
        while the clients train; each with the key, sigma and sizes of its round's
        :meth:`server_update` call (the noise multiplier of a round is fixed by the config: the
        schedule of :meth:`hyper`; the sizes are the model's in every round). Rounds already
        being drawn are not drawn again."""
        c = self.config
        if c.dp == "central" and c.secure_noise and c.randomness != "secret":
            for t in range(ctx.t, min(ctx.t + ROUNDS_AHEAD, c.rounds)):
                at = dataclasses.replace(ctx, t=t, hyper=self.hyper(t))  # what noise depends on, at t
                prefetch_noisy_sum(ctx.gparams, c.dp_clip, at.hyper["noise_multiplier"], Relation.REPLACE_ONE,
                                   self.central_noise_seed(at))

    def central_noise_seed(self, ctx) -> tuple[int, ...]:
        """The key of round ``ctx.t``'s central noise (the server step's, and its draw ahead)."""
        return self.noise_seed(Stream.CENTRAL_NOISE, ctx.t)

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        c = self.config
        if c.dp in ("none", "record", "formula"):  # record: the uploads are already private
            new, _ = super().server_update(gparams, server_state, uploads, weights, ctx)
        else:
            if c.dp == "central":
                total = noisy_sum(uploads["delta"], c.dp_clip, ctx.hyper["noise_multiplier"],
                                  Relation.REPLACE_ONE, self.central_noise_seed(ctx),
                                  c.secure_noise, server_state.get("masks"))
            else:
                total = {k: d.sum(0) for k, d in uploads["delta"].items()}
            m = c.clients  # public and fixed: every client takes part in every round
            new = {k: w + c.server_lr * total[k] / m for k, w in gparams.items()}
        if "masks" not in server_state:
            return new, server_state
        # pragma: no mutate start (pruning the released model: post-processing)
        threshold = schedules.pruning_threshold(ctx.t + 1, c.rounds, c.prune_t_min, c.prune_t_max)
        masks = pruning.update_masks(new, server_state["masks"], threshold)
        return pruning.apply_masks(new, masks), {"masks": masks}
        # pragma: no mutate end

    # ---- privacy ----------------------------------------------------------------------------
    def guarantee(self) -> Guarantee | None:
        if self.config.dp in ("none", "formula"):  # formula: no valid guarantee (module docstring)
            return None
        if self.config.dp == "record":
            return Guarantee("record", Relation.ADD_REMOVE, "local", self.config.dp_delta,
                             "DP-SGD in each client: Poisson-sampled records, per-sample gradients "
                             "clipped to C, Gaussian noise sigma C on each step's sum")
        where = "trusted server adds noise to the sum" if self.config.dp == "central" \
            else "each client adds noise to its update"
        return Guarantee("client", Relation.REPLACE_ONE, self.config.dp, self.config.dp_delta,
                         f"Gaussian, {where}; sensitivity 2C")

    def privacy_details(self) -> dict:
        if self.record is None:
            return {}
        eps = self.record["per_client_epsilon"]
        out = {"noise_multiplier": self.record["sigma"], "sampling_rate": self.record["q"],
               "steps_per_round": self.record["steps"],
               "accounted": "the least protected client (largest sampling rate)",
               "per_client_epsilon": [round(e, 6) for e in eps]}
        if "client_sigma" in self.record:  # every client calibrated to the budget: the accountant follows
            out["accounted"] = "the least protected client (each client's own sigma)"  # the largest epsilon
            out["per_client_noise_multiplier"] = [round(z, 6) for z in self.record["client_sigma"]]
        return out

    def privacy_event(self, ctx: RoundContext) -> GaussianEvent | None:
        """Client-level: one Gaussian release per round. Record-level: the least protected
        client's ``K`` Poisson-sampled steps (with one sigma per client, the client whose calibration
        spends the most; every client's own release is checked against its own sigma,
        :meth:`client_multipliers`)."""
        if self.record is not None:
            return GaussianEvent(self.record["sigma"], self.record["q"], self.record["steps"])
        return GaussianEvent(self.z[ctx.t]) if self.z else None

    # ---- bookkeeping ------------------------------------------------------------------------
    # pragma: no mutate start (bookkeeping: bytes sent and the round's schedule values)
    def upload_bytes(self, upload: Tree) -> int:
        if self.config.prune:
            masks = {k: (v != 0).float() for k, v in upload["delta"].items()}
            return pruning.sparse_bytes(masks)
        return super().upload_bytes(upload)

    def round_metrics(self, server_state: Tree, ctx: RoundContext) -> dict[str, float]:
        h = ctx.hyper
        out = {"lr": h["lr"], "tau": h["tau"], "mu": h["mu"]}
        if "masks" in server_state:
            out["sparsity"] = pruning.sparsity(server_state["masks"], ctx.gparams)
        if self.z:
            out["noise_multiplier"] = self.z[ctx.t]
        if self.record is not None:
            out["noise_multiplier"] = self.record["sigma"]
        if self.config.dp == "formula":
            out["epsilon_nominal"] = h["epsilon_nominal"]
        return out
    # pragma: no mutate end
