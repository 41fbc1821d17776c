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

Neighbouring relation: add/remove one client, with the *fixed* denominator ``qN`` (so the
number of clients in a round is never divided out), sensitivity ``C``.

Accounting: ``T`` Poisson-sampled Gaussian mechanisms with rate ``q`` and multiplier ``z``, by
the run's accountant (RDP at integer orders, which holds for the floating-point-safe discrete
Gaussian noise that :mod:`fedlib.privacy.central` adds; noise keyed on the whole configuration).
"""

from __future__ import annotations

import numpy as np
import torch

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.config import Config
from fedlib.privacy.central import AdaptiveClipping, noisy_sum
from fedlib.privacy.clipping import clip_by_l2
from fedlib.privacy.discrete import rng_for
from fedlib.privacy.guarantee import GaussianEvent, Guarantee, Relation
from fedlib.streams import Stream
from fedlib.tree import Tree


def count_std(config: Config) -> float:
    """sigma_b, the noise on adaptive clipping's count: as set, or Andrew et al.'s default qN / 20."""
    return config.clip_count_std or config.client_fraction * config.clients / 20


class DpFedAvg(Algorithm):
    """DP-FedAvg with client-level DP, fixed or adaptive clipping (McMahan et al. 2018; Andrew et
    al. 2021)."""
    name = "dp_fedavg"
    fields = ("dp_noise_multiplier", "adaptive_clip", "clip_quantile", "clip_lr", "clip_count_std", "dp_clip",
              "dp_delta", "secure_noise", "randomness")

    @classmethod
    def check(cls, config: Config) -> list[str]:
        c, errs = config, []
        if not c.dp_clip > 0 or not 0 < c.dp_delta < 1 or c.dp_noise_multiplier < 0:
            errs.append("DP-FedAvg needs dp_clip > 0, 0 < dp_delta < 1, dp_noise_multiplier >= 0")
        if not 0 < c.clip_quantile < 1 or not c.clip_lr > 0 or c.clip_count_std < 0:
            errs.append("adaptive clipping needs 0 < clip_quantile < 1, clip_lr > 0, clip_count_std >= 0")
        z, sigma_b = c.dp_noise_multiplier, count_std(c)
        if c.adaptive_clip and z > 0 and not z < 2 * sigma_b:
            errs.append(f"adaptive clipping needs dp_noise_multiplier < 2 clip_count_std = {2 * sigma_b:.3g} "
                        "(Andrew et al. 2021, Thm 1); raise clip_count_std")
        return errs

    def __init__(self, config: Config, model):
        super().__init__(config, model)
        c = config
        self.q = c.client_fraction
        self.expected = self.q * c.clients
        self.sigma_b = count_std(c)
        self.adaptive = (AdaptiveClipping(c.clip_quantile, c.clip_lr, self.sigma_b) if c.adaptive_clip
                         else None)
        z = c.dp_noise_multiplier
        self.z_delta = self.adaptive.update_multiplier(z) if self.adaptive else z

    def sample_clients(self, t: int) -> list[int]:
        """Poisson sampling: each client independently with probability q. The sample is part of
        the mechanism (amplification by sampling assumes nobody else knows it), so its generator
        is keyed like the privacy noise, on the whole configuration, not on the seed alone."""
        if self.q >= 1:
            return list(range(self.config.clients))
        rng = rng_for(*self.noise_seed(Stream.POISSON, t))  # the same stream as default_rng(list(key))
        return np.flatnonzero(rng.random(self.config.clients) < self.q).tolist()

    def init_server_state(self, gparams: Params) -> Tree:
        """The clip norm the next round uses (adaptive clipping moves it; fixed clipping keeps ``C``)."""
        device = next(iter(gparams.values())).device
        return {"clip": torch.tensor(float(self.config.dp_clip), dtype=torch.float64, device=device)}

    def broadcast(self, server_state: Tree) -> Tree:
        return {"clip": float(server_state["clip"])}

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """The client's update clipped to the round's ``C``, and whether it was within ``C`` (adaptive
        clipping's count, noised at the server)."""
        upload, new_cstate, metrics = super().client_final(sstate, cstate, ctx)
        clipped, norm = clip_by_l2(upload["delta"], ctx.shared["clip"])
        metrics["update_norm"] = norm
        return {"delta": clipped, "unclipped": (norm <= ctx.shared["clip"]).float()}, new_cstate, metrics

    def empty_uploads(self, gparams: Params) -> Tree:
        device = next(iter(gparams.values())).device
        return {**super().empty_uploads(gparams), "unclipped": torch.zeros(0, device=device)}

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        c = self.config
        clip = ctx.shared["clip"]
        total = noisy_sum(uploads["delta"], clip, self.z_delta, Relation.ADD_REMOVE,
                          self.noise_seed(Stream.DP_FEDAVG_NOISE, ctx.t), c.secure_noise)
        new = {k: w + c.server_lr * total[k] / self.expected for k, w in gparams.items()}
        if self.adaptive is None:
            return new, server_state
        new_clip = self.adaptive.next_clip(clip, uploads["unclipped"], self.expected,
                                           self.noise_seed(Stream.DP_FEDAVG_COUNT, ctx.t), c.secure_noise)
        return new, {"clip": torch.tensor(new_clip, dtype=torch.float64, device=server_state["clip"].device)}

    def round_metrics(self, server_state: Tree, ctx: RoundContext) -> dict[str, float]:
        return {"clip": ctx.shared["clip"], "next_clip": float(server_state["clip"]),
                "noise_norm": self.noise_norm(ctx.shared["clip"], ctx.gparams)}

    def noise_norm(self, clip: float, gparams: Params) -> float:
        """The expected L2 norm of the noise in this round's server step, ``eta_s z_Delta C sqrt(d) / (qN)``
        (Gaussian noise of std ``sigma`` in ``d`` coordinates has norm ``sigma sqrt(d)`` up to a relative
        ``1 / (4d)``; the discrete noise has the same variance). Computed from public quantities, not
        from the draw, so recording it releases nothing; set beside the update norms it shows how much
        of each step is noise (``C`` grows the noise as it grows the signal)."""
        d = sum(p.numel() for p in gparams.values())
        return self.config.server_lr * self.z_delta * clip * d ** 0.5 / self.expected

    def guarantee(self) -> Guarantee | None:
        if self.config.dp_noise_multiplier <= 0:
            return None
        return Guarantee("client", Relation.ADD_REMOVE, "central", self.config.dp_delta,
                         "Gaussian on the sum of clipped updates, fixed denominator qN, "
                         f"Poisson rate q = {self.q:g}"
                         + ("; adaptive clip from a noised count" if self.adaptive else ""))

    def privacy_event(self, ctx: RoundContext) -> GaussianEvent | None:
        z = self.config.dp_noise_multiplier
        return GaussianEvent(z, self.q) if z > 0 else None
