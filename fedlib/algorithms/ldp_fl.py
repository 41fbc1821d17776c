"""LDP-FL (Sun, Qian, Chen, IJCAI 2021, Alg. 2), the FDL paper's LDP baseline.

Each client clamps every coordinate of its update to the public range ``[-c, c]``
(``ldp_clip``) and replaces it by one of two values ``+/- c (e^eps + 1) / (e^eps - 1)``,
with the probability that makes it unbiased (:func:`fedlib.privacy.local.two_point`). All
``d`` coordinates are reported, one bit each. Per coordinate this is ``eps``-LDP; for the
whole update, by composition, ``d eps`` (the paper's parameter shuffling hides which client
sent what from the server, an anonymity argument that does not lower this bound).
"""

from __future__ import annotations

import torch

from fedlib.algorithms.sparse import SparseUpload
from fedlib.privacy.local import ldp_fl_epsilon, two_point
from fedlib.privacy.noise import generator_for
from fedlib.streams import Stream


class LdpFl(SparseUpload):
    """LDP-FL: every coordinate clamped to ``[-c, c]`` and replaced by the two-point mechanism."""
    name = "ldp_fl"
    stream = Stream.LDP_FL
    mechanism = "two-point mechanism on every coordinate"
    fields = ("ldp_fl_epsilon_per_coordinate", "ldp_clip", "randomness")

    @classmethod
    def check(cls, config) -> list[str]:
        if not config.ldp_fl_epsilon_per_coordinate > 0 or not config.ldp_clip > 0:
            return ["LDP-FL needs ldp_fl_epsilon_per_coordinate > 0 and ldp_clip > 0"]
        return []

    def encode(self, flat: torch.Tensor, seed: tuple[int, ...]) -> tuple[dict[str, torch.Tensor], dict]:
        c = self.config
        g = generator_for(*seed, device=flat.device)  # drawn where the update is (a GPU: its own stream)
        values = two_point(flat, 0.0, c.ldp_clip, c.ldp_fl_epsilon_per_coordinate, g)
        return {"mask": torch.ones_like(flat, dtype=torch.bool), "values": values}, {}

    # pragma: no mutate start (bytes on the wire: bookkeeping)
    def upload_bytes(self, upload) -> int:
        """One bit per coordinate (two possible values) and no indices: every coordinate is sent."""
        return int(-(-upload["mask"].numel() // 8))
    # pragma: no mutate end

    def epsilon_per_round(self) -> float:
        return ldp_fl_epsilon(self.config.ldp_fl_epsilon_per_coordinate, self.dims)
