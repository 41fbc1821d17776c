"""Shared by the local-DP algorithms: clients send a sparse, randomised version of their update.

A subclass implements :meth:`SparseUpload.encode`, the client-side mechanism on the flattened
updates of the round's clients (one row each). What leaves a client is the ``mask`` of
reported dimensions and the ``values`` there (zero elsewhere), plus, for FDL as published,
its normalisation ``scale``. The server adds the sample-weighted mean of the decoded vectors
(``values * scale``) to the global model, times ``server_lr``; dimensions nobody reported
count as zero (sparse FedAvg).
"""

from __future__ import annotations

import torch

from fedlib.algorithms.base import Algorithm, Params, RoundContext
from fedlib.privacy.noise import generator_for
from fedlib.tree import Tree, flatten_stacked, unflatten_like


class SparseUpload(Algorithm):
    #: Stream number of this mechanism's randomness (distinct per algorithm).
    stream: int = 60

    def __init__(self, config, model):
        super().__init__(config, model)
        self.dims = sum(p.numel() for p in model.parameters())
        self.stats: dict[str, float] = {}

    def encode(self, flat: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """``flat``: ``(m, d)`` updates -> ``{"mask", "values"[, "scale"]}``."""
        raise NotImplementedError

    def privatize(self, uploads: Tree, clients: list[int], ctx: RoundContext) -> Tree:
        flat = flatten_stacked(uploads["delta"]).float()
        g = generator_for(self.config.seed, self.stream, ctx.t)
        out = self.encode(flat, g)
        sent = out["mask"].sum(1).float()
        self.stats = {"sent_frac": float(sent.mean()) / self.dims, **self.stats}
        return out

    def empty_uploads(self, gparams: Params) -> Tree:
        return {"mask": torch.zeros(0, self.dims, dtype=torch.bool), "values": torch.zeros(0, self.dims)}

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
        eps = self.epsilon_per_round()
        out = {**self.stats, "epsilon_round": eps, "epsilon_run": eps * (ctx.t + 1)}
        self.stats = {}
        return out

    def epsilon_per_round(self) -> float:
        """The epsilon-LDP a client actually spends in one round (see fedlib.privacy.local)."""
        raise NotImplementedError
