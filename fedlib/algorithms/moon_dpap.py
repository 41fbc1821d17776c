"""MOON-DPAP (Su, ICDSE 2025): MOON plus five components, each with its own switch.

* cosine-annealed client learning rate, eq. 1 (``cosine_lr``, ``lr`` -> ``lr_min``);
* temperature shrinking and contrastive weight growing, eq. 2-3 (``moon_tau`` -> ``tau_min``,
  ``moon_mu`` -> ``mu_max`` over the first ``schedule_ramp`` of the rounds; always on);
* dropout on the representation (``dropout``);
* magnitude pruning with a linearly growing threshold, eq. 6-7 (``prune``): the server
  computes cumulative masks from the *noised* global model (post-processing, no leak),
  clients upload masked updates, and the upload is counted in a bitmap-sparse encoding;
* client-level differential privacy (``dp``):

  - each client clips its model update to L2 norm ``C`` (``dp_clip``);
  - ``central``: the server adds ``N(0, (z_t C)^2)`` to the *sum* of the clipped updates
    and divides by the number of clients (add/remove-one-client adjacency, sensitivity C);
  - ``local``: each client adds ``N(0, (2 z_t C)^2)`` to its own update before it leaves
    (replace-one adjacency, sensitivity 2C), as the paper's wording suggests;
  - ``z_t`` is the *analytic* Gaussian multiplier (Balle & Wang 2018) for the round's
    epsilon: the paper's eq. 4 (classic formula) is valid only for epsilon < 1;
  - schedule ``paper``: ``epsilon(t) = epsilon_0 (1 - t/T)`` (eq. 5) with t = 0..T-1 and
    the stated floor; schedule ``constant``: one ``z`` calibrated so the whole run spends
    ``dp_epsilon`` in total;
  - the whole run's (epsilon, delta) is composed exactly: with every client in every round
    the T Gaussian releases compose to one Gaussian with ``mu = sqrt(sum_t z_t^-2)``
    (Dong, Roth, Su 2022); the tests check it against dp-accounting's PLD and RDP.

With DP on, the average over clients is unweighted (the sensitivity of a sample-weighted
average would depend on the client sizes).
"""

from __future__ import annotations

import torch

from fedlib import pruning, schedules
from fedlib.algorithms.base import Params, RoundContext
from fedlib.algorithms.moon import Moon
from fedlib.config import Config, ConfigError
from fedlib.privacy.accounting import calibrate_constant_noise, gaussian_sigma, gdp_epsilon
from fedlib.privacy.clipping import clip_by_l2
from fedlib.privacy.noise import gaussian_noise_like, generator_for
from fedlib.tree import Tree, tmap


def noise_multipliers(config: Config) -> list[float]:
    """``z_t`` for every round t = 0..T-1 (noise std = z_t x sensitivity)."""
    c, total = config, config.rounds
    if c.dp == "none":
        return []
    if c.dp_schedule == "constant":
        return [calibrate_constant_noise(c.dp_epsilon, c.dp_delta, total)] * total
    return [gaussian_sigma(schedules.epsilon_schedule(t, total, c.dp_epsilon, c.dp_eps_floor), c.dp_delta)
            for t in range(total)]


def total_epsilon(zs: list[float], delta: float) -> float:
    """Exact epsilon at ``delta`` of the run so far (every client in every round: no sampling)."""
    return gdp_epsilon(zs, delta)


class MoonDpap(Moon):
    name = "moon_dpap"

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        if config.dp != "none" and config.client_fraction < 1:
            raise ConfigError("MOON-DPAP's DP accounting assumes every client in every round "
                              "(client_fraction = 1), as in the paper")
        self.z = noise_multipliers(config)
        total = config.rounds
        self.tau_slope = schedules.ramp_slope(config.moon_tau, config.tau_min, total, config.schedule_ramp)
        self.mu_slope = schedules.ramp_slope(config.moon_mu, config.mu_max, total, config.schedule_ramp)

    # ---- schedules ----------------------------------------------------------------------
    def hyper(self, t: int) -> dict[str, float]:
        c, total = self.config, self.config.rounds
        lr = schedules.cosine_lr(t, total, c.lr, c.lr_min) if c.cosine_lr else c.lr
        return {**super().hyper(t), "lr": lr,
                "tau": schedules.linear_down(t, c.moon_tau, c.tau_min, self.tau_slope),
                "mu": schedules.linear_up(t, c.moon_mu, c.mu_max, self.mu_slope),
                "noise_multiplier": self.z[t] if self.z else 0.0}

    # ---- pruning masks live in the server state and are broadcast -----------------------
    def init_server_state(self, gparams: Params) -> Tree:
        if not self.config.prune:
            return {}
        return {"masks": {k: torch.ones_like(v) for k, v in gparams.items()}}

    def broadcast(self, server_state: Tree) -> Tree:
        return {"masks": server_state["masks"]} if "masks" in server_state else {}

    # ---- client: mask, then clip --------------------------------------------------------
    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        upload, new_cstate, metrics = super().client_final(sstate, cstate, ctx)
        delta = upload["delta"]
        if "masks" in ctx.shared:
            delta = pruning.apply_masks(delta, ctx.shared["masks"])
        if self.config.dp != "none":
            delta, norm = clip_by_l2(delta, self.config.dp_clip)
            metrics["update_norm"] = norm
        return {"delta": delta}, new_cstate, metrics

    def privatize(self, uploads: Tree, clients: list[int], ctx: RoundContext) -> Tree:
        """Local mode: each client adds N(0, (2 z_t C)^2) to its clipped update (on the kept
        coordinates when pruning; the mask is public) before anything leaves it."""
        if self.config.dp != "local":
            return uploads
        std = 2 * ctx.hyper["noise_multiplier"] * self.config.dp_clip
        noisy = []
        for row, cid in enumerate(clients):
            g = generator_for(self.config.seed, 41, ctx.t, cid)
            d = tmap(lambda u, row=row: u[row], uploads["delta"])
            noise = gaussian_noise_like(d, std, g)
            if "masks" in ctx.shared:
                noise = pruning.apply_masks(noise, ctx.shared["masks"])
            noisy.append(tmap(torch.add, d, noise))
        return {"delta": tmap(lambda *xs: torch.stack(xs), *noisy)}

    # ---- server ---------------------------------------------------------------------------
    def server_update(self, gparams, server_state, uploads, weights, ctx):
        c = self.config
        if c.dp == "none":
            new, _ = super().server_update(gparams, server_state, uploads, weights, ctx)
        else:
            total = tmap(lambda d: d.sum(0), uploads["delta"])
            if c.dp == "central":
                g = generator_for(c.seed, 37, ctx.t)
                noise = gaussian_noise_like(total, ctx.hyper["noise_multiplier"] * c.dp_clip, g)
                if "masks" in server_state:
                    noise = pruning.apply_masks(noise, server_state["masks"])
                total = tmap(torch.add, total, noise)
            m = uploads["delta"][next(iter(uploads["delta"]))].shape[0]
            new = tmap(lambda w, s: w + c.server_lr * s / m, gparams, total)
        if "masks" not in server_state:
            return new, server_state
        threshold = schedules.pruning_threshold(ctx.t + 1, c.rounds, c.prune_t_min, c.prune_t_max)
        masks = pruning.update_masks(new, server_state["masks"], threshold)
        return pruning.apply_masks(new, masks), {"masks": masks}

    # ---- bookkeeping ------------------------------------------------------------------------
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
            out["epsilon_spent"] = total_epsilon(self.z[:ctx.t + 1], self.config.dp_delta)
        return out
