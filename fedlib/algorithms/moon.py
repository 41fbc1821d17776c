"""MOON, model-contrastive federated learning (Li, He, Song, CVPR 2021, eq. 3-4).

The local loss adds to cross-entropy ``mu * l_con`` with

``l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )``,

``sim`` the cosine similarity, ``z`` the local model's projected representation, ``z_glob``
the (frozen) global model's (positive pair) and ``z_prev`` the client's own previous local
model's (negative pair). The previous model is client state, initialised to the initial
global model (as in the official code). A projection head (``projection_dim``) maps the
128-d representation before the contrast. The server step is FedAvg's. ``mu = 0`` is
FedAvg. ``tau`` and ``mu`` come from ``hyper`` so MOON-DPAP can schedule them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedlib.algorithms.base import Algorithm, Params, RoundContext, weighted_mean
from fedlib.tree import Tree, tmap


class Moon(Algorithm):
    """MOON: cross-entropy plus ``mu`` times the model-contrastive loss (eq. 3-4) on the projected
    representations of the local, global and previous local models."""
    name = "moon"
    uses_projection_head = True
    fields = ("moon_mu", "moon_tau", "projection_dim")

    @classmethod
    def check(cls, config) -> list[str]:
        errs = []
        if config.moon_mu < 0:
            errs.append(f"moon_mu must be >= 0, got {config.moon_mu}")
        if not config.moon_tau > 0:
            errs.append(f"moon_tau must be > 0, got {config.moon_tau}")
        if config.projection_dim < 0:
            errs.append(f"projection_dim must be >= 0, got {config.projection_dim}")
        return errs

    def hyper(self, t: int) -> dict[str, float]:
        """FedAvg's hyperparameters plus MOON's temperature ``tau`` and weight ``mu``."""
        return {**super().hyper(t), "mu": self.config.moon_mu, "tau": self.config.moon_tau}

    def init_client_state(self, gparams: Params) -> Tree:
        return {"prev": tmap(torch.clone, gparams)}

    def frozen_reprs(self, batch, cstate: Tree, ctx: RoundContext) -> dict[str, torch.Tensor]:
        """The representations of the batch under the frozen global and previous models (the
        positive and negative pairs), without dropout and without gradient."""
        plain = {"x": batch["x"]}
        return {"z_glob": self.forward(ctx.gparams, plain, return_repr=True)[1].detach(),
                "z_prev": self.forward(cstate["prev"], plain, return_repr=True)[1].detach()}

    def loss(self, params: Params, batch, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """Eq. 3-4 on ``batch``; the frozen representations are computed here unless the batch
        carries them (DP-SGD computes them once per batch, not once per sample)."""
        logits, z = self.forward(params, batch, return_repr=True)
        ce = F.cross_entropy(logits, batch["y"], reduction="none")
        frozen = batch if "z_glob" in batch else self.frozen_reprs(batch, cstate, ctx)
        z_glob, z_prev = frozen["z_glob"], frozen["z_prev"]
        tau = ctx.hyper["tau"]
        pos = F.cosine_similarity(z, z_glob, dim=-1) / tau
        neg = F.cosine_similarity(z, z_prev, dim=-1) / tau
        con = torch.logsumexp(torch.stack([pos, neg], dim=-1), dim=-1) - pos
        return weighted_mean(ce + ctx.hyper["mu"] * con, batch["w"])

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """The model update, and the client's local model kept as its *previous* model for the next
        round's negative pair."""
        upload, _, metrics = super().client_final(sstate, cstate, ctx)
        return upload, {"prev": sstate["params"]}, metrics
