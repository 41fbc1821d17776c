"""Shared by the local-DP algorithms: clients send a sparse, randomised version of their update.

A subclass implements :meth:`SparseUpload.encode`, the client-side mechanism on the flattened
updates of the round's clients (one row each), and returns what leaves the clients (the
``mask`` of reported dimensions and the ``values`` there, zero elsewhere, plus, for FDL as
published, its normalisation ``scale``) with the round's statistics. The server adds the
sample-weighted mean of the decoded vectors (``values * scale``) to the global model, times
``server_lr``; dimensions nobody reported count as zero (sparse FedAvg).

Privacy: each client's message is ``epsilon_per_round()``-LDP (any change of that client's data:
the relation is replace-one); the run's accountant adds the rounds up (basic composition).
"""

from __future__ import annotations

import torch

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.privacy.guarantee import Guarantee, PureEvent, Relation
from fedlib.tree import Tree, flatten_stacked, unflatten_like


class SparseUpload(Algorithm):
    #: Stream of this mechanism's randomness (a :class:`fedlib.streams.Stream`).
    stream: int = 60
    #: How the released values are randomised (for the guarantee's description).
    mechanism: str = ""

    def __init__(self, config, model):
        super().__init__(config, model)
        self.dims = sum(p.numel() for p in model.parameters())

    def encode(self, flat: torch.Tensor, seed: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], dict]:
        """``flat``: ``(m, d)`` updates -> (``{"mask", "values"[, "scale"]}``, statistics); ``seed``
        keys the round's randomness (:meth:`Algorithm.noise_seed`)."""
        raise NotImplementedError

    def privatize(self, uploads: Tree, clients: list[int],
                  ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
        flat = flatten_stacked(uploads["delta"]).float()
        out, stats = self.encode(flat, self.noise_seed(self.stream, ctx.t))
        sent = out["mask"].sum(1).float()
        return out, {"sent_frac": float(sent.mean()) / self.dims, **stats}

    def empty_uploads(self, gparams: Params) -> Tree:
        device = next(iter(gparams.values())).device
        return {"mask": torch.zeros(0, self.dims, dtype=torch.bool, device=device),
                "values": torch.zeros(0, self.dims, device=device)}

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        if uploads["values"].shape[0] == 0:
            return gparams, server_state
        p = (weights / weights.sum()).to(uploads["values"].dtype)
        decoded = uploads["values"] * uploads["scale"][:, None] if "scale" in uploads else uploads["values"]
        avg = unflatten_like(p @ decoded, gparams)
        lr = self.config.server_lr
        return {k: w + lr * avg[k] for k, w in gparams.items()}, server_state

    def upload_bytes(self, upload: Tree) -> int:
        """(index, value) pairs: 4 bytes per index, 4 per float32 value, 4 for a scale."""
        return 8 * int(upload["mask"].sum()) + (4 if "scale" in upload else 0)

    def round_metrics(self, server_state: Tree, ctx: RoundContext) -> dict[str, float]:
        return {"epsilon_round": self.epsilon_per_round()}

    def epsilon_per_round(self) -> float:
        """The epsilon-LDP a client actually spends in one round (see fedlib.privacy.local)."""
        raise NotImplementedError

    def guarantee(self) -> Guarantee:
        return Guarantee("client", Relation.REPLACE_ONE, "local", 0.0, self.mechanism)

    def privacy_event(self, ctx: RoundContext) -> PureEvent:
        return PureEvent(self.epsilon_per_round())
