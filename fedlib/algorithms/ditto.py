"""Ditto, fair and robust personalisation (Li, Hu, Beirami, Smith, ICML 2021, Alg. 1).

Each client keeps a personal model ``v_i``. In a round it (a) trains the global model as
FedAvg does and uploads the update, and (b) trains ``v_i`` on the same minibatches to
minimise ``F_i(v) + lambda/2 ||v - w^t||^2``. The server step is FedAvg's.

The personal models are exposed through :meth:`Ditto.personal_models`; the run reports their
*personalised* accuracy at the last round (:meth:`fedlib.experiment.Experiment.personal_accuracy`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import grad

from fedlib.algorithms.base import Algorithm, Params, RoundContext, sgd_update, weighted_mean
from fedlib.tree import Tree, sq_norm, tmap


class Ditto(Algorithm):
    """Ditto: FedAvg on the global model, and a personal model per client pulled towards it (Alg. 1)."""
    name = "ditto"
    fields = ("ditto_lambda",)

    @classmethod
    def check(cls, config) -> list[str]:
        return [] if config.ditto_lambda >= 0 else [f"ditto_lambda must be >= 0, got {config.ditto_lambda}"]

    def init_client_state(self, gparams: Params) -> Tree:
        return {"v": tmap(torch.clone, gparams)}

    def client_init(self, cstate: Tree, ctx: RoundContext) -> Tree:
        """FedAvg's working state plus a copy of the client's personal model ``v_i`` and its momentum."""
        s = super().client_init(cstate, ctx)
        return {**s, "v": tmap(torch.clone, cstate["v"]), "vmom": tmap(torch.zeros_like, cstate["v"])}

    def personal_loss(self, v: Params, batch, ctx: RoundContext):
        """The personal objective ``F_i(v) + lambda/2 ||v - w^t||^2`` on one minibatch."""
        logits = self.forward(v, batch)
        ce = weighted_mean(F.cross_entropy(logits, batch["y"], reduction="none"), batch["w"])
        return ce + 0.5 * self.config.ditto_lambda * sq_norm(tmap(torch.sub, v, ctx.gparams))

    def client_step(self, sstate: Tree, batch, cstate: Tree, ctx: RoundContext) -> Tree:
        """One step of the global model (FedAvg's) and one of the personal model on the same minibatch."""
        s = super().client_step(sstate, batch, cstate, ctx)
        h = ctx.hyper
        g = grad(self.personal_loss)(sstate["v"], batch, ctx)
        v, vmom = sgd_update(sstate["v"], sstate["vmom"], g, h["lr"], h["momentum"], h["weight_decay"])
        return {**s, "v": v, "vmom": vmom}

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """The global model's update, and the personal model kept as the client's state."""
        upload, _, metrics = super().client_final(sstate, cstate, ctx)
        return upload, {"v": sstate["v"]}, metrics

    def personal_models(self, client_states: Tree) -> Tree:
        """Each client's personal model ``v_i`` (stacked over clients)."""
        return client_states["v"]
