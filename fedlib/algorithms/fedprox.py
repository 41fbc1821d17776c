"""FedProx (Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020, eq. 2).

Each client minimises ``F_k(w) + mu/2 ||w - w^t||^2``: the proximal term keeps local
models near the global model ``w^t`` under heterogeneous data. ``mu = 0`` is FedAvg.
The server step is FedAvg's.
"""

from __future__ import annotations

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.tree import Tree, sq_norm, tmap


class FedProx(Algorithm):
    """FedProx: FedAvg with the proximal term ``mu/2 ||w - w^t||^2`` in the client's loss (eq. 2)."""
    name = "fedprox"
    fields = ("prox_mu",)

    @classmethod
    def check(cls, config) -> list[str]:
        return [] if config.prox_mu >= 0 else [f"prox_mu must be >= 0, got {config.prox_mu}"]

    def loss(self, params: Params, batch, sstate: Tree, cstate: Tree, ctx: RoundContext):
        """Cross-entropy plus the proximal term ``prox_mu / 2 ||w - w^t||^2`` (FedProx eq. 2)."""
        prox = sq_norm(tmap(lambda w, g: w - g, params, ctx.gparams))
        return super().loss(params, batch, sstate, cstate, ctx) + 0.5 * self.config.prox_mu * prox
