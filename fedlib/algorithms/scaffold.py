"""SCAFFOLD, option II (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, Alg. 1).

Control variates correct client drift:

* local step: ``y <- y - eta_l (g(y) + c - c_i)`` (the correction is added to the gradient,
  before momentum and weight decay);
* after its ``K_i`` steps: ``c_i+ = c_i - c + (x - y_i) / (K_i eta_l)`` (option II), with
  each client's *own* step count ``K_i`` (clients of unequal size run unequal numbers of
  steps, which a shared K would get wrong);
* server: ``x <- x + eta_g * avg_i(y_i - x)`` (sample-weighted, as the other methods here)
  and ``c <- c + (1/N) sum_{i in S} (c_i+ - c_i)``.

Control variates start at zero (NIID-Bench starts them from a random network, which only
cancels under full participation). With zero variates round one equals FedAvg.
"""

from __future__ import annotations

import torch

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.tree import Tree, tmap


class Scaffold(Algorithm):
    """SCAFFOLD (option II): local steps corrected by control variates ``c - c_i``; the server keeps ``c``."""
    name = "scaffold"

    def init_server_state(self, gparams: Params) -> Tree:
        """The server's control variate ``c``, zero at the start."""
        return {"c": tmap(torch.zeros_like, gparams)}

    def init_client_state(self, gparams: Params) -> Tree:
        return {"c_i": tmap(torch.zeros_like, gparams)}

    def broadcast(self, server_state: Tree) -> Tree:
        return {"c": server_state["c"]}

    def correct_grad(self, grads: Params, sstate: Tree, cstate: Tree, ctx: RoundContext) -> Params:
        return tmap(lambda g, c, ci: g + c - ci, grads, ctx.shared["c"], cstate["c_i"])

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """The model update and the change of the client's control variate, option II of Alg. 1:
        ``c_i+ = c_i - c + (x - y_i) / (K_i eta_l)`` with the client's own step count ``K_i``."""
        upload, _, metrics = super().client_final(sstate, cstate, ctx)
        k_lr = sstate["steps"].clamp_min(1.0) * ctx.hyper["lr"]
        c_new = tmap(lambda ci, c, d: ci - c - d / k_lr, cstate["c_i"], ctx.shared["c"], upload["delta"])
        upload["delta_c"] = tmap(torch.sub, c_new, cstate["c_i"])
        return upload, {"c_i": c_new}, metrics

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        new_params, _ = super().server_update(gparams, server_state, {"delta": uploads["delta"]},
                                              weights, ctx)
        n = self.config.clients
        c = tmap(lambda c, dc: c + dc.sum(0) / n, server_state["c"], uploads["delta_c"])
        return new_params, {"c": c}
