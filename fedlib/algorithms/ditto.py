"""Ditto, fair and robust personalisation (Li, Hu, Beirami, Smith, ICML 2021, Alg. 1).

Each client keeps a personal model ``v_i``. In a round it (a) trains the global model as
FedAvg does and uploads the update, and (b) trains ``v_i`` on the same minibatches to
minimise ``F_i(v) + lambda/2 ||v - w^t||^2``. The server step is FedAvg's.

Reported beside the global model's accuracy: the *personalised* accuracy, the mean over
clients of ``v_i``'s accuracy on the test set re-weighted to client ``i``'s label
distribution (we have no per-client test split; per-class accuracy times the client's
class proportions estimates accuracy on its own distribution). Computed at the last round.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad

from fedlib.algorithms.base import Algorithm, Params, RoundContext, sgd_update, weighted_mean
from fedlib.tree import Tree, sq_norm, tmap


class Ditto(Algorithm):
    name = "ditto"

    def init_client_state(self, gparams: Params) -> Tree:
        return {"v": tmap(torch.clone, gparams)}

    def client_init(self, cstate: Tree, ctx: RoundContext) -> Tree:
        s = super().client_init(cstate, ctx)
        return {**s, "v": tmap(torch.clone, cstate["v"]), "vmom": tmap(torch.zeros_like, cstate["v"])}

    def personal_loss(self, v: Params, batch, ctx: RoundContext):
        logits = self.forward(v, batch)
        ce = weighted_mean(F.cross_entropy(logits, batch["y"], reduction="none"), batch["w"])
        return ce + 0.5 * self.config.ditto_lambda * sq_norm(tmap(torch.sub, v, ctx.gparams))

    def client_step(self, sstate: Tree, batch, cstate: Tree, ctx: RoundContext) -> Tree:
        s = super().client_step(sstate, batch, cstate, ctx)
        h = ctx.hyper
        g = grad(self.personal_loss)(sstate["v"], batch, ctx)
        v, vmom = sgd_update(sstate["v"], sstate["vmom"], g, h["lr"], h["momentum"], h["weight_decay"])
        return {**s, "v": v, "vmom": vmom}

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        upload, _, metrics = super().client_final(sstate, cstate, ctx)
        return upload, {"v": sstate["v"]}, metrics

    @torch.no_grad()
    def extra_metrics(self, experiment, final: bool) -> dict[str, float]:
        if not final:  # N evaluations per call: only at the end of the run
            return {}
        x, y = experiment.data.x_test, experiment.data.y_test
        k = experiment.data.num_classes
        class_count = torch.bincount(y, minlength=k).clamp_min(1).float()
        ytr = experiment.data.y_train
        accs = []
        for i, part in enumerate(experiment.parts):
            v = tmap(lambda t, i=i: t[i], experiment.client_states["v"])
            pred = torch.cat([functional_call(self.model, v, (x[j:j + 2000],)).argmax(1)
                              for j in range(0, len(y), 2000)])
            per_class = torch.bincount(y[pred == y], minlength=k).float() / class_count
            p = torch.bincount(ytr[torch.as_tensor(part, device=ytr.device)], minlength=k).float()
            accs.append(float((per_class * p / p.sum()).sum()))
        return {"personal_acc": sum(accs) / len(accs)}
