"""FedDyn (Acar, Zhao, Navarro, Mattina, Whatmough, Saligrama, ICLR 2021, Alg. 1).

Client ``i`` minimises the dynamically regularised loss
``L_i(w) - <g_i, w> + alpha/2 ||w - w^{t-1}||^2`` and then updates its state
``g_i <- g_i - alpha (w_i^t - w^{t-1})``. The server keeps
``h <- h - (alpha/N) sum_{i in S} (w_i^t - w^{t-1})`` and sets
``w^t = mean_{i in S} w_i^t - h / alpha`` (an unweighted mean, as in the paper).
The quadratic term uses the squared norm (PFLlib's non-squared norm is a known deviation).
"""

from __future__ import annotations

import torch

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.tree import Tree, sq_norm, tmap


class FedDyn(Algorithm):
    """FedDyn: the dynamically regularised client loss and the server's correction ``h`` (Alg. 1)."""
    name = "feddyn"
    fields = ("feddyn_alpha",)

    @classmethod
    def check(cls, config) -> list[str]:
        a = config.feddyn_alpha
        return [] if a > 0 else [f"feddyn_alpha must be > 0 (the server divides by it), got {a}"]

    def init_server_state(self, gparams: Params) -> Tree:
        """The server's correction ``h``, zero at the start."""
        return {"h": tmap(torch.zeros_like, gparams)}

    def init_client_state(self, gparams: Params) -> Tree:
        return {"g": tmap(torch.zeros_like, gparams)}

    def loss(self, params: Params, batch, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """Cross-entropy minus ``<g_i, w>`` plus ``alpha/2 ||w - w^{t-1}||^2``, the client's state ``g_i``
        the linear term (FedDyn's client objective)."""
        a = self.config.feddyn_alpha
        linear = sum((g * w).sum() for g, w in zip(cstate["g"].values(), params.values(), strict=True))
        quad = sq_norm(tmap(lambda w, g: w - g, params, ctx.gparams))
        return super().loss(params, batch, sstate, cstate, ctx) - linear + 0.5 * a * quad

    def client_final(self, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """The model update and the client's new linear term ``g_i <- g_i - alpha (w_i^t - w^{t-1})``."""
        upload, _, metrics = super().client_final(sstate, cstate, ctx)
        a = self.config.feddyn_alpha
        g_new = tmap(lambda g, d: g - a * d, cstate["g"], upload["delta"])
        return upload, {"g": g_new}, metrics

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        a, n = self.config.feddyn_alpha, self.config.clients
        h = tmap(lambda h, d: h - a / n * d.sum(0), server_state["h"], uploads["delta"])
        new = tmap(lambda w, d, h_: w + d.mean(0) - h_ / a, gparams, uploads["delta"], h)
        return new, {"h": h}
