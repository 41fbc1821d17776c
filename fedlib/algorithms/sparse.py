"""Shared by the local-DP algorithms: clients send a sparse, randomised version of their update.

A subclass implements :meth:`SparseUpload.encode`, the client-side mechanism on flattened updates
(one row each; :meth:`SparseUpload.release` gives it one client's row and that client's own
generators, keyed on the config, the round and the client id), and returns what leaves the clients (the
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
from fedlib.privacy.clipping import zero_if_not_finite
from fedlib.privacy.guarantee import Guarantee, PureEvent, Relation
from fedlib.tree import Tree, unflatten_like


class SparseUpload(Algorithm):
    """The local-DP algorithms' common part: a client's update leaves it sparse and randomised
    (:meth:`encode`); the server adds the mean of the decoded reports."""
    #: Stream of this mechanism's randomness (a :class:`fedlib.streams.Stream`).
    stream: int = 60
    #: How the released values are randomised (for the guarantee's description).
    mechanism: str = ""

    def __init__(self, config, model):
        super().__init__(config, model)
        self.dims = sum(p.numel() for p in model.parameters())

    def encode(self, flat: torch.Tensor, seed: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], dict]:
        """``flat``: ``(m, d)`` updates -> (``{"mask", "values"[, "scale"]}``, statistics); ``seed``
        keys the round's randomness (:meth:`~fedlib.algorithms.base.Algorithm.noise_seed`)."""
        raise NotImplementedError

    def releases_locally(self) -> bool:
        return True

    def release(self, upload: Tree, client: int, ctx: RoundContext) -> tuple[Tree, dict[str, float]]:
        """The client's mechanism on its own flattened update, with its own generators (keyed on
        the config, the round and the client id)."""
        delta, _ = zero_if_not_finite(upload["delta"])  # a NaN would fix the mechanism's output
        flat = torch.cat([v.reshape(1, -1) for v in delta.values()], dim=1).float()
        out, stats = self.encode(flat, self.noise_seed(self.stream, ctx.t, client))
        out = {k: v[0] for k, v in out.items()}
        return out, {"sent_frac": float(out["mask"].sum()) / self.dims, **stats}

    # pragma: no mutate start (the server's aggregation of released messages: post-processing)
    def empty_uploads(self, gparams: Params) -> Tree:
        device = next(iter(gparams.values())).device
        return {"mask": torch.zeros(0, self.dims, dtype=torch.bool, device=device),
                "values": torch.zeros(0, self.dims, device=device)}

    def server_update(self, gparams, server_state, uploads, weights, ctx):
        if uploads["values"].shape[0] == 0:
            return gparams, server_state
        p = (weights / weights.sum()).to(uploads["values"].dtype)
        decoded = uploads["values"] * uploads["scale"][:, None] if "scale" in uploads else uploads["values"]
        avg = unflatten_like(self.server_gain() * (p @ decoded), gparams)
        lr = self.config.server_lr
        return {k: w + lr * avg[k] for k, w in gparams.items()}, server_state

    def server_gain(self) -> float:
        """What the server multiplies the mean decoded report by before adding it (1: sparse FedAvg)."""
        return 1.0

    def upload_bytes(self, upload: Tree) -> int:
        """(index, value) pairs: 4 bytes per index, 4 per float32 value, 4 for a scale."""
        return 8 * int(upload["mask"].sum()) + (4 if "scale" in upload else 0)
    # pragma: no mutate end

    def round_metrics(self, server_state: Tree, ctx: RoundContext) -> dict[str, float]:
        return {"epsilon_round": self.epsilon_per_round()}

    def epsilon_per_round(self) -> float:
        """The epsilon-LDP a client actually spends in one round (see fedlib.privacy.local)."""
        raise NotImplementedError

    def guarantee(self) -> Guarantee:
        return Guarantee("client", Relation.REPLACE_ONE, "local", 0.0, self.mechanism)

    def privacy_event(self, ctx: RoundContext) -> PureEvent:
        return PureEvent(self.epsilon_per_round())
