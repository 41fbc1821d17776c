"""DP-FedAvg with client-level DP (McMahan, Ramage, Talwar, Zhang, ICLR 2018, Alg. 1) and
adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy, NeurIPS 2021, Alg. 1).

Round t:

* every client joins independently with probability ``q = client_fraction`` (Poisson
  sampling, which the accountant assumes; a round may have no client);
* each sampled client runs local SGD and clips its update to L2 norm ``C``;
* the server adds ``N(0, (z C)^2)`` to the *sum* and divides by the *expected* number of
  clients ``qN`` (a fixed denominator, so the sensitivity stays ``C``), then takes a server
  step: ``w <- w + eta_s (sum_i clip(Delta_i) + noise) / (qN)``.

Adaptive clipping replaces the fixed ``C`` by a private estimate of the ``gamma``-quantile
of the update norms: each client also reports ``b_i = 1[||Delta_i|| <= C]``; the server
forms ``b = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / (qN) + 1/2`` (sensitivity 1/2 after the
shift) and sets ``C <- C exp(-eta_C (b - gamma))`` for the next round. The two Gaussian
queries share the budget: the update noise uses ``z_Delta = (z^-2 - (2 sigma_b)^-2)^-1/2``
so the pair is exactly as private as one Gaussian query with multiplier ``z``.

Accounting: ``T`` Poisson-sampled Gaussian mechanisms with rate ``q`` and multiplier ``z``
(dp-accounting's RDP accountant per round; PLD for the final total).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.config import Config
from fedlib.privacy.accounting import epsilon_of_gaussian_rounds
from fedlib.privacy.clipping import clip_by_l2
from fedlib.privacy.noise import gaussian_noise_like, generator_for
from fedlib.tree import Tree, tmap


class DpFedAvg(Algorithm):
    name = "dp_fedavg"

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        c = config
        self.q = c.client_fraction
        self.expected = self.q * c.clients
        self.sigma_b = c.clip_count_std or self.expected / 20
        z = c.dp_noise_multiplier
        if c.adaptive_clip and z > 0:
            self.z_delta = (z ** -2 - (2 * self.sigma_b) ** -2) ** -0.5
        else:
            self.z_delta = z

    def sample_clients(self, t: int) -> list[int]:
        """Poisson sampling: each client independently with probability q."""
        if self.q >= 1:
            return list(range(self.config.clients))
        rng = np.random.default_rng([self.config.seed, 43, t])
        return np.flatnonzero(rng.random(self.config.clients) < self.q).tolist()

    def init_server_state(self, gparams: Params) -> Tree:
        device = next(iter(gparams.values())).device
        return {"clip": torch.tensor(float(self.config.dp_clip), dtype=torch.float64, device=device)}

    def broadcast(self, server_state: Tree) -> Tree:
        return {"clip": float(server_state["clip"])}

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        upload, new_cstate, metrics = super().client_final(sstate, cstate, ctx)
        clipped, norm = clip_by_l2(upload["delta"], ctx.shared["clip"])
        metrics["update_norm"] = norm
        return {"delta": clipped, "unclipped": (norm <= ctx.shared["clip"]).float()}, new_cstate, metrics

    def empty_uploads(self, gparams: Params) -> Tree:
        return {**super().empty_uploads(gparams), "unclipped": torch.zeros(0)}

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        c = self.config
        clip = ctx.shared["clip"]
        g = generator_for(c.seed, 47, ctx.t)
        total = tmap(lambda d: d.sum(0), uploads["delta"])
        noise = gaussian_noise_like(total, self.z_delta * clip, g)
        new = tmap(lambda w, s, n: w + c.server_lr * (s + n) / self.expected, gparams, total, noise)
        if not c.adaptive_clip:
            return new, server_state
        count_noise = float(torch.randn((), generator=g)) * self.sigma_b
        b = (float((uploads["unclipped"] - 0.5).sum()) + count_noise) / self.expected + 0.5
        b = min(1.0, max(0.0, b))
        new_clip = server_state["clip"] * math.exp(-c.clip_lr * (b - c.clip_quantile))
        return new, {"clip": new_clip}

    def round_metrics(self, server_state: Tree, ctx: RoundContext) -> dict[str, float]:
        c = self.config
        out = {"clip": ctx.shared["clip"], "next_clip": float(server_state["clip"])}
        if c.dp_noise_multiplier > 0:
            zs = [c.dp_noise_multiplier] * (ctx.t + 1)
            out["epsilon_spent"] = epsilon_of_gaussian_rounds(zs, c.dp_delta, q=self.q, accountant="rdp")
            if ctx.t + 1 == c.rounds:
                out["epsilon_pld"] = epsilon_of_gaussian_rounds(zs, c.dp_delta, q=self.q, accountant="pld")
        return out
