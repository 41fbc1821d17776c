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

Two controls of the repair (issue 63), to tell its design from its privacy:
``fdl_noise_free`` runs the same clip, encoding and k without noise, the selection
being the exponential mechanism's limit as epsilon grows (the k highest utilities, ties drawn
uniformly); it has no privacy guarantee (epsilon infinite). ``fdl_server_rescale`` makes the server
scale the mean report by ``d / k``: with a uniform selection the report of one client is then an
unbiased estimate of its clipped update (sparse FedAvg without it moves ``k / d`` of that), and the
noise grows by the same factor.
"""

from __future__ import annotations

import math

import torch

from fedlib.algorithms.sparse import SparseUpload
from fedlib.privacy.discrete import rng_for
from fedlib.privacy.local import (
    discrete_laplace_values,
    exponential_mechanism_log_weights,
    exponential_top_k,
    fdl_corrected_epsilon,
    fdl_published_epsilon,
    gumbel_top_k_mask,
    highest_k,
    laplace_values,
    mask_of,
)
from fedlib.privacy.noise import generator_for
from fedlib.privacy.record import Release, note
from fedlib.streams import Stream


class Fdl(SparseUpload):
    """FDL by dimension selection, as published or as our repair (``fdl_mode``)."""
    name = "fdl"
    stream = Stream.FDL
    fields = ("fdl_mode", "fdl_epsilon_per_draw", "fdl_epsilon_per_round", "ldp_clip", "fdl_r", "fdl_th",
              "fdl_k",
              "fdl_selection_share", "fdl_noise_free", "fdl_server_rescale", "secure_noise", "randomness")

    @classmethod
    def check(cls, config) -> list[str]:
        c, errs = config, []
        if c.fdl_mode not in ("as_published", "corrected"):
            errs.append(f"fdl_mode must be as_published or corrected, got {c.fdl_mode!r}")
        if not c.fdl_r >= 0:
            errs.append(f"fdl_r must be >= 0, got {c.fdl_r}")
        if c.fdl_mode == "as_published":
            if not c.fdl_epsilon_per_draw > 0 or not 0 < c.fdl_th <= 1:
                errs.append("FDL as published needs fdl_epsilon_per_draw > 0 and 0 < fdl_th <= 1")
        elif c.fdl_mode == "corrected":
            if not c.fdl_epsilon_per_round > 0 or not c.ldp_clip > 0 or c.fdl_k < 1:
                errs.append("corrected FDL needs fdl_epsilon_per_round > 0, ldp_clip > 0 and fdl_k >= 1")
            if not 0 < c.fdl_selection_share < 1:
                errs.append(f"fdl_selection_share must be in (0, 1), got {c.fdl_selection_share}")
        for flag in ("fdl_noise_free", "fdl_server_rescale"):
            if getattr(c, flag) and c.fdl_mode != "corrected":
                errs.append(f"{flag} is a control of corrected FDL (fdl_mode = corrected), not of FDL as "
                            "published")
        return errs

    @property
    def mechanism(self) -> str:  # type: ignore[override]
        if self.config.fdl_mode == "as_published":
            return "as published: data-dependent filter and scale, th draws and values at epsilon each"
        if self.config.fdl_noise_free:
            return "corrected FDL without noise (epsilon infinite: a control, no privacy)"
        return "k exponential draws (Gumbel-top-k) and discrete Laplace values, budget split"

    def encode(self, flat: torch.Tensor, seed: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], dict]:
        if self.config.fdl_mode == "as_published":
            return self._as_published(flat, generator_for(*seed, device=flat.device))
        return self._corrected(flat, seed)

    def _as_published(self, flat: torch.Tensor, g: torch.Generator) -> tuple[dict[str, torch.Tensor], dict]:
        """The paper's mechanism (continuous float64 Laplace: it has no finite epsilon to protect)."""
        c = self.config
        scale = flat.abs().amax(1).clamp_min(1e-12)
        v = flat / scale[:, None]
        kept = v.abs() > c.fdl_r
        n_kept = kept.sum(1)
        th = torch.floor(c.fdl_th * n_kept.double()).long()
        logw = exponential_mechanism_log_weights(1.0 + v.abs(), c.fdl_epsilon_per_draw)
        logw = torch.where(kept, logw, torch.full_like(logw, -math.inf))
        mask = gumbel_top_k_mask(logw, th, g)
        values = laplace_values(v, mask, 2.0 / c.fdl_epsilon_per_draw, g)
        note(Release("fdl_as_published", epsilon=math.inf))  # data-dependent filter: no finite bound
        th_mean = float(th.double().mean())
        claims = fdl_published_epsilon(c.fdl_epsilon_per_draw, round(th_mean))
        stats = {"kept_frac": float(n_kept.double().mean()) / self.dims, "th_mean": th_mean,
                 "epsilon_nominal": claims["nominal"],
                 "epsilon_composed_ignoring_filter": claims["composed_ignoring_filter"]}
        return {"mask": mask, "values": values, "scale": scale}, stats

    def _corrected(self, flat: torch.Tensor, seed: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], dict]:
        c = self.config
        k = self.k(flat.shape[1])
        eps_sel, eps_val = self.split()
        v = flat.clamp(-c.ldp_clip, c.ldp_clip) / c.ldp_clip
        u = (v.abs() / c.fdl_r).clamp(max=1.0) if c.fdl_r > 0 else v.abs()
        g = generator_for(*seed, device=flat.device)
        if c.fdl_noise_free:  # the control without noise: no privacy
            mask = mask_of(highest_k(u, k, g), v.shape[1])
            values = torch.where(mask, v, torch.zeros_like(v))
            note(Release("fdl_corrected_without_noise", epsilon=math.inf))
            return {"mask": mask, "values": values,
                    "scale": torch.full((flat.shape[0],), c.ldp_clip, device=flat.device)}, {"kept_frac": 1.0}
        idx = exponential_top_k(u, self.selection_epsilon_per_draw(k), k, g)
        mask = mask_of(idx, v.shape[1])
        values, _ = discrete_laplace_values(v, mask, self.values_l1_sensitivity(k), eps_val, rng_for(*seed))
        return {"mask": mask, "values": values,
                "scale": torch.full((flat.shape[0],), c.ldp_clip, device=flat.device)}, {"kept_frac": 1.0}

    # ---- the corrected mechanism's budget (each piece named, so each can be audited) ------------
    def k(self, dims: int) -> int:
        """The number of dimensions a client sends (the repair's public ``k``, at most the model's size)."""
        return min(self.config.fdl_k, dims)

    def split(self) -> tuple[float, float]:
        """(epsilon of the selection, epsilon of the values): their sum is ``fdl_epsilon_per_round``."""
        c = self.config
        eps, share = c.fdl_epsilon_per_round, c.fdl_selection_share
        return share * eps, (1 - share) * eps

    def selection_epsilon_per_draw(self, k: int) -> float:
        """Each of the k draws spends ``eps_sel / k``; by composition the selection spends ``eps_sel``."""
        return self.split()[0] / k

    def values_l1_sensitivity(self, k: int) -> float:
        """k values in ``[-1, 1]``: a replaced client can move each by 2, all together by ``2k``."""
        return 2.0 * k

    def server_gain(self) -> float:
        """``d / k`` under ``fdl_server_rescale`` (corrected FDL's control), else 1."""
        if self.config.fdl_mode == "corrected" and self.config.fdl_server_rescale:
            return self.dims / self.k(self.dims)
        return 1.0

    # pragma: no mutate start (bytes on the wire: bookkeeping)
    def upload_bytes(self, upload) -> int:
        n = int(upload["mask"].sum())
        return 8 * n + (4 if self.config.fdl_mode == "as_published" else 0)  # corrected: c is public
    # pragma: no mutate end

    def epsilon_per_round(self) -> float:
        if self.config.fdl_mode == "as_published" or self.config.fdl_noise_free:
            return math.inf
        return fdl_corrected_epsilon(*self.split())
