"""Magnitude pruning (MOON-DPAP eq. 6): ``w' = w if |w| >= T else 0``.

Masks are computed by the server from the (noised, when DP is on) global model, so they
are post-processing and leak nothing beyond what the model already does; they are
cumulative (a pruned weight stays pruned) and cover weight matrices and kernels, not biases.
"""

from __future__ import annotations

import torch

from fedlib.tree import Tree


def prunable(name: str, tensor: torch.Tensor) -> bool:
    """Whether a parameter can be pruned: a weight matrix or kernel, not a bias."""
    return name.endswith("weight") and tensor.dim() >= 2


def update_masks(params: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
                 threshold: float) -> dict[str, torch.Tensor]:
    """New cumulative masks: keep a weight iff it was kept and ``|w| >= threshold``."""
    return {k: m * (params[k].abs() >= threshold).to(m.dtype) if prunable(k, params[k]) else m
            for k, m in masks.items()}


def apply_masks(tree: Tree, masks: dict[str, torch.Tensor]) -> Tree:
    """Every masked tensor of ``tree`` multiplied by its 0/1 mask (pruned coordinates zero)."""
    return {k: v * masks[k].to(v.dtype) if k in masks else v for k, v in tree.items()}


def sparsity(masks: dict[str, torch.Tensor], params: dict[str, torch.Tensor]) -> float:
    """Fraction of all parameters that are pruned (zero by mask)."""
    total = sum(p.numel() for p in params.values())
    pruned = sum((m == 0).sum().item() for m in masks.values())
    return pruned / total


def sparse_bytes(masks: dict[str, torch.Tensor]) -> int:
    """Bytes of one update in a bitmap-sparse encoding: a 1-bit mask per parameter plus a
    float32 per kept entry (cheaper than index lists above ~3 % density)."""
    n = sum(m.numel() for m in masks.values())
    kept = sum(int(m.sum().item()) for m in masks.values())
    return (n + 7) // 8 + 4 * kept
