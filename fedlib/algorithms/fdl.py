"""FDL (M. Cheng, "Federated Learning Based on Dimension Selection", 2024, Alg. 1): as
published and corrected.

``as_published``: each client normalises its update into ``[-1, 1]`` by its largest
magnitude ``s`` (sent along, so the server can scale back); keeps the dimensions with
``|v| > r`` (the text's ``w > r`` would drop every negative coordinate; we read it as the
magnitude); draws ``th = floor(fdl_th * kept)`` of them without replacement by the
exponential mechanism with utility ``u = 1 + |v|`` (``Delta_u = 1``), weight
``exp(eps u / 2)`` per draw; adds Laplace noise of scale ``Delta / eps`` with ``Delta = 2``
(the range of a normalised coordinate) to each selected value; sends the (index, value)
pairs. The paper claims ``eps``-LDP (Theorem 2). It is not: the filter and ``th`` depend on
the data (a dimension with ``|v| <= r`` is never sent, so the likelihood ratio is unbounded)
and so does ``s``; and even without them, ``th`` draws and ``th`` values compose to
``2 th eps``.

``corrected`` (our repair): a public clip ``c``: ``v = clip(update, -c, c) / c``; utility
``u = min(1, |v| / r)`` (``r`` shapes the utility, ``Delta_u = 1``); a public number ``k`` of
dimensions drawn by the Gumbel-top-k trick at ``eps_sel / k`` per draw (k draws:
``eps_sel``); Laplace noise of scale ``2k / eps_val`` on the k values (their joint L1
sensitivity is ``2k``): ``eps_sel + eps_val = eps`` per client and round.
"""

from __future__ import annotations

import math

import torch

from fedlib.algorithms.sparse import SparseUpload
from fedlib.privacy.local import (
    exponential_mechanism_log_weights,
    fdl_corrected_epsilon,
    fdl_published_epsilon,
    gumbel_top_k,
    laplace_values,
    mask_of,
)


class Fdl(SparseUpload):
    name = "fdl"
    stream = 63

    def encode(self, flat: torch.Tensor, generator: torch.Generator) -> dict[str, torch.Tensor]:
        if self.config.fdl_mode == "as_published":
            return self._as_published(flat, generator)
        return self._corrected(flat, generator)

    def _as_published(self, flat: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        c = self.config
        scale = flat.abs().amax(1).clamp_min(1e-12)
        v = flat / scale[:, None]
        kept = v.abs() > c.fdl_r
        n_kept = kept.sum(1)
        th = torch.floor(c.fdl_th * n_kept.double()).long()
        logw = exponential_mechanism_log_weights(1.0 + v.abs(), c.ldp_epsilon)
        logw = torch.where(kept, logw, torch.full_like(logw, -math.inf))
        idx = gumbel_top_k(logw, int(th.max()), g)
        mask = mask_of(idx, v.shape[1], th)
        values = laplace_values(v, mask, 2.0 / c.ldp_epsilon, g)
        self.stats = {"kept_frac": float(n_kept.double().mean()) / self.dims,
                      "th_mean": float(th.double().mean())}
        return {"mask": mask, "values": values, "scale": scale}

    def _corrected(self, flat: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        c = self.config
        k = min(c.fdl_k, flat.shape[1])
        eps_sel, eps_val = self._split()
        v = flat.clamp(-c.ldp_clip, c.ldp_clip) / c.ldp_clip
        u = (v.abs() / c.fdl_r).clamp(max=1.0) if c.fdl_r > 0 else v.abs()
        idx = gumbel_top_k(exponential_mechanism_log_weights(u, eps_sel / k), k, g)
        mask = mask_of(idx, v.shape[1])
        values = laplace_values(v, mask, 2.0 * k / eps_val, g)
        self.stats = {"kept_frac": 1.0}
        return {"mask": mask, "values": values,
                "scale": torch.full((flat.shape[0],), c.ldp_clip, device=flat.device)}

    def _split(self) -> tuple[float, float]:
        c = self.config
        return c.fdl_selection_share * c.ldp_epsilon, (1 - c.fdl_selection_share) * c.ldp_epsilon

    def upload_bytes(self, upload) -> int:
        n = int(upload["mask"].sum())
        return 8 * n + (4 if self.config.fdl_mode == "as_published" else 0)  # corrected: c is public

    def epsilon_per_round(self) -> float:
        if self.config.fdl_mode == "as_published":
            return math.inf
        return fdl_corrected_epsilon(*self._split())

    def round_metrics(self, server_state, ctx):
        stats = dict(self.stats)
        out = super().round_metrics(server_state, ctx)
        if self.config.fdl_mode == "as_published" and "th_mean" in stats:
            claims = fdl_published_epsilon(self.config.ldp_epsilon, round(stats["th_mean"]))
            out.update({"epsilon_nominal": claims["nominal"],
                        "epsilon_composed_ignoring_filter": claims["composed_ignoring_filter"]})
        return out
