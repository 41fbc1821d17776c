"""Parameter trees (nested dicts of tensors) to and from Flower records, losslessly.

Tensor leaves go into an ``ArrayRecord`` under their path (``"masks/fc1.weight"``); Python
scalars (e.g. DP-FedAvg's broadcast clip norm) into a ``ConfigRecord``. float32 arrays travel
as they are, so a round trip returns the same bits.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

SEP = "/"


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            if SEP in str(k):
                raise ValueError(f"tree key {k!r} contains {SEP!r}")
            out.update(_flatten(v, f"{prefix}{k}{SEP}"))
        return out
    return {prefix[:-1]: tree}


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, v in flat.items():
        *parents, leaf = path.split(SEP)
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = v
    return out


def to_records(tree: Any) -> tuple[ArrayRecord, ConfigRecord]:
    """(tensor leaves, scalar leaves) of a tree."""
    flat = _flatten(tree) if tree else {}
    arrays = {k: Array(v.detach().cpu().numpy().copy(order="C"))
              for k, v in flat.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return ArrayRecord(arrays), ConfigRecord(scalars)


def from_records(arrays: ArrayRecord, scalars: ConfigRecord | None = None,
                 device: torch.device | str = "cpu") -> dict[str, Any]:
    """The tree :func:`to_records` encoded, with tensors on ``device``."""
    flat: dict[str, Any] = {k: torch.from_numpy(a.numpy().copy()).to(device) for k, a in arrays.items()}
    if scalars is not None:
        flat.update(dict(scalars.items()))
    return _unflatten(flat)
