"""SignDS-FL (Jiang, Zhou, Grossklags, ACM TIST 13(5) 2022, Alg. 2), as in MindSpore Federated.

Each client draws a random sign ``s``, forms the top-k set of ``s * update``
(``k = ceil(kappa d)``), draws how many ``nu`` of its ``h`` reported dimensions come from that
set by the exponential mechanism (:func:`fedlib.privacy.local.signds_nu_log_probs`), and
reports ``nu`` dimensions uniformly from the top-k set and ``h - nu`` from the rest, with
the sign ``s``. The server moves each reported dimension by ``eta_g s`` averaged over
clients: ``w_j <- w_j + eta_g (1/m) sum_i s_i 1[j in J_i]``. ``eps``-LDP per round. The
step size is fixed (MindSpore's private step-size estimate would spend extra budget).
"""

from __future__ import annotations

import math

import torch

from fedlib.algorithms.sparse import SparseUpload
from fedlib.privacy.discrete import rng_for
from fedlib.privacy.local import signds_epsilon, signds_select
from fedlib.streams import Stream


class SignDsFl(SparseUpload):
    """SignDS-FL: a random sign and ``h`` dimensions drawn by the exponential mechanism from the top-k set."""
    name = "signds_fl"
    stream = Stream.SIGNDS_FL
    mechanism = "exponential choice of how many reported dimensions come from the top-k set"
    fields = ("signds_epsilon_per_round", "signds_k", "signds_h", "signds_threshold", "signds_lr",
              "randomness")

    @classmethod
    def check(cls, config) -> list[str]:
        c, errs = config, []
        if not c.signds_epsilon_per_round > 0:
            errs.append(f"signds_epsilon_per_round must be > 0, got {c.signds_epsilon_per_round}")
        if not 0 < c.signds_k <= 0.25 or c.signds_h < 1 or not 0.5 <= c.signds_threshold <= 1:
            errs.append("SignDS-FL needs 0 < signds_k <= 0.25, signds_h >= 1, 0.5 <= signds_threshold <= 1")
        if not c.signds_lr > 0:
            errs.append(f"signds_lr must be > 0, got {c.signds_lr}")
        return errs

    def top_k_size(self, d: int) -> int:
        """The size of the "top" set among ``d`` coordinates: ``ceil(signds_k d)``, at least one."""
        return max(1, math.ceil(self.config.signds_k * d))

    def encode(self, flat: torch.Tensor, seed: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], dict]:
        c = self.config
        d = flat.shape[1]
        k = self.top_k_size(d)
        h = min(c.signds_h, d)
        nu_th = math.ceil(c.signds_threshold * h)
        mask, signs, nu = signds_select(flat, k, h, nu_th, c.signds_epsilon_per_round, rng_for(*seed))
        values = torch.where(mask, c.signds_lr * signs[:, None], torch.zeros_like(flat))
        return {"mask": mask, "values": values}, {"nu_mean": float(nu.float().mean()), "nu_threshold": nu_th}

    # pragma: no mutate start (bytes on the wire: bookkeeping)
    def upload_bytes(self, upload) -> int:
        return int(upload["mask"].sum()) * 4 + 1  # h indices and one sign
    # pragma: no mutate end

    def epsilon_per_round(self) -> float:
        return signds_epsilon(self.config.signds_epsilon_per_round)
